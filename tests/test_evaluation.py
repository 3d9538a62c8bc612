"""evaluation/loop.py: the perplexity loop every split, run and report uses; evaluate.py's
result files: which weights they say were evaluated, and the note when one is rewritten."""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil

import pytest
import torch

import evaluate
import train

from data.batching import batchify
from experiment.config import load_config
from evaluation.loop import evaluate_nll, iterate_chunks, perplexity
from model import build_model
from model.heads import HEADS

from conftest import REPO_ROOT, TINY, disk_full, head_overrides
from experiment.loading import checkpoint_weights

VOCAB = 50


def tiny_model(head: str):
    overrides = [o for o in TINY if not o.startswith("run.")] + head_overrides(head)
    config = load_config(f"configs/ptb/{head}.yaml", overrides)
    torch.manual_seed(0)
    model = build_model(config, VOCAB)
    with torch.no_grad():    # logits that vary between contexts, as in a trained model
        model.body.encoder.weight.mul_(20)
        model.head.decoder.bias.normal_()
    return model


@pytest.mark.parametrize("head", list(HEADS))
def test_evaluate_nll_is_the_mean_nll_of_the_full_log_probs_over_one_long_sequence(head):
    """evaluate_nll takes the targets-only path in bptt chunks; the reference runs the whole
    split as one sequence through forward() and its full log-probabilities."""
    model = tiny_model(head)
    source = batchify(torch.randint(VOCAB, (203,), generator=torch.Generator().manual_seed(1)), 2)
    nll = evaluate_nll(model, source, bptt=8)
    model.eval()
    with torch.no_grad():
        out = model(source[:-1], model.init_hidden(2))
        expected = -out.log_probs.gather(-1, source[1:].unsqueeze(-1)).double().mean().item()
    assert nll == pytest.approx(expected, rel=1e-6)
    chunked = torch.cat([out.log_probs.gather(-1, t.unsqueeze(-1)).view(-1)
                         for out, t in iterate_chunks(model, source, 8)])
    assert -chunked.double().mean().item() == pytest.approx(nll, rel=1e-6)


HOST_READS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")


class HostReads:
    """Counts the calls that copy a tensor's value to the host (each one waits for the device)."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self.recording(name, getattr(torch.Tensor, name)))

    def recording(self, name, method):
        def read(tensor, *args, **kwargs):
            self.calls.append(name)
            return method(tensor, *args, **kwargs)
        return read


@pytest.mark.parametrize("head", list(HEADS))
def test_evaluation_reads_the_device_once_per_split(head, monkeypatch):
    model = tiny_model(head)
    source = batchify(torch.randint(VOCAB, (400,)), 2)          # 25 chunks of 8
    expected = evaluate_nll(model, source, bptt=8)
    reads = HostReads(monkeypatch)
    assert evaluate_nll(model, source, bptt=8) == expected
    assert len(reads.calls) == 1, reads.calls


def test_perplexity_keeps_a_nan_loss_nan():
    """A NaN loss (`nan < 700` is False) was shown and written as perplexity inf, a number."""
    assert math.isnan(perplexity(math.nan))
    assert perplexity(math.inf) == perplexity(709.8) == math.inf          # past float64's range
    assert perplexity(709.7) == pytest.approx(math.exp(709.7)) and perplexity(1.0) == math.e


def rewrites(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note: rewrote")]


def test_rewriting_a_result_of_other_settings_says_what_it_held(tiny_run, small_data, tmp_path, capsys):
    """The earlier numbers were lost without a word when a result file was rewritten with
    another test batch size, corpus folder, method setting or checkpoint step."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval_*.json"))
    result = run / "eval_best.json"

    def evaluated(*argv) -> str:
        """stderr's rewrite notes of evaluate.py on the run with `argv`, and the result it read before."""
        assert evaluate.main([str(run), *argv]) == 0
        return "\n".join(rewrites(capsys.readouterr().err))

    assert evaluated() == evaluated() == ""                  # a first file, then the same settings
    before = json.loads(result.read_text())
    assert evaluated("--test-batch-size", "2") == (
        f"note: rewrote {result} (before: valid ppl {before['val_ppl']:.2f}, test ppl {before['test_ppl']:.2f} "
        f"with test batch size 1; now test batch size 2)")
    other = tmp_path / "other"
    shutil.copytree(small_data, other)
    before = json.loads(result.read_text())
    assert evaluated("--test-batch-size", "2", "--data-dir", str(other), "--allow-modified-corpus") == (
        f"note: rewrote {result} (before: valid ppl {before['val_ppl']:.2f}, test ppl {before['test_ppl']:.2f} "
        f"with the corpus in {small_data / 'ptb'}; now the corpus in {other / 'ptb'})")
    test_text = other / "ptb" / "test.txt"
    test_text.write_text("the the the\n" + test_text.read_text())              # edited in place
    note = evaluated("--test-batch-size", "2", "--data-dir", str(other), "--allow-modified-corpus")
    assert note.endswith(f"with the test text of sha256 {before['corpus']['sha256']['test'][:8]}...; now the test "
                         f"text of sha256 {hashlib.sha256(test_text.read_bytes()).hexdigest()[:8]}...)")
    result.write_text(json.dumps({**json.loads(result.read_text()), "step": 3}))    # a run trained on since
    note = evaluated("--test-batch-size", "2", "--data-dir", str(other), "--allow-modified-corpus")
    assert note.endswith(f"with the raw weights of step 3; now the raw weights of step {before['step']})")
    result.write_text("not JSON")
    assert evaluated() == f"note: rewrote {result}, which held no result of evaluate.py"

    cached = run / "eval_best_cache.json"
    assert evaluated("--cache", "--cache-window", "50") == ""
    before = json.loads(cached.read_text())
    note = evaluated("--cache-search", "--cache-window", "50")
    searched = json.loads(cached.read_text())["settings"]
    assert note == (f"note: rewrote {cached} (before: valid ppl {before['val_ppl']:.2f}, test ppl "
                    f"{before['test_ppl']:.2f} with --cache, --cache-theta 1, --cache-lambda 0.1; now "
                    f"--cache-search, --cache-theta {searched['theta']:g}, --cache-lambda {searched['lam']:g})")


def test_a_finetunings_starting_weights_are_labelled_as_what_they_are(small_data, tmp_path, capsys):
    """A finetuning's best.pt holds its starting weights until an epoch beats them: the trained
    run's ASGD averages here, which evaluate.py called "raw" (best.pt's `averaged` is of the
    finetuning's own optimizer, which had not averaged yet)."""
    parent = tmp_path / "run"
    assert train.main(["configs/ptb/softmax.yaml", f"data.data_dir={small_data}", *TINY,
                       "train.asgd_trigger=start", "train.epochs=1", f"run.dir={parent}"]) == 0
    # One step and no epoch's end: finetune/best.pt keeps the starting weights.
    assert train.main(["--finetune", str(parent), "run.max_steps=1"]) == 0
    parent_weights = checkpoint_weights(torch.load(parent / "best.pt", weights_only=True))
    assert parent_weights["weights"] == "averaged"
    capsys.readouterr()
    assert evaluate.main([str(parent / "finetune"), "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert (result["step"], result["weights"], result["asgd"]) == (0, "averaged", True)
    assert result["starting_weights"] == {"checkpoint": str(parent / "best.pt"), **parent_weights}
    assert out[0].endswith(f"the starting weights (before this run's first training step) from "
                           f"{parent / 'best.pt'}, its weights after epoch 1 (step {parent_weights['step']}), "
                           f"the ASGD averages")
    (parent / "best.pt").rename(parent / "moved.pt")         # the weights can no longer be told
    assert evaluate.main([str(parent / "finetune"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["weights"], result["asgd"]) == ("unknown", None)
    assert result["starting_weights"]["unknown"].startswith("it cannot be read now (")


def test_a_relative_init_from_is_found_from_another_folder(small_data, tmp_path, capsys, monkeypatch):
    """A finetuning started as `train.py --finetune run` names its start `run/best.pt`, relative
    to the folder it trained in (sweep.py's plans do so too): evaluate.py run from elsewhere
    finds it above the run directory, where it labelled the weights unknown ("cannot be read")."""
    monkeypatch.chdir(tmp_path)
    assert train.main([str(REPO_ROOT / "configs/ptb/softmax.yaml"),
                       f"data.data_dir={small_data}", *TINY, "train.asgd_trigger=start",
                       "train.epochs=1", "run.dir=run"]) == 0
    assert train.main(["--finetune", "run", "run.max_steps=1"]) == 0
    finetuning = torch.load(tmp_path / "run" / "finetune" / "best.pt", weights_only=True)
    assert finetuning["config"]["train"]["init_from"] == "run/best.pt"
    parent_weights = checkpoint_weights(torch.load(tmp_path / "run" / "best.pt", weights_only=True))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "run" / "finetune"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["weights"], result["asgd"]) == ("averaged", True)
    assert result["starting_weights"] == {"checkpoint": str(tmp_path / "run" / "best.pt"), **parent_weights}


@pytest.mark.parametrize("script, name", [("evaluate", "eval_best.json"), ("rank", "singular_values_test_logp.npy")])
def test_a_full_disk_is_a_failed_write_not_bad_input(script, name, tiny_run, tmp_path, capsys, monkeypatch):
    """A result file that cannot be written (a full disk) is one line and exit 1, as train.py's
    failed writes, not 2, which says the input was bad; nothing is left half-written."""
    import rank
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = sorted(p.name for p in run.iterdir())
    monkeypatch.setattr(os, "fsync", disk_full)
    main = {"evaluate": evaluate.main, "rank": rank.main}[script]
    assert main([str(run), *(["--contexts", "40"] if script == "rank" else [])]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: cannot write {run / name} (No space left on device); {run / name} was not written"
    assert sorted(p.name for p in run.iterdir()) == before
