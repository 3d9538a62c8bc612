"""The benchmarks time what training runs: train.py's float32 settings, on the device asked for."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.common import TrainerStep
from data import load_corpus
from experiment.config import load_config
from experiment.loading import set_float32_precision
from tests.conftest import TINY

REPO = Path(__file__).resolve().parent.parent


def test_the_timed_step_uses_the_configs_float32_settings(small_data):
    corpus = load_corpus("ptb", small_data, allow_modified=True)
    overrides = [o for o in TINY if not o.startswith("run.device")]
    try:
        set_float32_precision(True)                 # as PyTorch's default lets cuDNN RNNs do
        step = TrainerStep("configs/ptb/softmax.yaml", corpus, torch.device("cpu"), overrides)
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        step()
        TrainerStep("configs/ptb/softmax.yaml", corpus, torch.device("cpu"), [*overrides, "run.tf32=true"])
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    finally:
        set_float32_precision(False)


# bench_heads, bench_parallel and bench_eval_methods gave --device to torch.device as it was: a
# traceback (in bench_parallel's, from inside its worker) for a name torch does not know or a
# CUDA device this machine does not have.
def benchmark_here(script: str, args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """A benchmark's command line in this process (its exit code, stdout, stderr), as
    `python benchmarks/SCRIPT ARGS` runs it: a subprocess for each would import torch again,
    seconds of CI each. Only for what stops before any work (bad input)."""
    import importlib

    from benchmarks.common import run_benchmark
    module = importlib.import_module(f"benchmarks.{script.removesuffix('.py')}")
    monkeypatch.setattr(sys, "argv", [script, *args])
    try:
        run_benchmark(module.main)
        code = 0
    except SystemExit as stop:
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("script", ["bench_step.py", "bench_heads.py", "bench_parallel.py", "bench_eval_methods.py"])
def test_a_benchmark_takes_a_device(script, monkeypatch, capsys):
    for device, message in (("gpu", "expected auto, cpu, mps, cuda or cuda:N"),
                            (f"cuda:{torch.cuda.device_count()}", "requested but")):
        code, _, err = benchmark_here(script, ["--device", device], monkeypatch, capsys)
        assert code == 2 and err.startswith("error: --device: ") and message in err
        assert err.count("\n") == 1


def test_a_benchmarks_bad_input_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "benchmarks/bench_step.py", "--config", "configs/ptb_mini/nope.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: {REPO / 'configs/ptb_mini/nope.yaml'}: config file not found"


def test_bench_group_layers_three_ways_compute_the_same_gradients():
    """--layers times the same computation each way: the group's recurrence from the members'
    stacked weights gives the gradients of each member's own torch.nn.LSTM (float64)."""
    from benchmarks.bench_group import LayerWays
    ways = LayerWays(3, steps=5, rows=2, hidden=4, device=torch.device("cpu"), dtype=torch.float64)
    ways.grouped()
    ways.one_after_another()
    for k, lstm in enumerate(ways.lstms):
        assert torch.allclose(ways.x.grad[k], ways.inputs[k].grad, atol=1e-12)
        assert torch.allclose(ways.w_hh.grad[k], lstm.weight_hh_l0.grad, atol=1e-12)
        assert torch.allclose(ways.w_ih.grad[k], lstm.weight_ih_l0.grad, atol=1e-12)
        assert torch.allclose(ways.bias.grad[k], lstm.bias_ih_l0.grad, atol=1e-12)
    assert ways.streams is None                     # the streams' way only on CUDA


def test_bench_group_products_split_the_inner_dimension_where_the_parts_divide_it(monkeypatch, capsys):
    """--products' split ways are the batched product summed another way (float64), and a part
    count that does not divide the inner dimension is a '-' cell, not an error: H = 6 splits the
    forward's inner 6 in 2 only, the backward's 24 in 2, 4 and 8; the streams column is '-' off CUDA."""
    from types import SimpleNamespace

    from benchmarks import bench_group
    from model.kernels.grouped_lstm import product_with, split_inner
    torch.manual_seed(0)
    weights, a, bias = (torch.randn(3, 24, 5, dtype=torch.float64), torch.randn(3, 2, 24, dtype=torch.float64),
                        torch.randn(3, 2, 5, dtype=torch.float64))
    for parts in bench_group.SPLITS:
        torch.testing.assert_close(split_inner(weights, parts)(bias, a), product_with(weights, "batched")(bias, a),
                                   rtol=0, atol=1e-12)
    config = SimpleNamespace(train=SimpleNamespace(batch_size=2, bptt=3), model=SimpleNamespace(nhid=6))
    monkeypatch.setattr(bench_group, "load_config", lambda path: config)
    args = SimpleNamespace(shapes=["mini"], groups=[1, 2], steps=1, warmup=0)
    bench_group.products_table(args, torch.device("cpu"))
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 4
    # the last cell, one product per member on a stream each, is CUDA's only
    assert all(row.endswith("| - | - | - |") and row.count(" - ") == 3 for row in rows[:2])  # forward, inner 6
    assert all(row.endswith(" | - |") and row.count(" - ") == 1 and len(row.split(" | ")) == 8
               for row in rows[2:])                                                        # backward, inner 24


def test_bench_group_cpu_pair_training_trains_the_pair_both_ways_with_train_py(small_data, capsys):
    """--cpu-pair-training runs train.py as a user does (two processes, then one --group) and reads
    the runs' last.pt: a round's line with both tokens/s and their ratio, and the summary."""
    import re
    from benchmarks import bench_group
    from conftest import TINY
    bench_group.main(["--cpu-pair-training", "--steps", "3", "--rounds", "1", f"data.data_dir={small_data}", *TINY])
    out = capsys.readouterr().out
    found = re.search(r"at once: ([\d,]+) tokens/s; train\.py --group of the two at 2 threads: ([\d,]+) "
                      r"\(([\d.]+)x\)", out)
    assert found, out
    two, pair, ratio = (float(g.replace(",", "")) for g in found.groups())
    assert two > 0 and pair > 0 and abs(pair / two - ratio) < 0.01
    assert "seeds 1 and 2, 3 steps each, 1 round): the group" in out


# A count of 0 was a traceback from statistics.median of no times (--steps, --reps), from batchify
# (--eval-tokens, --tokens), a ZeroDivisionError (--concurrent 0) or a worker's CalledProcessError
# (--rows 0); 0 for an option read as "unset" where it was tested for truth (--jobs-vs-threads,
# --block-rows) was silently ignored.
BAD_COUNTS = [
    ("bench_step.py", "--steps", "0"), ("bench_step.py", "--eval-tokens", "0"),
    ("bench_heads.py", "--reps", "0"), ("bench_heads.py", "--warmup", "-1"),
    ("bench_parallel.py", "--concurrent", "0"), ("bench_parallel.py", "--jobs-vs-threads", "0"),
    ("bench_eval_methods.py", "--ms-batches", "0"), ("bench_eval_methods.py", "--tokens", "0"),
    ("bench_rank_decomposition.py", "--rows", "0"), ("bench_rank_decomposition.py", "--block-rows", "0"),
    ("bench_group.py", "--groups", "0"),
]


@pytest.mark.parametrize("script, option, value", BAD_COUNTS)
def test_a_benchmarks_count_below_its_least_is_one_line_and_exit_2(script, option, value, monkeypatch, capsys):
    code, out, err = benchmark_here(script, [option, value], monkeypatch, capsys)
    least = 0 if option == "--warmup" else 1
    assert code == 2 and out == ""
    assert err == f"{script}: error: argument {option}: expected an integer >= {least}, got '{value}'\n"


@pytest.mark.parametrize("script, options", [
    ("bench_step.py", ["--steps", "1", "--eval-tokens", "20"]),
    ("bench_eval_methods.py", ["--tokens", "600", "--ms-batches", "1000"]),   # the cache: > 501
])
def test_a_benchmark_reads_the_corpus_of_its_config(script, options, ptb_slice, tmp_path):
    """bench_step and bench_eval_methods read the corpus from $AWD_DATA_DIR whatever the config's
    data.data_dir said (an override of it silently left out): here $AWD_DATA_DIR has no corpus."""
    from conftest import TINY
    config = tmp_path / "tiny.yaml"                 # bench_eval_methods takes no overrides
    config.write_text(f"base: {REPO / 'configs/ptb_mini/softmax.yaml'}\ndata:\n  data_dir: {ptb_slice}\n"
                      "  allow_modified_corpus: true\n")
    overrides = [o for o in TINY if not o.startswith("run.")] if script == "bench_step.py" else []
    empty = tmp_path / "no-corpora"
    empty.mkdir()
    proc = subprocess.run([sys.executable, f"benchmarks/{script}", "--config", str(config), "--device", "cpu",
                           *options, *overrides], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "AWD_DATA_DIR": str(empty), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if script == "bench_eval_methods.py":
        # the tiny training split has fewer batches than asked: the time per batch is over those read
        # (it was over the number asked, too small)
        assert result["ms_batches_timed"] == result["ms_batches_full"] < 1_000


def test_bench_step_times_evaluation_in_ieee_float32(small_data, monkeypatch):
    """The training steps with the config's run.tf32, the evaluation without it, as evaluate.py
    runs it: with run.tf32=true the evaluation was timed in TensorFloat-32 too."""
    from benchmarks import bench_step
    from conftest import TINY
    tf32_in_evaluation = []

    def evaluate_nll(*args, **kwargs):
        tf32_in_evaluation.append(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)
        return 0.0

    monkeypatch.setattr(bench_step, "evaluate_nll", evaluate_nll)
    overrides = [o for o in TINY if not o.startswith("run.")]
    monkeypatch.setattr(sys, "argv", ["bench_step.py", "--config", "configs/ptb_mini/softmax.yaml", "--steps", "1",
                                      "--eval-tokens", "20", f"data.data_dir={small_data}", "run.tf32=true",
                                      *overrides])
    try:
        bench_step.main()
    finally:
        set_float32_precision(False)
    assert tf32_in_evaluation == [False]


@pytest.mark.parametrize("tokens, fix", [("100", "give more than 501"),
                                         ("5000", "the config's test split has only 249: give a config whose "
                                                  "corpus has more")])
def test_bench_eval_methods_refuses_a_text_too_short_for_the_cache(tokens, fix, small_data, tmp_path):
    """With at most the cache's window + 1 test tokens (501 on PTB) the cache is never mixed in, and
    its tokens/s was plain evaluation's under the cache's name."""
    config = tmp_path / "tiny.yaml"
    config.write_text(f"base: {REPO / 'configs/ptb_mini/softmax.yaml'}\ndata:\n  data_dir: {small_data}\n"
                      "  allow_modified_corpus: true\n")
    proc = subprocess.run([sys.executable, "benchmarks/bench_eval_methods.py", "--config", str(config),
                           "--device", "cpu", "--tokens", tokens], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    read = min(int(tokens), 249)                  # the fixture's test split: 249 tokens
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: --tokens {tokens}: the cache (window 500) is used only after 501 positions, "
                           f"so a text of {read} would time plain evaluation under the cache's name; {fix}\n")


def test_bench_heads_cpu_memory_count_writes_nothing_to_stderr(capfd):
    """The CPU's count ran torch's profiler, whose start and stop lines and a warning (a block
    allocated before it started, freed inside: the last step's gradients, which its timeline then
    never saw go) came between the table's lines."""
    from benchmarks import bench_heads
    config = load_config("configs/ptb_mini/softmax.yaml", [])
    shape = bench_heads.Shape(batch=2, bptt=3, vocab=50, emsize=config.model.emsize,
                              nhidlast=config.model.nhidlast)
    case = bench_heads.Case("softmax", config.head, shape, torch.device("cpu"))
    case.step()                                 # gradients there, as after the timed steps
    capfd.readouterr()
    assert bench_heads.peak_step_memory(case, torch.device("cpu")) > 0
    assert capfd.readouterr().err == ""


def test_bench_heads_drops_only_the_profilers_start_and_stop_lines(capfd):
    from benchmarks import bench_heads
    with bench_heads.profiler_start_and_stop_unsaid():
        os.write(2, b"USDT:2026-11-30 05:17:13 7747:7747 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
                    b"[W1130] a warning of torch's\n"
                    b"USDT:2026-11-30 05:17:13 7747:7747 SyncActivityProfilerHandler.cpp:59] profiler_stop\n")
    assert capfd.readouterr().err == "[W1130] a warning of torch's\n"
