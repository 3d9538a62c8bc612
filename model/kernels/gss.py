"""The fused kernel of the GSS transform (model/heads/sigsoftmax.py has the formula).

Since x - softplus(x) = log sigmoid(x), f(l) = k (l - c) + c - (k - 1) softplus(l - c) is
l + (k - 1) log sigmoid(l - c), which the kernel evaluates: it stays finite for any finite l (no
exp of a large argument is ever taken), and f'(l) = 1 + (k - 1) sigmoid(c - l) comes out of the
same pass, so backward is a single multiply.
"""
from __future__ import annotations

import torch

from .compiled import FusedKernel


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


_KERNEL = FusedKernel(_gss_kernel, varying={0: (0,)})


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
