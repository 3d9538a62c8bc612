"""The LSTM recurrence of G independent layers at once, with a hand-written backward.

model/group.py states the maths (`grouped_lstm_reference`: the cell of torch.lstm, batched over
a leading group dimension, each member's state frozen after its own last step). Written with
autograd, every time step leaves a dozen graph nodes, and on a GPU the step is then set by
launching them, forward and backward. `GroupedLSTMRecurrence` computes the same function with
the forward run outside autograd, saving the gates, and back-propagation through time written
out: per time step one batched product (or another way: PRODUCT) and one pointwise cell
function each way (fused into one kernel by torch.compile on a GPU), and the hidden-to-hidden
weights' gradient as one batched product over all time steps at the end.

Even so a step launches a few thousand small kernels (70 x 3 time steps, forward and backward),
and launching them from Python costs more than the GPU takes to run them: the first H200
measurement (results/gpu_h200_2026-11-27) found a group of one at 0.14x the cuDNN solo run and a
group of 16 no faster than one solo run. So on CUDA each time loop is captured once as a CUDA graph
per shape and replayed (`CapturedCall`): inputs are copied into the graph's own buffers, one
replay launches the whole loop, and the outputs are copied out (the next replay overwrites the
graph's buffers, and the backward needs the forward's saved tensors). The time dimension is
padded to a multiple of STEP_BUCKET (a few graphs serve every sequence length) with the padded
steps marked not alive, which keeps every member's state unchanged: the same numbers, exactly.
If capturing fails, one warning is printed and the loops run eagerly from then on.

tests/test_group.py compares the kernel with the reference (values and gradients, gradcheck in
float64), the compiled cell with the eager one, and the captured loops (their buffers replayed as
on CUDA, the replay emulated on the CPU) with the eager ones.

Shapes: G members, T time steps (the longest member's), B sequences, H hidden units.
    xw     (G, T, B, 4H)   input projections with both biases (gates in torch's order i, f, g, o)
    h0, c0 (G, B, H)       initial states
    w_hh   (G, 4H, H)      hidden-to-hidden weights (weight-dropped)
    alive  (T, G) bool     member g still running at step t (None: every member runs T steps)
returns out (G, T, B, H) (each step's state: past a member's end, its frozen state), h, c (G, B, H).
"""
from __future__ import annotations

import warnings
from functools import partial
from typing import Callable, ClassVar, Optional

import torch
import torch.nn.functional as F

from .compiled import FusedKernel

STEP_BUCKET = 4        # captured loops pad T to a multiple of this: at most 3 idle steps
WARMUP_CALLS = 2       # eager calls before a capture (compiles the cells, settles the allocator)

# How each time step's product with W_hh is computed: "batched", one batched product for the group;
# "per_member", one product per member, where the library chooses its kernel for one matrix
# (splitting the inner dimension over more of the GPU's cores, say) at the cost of G kernels a
# step; "gate_split", the backward's product (the gates' gradient by W_hh, inner dimension 4H) as
# 4G batched products of inner dimension H, one per member and gate, summed over the gates (the
# inner dimension split by hand, for every member at once; the forward's product, inner dimension
# H, stays batched); "streams", one product per member as per_member, each member's on a CUDA
# stream of its own so that the G products run at once (a member's product alone leaves most of
# the GPU idle: 27 us of 20 x 1150 by 1150 x 4600 on an H200, against 77 us for four batched;
# inside a captured loop the streams are branches of the graph; off CUDA it is per_member). The
# same function every way; gate_split sums in another order (float rounding apart).
# `benchmarks/bench_group.py --product WAY` times a way.
PRODUCT_WAYS = ("batched", "per_member", "gate_split", "streams")
GATES = 4

# The default, "by_shape": gate_split for layers of GATE_SPLIT_FROM hidden units or more, batched
# below, as measured on an H200 (docs/gpus.md): at a 1150-unit layer the batched backward product
# took 4.7 times as long at G = 2 as at G = 1, and gate_split raised PTB's whole step (layers of
# 1150 and 400) at G = 4 from 1.26x to 1.61x the solo run's tokens/s; at the miniature's 256-unit
# layer the batched product was the faster (1.7-2.1 against 2.9-4.0 ms a loop). The 400- and
# 32-unit layers were not timed alone (their ways follow the whole steps), nor sizes between 256
# and 400. Chosen by shape, never by timing at run time, so that a run resumed or repeated sums in
# the same order.
PRODUCT = "by_shape"
GATE_SPLIT_FROM = 400


def product_for(hidden: int) -> str:
    """The way (PRODUCT_WAYS) a layer of `hidden` units computes its products under PRODUCT."""
    if PRODUCT != "by_shape":
        return PRODUCT
    return "gate_split" if hidden >= GATE_SPLIT_FROM else "batched"


def product_with(weights: torch.Tensor, way: str) -> Callable:
    """(bias (G, B, N), a (G, B, K)) -> bias + a @ weights, member by member: weights (G, K, N)."""
    if way == "batched":
        return lambda bias, a: torch.baddbmm(bias, a, weights)
    if way == "gate_split":
        return split_inner(weights, GATES)
    members = weights.unbind(0)

    def per_member(bias, a):
        out = torch.empty_like(bias)
        for k, w in enumerate(members):
            torch.addmm(bias[k], a[k], w, out=out[k])
        return out
    if way == "per_member" or not weights.is_cuda:
        return per_member
    streams = member_streams(len(members), weights.device)

    def on_streams(bias, a):
        # Each side stream starts after what the current stream has queued (a and bias are
        # ready), and the current stream goes on only after all of them: out is complete and no
        # buffer is freed under a running product (the caching allocator orders reuse on the
        # current stream).
        current = torch.cuda.current_stream(weights.device)
        out = torch.empty_like(bias)
        for k, (w, stream) in enumerate(zip(members, streams)):
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                torch.addmm(bias[k], a[k], w, out=out[k])
        for stream in streams:
            current.wait_stream(stream)
        return out
    return on_streams


_STREAMS: dict = {}


def member_streams(count: int, device: torch.device) -> list:
    """`count` CUDA streams on `device`, made once and kept (the "streams" way's, one a member)."""
    made = _STREAMS.setdefault(torch.device(device), [])
    while len(made) < count:
        made.append(torch.cuda.Stream(device))
    return made[:count]


def split_inner(weights: torch.Tensor, parts: int) -> Callable:
    """product_with's function with the inner dimension K split into `parts` equal parts: G x parts
    batched products of inner dimension K / parts, summed over the parts (gate_split: the backward's
    4H split into the four gates). `bench_group.py --products` also times other part counts."""
    members, inner, outer = weights.shape
    width = inner // parts
    by_part = weights.reshape(members * parts, width, outer)

    def split(bias, a):
        a = a.view(members, -1, parts, width).transpose(1, 2).reshape(members * parts, -1, width)
        return torch.bmm(a, by_part).view(members, parts, -1, outer).sum(1) + bias
    return split


def _cell(a, c, h, keep):
    """One step's pointwise part from the pre-activations a (G, B, 4H), the state (h, c) it starts
    from, and keep (G, 1, 1), true for a member still running: (the activated gates, side by
    side as saved for the backward; c'; tanh of the new cell state; h'), where a member that has
    ended keeps its h and c."""
    i, f, g, o = a.chunk(4, dim=-1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    c_new = f * c + i * g
    tanh_c = torch.tanh(c_new)
    return (torch.cat([i, f, g, o], dim=-1), torch.where(keep, c_new, c), tanh_c,
            torch.where(keep, o * tanh_c, h))


def _cell_backward(gates, c, tanh_c, d_out, d_h, d_c, keep):
    """The gradients of one step's pre-activations and of the cell state it started from, and
    the part of h's gradient that bypasses the step, given the gradients of its output (d_out),
    of the h' and c' it passed on (d_h, d_c) and keep (as in _cell). A member that had ended
    passed its state on unchanged: its gradients go straight back to the step before, none into
    this step's gates."""
    d_h = d_h + d_out
    ran = keep.to(d_h.dtype)
    bypass_h, bypass_c = d_h * (1 - ran), d_c * (1 - ran)
    d_h, d_c = d_h * ran, d_c * ran
    i, f, g, o = gates.chunk(4, dim=-1)
    d_c = d_c + d_h * o * (1 - tanh_c * tanh_c)
    d_a = torch.cat([d_c * g * i * (1 - i),               # input gate
                     d_c * c * f * (1 - f),               # forget gate
                     d_c * i * (1 - g * g),               # cell candidate
                     d_h * tanh_c * o * (1 - o)], dim=-1)  # output gate
    return d_a, d_c * f + bypass_c, bypass_h


# On a GPU each of these is one fused kernel instead of a dozen (torch.compile; eager elsewhere),
# the members that have ended included: a step of the time loop is then two kernels each way
# (the product with W_hh, the cell) with one batched product; gate_split's backward adds the copy
# into parts and their sum. Every argument is (G, B, .) or keep's (G, 1, 1), contiguous
# (the saved per-step tensors are stored time first), and G is a symbol of the kernel: one
# compilation serves every group size and sequence length.
CELL = FusedKernel(_cell, varying={k: (0,) for k in range(4)})
CELL_BACKWARD = FusedKernel(_cell_backward, varying={k: (0,) for k in range(7)})


def recurrence_forward(xw, h0, c0, w_hh, alive, compiled: bool, product: str = "batched"):
    """The time loop forward: (out (G, T, B, H), h, c, and for the backward the activated gates,
    the cell states each step started from and tanh of the new ones, each (T, G, B, .))."""
    gates_of = product_with(w_hh.transpose(1, 2), "batched" if product == "gate_split" else product)
    keeps = alive.view(alive.size(0), -1, 1, 1)
    h, c = h0, c0
    outs, gates, cells, tanh_cells = [], [], [], []
    for t in range(xw.size(1)):
        cells.append(c)                       # the state the step started from
        activated, c, tanh_c, h = CELL(gates_of(xw[:, t], h), c, h, keeps[t], compiled=compiled)
        gates.append(activated)
        tanh_cells.append(tanh_c)
        outs.append(h)
    return torch.stack(outs, dim=1), h, c, torch.stack(gates), torch.stack(cells), torch.stack(tanh_cells)


def recurrence_backward(d_out, d_h, d_c, h0, w_hh, gates, cells, tanh_cells, out, alive, compiled: bool,
                        product: str = "batched"):
    """Back-propagation through the time loop: the gradients of xw (G, T, B, 4H), h0, c0, w_hh."""
    keeps = alive.view(alive.size(0), -1, 1, 1)
    through_weights = product_with(w_hh, product)
    d_gates = []
    for t in reversed(range(gates.size(0))):
        d_a, d_c, bypass_h = CELL_BACKWARD(gates[t], cells[t], tanh_cells[t], d_out[:, t], d_h, d_c, keeps[t],
                                           compiled=compiled)
        d_h = through_weights(bypass_h, d_a)
        d_gates.append(d_a)
    # Every step's hidden-to-hidden gradient in one product: sum over t of d_gates_t^T h_{t-1}.
    d_xw = torch.stack(d_gates[::-1], dim=1)                                        # (G, T, B, 4H)
    h_before = torch.cat([h0.unsqueeze(1), out[:, :-1]], dim=1)
    g, t, b = d_xw.shape[:3]
    d_w_hh = torch.bmm(d_xw.reshape(g, t * b, -1).transpose(1, 2), h_before.reshape(g, t * b, -1))
    return d_xw, d_h, d_c, d_w_hh


class CapturedCall:
    """fn (tensors in, a tuple of tensors out) captured for the shapes of its first arguments and
    replayed: each call copies its arguments into the captured buffers, replays, and returns
    copies of the outputs. On CUDA a CUDA graph; elsewhere the replay is emulated (fn recomputed
    from the buffers into the same output buffers), so that the CPU's tests exercise the buffers
    exactly as CUDA uses them."""

    def __init__(self, fn: Callable, example: tuple):
        self.fn, self.graph = fn, None
        self.inputs = [x.detach().clone() for x in example]
        if self.inputs[0].is_cuda:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    fn(*self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.outputs = fn(*self.inputs)
        else:
            self.outputs = fn(*self.inputs)

    def __call__(self, *args) -> tuple:
        for buffer, x in zip(self.inputs, args):
            buffer.copy_(x)
        if self.graph is not None:
            self.graph.replay()
        else:
            for buffer, x in zip(self.outputs, self.fn(*self.inputs)):
                buffer.copy_(x)
        return tuple(x.clone() for x in self.outputs)


class Loops:
    """How the two time loops run: launched step by step from Python (eager), or each captured
    once per shape and replayed (CapturedCall). The captures are kept while the group keeps its
    size: their buffers hold the loops' saved tensors (by their sizes, about 1 GiB per
    sequence-length bucket for 8 runs at PTB's shapes), so a group that shrinks (a run finished)
    frees the larger group's."""

    captures: ClassVar[dict] = {}
    captured_members: ClassVar[Optional[int]] = None
    capture_failed: ClassVar[bool] = False

    def __init__(self, compiled: bool, captured: bool, product: str = "batched"):
        self.compiled, self.product = compiled, product
        self.captured = captured and not Loops.capture_failed

    def forward(self, xw, h0, c0, w_hh, alive):
        return self.run(recurrence_forward, (xw, h0, c0, w_hh, alive))

    def backward(self, *args):
        return self.run(recurrence_backward, args)

    def run(self, loop: Callable, args: tuple):
        fn = partial(loop, compiled=self.compiled, product=self.product)
        if self.captured:
            key = (loop.__name__, self.compiled, self.product, *((x.shape, x.dtype, x.device) for x in args))
            if Loops.captured_members != args[0].size(0):
                Loops.release()
                Loops.captured_members = args[0].size(0)
            try:
                if key not in Loops.captures:
                    Loops.captures[key] = CapturedCall(fn, args)
                return Loops.captures[key](*args)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as error:  # whatever capturing raises, the eager loop still works
                Loops.capture_failed = True
                reason = (str(error).strip().splitlines() or [""])[0]
                warnings.warn(f"capturing the grouped LSTM as a CUDA graph failed ({type(error).__name__}: "
                              f"{reason}); its time loops run eagerly from now on (same results, slower)",
                              RuntimeWarning, stacklevel=2)
        return fn(*args)

    @staticmethod
    def release() -> None:
        """Free every capture (their buffers and graphs)."""
        Loops.captures.clear()
        Loops.captured_members = None


class GroupedLSTMRecurrence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xw, h0, c0, w_hh, alive, loops: Loops):
        out, h, c, gates, cells, tanh_cells = loops.forward(xw, h0, c0, w_hh, alive)
        ctx.save_for_backward(h0, w_hh, gates, cells, tanh_cells, out, alive)
        ctx.loops = loops
        return out, h, c

    @staticmethod
    def backward(ctx, d_out, d_h, d_c):
        h0, w_hh, gates, cells, tanh_cells, out, alive = ctx.saved_tensors
        d_out = torch.zeros_like(out) if d_out is None else d_out.contiguous()
        d_h = torch.zeros_like(h0) if d_h is None else d_h
        d_c = torch.zeros_like(h0) if d_c is None else d_c
        grads = ctx.loops.backward(d_out, d_h, d_c, h0, w_hh, gates, cells, tanh_cells, out, alive)
        return (*grads, None, None)


# None: captured on CUDA, eager elsewhere. The tests set True to run the captured path (padding,
# buffers, emulated replay) on the CPU.
CAPTURE: Optional[bool] = None


def grouped_lstm_recurrence(xw, h0, c0, w_hh, alive=None):
    """The recurrence (shapes above); on a GPU its pointwise steps are compiled and its time
    loops captured (CUDA graphs)."""
    captured = xw.is_cuda if CAPTURE is None else CAPTURE
    steps, members = xw.size(1), xw.size(0)
    alive = torch.ones(steps, members, dtype=torch.bool, device=xw.device) if alive is None else alive
    if not captured or Loops.capture_failed:
        loops = Loops(xw.is_cuda, captured=False, product=product_for(h0.size(-1)))
        return GroupedLSTMRecurrence.apply(xw, h0, c0, w_hh, alive, loops)
    padded = -(-steps // STEP_BUCKET) * STEP_BUCKET
    if padded > steps:
        xw = F.pad(xw, (0, 0, 0, 0, 0, padded - steps))
        alive = F.pad(alive, (0, 0, 0, padded - steps), value=False)
    loops = Loops(xw.is_cuda, captured=True, product=product_for(h0.size(-1)))
    out, h, c = GroupedLSTMRecurrence.apply(xw, h0, c0, w_hh, alive, loops)
    return out[:, :steps], h, c
