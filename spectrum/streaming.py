"""Exact singular values of a tall matrix whose rows arrive in blocks, in memory independent of m.

The log-P matrix of a language model (contexts x vocabulary, up to ~250,000 x 33,278) is too large
to hold, let alone to hand to a dense SVD. But A = QR has the same singular values as its n x n
triangular factor R, and R can be updated one block of rows B at a time: QR([R; B]) = Q' R'. So we
keep only R (plus a buffer of pending rows), never Q, and finish with a full, non-randomised SVD
of R. A^T A is never formed: it squares the condition number and would wipe out exactly the small
singular values that Press's rank rule counts.

Two backends do the update:
- "lapack" (CPU, numpy): LAPACK ?tpqrt folds a rectangular block into R in place, at the cost of
  the block alone (2 k n^2 flops for k rows), without re-factorising R.
- "torch" (any torch device, meant for CUDA): QR of the stacked [R; B] per block. It re-factorises
  R each time, so it wants blocks of about n rows or more.

GPU memory is bounded by `max_memory` (bytes; rank.py gives it from the free memory or
--max-memory): the torch backend's blocks shrink to fit it, and where even a small block does not
fit, or the GPU has no full-rate float64 for a float64 decomposition, "auto" runs the LAPACK
backend on the CPU instead (the rows are copied there). The final SVD of R runs on the GPU with
cuSOLVER's gesvd (QR iteration, whose small singular values are accurate to rounding of the
largest; the default gesvdj is an iterative Jacobi method documented to be unreliable for large
matrices) when R, its copy and the SVD's workspace fit the budget and n is at most 26,711 (the
largest gesvd takes), else on the CPU.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import torch
from scipy.linalg import lapack

from .numerical_rank import float_dtype

# Panel width of ?tpqrt (its `nb`): wide enough for its matrix-matrix updates to run at BLAS-3
# speed, narrow enough that the matrix-vector panel work stays small. OpenBLAS, 2 cores, float32:
# 140 GF/s with 128 against 123 with 64 at n = 10,000; 256 was slower at n = 4,000.
_TPQRT_PANEL = 128
# Default buffered rows per ?tpqrt call: at n = 10,000, 4,096 rows ran at 149 GF/s against 138
# with 2,048 (n = 4,000: flat from 1,024 to 8,192), and the buffer stays small next to R.
_LAPACK_BLOCK_ROWS = 4096
# The torch backend re-factorises R (4/3 n^3 flops) per block of k rows; k >= n keeps that overhead
# within 2/3 of the useful 2 k n^2.
_TORCH_MIN_BLOCK_ROWS = 2048

# Fewest rows per block of the torch backend under a memory budget: below this the
# re-factorisation of R per block costs over 20 times the useful work at n = 10,000, and the
# LAPACK backend on the CPU is the better choice.
_TORCH_MIN_BUDGET_ROWS = 256
# Multiples of n x n values the final SVD holds on the GPU: R, the copy gesvd overwrites, and an
# allowance of a quarter for its workspace (without singular vectors it needs O(n) per panel).
_SVD_SQUARES = 2.25
# The largest n x n matrix cuSOLVER's gesvd takes: it counts its workspace (about 3 n^2 values)
# in a 32-bit integer, and cusolverDn[SD]gesvd_bufferSize refuses n = 26,712 and beyond with
# CUSOLVER_STATUS_INVALID_VALUE (measured on an H200, CUDA 13.0, torch 2.11: float32 and float64
# alike; n = 26,711 took 28.4 s there). WikiText-2's V = 33,278 is past it: its SVD runs on the CPU.
CUSOLVER_GESVD_MAX_N = 26_711
# GPUs whose float64 runs at half the float32 rate (compute capability): the data-centre parts.
# Elsewhere float64 runs at 1/32 or 1/64 of it, slower than a CPU's LAPACK.
_FULL_RATE_FLOAT64 = {(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)}

_NUMPY_TO_TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def torch_backend_bytes(n_cols: int, block_rows: int, element_size: int) -> int:
    """Peak memory of the torch backend: its (n + k) x n work tensor, and geqrf's factor of it
    at a flush."""
    return 2 * (n_cols + block_rows) * n_cols * element_size


def torch_block_rows_within(max_memory: int, n_cols: int, element_size: int) -> int | None:
    """The most rows per block whose torch-backend peak fits `max_memory` bytes; None when fewer
    than _TORCH_MIN_BUDGET_ROWS do."""
    rows = max_memory // (2 * n_cols * element_size) - n_cols
    return rows if rows >= _TORCH_MIN_BUDGET_ROWS else None


def svd_fits(n_cols: int, element_size: int, max_memory: int | None) -> bool:
    """Whether the final SVD of an n x n R fits `max_memory` bytes (None: no bound)."""
    return max_memory is None or _SVD_SQUARES * n_cols * n_cols * element_size <= max_memory


def svd_device(device: torch.device, n_cols: int, element_size: int, max_memory: int | None) -> torch.device:
    """Where the final SVD of an n x n R held on `device` runs: there when R, its copy and the
    workspace fit `max_memory` and, on CUDA, cuSOLVER's gesvd takes n; else on the CPU (LAPACK)."""
    stays = svd_fits(n_cols, element_size, max_memory) and (
        device.type != "cuda" or n_cols <= CUSOLVER_GESVD_MAX_N)
    return device if stays else torch.device("cpu")


def full_rate_float64(device: torch.device) -> bool:
    """Whether `device` runs float64 at about half its float32 rate (CPUs do)."""
    if device.type != "cuda":
        return device.type == "cpu"
    properties = torch.cuda.get_device_properties(device)
    return (properties.major, properties.minor) in _FULL_RATE_FLOAT64


def singular_values_of(matrix: torch.Tensor) -> torch.Tensor:
    """All singular values of `matrix`; on CUDA with the gesvd driver (see the module docstring)."""
    if matrix.device.type == "cuda":
        return torch.linalg.svdvals(matrix, driver="gesvd")
    return torch.linalg.svdvals(matrix)


def _as_numpy_rows(rows: Any) -> np.ndarray:
    if isinstance(rows, torch.Tensor):
        return rows.detach().cpu().numpy()
    return np.asarray(rows)


def _row_count_and_width(rows: Any) -> tuple[int, int]:
    shape = tuple(rows.shape)
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) != 2:
        raise ValueError(f"rows must be 1-D or 2-D, got shape {shape}")
    return shape[0], shape[1]


def tpqrt_update(r: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Fold `block` (k x n) into the upper-triangular `r` (n x n): R' of QR([r; block]).

    Both arrays must be Fortran-ordered and of the same float dtype: LAPACK then works on them in
    place (no copy of the n x n R, which is 4.4 GB at n = 33,278 in float32). `r` is overwritten
    with R' and returned; `block` is overwritten with Householder vectors (scratch). The strictly
    lower triangle of `r` is never read or written, so it stays zero if it started zero.
    """
    tpqrt = lapack.stpqrt if r.dtype == np.float32 else lapack.dtpqrt
    panel = min(_TPQRT_PANEL, r.shape[1])  # LAPACK requires nb <= n
    # l = 0: the block is a full rectangle (no triangular part), as for fresh rows of A.
    r, _, _, info = tpqrt(0, panel, r, block, overwrite_a=1, overwrite_b=1)
    if info != 0:
        raise RuntimeError(f"LAPACK ?tpqrt failed with info={info}")
    return r


class _LapackBackend:
    """R as an n x n Fortran array updated in place by ?tpqrt; rows buffered Fortran-ordered."""

    def __init__(self, n_cols: int, dtype: np.dtype, block_rows: int) -> None:
        self._buffer = np.empty((block_rows, n_cols), dtype=dtype, order="F")
        self._r: np.ndarray | None = None  # allocated at the first flush

    def write(self, offset: int, rows: Any) -> None:
        rows = _as_numpy_rows(rows)
        self._buffer[offset : offset + rows.shape[0]] = rows  # casts to the working dtype

    def flush(self, count: int) -> None:
        block = self._buffer[:count]
        _check_finite(block)
        if count < self._buffer.shape[0]:
            # A row slice of a Fortran array is not contiguous; copy it once (LAPACK would
            # otherwise copy it silently). Happens only for the last, partial block.
            block = np.asfortranarray(block)
        if self._r is None:
            n = self._buffer.shape[1]
            # Starting from R = 0 lets ?tpqrt do the first block too. If only m < n rows are ever
            # seen, R gains n - m singular values of rounding noise: the caller keeps the top m.
            self._r = np.zeros((n, n), dtype=self._buffer.dtype, order="F")
        self._r = tpqrt_update(self._r, block)

    def finish(self, count: int) -> torch.Tensor:
        """The matrix whose singular values are those of A (buffer released)."""
        if self._r is None:
            # Never flushed: all rows are still in the buffer, take them as they are.
            matrix = self._buffer[:count]
            _check_finite(matrix)
        else:
            if count:
                self.flush(count)
            matrix = self._r
        self._buffer = self._r = None
        return torch.from_numpy(matrix)


class _TorchBackend:
    """R kept in the top rows of a torch work tensor whose lower rows buffer the incoming rows.

    A flush factorises the stacked [R; pending] with torch.geqrf (LAPACK/MAGMA/cuSOLVER, on a copy)
    and writes the new R back on top, so the peak is about twice the work tensor, (n + k) x n.
    """

    def __init__(self, n_cols: int, dtype: torch.dtype, device: torch.device, block_rows: int):
        self._block_rows = block_rows
        self._work = torch.empty((block_rows, n_cols), dtype=dtype, device=device)
        self._r_rows = 0  # rows of R at the top of the work tensor (min(rows seen, n))
        self._flushed = False

    def write(self, offset: int, rows: Any) -> None:
        rows = torch.as_tensor(rows)
        start = self._r_rows + offset
        self._work[start : start + rows.shape[0]].copy_(rows)  # casts and moves as needed

    def flush(self, count: int) -> None:
        start, rows = self._r_rows, self._r_rows + count
        _check_finite(self._work[start:rows])
        factor, _ = torch.geqrf(self._work[:rows])
        new_r_rows = min(rows, self._work.shape[1])
        if self._work.shape[0] < new_r_rows + self._block_rows:
            # R has grown (fewer than n rows seen so far): enlarge, freeing the old tensor first.
            shape = (new_r_rows + self._block_rows, self._work.shape[1])
            dtype, device = self._work.dtype, self._work.device
            self._work = None
            self._work = torch.empty(shape, dtype=dtype, device=device)
        # Below its diagonal geqrf leaves Householder vectors; R is the upper triangle (trapezoid).
        self._work[:new_r_rows].copy_(factor[:new_r_rows].triu_())
        self._r_rows, self._flushed = new_r_rows, True

    def finish(self, count: int) -> torch.Tensor:
        """The matrix whose singular values are those of A (work tensor released)."""
        if not self._flushed:
            # Never flushed: all rows are still pending, take them as they are.
            matrix = self._work[:count]
            _check_finite(matrix)
        else:
            if count:
                self.flush(count)
            # A copy of R alone, so that the work tensor's block rows are freed before the SVD
            # (the copy and the work tensor together stay within a flush's peak).
            matrix = self._work[: self._r_rows].clone()
        self._work = None
        return matrix


class NonFiniteMatrix(ValueError):
    """The matrix holds a NaN or inf (a diverged model's log-probabilities): its input, not the
    code, is at fault."""


def _check_finite(block: np.ndarray | torch.Tensor) -> None:
    # A NaN or inf would silently spread through R into every singular value.
    module = np if isinstance(block, np.ndarray) else torch
    if not bool(module.isfinite(block).all()):
        raise NonFiniteMatrix("the matrix has non-finite entries (NaN or inf)")


class StreamingSingularValues:
    """Singular values of an m x n matrix fed row block by row block, in O(n^2) memory.

    Example:
        stream = StreamingSingularValues(n_cols=vocab_size)          # float32, CPU, LAPACK
        for log_probs in batches:                                     # (k, n) arrays or tensors
            stream.update(log_probs)
        values = stream.singular_values()                             # descending float64

    Args:
        n_cols: n, the number of columns.
        dtype: working precision of the decomposition (float32 by default, as in [SB]; float64 on
            request); incoming rows are cast to it. Numpy dtype, string or torch dtype.
        device: where the torch backend works (e.g. "cuda"); the LAPACK backend needs "cpu".
        block_rows: rows buffered per update of R (any update size is accepted). Default 4,096 for
            LAPACK and max(n, 2,048) for torch, which re-factorises R at every block, or fewer
            to fit `max_memory`.
        backend: "lapack" (?tpqrt via scipy, CPU), "torch" (torch.geqrf, any device) or "auto"
            ("lapack" on CPU, "torch" elsewhere, "lapack" on the CPU when the torch backend
            does not fit `max_memory` or the device has no full-rate float64 for float64).
        max_memory: bytes the torch backend may use on its device (None: no bound); the final
            SVD runs on the CPU when it does not fit them.

    Memory: R (n^2 values) plus the buffer (block_rows x n); the final SVD takes one more copy of R
    (torch.linalg.svdvals works on a copy). With the torch backend, about 2 (n + block_rows) n
    (`torch_backend_bytes`), R copied out of the work tensor before the SVD.
    """

    def __init__(
        self,
        n_cols: int,
        dtype: Any = np.float32,
        device: str | torch.device = "cpu",
        block_rows: int | None = None,
        backend: str = "auto",
        max_memory: int | None = None,
    ) -> None:
        if n_cols < 1:
            raise ValueError(f"n_cols must be positive, got {n_cols}")
        device = torch.device(device)
        self.n_cols = n_cols
        self.dtype = float_dtype(dtype)
        if backend not in ("auto", "lapack", "torch"):
            raise ValueError(f"backend must be 'auto', 'lapack' or 'torch', got {backend!r}")
        element_size = np.dtype(self.dtype).itemsize
        budget_rows = None if max_memory is None else torch_block_rows_within(max_memory, n_cols, element_size)
        if backend == "auto":
            on_device = (device.type != "cpu" and (max_memory is None or budget_rows is not None)
                         and (self.dtype == np.float32 or full_rate_float64(device)))
            backend, device = ("torch", device) if on_device else ("lapack", torch.device("cpu"))
        if backend == "lapack" and device.type != "cpu":
            raise ValueError(f"the lapack backend runs on the CPU, not {device}")
        if backend == "torch" and max_memory is not None and budget_rows is None:
            raise ValueError(f"the torch backend needs {torch_backend_bytes(n_cols, _TORCH_MIN_BUDGET_ROWS, element_size):,} "
                             f"bytes for n = {n_cols:,}, more than max_memory = {max_memory:,}")
        if block_rows is None:
            block_rows = (_LAPACK_BLOCK_ROWS if backend == "lapack"
                          else min(max(n_cols, _TORCH_MIN_BLOCK_ROWS), budget_rows or math.inf))
        if block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {block_rows}")
        self.device = device
        self.max_memory = max_memory if backend == "torch" else None
        self.block_rows = block_rows
        if backend == "lapack":
            self._backend = _LapackBackend(n_cols, self.dtype, block_rows)
        else:
            self._backend = _TorchBackend(n_cols, _NUMPY_TO_TORCH[self.dtype], device, block_rows)
        self.backend = backend
        self._pending = 0  # rows in the buffer, not yet folded into R
        self._rows_seen = 0
        self._result: np.ndarray | None = None

    @property
    def rows_seen(self) -> int:
        """m so far: the number of rows passed to `update`."""
        return self._rows_seen

    @property
    def shape(self) -> tuple[int, int]:
        return self._rows_seen, self.n_cols

    def update(self, rows: Any) -> None:
        """Append rows: a (k, n) (or (n,) for one row) numpy array or torch tensor, any k >= 0."""
        if self._result is not None:
            raise RuntimeError("singular_values() has been called; no more rows can be added")
        if not isinstance(rows, torch.Tensor):
            rows = np.asarray(rows)
        count, width = _row_count_and_width(rows)
        if width != self.n_cols:
            raise ValueError(f"rows have {width} columns, expected {self.n_cols}")
        rows = rows.reshape(count, width)
        done = 0
        while done < count:
            take = min(count - done, self.block_rows - self._pending)
            self._backend.write(self._pending, rows[done : done + take])
            self._pending += take
            done += take
            if self._pending == self.block_rows:
                self._backend.flush(self._pending)
                self._pending = 0
        self._rows_seen += count

    def final_svd_device(self) -> torch.device:
        """Where singular_values() runs the SVD of R: see svd_device."""
        return svd_device(self.device, self.n_cols, np.dtype(self.dtype).itemsize, self.max_memory)

    def singular_values(self) -> np.ndarray:
        """All min(m, n) singular values of the rows seen, descending, as float64.

        The first call folds in the pending rows, runs a full SVD of R in the working dtype
        (torch.linalg.svdvals: LAPACK gesdd on CPU, cuSOLVER gesvd on CUDA, or on the CPU when
        it does not fit `max_memory` or n is past gesvd's CUSOLVER_GESVD_MAX_N) and releases R;
        later calls return the same array, and `update` is no longer allowed.
        """
        if self._result is None:
            if self._rows_seen == 0:
                raise RuntimeError("no rows have been added")
            matrix = self._backend.finish(self._pending)
            self._backend = None
            matrix = matrix.to(self.final_svd_device())      # a CPU copy frees the device's
            # torch's SVD even for the lapack backend: x86 torch wheels bring MKL, whose gesdd
            # (the same LAPACK routine as numpy's/scipy's OpenBLAS one) ran 3.6x faster at
            # n = 4,000 (on par at 2,000; the gap opens once R outgrows the cache); n = 8,000
            # took 20 s on 2 cores.
            values = singular_values_of(matrix).cpu().numpy().astype(np.float64)
            del matrix  # frees R
            # When m < n, R carries n - m extra rows of rounding noise (lapack backend); A itself
            # has only m singular values.
            values = -np.sort(-values)[: min(self._rows_seen, self.n_cols)]
            if not np.isfinite(values).all():
                raise RuntimeError("the SVD returned non-finite singular values")
            self._result = values
        return self._result


def streaming_singular_values(
    blocks: Iterable[Any], n_cols: int, **options: Any
) -> tuple[np.ndarray, tuple[int, int]]:
    """Singular values (descending, float64) and (m, n) shape of the matrix stacked from `blocks`.

    `options` are those of StreamingSingularValues (dtype, device, block_rows, backend).
    """
    stream = StreamingSingularValues(n_cols, **options)
    for block in blocks:
        stream.update(block)
    return stream.singular_values(), stream.shape
