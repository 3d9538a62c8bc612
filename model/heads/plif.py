"""LMS-PLIF ([LMS] section 4) and its frozen variant LMS-PLIF† ([SB] Table 3).

log p = log_softmax(f(l)), l = W g + b, with f a Piecewise Linear Increasing Function of K
equal pieces of [-T, T] (K is the option `knots`, T the option `bound`): piece i starts at
knot_i = -T + i Delta, Delta = 2T/K, and has the slope s_i = softplus(v_i) > 0. For x in piece
i = clamp(floor((x + T) / Delta), 0, K - 1),

    f(x) = s_i (x - knot_i) + Delta * sum_{j<i} s_j,

so f is continuous, and logits outside [-T, T] continue the two edge pieces. `plif_reference`
is this definition with plain autograd (which would store an index per logit); the heads run a
custom autograd function of the same f that saves only the logits (model/kernels/plif.py), and
the tests check that the two agree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from ..kernels.plif import plif
from .base import PointwiseTransformHead


def plif_reference(x: torch.Tensor, v: torch.Tensor, bound: float) -> torch.Tensor:
    """f(x) of the definition above, elementwise, with K = len(v) pieces on [-bound, bound]."""
    pieces = v.shape[0]
    delta = 2 * bound / pieces
    s = F.softplus(v)
    below = torch.cumsum(s, 0) - s                                   # sum_{j<i} s_j
    i = torch.floor((x + bound) / delta).clamp(0, pieces - 1).long()
    return s[i] * (x - (-bound + i.to(x.dtype) * delta)) + delta * below[i]


@dataclass(frozen=True)
class FrozenPLIFOptions:
    knots: int = 100_000   # K, the number of linear pieces (each has its own slope)
    bound: float = 20.0    # T: the pieces span [-T, T]
    compile: bool = True   # fuse the per-logit kernels with torch.compile (eager fallback)

    def __post_init__(self):
        if self.knots < 1:
            raise ValueError(f"knots: expected an integer >= 1, got {self.knots}")
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise ValueError(f"bound: expected a finite value > 0, got {self.bound}")


@dataclass(frozen=True)
class PLIFOptions(FrozenPLIFOptions):
    lr: float = 0.02       # base learning rate of v (its own optimizer group; same weight decay)

    def __post_init__(self):
        super().__post_init__()
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr: expected a finite value > 0, got {self.lr}")


class PLIFHead(PointwiseTransformHead):
    """LMS-PLIF: the slopes are learnt, through v, with a learning rate of their own."""

    Options = PLIFOptions
    label = "LMS-PLIF"
    trainable_slopes = True

    def __init__(self, options, vocab_size: int, emsize: int, nhidlast: int,
                 tied_weight: nn.Parameter):
        super().__init__(options, vocab_size, emsize, nhidlast, tied_weight)
        # N(0, 1) + log(e - 1): softplus(log(e - 1)) = 1, so f starts near the identity.
        v = torch.randn(options.knots) + math.log(math.e - 1)
        if self.trainable_slopes:
            self.v = nn.Parameter(v)
        else:
            self.register_buffer("v", v)   # in state_dict, not a parameter

    @classmethod
    def small_options(cls):
        return cls.Options(knots=16, bound=4.0, compile=False)

    def transform(self, logits: torch.Tensor) -> torch.Tensor:
        return plif(logits, self.v, self.options.bound, self.options.compile)

    def transform_reference(self, logits: torch.Tensor) -> torch.Tensor:
        return plif_reference(logits, self.v, self.options.bound)

    def extra_param_groups(self) -> list[dict]:
        return [{"params": [self.v], "lr": self.options.lr}]


class FrozenPLIFHead(PLIFHead):
    """LMS-PLIF†: the slopes keep their random initial values."""

    Options = FrozenPLIFOptions
    label = "LMS-PLIF†"
    trainable_slopes = False

    def extra_param_groups(self) -> list[dict]:
        return []
