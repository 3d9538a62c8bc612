"""How robust is the Press rank? [SB] SM section 5, Algorithms 1 and 2 (SM Tables 14-16).

Both algorithms take a dense m x n log-P matrix A ([SB]: MoS on the first 10,000 contexts of PTB's
test set, so m = n = 10,000; `python rank.py RUN --robustness` builds it), its SVD A = U S V^T, and
keep the top `keep` (10) singular values: S_p is S with the others set to 0, and A_0 = U S_p V^T
has rank exactly 10, so any higher rank a rule reports comes from rounding or noise.

Algorithm 1 (reconstruction errors, SM Table 14): factorise A_{i-1} by SVD and multiply the factors
back, A_i = U_i S_i V_i^T, `iterations` times; after each, the Press and epsilon-effective ranks of
A_i and its error, the mean of (A_i - A_0)^2 over all entries. (SM Table 14 prints errors of about
1e-28, the size of float64 rounding on entries of order 10: the decompositions ran in float64.)

Algorithm 2 (Gaussian additive noise, SM Tables 15 and 16): for each scale c, S_g = S_p + Z with Z
an n x n matrix of independent N(0, c / n^2) entries, n the order of S (min(m, n): the vocabulary
size when m >= n, as in [SB]), and the ranks of S_g, which has the singular values of U S_g V^T.
c / n^2 is the variance: the SM says c "controls the standard deviation", and its Press ranks
(9,899 / 9,681 / 9,001 / 6,869 at c = 1e-20 ... 1e-23) are the quarter-circle law of a square
Gaussian matrix's singular values crossing a fixed tolerance at points sqrt(10) apart per decade
of c, which a standard deviation proportional to sqrt(c) gives and one proportional to c does not.

Everything runs in the matrix's own dtype and on its device (torch.linalg.svd: LAPACK on CPU,
cuSOLVER on CUDA); the Press tolerance uses that dtype's machine epsilon. A 10,000 x 10,000
float64 matrix needs about 5 such matrices at once (4 GB).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from .numerical_rank import rank_summary

# [SB] SM Table 15's three sub-tables (c in powers of 2 of the exponent, steps of 2 and of 1), merged.
NOISE_SCALES: tuple[float, ...] = (1e-2, 1e-4, 1e-8, 1e-16, 1e-20, 1e-21, 1e-22, 1e-23, 1e-24,
                                   1e-25, 1e-26, 1e-28, 1e-32)


def _summary(values: torch.Tensor, shape: tuple[int, int]) -> dict:
    return rank_summary(values.cpu().double().numpy(), shape, values.dtype)


def matrix_ranks(matrix: torch.Tensor) -> dict:
    """The rank summary of `matrix` (Press and epsilon-effective ranks) in its own dtype."""
    return _summary(torch.linalg.svdvals(matrix), tuple(matrix.shape))


def truncate(matrix: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(A_0 = U S_p V^T, the n singular values of S_p (zeros after the top `keep`), A's rank summary)."""
    m, n = matrix.shape
    if not 1 <= keep < min(m, n):
        raise ValueError(f"keep: expected 1 <= keep < {min(m, n):,}, the number of singular values "
                         f"of the {m:,} x {n:,} matrix, got {keep}")
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError("the matrix has non-finite entries (NaN or inf)")
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    original = _summary(s, (m, n))
    truncated = (u[:, :keep] * s[:keep]) @ vh[:keep]
    kept = s.clone()
    kept[keep:] = 0
    return truncated, kept, original


def reconstruction_test(truncated: torch.Tensor, iterations: int) -> list[dict]:
    """Algorithm 1: ranks and error of A_1 ... A_iterations (and of A_0 itself, iteration 0)."""
    shape = tuple(truncated.shape)
    current = truncated
    u, s, vh = torch.linalg.svd(current, full_matrices=False)
    records = [{"iteration": 0, "error": 0.0, **_summary(s, shape)}]
    for i in range(1, iterations + 1):
        current = (u * s) @ vh
        u, s, vh = torch.linalg.svd(current, full_matrices=False)   # A_i's spectrum, A_{i+1}'s factors
        error = (current - truncated).pow(2).mean().item()
        records.append({"iteration": i, "error": error, **_summary(s, shape)})
    return records


def gaussian_noise(n: int, c: float, generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """An n x n matrix of independent N(0, c / n^2) entries in like's dtype and device."""
    if not c > 0:
        raise ValueError(f"noise scale c: expected a value > 0, got {c}")
    z = torch.randn((n, n), generator=generator, dtype=like.dtype, device=like.device)
    return z.mul_(math.sqrt(c) / n)


def noise_test(kept: torch.Tensor, scales: Sequence[float], seed: int = 0) -> list[dict]:
    """Algorithm 2: for each c, the ranks of S_p + Z, Z ~ N(0, c / n^2) entry-wise (one fresh Z per c)."""
    n = kept.numel()
    s_p = torch.diag(kept)
    generator = torch.Generator(device=kept.device).manual_seed(seed)
    records = []
    for c in scales:
        values = torch.linalg.svdvals(s_p + gaussian_noise(n, c, generator, s_p))
        records.append({"c": float(c), **_summary(values, (n, n))})
    return records


def press_rank_robustness(matrix: torch.Tensor, keep: int = 10, iterations: int = 10,
                          scales: Sequence[float] = NOISE_SCALES, seed: int = 0) -> dict:
    """Both algorithms on `matrix` (m x n), JSON-ready: the matrix's own ranks ("original"),
    Algorithm 1 ("reconstruction") and Algorithm 2 ("noise", seeded by `seed`)."""
    if iterations < 1:
        raise ValueError(f"iterations: expected at least 1, got {iterations}")
    bad = [c for c in scales if not c > 0]
    if bad:
        raise ValueError(f"noise scale c: expected values > 0, got {bad[0]}")
    truncated, kept, original = truncate(matrix, keep)
    return {"keep": keep, "original": original,
            "reconstruction": reconstruction_test(truncated, iterations),
            "noise": noise_test(kept, scales, seed), "noise_seed": seed}
