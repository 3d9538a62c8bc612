"""Streaming singular values and the rank rules of docs/reference.md section 7 (spectrum/)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spectrum import (
    StreamingSingularValues,
    effective_rank,
    press_rank,
    press_tolerance,
    rank_summary,
    streaming_singular_values,
)
from spectrum.streaming import (CUSOLVER_GESVD_MAX_N, singular_values_of, svd_device, torch_backend_bytes,
                                tpqrt_update)

DTYPES = [np.float32, np.float64]
BACKENDS = ["lapack", "torch"]


def orthonormal(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((rows, cols)))
    return q


def with_spectrum(m: int, n: int, values, seed: int = 0) -> np.ndarray:
    """A float64 m x n matrix U diag(values) V^T with orthonormal U, V (rank = len(values))."""
    rng = np.random.default_rng(seed)
    values = np.asarray(values, dtype=np.float64)
    r = values.size
    return (orthonormal(m, r, rng) * values) @ orthonormal(n, r, rng).T


def stream(matrix, chunk: int | None = None, as_tensor: bool = False, **options) -> np.ndarray:
    """Singular values of `matrix` fed to StreamingSingularValues in chunks of `chunk` rows."""
    m, n = matrix.shape
    chunk = chunk or m
    sv = StreamingSingularValues(n, **options)
    for start in range(0, m, chunk):
        rows = matrix[start : start + chunk]
        sv.update(torch.from_numpy(np.ascontiguousarray(rows)) if as_tensor else rows)
    assert sv.rows_seen == m and sv.shape == (m, n)
    return sv.singular_values()


def reference(matrix: np.ndarray) -> np.ndarray:
    """Singular values of the matrix exactly as stored (numpy SVD of the whole, in float64)."""
    return np.linalg.svd(np.asarray(matrix, dtype=np.float64), compute_uv=False)


def agreement_tolerance(matrix: np.ndarray, dtype) -> float:
    # Householder QR plus SVD are backward stable: errors of a few sqrt(m) eps ||A||.
    m = matrix.shape[0]
    return 8 * math.sqrt(m) * np.finfo(dtype).eps * reference(matrix)[0]


# --------------------------------------------------------------------------------------------
# Agreement with a dense SVD, for all block layouts and both backends


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "block_rows, chunk",
    [(1, 1), (7, 13), (64, 1), (64, None), (None, 5)],
)
def test_matches_dense_svd(dtype, backend, block_rows, chunk):
    # 203 rows: with 64-row blocks the last block is partial (11 rows); with 7, 203 = 29 * 7.
    m, n = 203, 40
    values = np.logspace(0, -3, n)
    matrix = with_spectrum(m, n, values, seed=1).astype(dtype)
    got = stream(matrix, chunk, as_tensor=backend == "torch", dtype=dtype, block_rows=block_rows,
                 backend=backend)
    want = reference(matrix)
    assert got.dtype == np.float64 and got.shape == (n,)
    assert np.all(np.diff(got) <= 0), "not descending"
    np.testing.assert_allclose(got, want, rtol=0, atol=agreement_tolerance(matrix, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_dense_svd_on_gaussian_rows(dtype, backend):
    rng = np.random.default_rng(2)
    matrix = rng.standard_normal((517, 90)).astype(dtype)
    got = stream(matrix, 100, dtype=dtype, block_rows=128, backend=backend)
    np.testing.assert_allclose(got, reference(matrix), rtol=0,
                               atol=agreement_tolerance(matrix, dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_rows", [8, None])
def test_fewer_rows_than_columns(backend, block_rows):
    # m < n: A has only m singular values. With 8-row blocks R is built (and carries n - m rows
    # of rounding noise in the lapack backend); by default the rows never leave the buffer.
    m, n, rank = 25, 40, 10
    matrix = with_spectrum(m, n, np.linspace(1, 0.1, rank), seed=3).astype(np.float32)
    got = stream(matrix, 6, backend=backend, block_rows=block_rows)
    assert got.shape == (m,)
    np.testing.assert_allclose(got, reference(matrix), rtol=0,
                               atol=agreement_tolerance(matrix, np.float32))
    assert press_rank(got, matrix.shape, np.float32) == rank


def test_input_dtype_is_cast_to_working_dtype():
    matrix = with_spectrum(60, 20, np.logspace(0, -2, 20), seed=4)  # float64 rows
    got = stream(matrix, 9, dtype=np.float32, block_rows=16)
    want = reference(matrix.astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=0,
                               atol=agreement_tolerance(matrix, np.float32))


def test_single_row_update_and_convenience_function():
    matrix = with_spectrum(30, 12, np.arange(12, 0, -1), seed=5)
    sv = StreamingSingularValues(12, dtype=np.float64, block_rows=4)
    for row in matrix:
        sv.update(row)  # 1-D: one row
    values, shape = streaming_singular_values(iter(np.split(matrix, [3, 17])), 12,
                                              dtype="float64", block_rows=5)
    assert shape == (30, 12)
    np.testing.assert_allclose(sv.singular_values(), reference(matrix), atol=1e-12)
    np.testing.assert_allclose(values, reference(matrix), atol=1e-12)


# --------------------------------------------------------------------------------------------
# Press rank of matrices of known rank


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "m, n, rank",
    [(300, 40, 40), (300, 40, 13), (2000, 30, 30), (2000, 30, 1), (35, 50, 35), (35, 50, 12)],
    ids=["full", "deficient", "tall-full", "tall-rank1", "wide-full", "wide-deficient"],
)
def test_press_rank_of_known_rank(dtype, backend, m, n, rank):
    values = np.logspace(0, -2, rank)  # condition number 100: far above the tolerance
    matrix = with_spectrum(m, n, values, seed=rank).astype(dtype)
    got = stream(matrix, 97, dtype=dtype, block_rows=64, backend=backend)
    assert press_rank(got, matrix.shape, dtype) == rank


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_press_rank_at_the_tolerance(dtype, backend, seed):
    # Ten clear singular values, one 2x above the Press tolerance (counted), one 0.5x below it
    # (not counted), the rest exactly zero.
    m, n = 300, 60
    tol = 0.5 * math.sqrt(m + n + 1) * 1.0 * np.finfo(dtype).eps  # sigma_max = 1
    values = np.concatenate([np.linspace(1.0, 0.1, 10), [2.0 * tol, 0.5 * tol]])
    matrix = with_spectrum(m, n, values, seed=seed).astype(dtype)
    got = stream(matrix, 50, dtype=dtype, block_rows=64, backend=backend)
    assert press_tolerance(got, matrix.shape, dtype) == pytest.approx(tol, rel=1e-5)
    assert press_rank(got, matrix.shape, dtype) == 11


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias, expected_extra", [(True, 2), (False, 1)])
def test_log_softmax_matrix_has_rank_d_plus_2(dtype, backend, bias, expected_extra):
    # Rows log_softmax(H W^T + b) = H W^T + 1 b^T - lse 1^T: d directions from H W^T, one from
    # b, one from the log-partition column (docs/reference.md section 7: 402 for d = 400).
    m, n, d = 300, 60, 8
    g = torch.Generator().manual_seed(7)
    tdtype = torch.float32 if dtype == np.float32 else torch.float64
    hidden = torch.randn(m, d, generator=g, dtype=tdtype)
    weight = torch.randn(n, d, generator=g, dtype=tdtype)
    b = torch.randn(n, generator=g, dtype=tdtype) if bias else torch.zeros(n, dtype=tdtype)
    log_p = torch.log_softmax(hidden @ weight.T + b, dim=-1)
    sv = StreamingSingularValues(n, dtype=dtype, block_rows=64, backend=backend)
    for rows in log_p.split(35):  # as rank.py feeds bptt chunks
        sv.update(rows)
    assert press_rank(sv.singular_values(), (m, n), dtype) == d + expected_extra


# --------------------------------------------------------------------------------------------
# The LAPACK update itself, and the object's contract


@pytest.mark.parametrize("dtype", DTYPES)
def test_tpqrt_update_works_in_place(dtype):
    rng = np.random.default_rng(8)
    n = 30
    r = np.zeros((n, n), dtype=dtype, order="F")
    blocks = [rng.standard_normal((k, n)).astype(dtype) for k in (50, 1, 17)]
    for block in blocks:
        scratch = np.array(block, order="F")  # tpqrt_update overwrites its block
        updated = tpqrt_update(r, scratch)
        assert np.shares_memory(updated, r), "LAPACK copied R"
    assert np.all(np.tril(r, -1) == 0)
    np.testing.assert_allclose(reference(r), reference(np.vstack(blocks)), rtol=0,
                               atol=50 * np.finfo(dtype).eps * reference(r)[0])


def test_contract_errors():
    sv = StreamingSingularValues(5)
    with pytest.raises(RuntimeError, match="no rows"):
        sv.singular_values()
    with pytest.raises(ValueError, match="columns"):
        sv.update(np.ones((2, 4)))
    sv.update(np.ones((0, 5)))  # an empty block is fine
    sv.update(np.eye(5))
    first = sv.singular_values()
    assert sv.singular_values() is first  # cached
    with pytest.raises(RuntimeError, match="no more rows"):
        sv.update(np.ones((1, 5)))
    with pytest.raises(ValueError, match="backend"):
        StreamingSingularValues(5, backend="magic")
    with pytest.raises(ValueError, match="CPU"):
        StreamingSingularValues(5, device="meta", backend="lapack")
    with pytest.raises(ValueError, match="float32 and float64"):
        StreamingSingularValues(5, dtype=np.float16)
    with pytest.raises(ValueError, match="block_rows"):
        StreamingSingularValues(5, block_rows=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_rows", [2, 64])
def test_non_finite_rows_are_rejected(backend, block_rows):
    sv = StreamingSingularValues(3, backend=backend, block_rows=block_rows)
    with pytest.raises(ValueError, match="non-finite"):
        sv.update(np.array([[1.0, 2.0, 3.0], [0.0, -np.inf, 1.0]]))
        sv.singular_values()


def test_auto_backend_and_dtypes():
    assert StreamingSingularValues(4).backend == "lapack"
    assert StreamingSingularValues(4, dtype=torch.float64).dtype == np.float64
    assert StreamingSingularValues(4, backend="torch").block_rows >= 4


# --------------------------------------------------------------------------------------------
# Rank rules on hand-computed spectra


def test_press_rank_by_hand():
    shape = (100, 20)
    tol = 0.5 * math.sqrt(121) * 2.0 * np.finfo(np.float32).eps  # sigma_max = 2
    values = [2.0, 1.0, 2.0 * tol, 1.01 * tol, tol, 0.5 * tol, 0.0]
    assert press_tolerance(values, shape, np.float32) == pytest.approx(tol)
    assert press_rank(values, shape, np.float32) == 4  # strictly above
    assert press_rank(values[::-1], shape, torch.float32) == 4  # order and dtype kind don't matter
    assert press_rank(values, shape, np.float64) == 6  # float64 eps is far smaller
    assert press_rank([0.0, 0.0], shape, np.float32) == 0


def test_effective_rank_by_hand():
    # Squares 9, 4, 1, 1, 1: total 16, cumulative 9, 13, 14, 15, 16 (all exact in binary).
    values = [3.0, 2.0, 1.0, 1.0, 1.0]
    assert effective_rank(values, 0.5) == 1  # threshold 8
    assert effective_rank(values, 0.25) == 2  # threshold 12
    assert effective_rank(values, 3 / 16) == 2  # threshold 13: reached exactly at k = 2
    assert effective_rank(values, 0.125) == 3  # threshold 14: exactly at k = 3
    assert effective_rank(values, 1 / 16) == 4  # threshold 15: exactly at k = 4
    assert effective_rank(values, 0.0) == 5
    assert effective_rank([1.0, 1.0, 3.0, 1.0, 2.0], 0.25) == 2  # any order
    assert effective_rank([0.0, 0.0], 1e-3) == 0


def test_effective_rank_accumulates_in_float64():
    # One unit value and a million values of 1e-4: the tail holds 1% of the energy, which a
    # float32 running sum (1 + 1e-8 == 1) would lose entirely.
    values = np.full(1_000_001, 1e-4, dtype=np.float32)
    values[0] = 1.0
    assert effective_rank(values, 1e-3) > 800_000


def test_rank_summary_is_json_ready():
    values = np.array([3.0, 2.0, 1.0, 1.0, 1.0], dtype=np.float32)
    summary = rank_summary(values, (10, 5), np.float32)
    assert summary["press_rank"] == 5
    assert summary["effective_rank"] == {1e-3: 5, 1e-4: 5, 1e-5: 5}
    assert summary["shape"] == [10, 5] and summary["dtype"] == "float32"
    assert summary["sigma_max"] == 3.0 and summary["sigma_min"] == 1.0
    assert json.loads(json.dumps(summary))["effective_rank"]["0.001"] == 5


# --------------------------------------------------------------------------------------------
# Memory bounds of the torch backend (meant for GPUs; the same code path on the CPU and on
# PyTorch's "meta" device, which allocates nothing)


def test_the_torch_backend_shrinks_its_blocks_to_a_memory_budget():
    n, budget = 1500, 48 << 20
    sv = StreamingSingularValues(n, dtype=np.float64, backend="torch", max_memory=budget)
    assert sv.block_rows == budget // (2 * n * 8) - n
    assert torch_backend_bytes(n, sv.block_rows, 8) <= budget
    assert StreamingSingularValues(n, dtype=np.float64, backend="torch").block_rows == 2048   # unbounded
    matrix = with_spectrum(200, 60, np.logspace(0, -6, 60))
    bounded = stream(matrix, chunk=33, backend="torch", dtype=np.float64,
                     max_memory=torch_backend_bytes(60, 300, 8))
    np.testing.assert_allclose(bounded, reference(matrix), rtol=0, atol=agreement_tolerance(matrix, np.float64))
    with pytest.raises(ValueError, match="more than max_memory"):
        StreamingSingularValues(n, backend="torch", max_memory=1 << 20)


def test_auto_sends_what_does_not_fit_the_device_to_the_cpu():
    fits = StreamingSingularValues(2000, device="meta", max_memory=100 << 20)
    assert (fits.backend, fits.device.type) == ("torch", "meta")
    assert torch_backend_bytes(2000, fits.block_rows, 4) <= 100 << 20
    short = StreamingSingularValues(2000, device="meta", max_memory=20 << 20)
    assert (short.backend, short.device.type) == ("lapack", "cpu")
    # float64 where the device has no full-rate float64 (meta has no float64 units at all)
    slow = StreamingSingularValues(2000, dtype=np.float64, device="meta", max_memory=1 << 30)
    assert (slow.backend, slow.device.type) == ("lapack", "cpu")


def test_the_final_svd_on_cuda_uses_the_gesvd_driver(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.linalg, "svdvals", lambda matrix, **options: calls.append(options))

    class OnCuda:
        device = torch.device("cuda", 0)

    singular_values_of(OnCuda())
    singular_values_of(torch.eye(2))
    assert calls == [{"driver": "gesvd"}, {}]


def test_the_final_svd_leaves_the_gpu_past_gesvds_largest_n_or_the_memory_budget():
    """cuSOLVER's gesvd refuses n > 26,711 (its 32-bit workspace count; measured on an H200):
    WikiText-2's R (n = 33,278) must go to the CPU, PTB's (10,000) stay on the GPU."""
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert CUSOLVER_GESVD_MAX_N == 26_711
    assert svd_device(gpu, 10_000, 4, None) == gpu
    assert svd_device(gpu, 26_711, 4, None) == gpu
    assert svd_device(gpu, 26_712, 4, None) == cpu
    assert svd_device(gpu, 33_278, 4, 1 << 40) == cpu
    assert svd_device(gpu, 10_000, 4, 2 * 10_000 ** 2 * 4) == cpu           # under 2.25 n^2 values
    assert svd_device(cpu, 33_278, 4, None) == cpu


PEAK_SCRIPT = """
import resource, sys
import numpy as np, torch
from spectrum import StreamingSingularValues
n, m, budget = 1500, 4000, int(sys.argv[1])
rng = np.random.default_rng(0)
chunks = [rng.standard_normal((100, n)) for _ in range(m // 100)]
torch.linalg.svdvals(torch.randn(300, 300, dtype=torch.float64))   # libraries and their buffers
torch.geqrf(torch.randn(300, n, dtype=torch.float64))
torch.geqrf(torch.randn(n, 300, dtype=torch.float64))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sv = StreamingSingularValues(n, dtype=np.float64, backend="torch", max_memory=budget)
for rows in chunks:
    sv.update(rows)
sv.singular_values()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_the_torch_backend_stays_inside_an_explicit_budget_measured():
    """The peak resident memory of a whole decomposition (n = 1,500, float64, 4,000 rows) on the
    CPU with the torch backend: the budget bounds it (without one it takes 2 (n + 2,048) n values)."""
    budget = torch_backend_bytes(1500, 800, 8)                          # 55 MB
    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(budget)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, timeout=300,
                          # big blocks straight from mmap, so that freed ones leave the resident set
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"})
    assert proc.returncode == 0, proc.stderr
    growth = int(proc.stdout.split()[-1])
    assert growth <= budget + (4 << 20), (growth, budget)
