"""model/kernels/skinny_product.py: the Triton kernel for the grouped LSTM's time-step products,
run by Triton's interpreter on the CPU (in a process of its own: the interpreter must be chosen
before Triton is imported), in float64 against torch's products and the recurrence's reference
maths. Without Triton (a CPU-only torch need not bring it) these tests skip; benchmarks/gpu_check.py
checks the kernel in float32 on a GPU."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"),
                                  reason="Triton is not installed (it comes with torch's CUDA wheels)")


def interpreted(code: str) -> str:
    """Run `code` in a fresh Python under TRITON_INTERPRET=1; its stdout."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@needs_triton
def test_the_kernel_is_torchs_product_for_every_split_tile_and_stride():
    out = interpreted("""
        import torch
        from model.kernels.skinny_product import skinny_addmm, split_for
        torch.manual_seed(0)
        cases = 0
        # (G, M, K, N, split, tiles): rows padded to 16 and 32, K not a multiple of the slice,
        # N not a multiple of the column block, splits the shapes choose and given ones
        for g, m, k, n, split, block_n, block_k in [(2, 5, 70, 130, None, 64, 32), (3, 20, 300, 96, 3, 64, 32),
                                                   (1, 17, 64, 64, 1, 32, 32), (2, 20, 600, 40, None, 32, 64),
                                                   (4, 20, 1100, 70, None, 128, 32)]:
            a = torch.randn(g, m, k, dtype=torch.float64)
            bias = torch.randn(g, m, n, dtype=torch.float64)
            for w in (torch.randn(g, k, n, dtype=torch.float64),                  # rows of N contiguous
                      torch.randn(g, n, k, dtype=torch.float64).transpose(1, 2)):  # W^T, as the forward's
                got = skinny_addmm(bias, a, w, split, block_n=block_n, block_k=block_k)
                torch.testing.assert_close(got, torch.baddbmm(bias, a, w), rtol=0, atol=1e-12)
                cases += 1
        # the split by shape: more ranges for few programs, none below MIN_RANGE of K
        print(cases, split_for(4, 1150, 4600), split_for(4, 4600, 1150), split_for(1, 40, 600), split_for(2, 64, 300))
    """)
    cases, *splits = out.split()
    assert int(cases) == 10
    assert [int(s) for s in splits] == [4, 1, 2, 1]


@needs_triton
def test_the_recurrence_with_triton_products_is_its_reference_maths():
    """grouped_lstm's PRODUCT "triton": values and gradients of members of three lengths equal the
    reference maths (model/group.py), the captured loops (replay emulated) included."""
    out = interpreted("""
        import torch
        from model.group import alive_steps, grouped_lstm_reference
        from model.kernels import grouped_lstm
        torch.set_default_dtype(torch.float64)
        grouped_lstm.PRODUCT = "triton"
        used = []
        real = grouped_lstm.product_with
        grouped_lstm.product_with = lambda w, way: used.append(way) or real(w, way)
        for captured in (False, True):
            grouped_lstm.CAPTURE = captured
            torch.manual_seed(0)
            g, t, b, h = 3, 6, 4, 5
            inputs = [torch.randn(g, t, b, 4 * h), torch.randn(g, b, h), torch.randn(g, b, h), torch.randn(g, 4 * h, h)]
            inputs = [x.requires_grad_() for x in inputs]
            alive = alive_steps([6, 3, 5], "cpu")
            reference = grouped_lstm_reference(*inputs, alive)
            kernel = grouped_lstm.grouped_lstm_recurrence(*inputs, alive)
            weights = [torch.randn_like(x) for x in reference]
            grads = [torch.autograd.grad(sum((w * x).sum() for w, x in zip(weights, out)), inputs)
                     for out in (reference, kernel)]
            for x, y in zip([*reference, *grads[0]], [*kernel, *grads[1]]):
                torch.testing.assert_close(x, y, rtol=0, atol=1e-12)
        print(sorted(set(used)))
    """)
    assert out.strip() == "['triton']"


def test_the_kernel_says_where_it_cannot_run():
    """On the CPU without the interpreter (or without Triton) the way is refused in one line."""
    from model.kernels import skinny_product
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process interprets Triton")
    assert not skinny_product.usable(torch.device("cpu"))
    x = torch.zeros(1, 2, 3)
    with pytest.raises(RuntimeError, match="cannot run on cpu: it needs Triton and a CUDA GPU"):
        skinny_product.skinny_addmm(torch.zeros(1, 2, 4), x, torch.zeros(1, 3, 4))
