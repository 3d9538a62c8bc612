"""Singular values and numerical ranks of large matrices (the log-P matrix of docs/reference.md section 7).

`StreamingSingularValues` computes the exact singular values of a tall matrix fed in row blocks,
keeping only the n x n triangular factor of a running QR; `press_rank`, `effective_rank` and
`rank_summary` turn a spectrum into the ranks reported in [SB].
"""

from .numerical_rank import (
    EFFECTIVE_RANK_EPSILONS,
    effective_rank,
    press_rank,
    press_tolerance,
    rank_summary,
)
from .streaming import StreamingSingularValues, streaming_singular_values

__all__ = [
    "EFFECTIVE_RANK_EPSILONS",
    "StreamingSingularValues",
    "effective_rank",
    "press_rank",
    "press_tolerance",
    "rank_summary",
    "streaming_singular_values",
]
