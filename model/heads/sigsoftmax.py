"""SigSoftmax (SS) and generalised SigSoftmax (GSS): log_softmax of a pointwise f(l).

    GSS(c, k):  f(l) = k (l - c) + c - (k - 1) softplus(l - c)
    SS:         f(l) = 2 l - softplus(l)                 (= GSS(0, 2))

Since x - softplus(x) = log sigmoid(x), f(l) = l + (k - 1) log sigmoid(l - c), which is
what the kernel evaluates: k = 1 gives the Softmax, and f stays finite for any finite l
(no exp of a large argument is ever taken). f'(l) = 1 + (k - 1) sigmoid(c - l).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from .base import FusedKernel, HeadOutput, OutputHead
from .softmax import TiedDecoder


@dataclass(frozen=True)
class SigSoftmaxOptions:
    compile: bool = True   # fuse the transform with torch.compile (eager fallback if it fails)


@dataclass(frozen=True)
class GSSOptions:
    c: float               # no defaults: [SB] uses (c, k) = (-1.5, 2.5) on PTB, (-1.5, 3) on WT2
    k: float
    compile: bool = True

    def __post_init__(self):
        if not math.isfinite(self.c):
            raise ValueError(f"c: expected a finite number, got {self.c}")
        if not (math.isfinite(self.k) and self.k > 0):
            raise ValueError(f"k: expected a finite value > 0, got {self.k}")


def _gss_kernel(logits: torch.Tensor, c: float, k: float) -> tuple[torch.Tensor, torch.Tensor]:
    """f(l) and f'(l), sharing the one exp they both need."""
    x = logits - c
    e = torch.exp(-x.abs())                       # in (0, 1]: cannot overflow
    one_plus_e = 1 + e
    # log(1 + e) rather than log1p(e): rounding 1 + e moves f by at most (k - 1) * eps / 2
    # in absolute terms, i.e. log-probabilities by ~1e-7 in float32, and log makes the
    # kernel about a fifth faster.
    log_sigmoid = x.clamp(max=0) - torch.log(one_plus_e)
    sigmoid_neg = torch.where(x >= 0, e, 1.0) / one_plus_e   # sigmoid(-x)
    return logits + (k - 1) * log_sigmoid, 1 + (k - 1) * sigmoid_neg


_KERNEL = FusedKernel(_gss_kernel)


class _GSSTransform(torch.autograd.Function):
    """f(l) with f'(l) computed in the same pass; backward is then a single multiply.

    Saves f'(l) (4 bytes per logit), not l: recomputing the derivative from l would cost
    another exp per logit in backward.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, c: float, k: float, compiled: bool) -> torch.Tensor:
        transformed, slope = _KERNEL(logits, c, k, compiled=compiled)
        ctx.save_for_backward(slope)
        return transformed

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        slope, = ctx.saved_tensors
        return grad * slope, None, None, None


def gss_transform(logits: torch.Tensor, c: float, k: float, compiled: bool = False) -> torch.Tensor:
    """f(l) = k (l - c) + c - (k - 1) softplus(l - c), elementwise."""
    return _GSSTransform.apply(logits, float(c), float(k), compiled)


class SigSoftmaxHead(OutputHead):
    Options = SigSoftmaxOptions

    def __init__(self, options, vocab_size: int, emsize: int, nhidlast: int,
                 tied_weight: nn.Parameter):
        super().__init__(options, vocab_size, emsize, nhidlast, tied_weight)
        self.decoder = TiedDecoder(vocab_size, tied_weight)

    def shape(self) -> tuple[float, float]:
        """(c, k) of the transform."""
        return 0.0, 2.0

    def forward(self, hidden: torch.Tensor) -> HeadOutput:
        c, k = self.shape()
        transformed = gss_transform(self.decoder(hidden), c, k, self.options.compile)
        return HeadOutput(F.log_softmax(transformed, dim=-1), transformed)


class GSSHead(SigSoftmaxHead):
    Options = GSSOptions

    def shape(self) -> tuple[float, float]:
        return self.options.c, self.options.k
