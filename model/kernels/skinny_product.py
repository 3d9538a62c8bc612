"""bias + a @ w for each member of a group, when a has few rows: a Triton kernel.

The grouped LSTM's time loops (grouped_lstm.py) multiply, at every time step, the G members' states
(B = 20 rows at PTB's shapes) by their hidden-to-hidden weights (1150 x 4600 at PTB's shapes).
cuBLAS runs these skinny products far below the GPU's memory bandwidth: on an H200 one member's
forward product took 27 us (0.8 TB/s) and four members' 76 us
(results/gpu_h200_2026-11-27/splits/profile.txt), with tiles of 32 x 32 and an 8-deep inner
step. Such a product reads its weights once and does little else, so it is bound by how fast the
weights stream in. This kernel gives each program one member and BLOCK_N columns of the
weights, streams the whole inner dimension K through it in BLOCK_K-deep slices (all of a's rows
at once, padded to BLOCK_M), and, where one member's columns give too few programs to fill the
GPU, splits K into `split` equal ranges whose partial products are summed afterwards in a fixed
order (no atomics: the same inputs give the same bits every time).

The sum over K runs in the order of its slices, so a product here is not bit-equal to cuBLAS's
(float rounding apart, the same function): tests/test_group.py checks it against torch.baddbmm
in float64 under Triton's interpreter on the CPU, benchmarks/gpu_check.py in float32 on a GPU.
The inner products run as IEEE float32 (input_precision "ieee": no TF32).
"""
import os
from functools import lru_cache
from typing import Optional

import torch

# Tile sizes: the rows of a padded to BLOCK_M (a power of two, at least 16 for tl.dot), BLOCK_N
# columns of the weights per program, BLOCK_K of the inner dimension per slice.
BLOCK_N = 64
BLOCK_K = 32
# Aim for about this many programs a product (the H100's and H200's 132 multiprocessors, four
# each, so that enough loads are in flight): K is split in two while G x column blocks x split
# stays within it and each range keeps at least MIN_RANGE of K.
TARGET_PROGRAMS = 528
MIN_RANGE = 256


try:                    # Triton comes with torch's CUDA wheels; on the CPU only its interpreter runs
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


def usable(device: torch.device) -> bool:
    """Whether the kernel runs on `device`: Triton compiles it for a CUDA GPU; on the CPU only
    Triton's interpreter runs it, which must be chosen (TRITON_INTERPRET=1) before Triton is
    imported (the tests run it so, in a process of their own)."""
    if triton is None:
        return False
    return torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:
    def _skinny_addmm(a, w, partial, M, N, K, k_range,
                      s_ag, s_am, s_ak, s_wg, s_wk, s_wn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """partial[part, member] = a[member] @ w[member] over the inner range of `part` (its
        program's third index): one program per member, BLOCK_N columns and inner range."""
        member, column_block, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rows = tl.arange(0, BLOCK_M)
        columns = column_block * BLOCK_N + tl.arange(0, BLOCK_N)
        k_start = part * k_range
        k_end = tl.minimum(k_start + k_range, K)
        a_rows = a + member * s_ag + rows[:, None] * s_am
        w_columns = w + member * s_wg + columns[None, :] * s_wn
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=partial.dtype.element_ty)
        for k0 in range(k_start, k_end, BLOCK_K):
            inner = k0 + tl.arange(0, BLOCK_K)
            a_slice = tl.load(a_rows + inner[None, :] * s_ak,
                              mask=(rows[:, None] < M) & (inner[None, :] < k_end), other=0.0)
            w_slice = tl.load(w_columns + inner[:, None] * s_wk,
                              mask=(inner[:, None] < k_end) & (columns[None, :] < N), other=0.0)
            total += tl.dot(a_slice, w_slice, input_precision="ieee")
        # partial is (split, G, M, N), contiguous
        out = partial + ((part * tl.num_programs(0) + member) * M + rows[:, None]) * N + columns[None, :]
        tl.store(out, total, mask=(rows[:, None] < M) & (columns[None, :] < N))


@lru_cache(maxsize=None)
def _kernel():
    """The kernel, compiled for a GPU on first use (under TRITON_INTERPRET=1, interpreted)."""
    return triton.jit(_skinny_addmm)


def split_for(members: int, columns: int, inner: int, block_n: int = BLOCK_N) -> int:
    """How many ranges the inner dimension is split into (see TARGET_PROGRAMS). A function of the
    shapes alone, so that a product sums in the same order on every call."""
    programs = members * -(-columns // block_n)
    split = 1
    while programs * split * 2 <= TARGET_PROGRAMS and inner // (split * 2) >= MIN_RANGE:
        split *= 2
    return split


def skinny_addmm(bias: torch.Tensor, a: torch.Tensor, w: torch.Tensor, split: Optional[int] = None,
                 block_n: int = BLOCK_N, block_k: int = BLOCK_K) -> torch.Tensor:
    """bias (G, M, N) + a (G, M, K) @ w (G, K, N), member by member (any strides); the inner
    dimension split as split_for says unless `split` is given (benchmarks/bench_group.py times
    other tiles and splits)."""
    if not usable(a.device):
        raise RuntimeError(f"the 'triton' product cannot run on {a.device}: it needs Triton and a CUDA GPU "
                           "(on the CPU, Triton's interpreter: TRITON_INTERPRET=1 before Triton is imported)")
    members, rows, inner = a.shape
    columns = w.size(2)
    block_m = max(16, 1 << (rows - 1).bit_length())
    split = split_for(members, columns, inner, block_n) if split is None else split
    k_range = -(-inner // split)
    k_range = -(-k_range // block_k) * block_k           # ranges start on a slice boundary
    split = -(-inner // k_range)
    partial = torch.empty(split, members, rows, columns, dtype=a.dtype, device=a.device)
    grid = (members, -(-columns // block_n), split)
    _kernel()[grid](a, w, partial, rows, columns, inner, k_range,
                    a.stride(0), a.stride(1), a.stride(2), w.stride(0), w.stride(1), w.stride(2),
                    BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    total = partial[0] if split == 1 else partial.sum(0)
    return total + bias
