"""The PLIF as a custom autograd function (model/heads/plif.py has the definition).

The forward pass is a bucket lookup and two gathers (s_i and the offset at knot i). The gradient
needs, per logit, only the logit itself (the bucket is recomputed), so the function saves l and
nothing else per logit: memory does not grow with K x batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .compiled import FusedKernel


def _bucket(x: torch.Tensor, bound: float, knots: int) -> torch.Tensor:
    """i = clamp(floor((x + T) / Delta), 0, K - 1) as int32."""
    # Clamp while still floating point: huge or infinite logits must not reach the integer
    # conversion (it would overflow). Truncation is floor once the value is >= 0.
    i = ((x + bound) * (knots / (2 * bound))).clamp(0, knots - 1).int()
    # A NaN logit converts to an arbitrary integer; clamping again keeps the gathers in
    # bounds, and f(NaN) is still NaN.
    return i.clamp(0, knots - 1)


def _offset_in_bucket(x: torch.Tensor, i: torch.Tensor, bound: float, knots: int) -> torch.Tensor:
    """x - knot_i, in x's dtype."""
    return x - (i.to(x.dtype) * (2 * bound / knots) - bound)


def _forward_kernel(x: torch.Tensor, slopes: torch.Tensor, offsets: torch.Tensor,
                    bound: float) -> torch.Tensor:
    knots = slopes.shape[0]
    i = _bucket(x, bound, knots)
    return slopes[i] * _offset_in_bucket(x, i, bound, knots) + offsets[i]


def _input_gradient_kernel(x: torch.Tensor, slopes: torch.Tensor, grad: torch.Tensor,
                           bound: float) -> torch.Tensor:
    """grad * f'(x) = grad * s_i."""
    return grad * slopes[_bucket(x, bound, slopes.shape[0])]


def _bucket_pairs_kernel(x: torch.Tensor, grad: torch.Tensor, bound: float, knots: int):
    """Each logit's bucket i and the pair (grad * (x - knot_i), grad) to be summed per bucket."""
    i = _bucket(x, bound, knots)
    return i, torch.stack([grad * _offset_in_bucket(x, i, bound, knots), grad], dim=-1)


_FORWARD = FusedKernel(_forward_kernel, varying={0: (0,)})
_INPUT_GRADIENT = FusedKernel(_input_gradient_kernel, varying={0: (0,), 2: (0,)})
_BUCKET_PAIRS = FusedKernel(_bucket_pairs_kernel, varying={0: (0,), 1: (0,)})
# Logits per scatter in backward: bounds the transient (bucket, pair) tensors to 48 MB, and
# they stay in cache between the kernel that writes them and the scatter that reads them.
_SCATTER_CHUNK = 1 << 22


def _exclusive_cumsum(t: torch.Tensor) -> torch.Tensor:
    """out_i = sum_{j<i} t_j."""
    return torch.cat([t.new_zeros(1), torch.cumsum(t, 0)[:-1]])


def _bucket_sums(x: torch.Tensor, grad: torch.Tensor, bound: float, knots: int,
                 compiled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per bucket, the sums of grad * (x - knot_i) and of grad over its logits, chunk by chunk;
    in a fixed order of additions when torch's deterministic algorithms are on."""
    ordered = _ordered_sums_needed(x.device)
    # Both per-bucket sums in one scatter of the pairs read as complex numbers: eager
    # index_add_ is a plain loop, while a compiled scatter-add into 100,000 buckets
    # goes through atomic adds and is several times slower on CPU.
    sums = torch.zeros(knots, dtype=x.dtype.to_complex(), device=x.device)
    for start in range(0, x.numel(), _SCATTER_CHUNK):
        chunk = slice(start, start + _SCATTER_CHUNK)
        bucket, pairs = _BUCKET_PAIRS(x[chunk], grad[chunk], bound, knots, compiled=compiled)
        if ordered:
            sums += torch.view_as_complex(_ordered_bucket_sums(bucket, pairs, knots).to(pairs.dtype))
        else:
            sums.index_add_(0, bucket, torch.view_as_complex(pairs))
    return sums.real, sums.imag


def _ordered_sums_needed(device: torch.device) -> bool:
    """Whether the bucket sums must avoid index_add_: with deterministic algorithms on, off the
    CPU (there index_add_ is a loop, in a fixed order; a GPU's atomics arrive in any order). The
    ordered sums sort the logits, some ten times the scatter's time on a CPU."""
    return device.type != "cpu" and torch.are_deterministic_algorithms_enabled()


def _ordered_bucket_sums(bucket: torch.Tensor, pairs: torch.Tensor, knots: int) -> torch.Tensor:
    """The (knots, 2) per-bucket sums of `pairs` without atomic adds (a GPU's index_add_ adds
    in whatever order its threads arrive): the pairs sorted by bucket (stably), a float64
    running sum, and each bucket's sum as the difference of the running sum at its ends."""
    order = torch.argsort(bucket, stable=True)
    running = torch.cumsum(pairs[order].double(), 0)
    running = torch.cat([running.new_zeros(1, 2), running])
    ends = torch.searchsorted(bucket[order], torch.arange(knots + 1, device=bucket.device,
                                                          dtype=bucket.dtype))
    return running[ends[1:]] - running[ends[:-1]]


class _PLIF(torch.autograd.Function):
    """f(x) for every logit x, as defined in model/heads/plif.py, with s = softplus(v).

    d f(x) / d x = s_i. For the slopes, d f(x) / d s_j is (x - knot_i) for j = i, Delta for
    every j < i, and 0 above i. Backward therefore scatter-adds grad * (x - knot_i) and grad
    into per-bucket sums (bucket indices and these pairs are transient, chunk by chunk, never
    saved), adds Delta times the sum of grad over all buckets above j, and multiplies by
    d s / d v = sigmoid(v). Taking v rather than s as input means the only
    tensors saved are the logits and v itself (a parameter, stored anyway).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, v: torch.Tensor, bound: float,
                compiled: bool) -> torch.Tensor:
        slopes = F.softplus(v)
        offsets = (2 * bound / v.shape[0]) * _exclusive_cumsum(slopes)
        ctx.save_for_backward(logits, v)
        ctx.bound, ctx.compiled = bound, compiled
        return _FORWARD(logits.reshape(-1), slopes, offsets, bound,
                        compiled=compiled).view_as(logits)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, v = ctx.saved_tensors
        v_needs_grad = ctx.needs_input_grad[1]
        x, grad = logits.reshape(-1), grad.reshape(-1)
        grad_x = _INPUT_GRADIENT(x, F.softplus(v), grad, ctx.bound, compiled=ctx.compiled)
        grad_v = None
        if v_needs_grad:
            # Both per-bucket sums in one scatter of the pairs read as complex numbers: eager
            # index_add_ is a plain loop, while a compiled scatter-add into 100,000 buckets
            # goes through atomic adds and is several times slower on CPU.
            knots = v.shape[0]
            in_bucket, per_bucket = _bucket_sums(x, grad, ctx.bound, knots, ctx.compiled)
            delta = 2 * ctx.bound / v.shape[0]
            above = _exclusive_cumsum(per_bucket.flip(0)).flip(0)   # sum over buckets > j
            grad_v = (in_bucket + delta * above) * torch.sigmoid(v)
        return grad_x.view_as(logits), grad_v, None, None


def plif(logits: torch.Tensor, v: torch.Tensor, bound: float,
         compiled: bool = False) -> torch.Tensor:
    """The PLIF on [-bound, bound] with slopes softplus(v) (K of them), elementwise."""
    return _PLIF.apply(logits, v, float(bound), compiled)
