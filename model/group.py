"""G AWD-LSTM bodies of the same shapes computed in one batched pass (train.py --group on a GPU).

On a GPU one body's step is a chain of small sequential LSTM steps (70 x 3 at PTB's shapes) that
leaves most of the chip idle; G bodies computed together do G times the work in about the same
number of steps. Here every member keeps its own everything: its weights (stacked along a
leading group dimension at each forward, so each gradient reaches the member's own Parameters),
its masks (`AWDLSTMBody.draw_random`, drawn from the member's own random stream by the caller,
turned into masks here for all members at once),
its hidden state and its own sequence length: members shorter than the group's longest are
padded, and each one's state stops at its own last step (`alive`), so that its output and the
hidden state it carries are those of its solo forward.

    grouped_forward(bodies, ids, hidden, draws) -> GroupedBodies (.member(k): member k's BodyOutput)

Every member's weights are stacked once per forward and its masks applied to the stack, so that
the number of kernels launched for the group's embedding, weight drop and biases does not grow
with G (on a GPU a group's step is set by how many small kernels the host launches).

The LSTM maths is `grouped_lstm_reference` (torch.lstm's cell, batched over G); the training
forward runs the same function through model/kernels/grouped_lstm.py, which writes its backward
out by hand (the test compares them).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .body import AWDLSTMBody, BodyMasks, BodyOutput, BodyRandom, masked_embedding
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


class GroupedBodies(NamedTuple):
    """The bodies' forward, stacked over the group (members shorter than the longest padded: past
    a member's length its entries are not its own and are never read as such)."""
    output: torch.Tensor        # (G, T, B, nhidlast) g, the heads' input
    raw: torch.Tensor           # (G, T, B, nhidlast) the last layer before its dropout, for TAR
    states: list                # per layer (h, c), each (G, B, H): the state each member carries on
    lengths: list               # each member's own T
    own: torch.Tensor           # (G, T) bool: whether step t is member g's own (not its padding)
    embedding: torch.Tensor     # (G, V, emsize) the members' embedding matrices (the tied decoders')

    def member(self, k: int) -> BodyOutput:
        """Member k's forward, as `body(ids, hidden, masks)` returns it."""
        n = self.lengths[k]
        return BodyOutput(self.output[k, :n], [(h[k:k + 1], c[k:k + 1]) for h, c in self.states],
                          self.raw[k, :n])

    def valid(self) -> torch.Tensor:
        """(G, T) in the output's dtype: 1 where step t is member g's own, 0 in its padding."""
        return self.own.to(self.output.dtype)


def on_device(values: list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small tensor of Python values on `device`, copied there without waiting: on a GPU from
    pinned memory, asynchronously. torch.tensor(values, device=...) would wait for every kernel
    queued before it, and a host that waits cannot queue the next kernels while the GPU runs."""
    host, device = torch.tensor(values, dtype=dtype), torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def own_steps(lengths: list[int], device) -> torch.Tensor:
    """(G, T) bool, T the longest: whether step t is member g's own, within its length."""
    return torch.arange(max(lengths), device=device) < on_device(lengths, device)[:, None]


def alive_steps(lengths: list[int], device, own: torch.Tensor | None = None) -> torch.Tensor | None:
    """(T, G): whether member g still runs at step t (own_steps transposed; `own` if already made);
    None when every member runs all T steps."""
    if min(lengths) == max(lengths):
        return None
    return (own_steps(lengths, device) if own is None else own).T.contiguous()


def padded(tensors: list[torch.Tensor], steps: int) -> torch.Tensor:
    """(G, steps, ...): the members' (T_g, ...) tensors stacked, each zero past its own T_g."""
    out = tensors[0].new_zeros((len(tensors), steps, *tensors[0].shape[1:]))
    for k, x in enumerate(tensors):
        out[k, :x.size(0)] = x
    return out


def group_masks(draws: list[BodyRandom], rates: list[BodyMasks], steps: int) -> BodyMasks:
    """All the members' masks at once, stacked (G, ...) in BodyMasks' fields, from each member's
    own draws (`AWDLSTMBody.draw_random`, from its own stream) and rates: the same numbers as
    each member's `draws.masks(rates)` (mask = 1/(1-p) where the uniform is >= p), in a few
    launches for the whole group instead of a few per member. A member with nothing dropped in
    a field gets ones there (noise: zeros); a field no member has is None. The noise is padded
    to `steps`."""
    flat_draws = [[d.words, d.inputs, *d.weight_hh, *d.outputs] for d in draws]
    flat_rates = [[r.words, r.inputs, *r.weight_hh, *r.outputs] for r in rates]
    fields = list(zip(*flat_draws))
    present = [f for f, members in enumerate(fields) if any(d is not None for d in members)]
    masks: list = [None] * len(fields)
    if present:
        like = next(d for d in fields[present[0]] if d is not None)
        # Every present field's rates and scales (member g's: p and 1/(1-p), 0 and 1 without a
        # draw) as one tensor: one copy to the device for the whole step.
        table = on_device([[[r[f] for r in flat_rates] for f in present],
                           [[1.0 / (1.0 - r[f]) for r in flat_rates] for f in present]],
                          like.device, like.dtype)                              # (2, fields, G)
        for row, f in enumerate(present):
            shape = next(d for d in fields[f] if d is not None).shape
            ones = like.new_ones(()).expand(shape)
            uniforms = torch.stack([ones if d is None else d for d in fields[f]])
            broadcast = (-1,) + (1,) * len(shape)
            masks[f] = uniforms.ge_(table[0, row].view(broadcast)).mul_(table[1, row].view(broadcast))
    layers = len(draws[0].weight_hh)
    noise = None
    if any(d.noise is not None for d in draws):
        like = next(d.noise for d in draws if d.noise is not None)
        sigma = on_device([r.noise for r in rates], like.device, like.dtype)
        normals = padded([like.new_zeros(()).expand(like.shape) if d.noise is None else d.noise
                          for d in draws], steps)
        noise = normals * sigma.view(-1, 1, 1, 1)
    return BodyMasks(masks[0], noise, masks[1], masks[2:2 + layers], masks[2 + layers:])


class SumOfTwo(torch.autograd.Function):
    """a + b, whose backward gives b a copy of the gradient rather than the same tensor. With the
    same tensor, autograd would hand each member's bias_ih and bias_hh a view of one buffer as
    their .grad (it keeps a gradient without copying when nothing else holds that view), and an
    in-place change of one (clipping, a second chunk's accumulation) would change the other."""

    @staticmethod
    def forward(ctx, a, b):
        return a + b

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.clone()


class Stacked(torch.autograd.Function):
    """torch.stack of the members' parameters, whose backward makes the stacked gradient contiguous
    once for the group: each member's .grad is then a plain slice of it, which autograd keeps
    as it is. A transposed gradient (a product with a weight's transpose gives one) would
    otherwise be copied per member into the parameter's layout."""

    @staticmethod
    def forward(ctx, *tensors):
        return torch.stack(tensors)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous().unbind(0)


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    return Stacked.apply(*tensors)


def grouped_forward(bodies: list[AWDLSTMBody], ids: list[torch.Tensor], hidden: list[list],
                    draws: list[BodyRandom], recurrence=grouped_lstm_recurrence) -> GroupedBodies:
    """Each body's forward of its ids (T_g, B) from its hidden state with the masks of its draws,
    as `body(ids, hidden, draws.masks(body.rates()))` computes it, in one pass over the group:
    `.member(k)` is member k's BodyOutput."""
    lengths = [x.size(0) for x in ids]
    steps, batch = max(lengths), ids[0].size(1)
    device = ids[0].device
    own = own_steps(lengths, device)                                                     # (G, T)
    alive = alive_steps(lengths, device, own)                                            # (T, G)
    masks = group_masks(draws, [body.rates() for body in bodies], steps)
    # The first layer's inputs: one lookup in the members' embedding matrices side by side (member
    # g's words offset by g V), with each one's embedding dropout, noise and dropouti.
    embedding = stacked([body.encoder.weight for body in bodies])                   # (G, V, d)
    g, vocab, emsize = embedding.shape
    words = padded(ids, steps) + torch.arange(0, g * vocab, vocab, device=device).view(-1, 1, 1)
    x = masked_embedding(words, embedding.view(g * vocab, emsize),
                         None if masks.words is None else masks.words.view(g * vocab, 1))  # (G, T, B, d)
    x = x if masks.noise is None else x + masks.noise
    x = x if masks.inputs is None else x * masks.inputs
    states = []
    for layer in range(len(bodies[0].rnns)):
        rnns = [body.rnns[layer] for body in bodies]
        w_ih = stacked([rnn.weight_ih for rnn in rnns])                             # (G, 4H, in)
        w_hh = stacked([rnn.weight_hh for rnn in rnns])                             # (G, 4H, H)
        w_hh = w_hh if masks.weight_hh[layer] is None else w_hh * masks.weight_hh[layer]
        bias = SumOfTwo.apply(stacked([rnn.bias_ih for rnn in rnns]), stacked([rnn.bias_hh for rnn in rnns]))
        size = x.size(-1)
        xw = torch.baddbmm(bias.unsqueeze(1), x.reshape(g, steps * batch, size), w_ih.transpose(1, 2))
        h0 = torch.cat([member[layer][0] for member in hidden])                         # (G, B, H)
        c0 = torch.cat([member[layer][1] for member in hidden])
        raw, h, c = recurrence(xw.view(g, steps, batch, -1), h0, c0, w_hh, alive)       # (G, T, B, H)
        states.append((h, c))
        x = raw if masks.outputs[layer] is None else raw * masks.outputs[layer]         # (G, 1, B, H) masks
    return GroupedBodies(x, raw, states, lengths, own, embedding)
