"""rank.py on tiny trained models: the rank properties of docs/reference.md section 7, outputs and options."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import rank
import train
from experiment import checkpoint

PTB = "configs/ptb/{}.yaml"
D = 8                                  # d_emb of the tiny models: the slice vocabulary is far larger
HEAD_OPTIONS = {"ss": ["head.compile=false"], "gss": ["head.c=-1.5", "head.k=2.5", "head.compile=false"],
                "plif": ["head.knots=1000", "head.compile=false"],
                "mos": ["head.components=3", "head.compile=false"],
                "moc": ["head.components=3"], "softmax": []}


@pytest.fixture(scope="module")
def tiny_runs(ptb_slice, tmp_path_factory):
    """One tiny run per head, a few optimizer steps each (so the decoder bias is not zero)."""
    from tests.conftest import TINY
    root = tmp_path_factory.mktemp("rank-runs")
    runs = {}
    for head, options in HEAD_OPTIONS.items():
        run_dir = root / head
        nhidlast = 12 if head in ("mos", "moc") else D
        argv = [PTB.format(head), f"data.data_dir={ptb_slice}", *TINY, f"model.emsize={D}",
                f"model.nhidlast={nhidlast}", *options, "train.lr=1", "run.max_steps=3",
                f"run.dir={run_dir}"]
        assert train.main(argv) == 0
        runs[head] = spread_out(run_dir / "last.pt")
    return runs


def spread_out(path: Path) -> Path:
    """Scale up the (tied) embedding and give the decoder bias a clear spread.

    A tiny model a few steps from its U(-0.1, 0.1) init barely varies its logits between
    contexts: the context-dependent singular values would sit near the Press tolerance and the
    test would be about that model rather than about rank.py.
    """
    ckpt = torch.load(path, weights_only=True)
    generator = torch.Generator().manual_seed(0)
    for key, tensor in ckpt["model"].items():
        if key.endswith(("encoder.weight", "decoder.weight")):
            tensor.mul_(30)
        elif key.endswith("decoder.bias"):
            tensor.add_(torch.randn(tensor.shape, generator=generator))
    checkpoint.save_atomic(ckpt, path)
    return path


def ranks(path: Path, *extra: str) -> dict:
    assert rank.main([str(path), "--device", "cpu", *extra]) == 0
    return json.loads((path.parent / "rank_test.json").read_text())


def test_softmax_gives_d_plus_2_and_d_plus_1_with_a_zero_bias(tiny_runs, tmp_path):
    result = ranks(tiny_runs["softmax"])
    m, n = result["shape"]
    assert n > 10 * D and m > n / 4
    assert result["press_rank"] == D + 2
    assert "transformed" not in result
    ckpt = torch.load(tiny_runs["softmax"], weights_only=True)
    assert ckpt["model"]["head.decoder.bias"].abs().max() > 0
    ckpt["model"]["head.decoder.bias"].zero_()
    checkpoint.save_atomic(ckpt, tmp_path / "zero_bias.pt")
    assert ranks(tmp_path / "zero_bias.pt")["press_rank"] == D + 1


def test_moc_is_linear_too(tiny_runs):
    assert ranks(tiny_runs["moc"])["press_rank"] == D + 2


@pytest.mark.parametrize("head", ["ss", "gss", "mos"])
def test_nonlinear_heads_break_the_bottleneck(tiny_runs, head):
    assert ranks(tiny_runs[head])["press_rank"] > D + 2


@pytest.mark.parametrize("head", ["ss", "gss", "plif"])
def test_transformed_logits_are_ranked_too(tiny_runs, head):
    result = ranks(tiny_runs[head])
    assert result["transformed"]["shape"] == result["shape"]
    assert (tiny_runs[head].parent / "singular_values_test_transformed.npy").is_file()
    if head != "plif":      # a pointwise non-linearity of the logits has more than d + 1
        assert result["transformed"]["press_rank"] > D + 1


def test_outputs_contexts_and_precision(tiny_runs, capsys):
    path = tiny_runs["softmax"]
    assert rank.main([str(path), "--contexts", "100", "--json", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert "Press rank" in out[-2]
    assert result["shape"][0] == 100 and result["contexts"] == 100
    assert result["corpus"]["published"] is False and set(result["corpus"]["tokens"]) == {"valid", "test"}
    assert set(result["effective_rank"]) == {"0.001", "0.0001", "1e-05"}
    values = np.load(path.parent / "singular_values_test_logp.npy")
    assert values.shape == (100,) and np.all(np.diff(values) <= 0)
    assert result["sigma_max"] == pytest.approx(values[0])
    # effective ranks are non-decreasing as epsilon shrinks
    eff = result["effective_rank"]
    assert eff["0.001"] <= eff["0.0001"] <= eff["1e-05"] <= result["shape"][1]
    double = ranks(path, "--dtype", "float64")
    assert double["dtype"] == "float64" and double["press_rank"] == D + 2
    # more contexts than the split has: all of them, and a note that says so
    tokens = result["corpus"]["tokens"]["test"]
    assert rank.main([str(path), "--contexts", "10000000", "--json", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["contexts"] == tokens - 1
    assert f"note: 10,000,000 contexts asked, the test split has {tokens - 1:,}; all are used" in captured.err


def test_the_matrix_is_what_evaluation_computes(tiny_runs, ptb_slice):
    """Rows of the log-P matrix: exactly evaluation's log-probs at batch size 1, context by context."""
    from data.batching import batchify
    from evaluation.loop import iterate_chunks
    from experiment.loading import load_trained
    run = load_trained(tiny_runs["softmax"], torch.device("cpu"))
    source = batchify(run.corpus.test, 1)
    rows = torch.cat([lp for lp, _ in rank.log_p_rows(run.model, source, 8, limit=50)])
    direct = torch.cat([out.log_probs[:, 0] for out, _ in iterate_chunks(run.model, source, 8)])[:50]
    assert torch.equal(rows, direct)


def test_plot_overlays_runs(tiny_runs, tmp_path):
    for head in ("softmax", "ss"):
        ranks(tiny_runs[head])
    out = tmp_path / "spectra.png"
    assert rank.main(["--plot", str(tiny_runs["softmax"].parent), str(tiny_runs["ss"].parent),
                      "--transformed", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rank_py_starts_without_the_analysis_packages_statistics_and_figures():
    """rank.py runs once per run of every sweep: scipy.stats and matplotlib (the analysis package's,
    about 1.7 s of start-up) are imported only for --plot, which test_plot_overlays_runs checks."""
    probe = ("import sys, rank; heavy = [m for m in ('scipy.stats', 'matplotlib') if m in sys.modules]; "
             "print(heavy)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_bad_input_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "rank.py", str(tmp_path / "nope")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "no such run directory" in proc.stderr


def test_the_streams_share_the_gpu_budget_and_what_does_not_fit_goes_to_the_cpu():
    """Two streams (log P and f(l)) on a device ("meta" stands in for a GPU: it allocates nothing)
    with room for one: the second runs the LAPACK backend on the CPU."""
    from spectrum.streaming import torch_backend_bytes
    vocab, budget = 3000, torch_backend_bytes(3000, 1500, 4)
    streams = rank.open_streams(["logp", "transformed"], vocab, "float32", torch.device("meta"), budget)
    logp, transformed = streams["logp"], streams["transformed"]
    assert (logp.backend, logp.device.type, transformed.backend, transformed.device.type) == \
        ("torch", "meta", "lapack", "cpu")
    assert torch_backend_bytes(vocab, logp.block_rows, 4) <= budget
    room_for_two = 2 * torch_backend_bytes(vocab, 3000, 4)                 # blocks of n rows each
    both = rank.open_streams(["logp", "transformed"], vocab, "float32", torch.device("meta"), room_for_two)
    assert [s.backend for s in both.values()] == ["torch", "torch"]
    assert rank.decomposition_budget(torch.device("meta"), 1.5) == 3 * 2**29
    assert rank.decomposition_budget(torch.device("cpu"), None) is None


def test_max_memory_is_checked(capsys):
    with pytest.raises(SystemExit):
        rank.parse_args(["runs/x", "--max-memory", "0"])
    assert "--max-memory: expected a number of GiB > 0, got 0.0" in capsys.readouterr().err
    # the CPU's decomposition (LAPACK) has no bound to take: refused, not silently ignored
    assert rank.main(["runs/x", "--device", "cpu", "--max-memory", "2"]) == 2
    assert capsys.readouterr().err == (
        "error: --max-memory bounds the decomposition's memory on a GPU; on the CPU (the device "
        "here) LAPACK takes what it needs: leave --max-memory out\n")


def test_rank_says_when_a_gpu_streams_final_svd_goes_to_the_cpu_and_why(monkeypatch):
    """WikiText-2's R (33,278) is past cuSOLVER gesvd's 26,711: rank.py says the SVD runs on the
    CPU and why, instead of sitting silent for minutes; nothing is said when it stays on the GPU
    or the stream was on the CPU all along."""
    from spectrum import StreamingSingularValues

    def stream_on(device: str, n: int, max_memory=None) -> StreamingSingularValues:
        stream = StreamingSingularValues(n, device="meta", max_memory=max_memory)   # no CUDA here
        stream.device = torch.device(device)
        return stream

    wikitext = rank.cpu_svd_note("logp", stream_on("cuda", 33_278))
    assert wikitext == ("the final SVD of the 33,278 x 33,278 R (logp) runs on the CPU's LAPACK: past the "
                        "26,711 x 26,711 cuSOLVER's gesvd takes; it can take many minutes")
    budget = rank.cpu_svd_note("transformed", stream_on("cuda", 10_000, max_memory=850 * 10**6))
    assert budget is not None and "exceed the memory budget" in budget
    assert rank.cpu_svd_note("logp", stream_on("cuda", 10_000)) is None
    assert rank.cpu_svd_note("logp", StreamingSingularValues(50)) is None


def test_the_docs_give_the_number_of_ptb_test_contexts_that_rank_py_ranks(shared_data_dir, monkeypatch):
    """rank.py's own count (open_split on the real PTB test split), not the split's 82,430 tokens:
    the last token has no next one."""
    import re
    from types import SimpleNamespace
    from data import load_corpus
    corpus = load_corpus("ptb", shared_data_dir)
    monkeypatch.setattr(rank, "load_trained", lambda *args, **kwargs: SimpleNamespace(
        model=torch.nn.Identity(), corpus=corpus))
    contexts = rank.open_split("run", "test", None, "float32", torch.device("cpu"), None)[3]
    repo = Path(__file__).resolve().parent.parent
    said = [(page.name, count) for page in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
            for count in re.findall(r"all ([\d,]+) contexts", page.read_text(encoding="utf-8"))]
    assert ("ranks.md", f"{contexts:,}") in said
    assert all(count == f"{contexts:,}" for _, count in said), said


def test_the_lines_docs_ranks_md_explains_are_the_lines_rank_py_prints():
    """docs/ranks.md's "What rank.py prints" shows the README's first run's two lines, its
    numbers as letters: rank.py's own describe() gives them, the letters put back."""
    from tests.conftest import doc_section
    result = {"checkpoint": "runs/first/best.pt", "head": "softmax", "dataset": "ptb", "split": "test",
              "contexts": 2000, "epoch": 1, "epoch_complete": True, "step": 666, "weights": "raw",
              "asgd": False, "shape": [2000, 10000], "dtype": "float32", "press_rank": 18,
              "effective_rank": {0.001: 111, 0.0001: 222, 1e-05: 333}, "sigma_max": 444.0, "sigma_min": 555.0}
    printed = rank.describe(result)
    for number, letter in (("666", "S"), ("111", "A"), ("222", "B"), ("333", "C"), ("444", "X"), ("555", "Y")):
        printed = printed.replace(number, letter)
    assert f"```\n{printed}\n```" in doc_section("docs/ranks.md", "What rank.py prints")


def test_a_run_without_checkpoints_and_a_missing_one_are_told_apart(tmp_path):
    """A run that has saved nothing yet, and a committed run of results/ (its result files, no
    checkpoint), each say so and what to do;
    a path that does not exist says that; a missing checkpoint file says checkpoint not found."""
    from experiment.checkpoint import CheckpointError, existing_checkpoint
    run = tmp_path / "ptb-softmax-seed1"
    run.mkdir()
    (run / "config.yaml").write_text("data: {dataset: ptb}\n", encoding="utf-8")
    # started but no epoch finished (in its first epoch, or killed there): not a results/ copy
    with pytest.raises(CheckpointError, match="holds a run that has not saved a checkpoint yet .*its train.py command$"):
        existing_checkpoint(run)
    (run / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="result files without its checkpoints .*sweep.py PLAN --out DIR"):
        existing_checkpoint(run)
    with pytest.raises(CheckpointError, match="no such run directory"):
        existing_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="best.pt: checkpoint not found$"):
        existing_checkpoint(tmp_path / "nope" / "best.pt")
    # the folder above run directories, given for one of them
    holder = tmp_path / "runs"
    (holder / "ptb-softmax-seed1").mkdir(parents=True)
    (holder / "ptb-softmax-seed1" / "best.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"runs: not a run directory, no best.pt and no config.yaml "
                                              r"\(it holds runs: ptb-softmax-seed1\); give one run's directory"):
        existing_checkpoint(holder)


def test_a_log_p_matrix_with_nan_rows_is_refused_and_nothing_written(tiny_runs, monkeypatch, capsys, tmp_path):
    """A NaN or inf entry (a diverged model) was a traceback from the streaming decomposition."""
    import shutil
    run_dir = shutil.copytree(tiny_runs["softmax"].parent, tmp_path / "run")
    before = {p.name for p in run_dir.iterdir()}
    real_rows = rank.log_p_rows

    def rows_with_a_nan(*args, **kwargs):
        for i, (log_probs, transformed) in enumerate(real_rows(*args, **kwargs)):
            if i == 1:
                log_probs = log_probs.clone()
                log_probs[0, 0] = float("nan")
            yield log_probs, transformed
    monkeypatch.setattr(rank, "log_p_rows", rows_with_a_nan)
    capsys.readouterr()
    assert rank.main([str(run_dir / "last.pt"), "--contexts", "100", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run_dir / 'last.pt'}: the logp matrix of the test split: ") and err.count("\n") == 1
    assert "the matrix has non-finite entries (NaN or inf); nothing written" in err
    assert {p.name for p in run_dir.iterdir()} == before
