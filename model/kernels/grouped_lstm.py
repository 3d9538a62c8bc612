"""The LSTM recurrence of G independent layers at once, with a hand-written backward.

model/group.py states the maths (`grouped_lstm_reference`: the cell of torch.lstm, batched over
a leading group dimension, each member's state frozen after its own last step). Written with
autograd, every time step leaves a dozen graph nodes, and on a GPU the step is then set by
launching them, forward and backward. `GroupedLSTMRecurrence` computes the same function with
the forward run outside autograd, saving the gates, and back-propagation through time written
out: per time step one batched product and one pointwise cell function each way (fused into one
kernel by torch.compile on a GPU), and the hidden-to-hidden weights' gradient as one batched
product over all time steps at the end.
tests/test_group.py compares it with the reference (values and gradients, gradcheck in float64).

Shapes: G members, T time steps (the longest member's), B sequences, H hidden units.
    xw     (G, T, B, 4H)   input projections with both biases (gates in torch's order i, f, g, o)
    h0, c0 (G, B, H)       initial states
    w_hh   (G, 4H, H)      hidden-to-hidden weights (weight-dropped)
    alive  (T, G) bool     member g still running at step t (None: every member runs T steps)
returns out (G, T, B, H) (each step's state: past a member's end, its frozen state), h, c (G, B, H).
"""
from __future__ import annotations

import torch

from .compiled import FusedKernel


def _cell(a, c):
    """One step's pointwise part from the pre-activations a (G, B, 4H) and the cell state c:
    (the activated gates, side by side as saved for the backward; c'; tanh(c'); h')."""
    i, f, g, o = a.chunk(4, dim=-1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    c_new = f * c + i * g
    tanh_c = torch.tanh(c_new)
    return torch.cat([i, f, g, o], dim=-1), c_new, tanh_c, o * tanh_c


def _cell_backward(gates, c, tanh_c, d_h, d_c):
    """The gradients of one step's pre-activations and of the state c it started from, given
    those of its outputs h' (d_h) and c' (d_c)."""
    i, f, g, o = gates.chunk(4, dim=-1)
    d_c = d_c + d_h * o * (1 - tanh_c * tanh_c)
    d_a = torch.cat([d_c * g * i * (1 - i),               # input gate
                     d_c * c * f * (1 - f),               # forget gate
                     d_c * i * (1 - g * g),               # cell candidate
                     d_h * tanh_c * o * (1 - o)], dim=-1)  # output gate
    return d_a, d_c * f


# On a GPU each of these is one fused kernel instead of about ten (torch.compile; eager elsewhere).
CELL = FusedKernel(_cell)
CELL_BACKWARD = FusedKernel(_cell_backward)


class GroupedLSTMRecurrence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xw, h0, c0, w_hh, alive, compiled):
        w_hh_t = w_hh.transpose(1, 2)
        h, c = h0, c0
        outs, gates, cells, tanh_cells = [], [], [], []
        for t in range(xw.size(1)):
            activated, c_new, tanh_c, h_new = CELL(torch.baddbmm(xw[:, t], h, w_hh_t), c, compiled=compiled)
            gates.append(activated)
            tanh_cells.append(tanh_c)
            cells.append(c)                       # the state the step started from
            if alive is not None:
                keep = alive[t].view(-1, 1, 1)
                h_new = torch.where(keep, h_new, h)
                c_new = torch.where(keep, c_new, c)
            outs.append(h_new)
            h, c = h_new, c_new
        out = torch.stack(outs, dim=1)
        ctx.save_for_backward(h0, w_hh, torch.stack(gates, 1), torch.stack(cells, 1),
                              torch.stack(tanh_cells, 1), out, alive)
        ctx.has_alive, ctx.compiled = alive is not None, compiled
        return out, h, c

    @staticmethod
    def backward(ctx, d_out, d_h, d_c):
        h0, w_hh, gates, cells, tanh_cells, out, alive = ctx.saved_tensors
        d_out = torch.zeros_like(out) if d_out is None else d_out
        d_h = torch.zeros_like(h0) if d_h is None else d_h
        d_c = torch.zeros_like(h0) if d_c is None else d_c
        d_gates = torch.empty_like(gates)
        for t in reversed(range(gates.size(1))):
            d_h = d_h + d_out[:, t]
            if ctx.has_alive:
                # A member past its end passed its state on unchanged: its gradient goes straight
                # back to the step before, and none into this step's gates.
                keep = alive[t].view(-1, 1, 1).to(d_h.dtype)
                d_h_pass, d_c_pass = d_h * (1 - keep), d_c * (1 - keep)
                d_h, d_c = d_h * keep, d_c * keep
            d_gates[:, t], d_c = CELL_BACKWARD(gates[:, t], cells[:, t], tanh_cells[:, t], d_h, d_c,
                                               compiled=ctx.compiled)
            d_h = torch.bmm(d_gates[:, t], w_hh)
            if ctx.has_alive:
                d_h, d_c = d_h + d_h_pass, d_c + d_c_pass
        # Every step's hidden-to-hidden gradient in one product: sum over t of d_gates_t^T h_{t-1}.
        h_before = torch.cat([h0.unsqueeze(1), out[:, :-1]], dim=1)
        g, t, b = gates.shape[:3]
        d_w_hh = torch.bmm(d_gates.reshape(g, t * b, -1).transpose(1, 2), h_before.reshape(g, t * b, -1))
        return d_gates, d_h, d_c, d_w_hh, None, None


def grouped_lstm_recurrence(xw, h0, c0, w_hh, alive=None):
    """The recurrence (shapes above); on a GPU its pointwise steps are compiled."""
    return GroupedLSTMRecurrence.apply(xw, h0, c0, w_hh, alive, xw.is_cuda)
