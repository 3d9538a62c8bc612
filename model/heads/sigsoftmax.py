"""SigSoftmax (SS) and generalised SigSoftmax (GSS) ([SB] section 3): log_softmax of a pointwise f.

    GSS(c, k):  log p = log_softmax(f(l)),   f(l) = k (l - c) + c - (k - 1) softplus(l - c)
    SS:         f(l) = 2 l - softplus(l)     (= GSS(0, 2); k = 1 gives the Softmax)

with l = W g + b, W tied to the embedding. `gss_reference` is the formula as written; the heads
run a fused kernel of the same f (model/kernels/gss.py: stable for any l, f' from the same pass),
and the tests check that the two agree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels.gss import gss_transform
from .base import PointwiseTransformHead


def gss_reference(logits: torch.Tensor, c: float, k: float) -> torch.Tensor:
    """f(l) = k (l - c) + c - (k - 1) softplus(l - c), taken literally."""
    return k * (logits - c) + c - (k - 1) * F.softplus(logits - c)


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


class SigSoftmaxHead(PointwiseTransformHead):
    Options = SigSoftmaxOptions
    label = "SS"

    @classmethod
    def small_options(cls):
        return cls.Options(compile=False)

    def shape(self) -> tuple[float, float]:
        """(c, k) of the transform."""
        return 0.0, 2.0

    def transform(self, logits: torch.Tensor) -> torch.Tensor:
        c, k = self.shape()
        return gss_transform(logits, c, k, self.options.compile)

    def transform_reference(self, logits: torch.Tensor) -> torch.Tensor:
        return gss_reference(logits, *self.shape())


class GSSHead(SigSoftmaxHead):
    Options = GSSOptions
    label = "GSS"

    @classmethod
    def small_options(cls):
        return cls.Options(c=-1.5, k=2.5, compile=False)

    def shape(self) -> tuple[float, float]:
        return self.options.c, self.options.k
