"""G AWD-LSTM bodies of the same shapes computed in one batched pass (train.py --group on a GPU).

On a GPU one body's step is a chain of small sequential LSTM steps (70 x 3 at PTB's shapes) that
leaves most of the chip idle; G bodies computed together do G times the work in about the same
number of steps. Here every member keeps its own everything: its weights (stacked along a
leading group dimension at each forward, so each gradient reaches the member's own Parameters),
its masks (`AWDLSTMBody.draw_masks`, drawn from the member's own random stream by the caller),
its hidden state and its own sequence length: members shorter than the group's longest are
padded, and each one's state stops at its own last step (`alive`), so that its output and the
hidden state it carries are those of its solo forward.

    grouped_forward(bodies, ids, hidden, masks) -> one BodyOutput per member

The LSTM maths is `grouped_lstm_reference` (torch.lstm's cell, batched over G); the training
forward runs the same function through model/kernels/grouped_lstm.py, which writes its backward
out by hand (the test compares them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .body import AWDLSTMBody, BodyMasks, BodyOutput
from .kernels.grouped_lstm import grouped_lstm_recurrence


def grouped_lstm_reference(xw, h0, c0, w_hh, alive=None):
    """The recurrence of model/kernels/grouped_lstm.py written plainly (shapes there): per step,
    gates = xw_t + h W_hh^T in torch's order (input, forget, cell, output);
    c' = sigmoid(f) c + sigmoid(i) tanh(g), h' = sigmoid(o) tanh(c'); a member no longer alive
    keeps its state."""
    h, c, outs = h0, c0, []
    for t in range(xw.size(1)):
        i, f, g, o = torch.baddbmm(xw[:, t], h, w_hh.transpose(1, 2)).chunk(4, dim=-1)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(c_new)
        if alive is not None:
            keep = alive[t].view(-1, 1, 1)
            h_new, c_new = torch.where(keep, h_new, h), torch.where(keep, c_new, c)
        outs.append(h_new)
        h, c = h_new, c_new
    return torch.stack(outs, dim=1), h, c


def stacked(tensors: list, like_shape, reference: torch.Tensor) -> torch.Tensor:
    """The members' masks stacked, a member without one (nothing dropped) given ones."""
    return torch.stack([reference.new_ones(like_shape) if t is None else t for t in tensors])


def alive_steps(lengths: list[int], device) -> torch.Tensor | None:
    """(T, G): whether member g still runs at step t; None when every member runs all T steps."""
    steps = max(lengths)
    if min(lengths) == steps:
        return None
    return torch.arange(steps, device=device)[:, None] < torch.tensor(lengths, device=device)[None, :]


def grouped_forward(bodies: list[AWDLSTMBody], ids: list[torch.Tensor], hidden: list[list],
                    masks: list[BodyMasks], recurrence=grouped_lstm_recurrence) -> list[BodyOutput]:
    """Each body's forward of its ids (T_g, B) from its hidden state with its masks, as
    `body(ids, hidden, masks)` computes it, in one pass over the group."""
    lengths = [x.size(0) for x in ids]
    steps, batch = max(lengths), ids[0].size(1)
    device = ids[0].device
    alive = alive_steps(lengths, device)
    # The first layer's inputs, each member's embedding (its dropout, noise, dropouti) padded to T.
    x = torch.stack([F.pad(body.embed(x, m), (0, 0, 0, 0, 0, steps - x.size(0)))
                     for body, x, m in zip(bodies, ids, masks)])                        # (G, T, B, d)
    states = []
    for layer in range(len(bodies[0].rnns)):
        rnns = [body.rnns[layer] for body in bodies]
        w_ih = torch.stack([rnn.weight_ih for rnn in rnns])                             # (G, 4H, in)
        w_hh = torch.stack([rnn.masked_weight_hh(m.weight_hh[layer]) for rnn, m in zip(rnns, masks)])
        bias = torch.stack([rnn.bias_ih + rnn.bias_hh for rnn in rnns])                 # (G, 4H)
        g, _, _, size = x.shape
        xw = torch.baddbmm(bias.unsqueeze(1), x.reshape(g, steps * batch, size), w_ih.transpose(1, 2))
        h0 = torch.cat([member[layer][0] for member in hidden])                         # (G, B, H)
        c0 = torch.cat([member[layer][1] for member in hidden])
        raw, h, c = recurrence(xw.view(g, steps, batch, -1), h0, c0, w_hh, alive)       # (G, T, B, H)
        states.append((h, c))
        drop = stacked([m.outputs[layer] for m in masks], (1, batch, rnns[0].hidden_size), raw)
        x = raw * drop                                                                  # (G, 1, B, H) masks
    return [BodyOutput(x[k, :n], [(h[k:k + 1], c[k:k + 1]) for h, c in states], raw[k, :n])
            for k, n in enumerate(lengths)]
