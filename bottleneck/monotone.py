"""LMS with the monotone network of [LMS] eq. 14, the head of the paper's synthetic experiment.

    log p = log_softmax(f(l)),   l = W g + b,   f(x) = sum_i v_i sigmoid(u_i x + c_i) + b0

with K hidden units and u_i, v_i >= 0 (here u = softplus(u_raw), v = softplus(v_raw)), so f is
increasing [Daniels & Velikova 2010]. Softplus rather than exp: with u = exp(.), v = exp(.)
Adam at lr 0.05 to 0.1 diverges (M = 1,000, D = 8). The additive b0 cancels in the softmax (its
gradient is 0); it is kept so that f is eq. 14 as written.

`monotone_reference` is the formula with plain autograd; it keeps K values per logit, which
for 10,000 contexts x 10,000 words is tens of GB. The head runs `_Monotone`, a custom autograd
function of the same f that saves only the logits and recomputes the K hidden units per chunk
in backward. It is not a registry head: its (logits x K) cost is why [LMS] proposes the PLIF
for language models (section 4), so it lives with the synthetic experiment.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from model.heads.base import PointwiseTransformHead
from model.kernels.compiled import FusedKernel


def monotone_reference(x: torch.Tensor, u_raw: torch.Tensor, v_raw: torch.Tensor,
                       c: torch.Tensor, b0: torch.Tensor) -> torch.Tensor:
    """f(x) of eq. 14 elementwise, taken literally (x (...,), parameters (K,), b0 scalar)."""
    u, v = F.softplus(u_raw), F.softplus(v_raw)
    return (v * torch.sigmoid(x.unsqueeze(-1) * u + c)).sum(-1) + b0


def _forward_kernel(x, u, v, c):
    return (v * torch.sigmoid(x.unsqueeze(-1) * u + c)).sum(-1)


def _backward_kernel(x, grad, u, v, c):
    """grad * f'(x) per logit, and the chunk's sums of d/du, d/dv, d/dc (each (K,))."""
    s = torch.sigmoid(x.unsqueeze(-1) * u + c)              # (n, K)
    g = grad.unsqueeze(-1)
    slope = g * v * s * (1 - s)                               # grad * d f / d (u_i x + c_i)
    return (slope * u).sum(-1), (slope * x.unsqueeze(-1)).sum(0), (g * s).sum(0), slope.sum(0)


_FORWARD = FusedKernel(_forward_kernel, varying={0: (0,)})
_BACKWARD = FusedKernel(_backward_kernel, varying={0: (0,), 1: (0,)})
# Logits per chunk: the (chunk, K) hidden units stay a few tens of MB for K up to ~30.
_CHUNK = 1 << 18


class _Monotone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, u_raw, v_raw, c, b0, compiled: bool):
        u, v = F.softplus(u_raw), F.softplus(v_raw)
        x = logits.reshape(-1)
        out = torch.empty_like(x)
        for start in range(0, x.numel(), _CHUNK):
            chunk = slice(start, start + _CHUNK)
            out[chunk] = _FORWARD(x[chunk], u, v, c, compiled=compiled)
        ctx.save_for_backward(logits, u_raw, v_raw, c)
        ctx.compiled = compiled
        return (out + b0).view_as(logits)

    @staticmethod
    def backward(ctx, grad):
        logits, u_raw, v_raw, c = ctx.saved_tensors
        u, v = F.softplus(u_raw), F.softplus(v_raw)
        x, grad = logits.reshape(-1), grad.reshape(-1)
        grad_x = torch.empty_like(x)
        grad_u = torch.zeros_like(u)
        grad_v = torch.zeros_like(v)
        grad_c = torch.zeros_like(c)
        for start in range(0, x.numel(), _CHUNK):
            chunk = slice(start, start + _CHUNK)
            gx, gu, gv, gc = _BACKWARD(x[chunk], grad[chunk], u, v, c, compiled=ctx.compiled)
            grad_x[chunk] = gx
            grad_u += gu
            grad_v += gv
            grad_c += gc
        # Chain rule through u = softplus(u_raw), v = softplus(v_raw).
        return (grad_x.view_as(logits), grad_u * torch.sigmoid(u_raw),
                grad_v * torch.sigmoid(v_raw), grad_c, grad.sum(), None)


@dataclass(frozen=True)
class MonotoneOptions:
    units: int = 10        # K, hidden units of the monotone network
    compile: bool = True   # fuse the per-logit passes with torch.compile (eager fallback)

    def __post_init__(self):
        if self.units < 1:
            raise ValueError(f"units: expected an integer >= 1, got {self.units}")


class MonotoneHead(PointwiseTransformHead):
    """LMS with f of eq. 14, on the OutputHead interface (same constructor as every head)."""

    Options = MonotoneOptions
    label = "LMS (monotone net)"

    def __init__(self, options, vocab_size: int, emsize: int, nhidlast: int,
                 tied_weight: nn.Parameter):
        super().__init__(options, vocab_size, emsize, nhidlast, tied_weight)
        k = options.units
        # Start as an increasing, roughly linear f over the logits' initial range: u = v = 1,
        # the units' centres -c_i / u_i spread evenly over [-3, 3].
        self.u_raw = nn.Parameter(torch.full((k,), math.log(math.e - 1)))
        self.v_raw = nn.Parameter(torch.full((k,), math.log(math.e - 1)))
        self.c = nn.Parameter(torch.linspace(-3.0, 3.0, k) if k > 1 else torch.zeros(1))
        self.b0 = nn.Parameter(torch.zeros(()))

    @classmethod
    def small_options(cls):
        return cls.Options(units=4, compile=False)

    def transform(self, logits: torch.Tensor) -> torch.Tensor:
        return _Monotone.apply(logits, self.u_raw, self.v_raw, self.c, self.b0,
                               self.options.compile)

    def transform_reference(self, logits: torch.Tensor) -> torch.Tensor:
        return monotone_reference(logits, self.u_raw, self.v_raw, self.c, self.b0)
