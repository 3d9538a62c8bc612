"""Rank rules applied to a spectrum of singular values (docs/reference.md section 7).

All functions take the singular values as any 1-D array-like (numpy, list, CPU torch tensor) in any
order; they sort them descending themselves.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import torch

EFFECTIVE_RANK_EPSILONS: tuple[float, ...] = (1e-3, 1e-4, 1e-5)

_TORCH_TO_NUMPY = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


def float_dtype(dtype: Any) -> np.dtype:
    """The numpy float32/float64 dtype named by a numpy dtype, a string or a torch dtype."""
    resolved = _TORCH_TO_NUMPY.get(dtype) if isinstance(dtype, torch.dtype) else np.dtype(dtype)
    if resolved not in (np.float32, np.float64):
        raise ValueError(f"only float32 and float64 are supported, got {dtype!r}")
    return resolved


def _descending(singular_values: Any) -> np.ndarray:
    values = np.asarray(singular_values, dtype=np.float64).ravel()
    return np.sort(values)[::-1]


def press_tolerance(singular_values: Any, shape: tuple[int, int], dtype: Any) -> float:
    """Numerical Recipes' threshold 0.5 * sqrt(m + n + 1) * sigma_max * eps(dtype)."""
    values = _descending(singular_values)
    sigma_max = float(values[0]) if values.size else 0.0
    m, n = shape
    return 0.5 * math.sqrt(m + n + 1) * sigma_max * float(np.finfo(float_dtype(dtype)).eps)


def press_rank(singular_values: Any, shape: tuple[int, int], dtype: Any) -> int:
    """Number of singular values strictly above `press_tolerance`.

    `shape` is the (m, n) shape of the matrix, `dtype` the dtype the decomposition ran in (its
    machine epsilon sets the threshold: float32 in [SB]).
    """
    values = _descending(singular_values)
    return int(np.count_nonzero(values > press_tolerance(values, shape, dtype)))


def effective_rank(singular_values: Any, epsilon: float) -> int:
    """Smallest k with sum_{i<=k} sigma_i^2 >= (1 - epsilon) * sum_i sigma_i^2 (0 if all are 0).

    The energies are accumulated in float64 so that float32 spectra with ~10^4 terms do not lose the
    tail the small epsilons look at.
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must be in [0, 1), got {epsilon}")
    energy = np.cumsum(_descending(singular_values) ** 2)
    if energy.size == 0 or energy[-1] == 0.0:
        return 0
    # (1 - epsilon) * total never rounds above the total, so the search always lands in range.
    threshold = (1.0 - epsilon) * energy[-1]
    return int(np.searchsorted(energy, threshold, side="left")) + 1


def rank_summary(
    singular_values: Any,
    shape: tuple[int, int],
    dtype: Any,
    epsilons: Iterable[float] = EFFECTIVE_RANK_EPSILONS,
) -> dict[str, Any]:
    """JSON-ready summary: Press rank, effective ranks, shape, dtype, extreme singular values.

    `effective_rank` maps each epsilon (a float key) to its rank; json.dumps writes the keys as
    strings ("0.001").
    """
    values = _descending(singular_values)
    return {
        "press_rank": press_rank(values, shape, dtype),
        "effective_rank": {float(eps): effective_rank(values, eps) for eps in epsilons},
        "shape": [int(shape[0]), int(shape[1])],
        "dtype": float_dtype(dtype).name,
        "sigma_max": float(values[0]) if values.size else 0.0,
        "sigma_min": float(values[-1]) if values.size else 0.0,
    }
