"""train.py and evaluate.py end to end on a PTB slice with a tiny model (docs/reference.md section 3)."""
from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import evaluate
import train
from data import load_corpus
from data.batching import batchify
from experiment import checkpoint
from experiment.config import load_config
from evaluation.loop import evaluate_nll
from model import ModelOutput, build_model
from model.heads.softmax import SoftmaxHead

PTB = "configs/ptb/softmax.yaml"
REPO = Path(__file__).resolve().parent.parent


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def cli(script: str, *args: str, check_ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, cwd=REPO)
    if check_ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def model_tensors(path: Path) -> dict:
    ckpt = torch.load(path, weights_only=True)
    tensors = dict(ckpt["model"])
    if "optimizer" in ckpt:
        for i, state in ckpt["optimizer"]["state"]["state"].items():
            for key, value in state.items():
                if torch.is_tensor(value):
                    tensors[f"optimizer.{i}.{key}"] = value
    return tensors


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


@pytest.mark.parametrize("config, params, vocab", [
    ("configs/ptb/softmax.yaml", 24_221_600, 10_000),
    ("configs/wt2/softmax.yaml", 33_556_078, 33_278),
])
def test_dry_run_reports_the_papers_parameter_counts(shared_data_dir, config, params, vocab, tmp_path):
    proc = cli("train.py", config, "--dry-run", f"run.dir={tmp_path / 'never'}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["params"] == params and summary["vocab_size"] == vocab
    resolved = yaml.safe_load("\n".join(proc.stdout.strip().splitlines()[:-1]))
    assert resolved["head"]["name"] == "softmax"
    assert not (tmp_path / "never").exists()


@pytest.fixture(scope="module")
def et_run(ptb_slice, tmp_path_factory):
    """Two epochs, ASGD from epoch 2 (ET-ASGD at epoch 1), with small-batch accumulation."""
    run_dir = tmp_path_factory.mktemp("runs") / "et"
    from tests.conftest import TINY
    argv = [PTB, f"data.data_dir={ptb_slice}", *TINY, "train.epochs=2", "train.asgd_switch_epoch=1",
            "train.small_batch_size=2", "run.tensorboard=true", f"run.dir={run_dir}"]
    assert train.main(argv) == 0
    return run_dir


def test_run_directory_contents(et_run):
    assert {"config.yaml", "best.pt", "last.pt", "metrics.jsonl", "tensorboard"} <= {p.name for p in et_run.iterdir()}
    assert any((et_run / "tensorboard").iterdir())
    saved = load_config(et_run / "config.yaml")
    assert saved.train.asgd_switch_epoch == 1 and saved.run.dir == str(et_run)
    for name in ("best.pt", "last.pt"):                 # tensors and plain data only
        ckpt = torch.load(et_run / name, weights_only=True)
        assert ckpt["config"] == saved.to_dict()


def test_et_asgd_switches_after_the_configured_epoch(et_run):
    records = metrics(et_run)
    assert [r["optimizer"] for r in records] == ["SGD", "ASGD"]
    assert records[0].get("switched_to_asgd") and not records[1].get("switched_to_asgd")
    last = torch.load(et_run / "last.pt", weights_only=True)
    assert last["optimizer"]["averaged"] and last["progress"]["asgd_start_epoch"] == 2
    for r in records:
        assert r["seconds"] > 0 and math.isclose(r["val_ppl"], math.exp(r["val_loss"]))
        assert r["cpu_seconds"] > 0       # the epoch's cost, which report.py cost adds up


def test_validation_after_the_switch_uses_the_averaged_weights(et_run, ptb_slice):
    config = load_config(et_run / "config.yaml")
    corpus = load_corpus("ptb", ptb_slice, allow_modified=True)
    last = torch.load(et_run / "last.pt", weights_only=True)
    model = build_model(config, corpus.vocab_size)
    model.load_state_dict(last["model"])
    val = batchify(corpus.valid, config.train.eval_batch_size)
    raw_loss = evaluate_nll(model, val, config.train.bptt)
    params = [p for p in model.parameters()]
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(last["optimizer"]["state"]["state"][i]["ax"])
    averaged_loss = evaluate_nll(model, val, config.train.bptt)
    recorded = metrics(et_run)[-1]["val_loss"]
    assert math.isclose(averaged_loss, recorded, rel_tol=1e-9)
    assert not math.isclose(raw_loss, recorded, rel_tol=1e-6)


def test_evaluate_reproduces_the_best_validation_and_prints_json(et_run):
    proc = cli("evaluate.py", str(et_run), "--json")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    best = min(r["val_loss"] for r in metrics(et_run))
    assert math.isclose(result["val_loss"], best, rel_tol=1e-9)
    assert result["test_batch_size"] == 1 and result["val_batch_size"] == 2
    assert math.isclose(result["test_ppl"], math.exp(result["test_loss"]))
    assert "test ppl" in proc.stdout
    best_record = min(metrics(et_run), key=lambda r: r["val_loss"])
    assert result["epoch"] == best_record["epoch"] and result["step"] == best_record["step"]
    averaged = best_record["optimizer"] == "ASGD"      # validated on the averages after the switch
    assert result["weights"] == ("averaged" if averaged else "raw") and result["epoch_complete"]
    assert f"weights after epoch {best_record['epoch']} (step {best_record['step']})" in proc.stdout
    assert ("the ASGD averages" in proc.stdout) == averaged


def test_evaluate_says_which_epoch_and_which_weights_last_pt_holds(et_run):
    """last.pt of a finished 2-epoch run: the raw weights after epoch 2 (not "epoch 3")."""
    proc = cli("evaluate.py", str(et_run / "last.pt"), "--json")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    last = metrics(et_run)[-1]
    assert (result["epoch"], result["step"], result["epoch_complete"]) == (2, last["step"], True)
    assert result["weights"] == "raw" and result["asgd"]
    assert (f"weights after epoch 2 (step {last['step']}), raw (not the ASGD averages validation "
            f"uses)") in proc.stdout
    saved = json.loads((et_run / "eval_last.json").read_text())
    assert {k: saved[k] for k in ("epoch", "weights")} == {"epoch": 2, "weights": "raw"}


def test_evaluate_on_a_checkpoint_from_within_an_epoch(ptb_slice, tmp_path, tiny_overrides, capsys):
    run_dir = tmp_path / "mid"
    assert train.main([PTB, *tiny_overrides, "run.max_steps=7", f"run.dir={run_dir}"]) == 0
    capsys.readouterr()
    assert evaluate.main([str(run_dir / "last.pt"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["epoch"], result["step"], result["epoch_complete"], result["weights"]) == (1, 7, False, "raw")


def test_tensorboard_says_what_metrics_says(et_run):
    records = metrics(et_run)
    asgd = tensorboard_scalars(et_run, "epoch/asgd")
    assert [value for _, value in asgd] == [float(r["optimizer"] == "ASGD") for r in records] == [0.0, 1.0]
    val_ppl = tensorboard_scalars(et_run, "epoch/val_ppl")
    assert [step for step, _ in val_ppl] == [r["step"] for r in records]
    assert [v for _, v in val_ppl] == pytest.approx([r["val_ppl"] for r in records], rel=1e-6)


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of `tag` as TensorBoard shows it (purged events dropped)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def make_trainer(ptb_slice, tmp_path, *overrides):
    from tests.conftest import TINY
    config = load_config(PTB, [f"data.data_dir={ptb_slice}", *TINY, f"run.dir={tmp_path}", *overrides])
    corpus = load_corpus("ptb", ptb_slice, allow_modified=True)
    torch.manual_seed(0)
    model = build_model(config, corpus.vocab_size)
    return train.Trainer(config, model, corpus, tmp_path, torch.device("cpu"))


def test_nt_asgd_rule(ptb_slice, tmp_path):
    trainer = make_trainer(ptb_slice, tmp_path, "train.asgd_trigger=nt", "train.nonmono=2")
    trainer.progress.val_history = [5.0, 4.0]
    assert not trainer.should_switch_to_asgd(9.0)          # not more than nonmono losses yet
    trainer.progress.val_history = [5.0, 4.0, 3.0]
    assert not trainer.should_switch_to_asgd(4.5)          # better than 5.0, the best but the last 2
    assert trainer.should_switch_to_asgd(5.5)              # worse than every loss before the last 2
    trainer.progress.val_history = [5.0, 3.0, 4.0, 4.5]
    assert trainer.should_switch_to_asgd(3.5)              # best of [5, 3] is 3
    never = make_trainer(ptb_slice, tmp_path, "train.asgd_trigger=never")
    never.progress.val_history = [1.0] * 10
    assert not never.should_switch_to_asgd(100.0)


def test_lr_is_rescaled_by_sequence_length(ptb_slice, tmp_path, monkeypatch):
    """The lr of each step is base lr x seq_len / bptt, and the update takes that lr: a step
    moves a weight by lr times its (clipped) gradient plus weight decay."""
    import train
    trainer = make_trainer(ptb_slice, tmp_path, "train.lr=16")
    trainer.progress.hidden = [trainer.model.init_hidden(4)]
    lengths = iter([4, 8, 12])
    trainer.sampler.sample = lambda: next(lengths)
    seen, moved = [], []
    step = train.step_optimizers
    bias = trainer.model.head.decoder.bias

    def recording(optimizers):
        group = trainer.optimizer.param_groups[0]
        seen.append(group["lr"])
        before, grad = bias.detach().clone(), bias.grad.clone()
        step(optimizers)
        expected = before - group["lr"] * (grad + group["weight_decay"] * before)
        moved.append(torch.allclose(bias.detach(), expected, rtol=0, atol=1e-6))
    monkeypatch.setattr(train, "step_optimizers", recording)
    for _ in range(3):
        trainer.train_step()
    assert seen == [16 * 4 / 8, 16 * 8 / 8, 16 * 12 / 8] and all(moved)
    assert trainer.progress.position == 24 and trainer.progress.step == 3


def test_small_batch_accumulation_is_the_same_maths(ptb_slice, tmp_path):
    no_dropout = ["model.dropout=0", "model.dropouth=0", "model.dropouti=0", "model.dropoute=0", "model.wdrop=0"]
    results = []
    for small in (4, 2, 1):
        trainer = make_trainer(ptb_slice, tmp_path, *no_dropout, f"train.small_batch_size={small}")
        trainer.progress.hidden = [trainer.model.init_hidden(e - s) for s, e in trainer.chunks]
        trainer.sampler.sample = lambda: 8
        for _ in range(3):
            trainer.train_step()
        results.append([p.detach().clone() for p in trainer.model.parameters()])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_regularized_loss_terms():
    torch.manual_seed(0)
    g = torch.randn(5, 2, 3)
    raw = torch.randn(5, 2, 3)
    log_probs = torch.log_softmax(torch.randn(5, 2, 7), -1)
    targets = torch.randint(0, 7, (5, 2))
    target_log_probs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    out = ModelOutput(None, None, [], g, raw, target_log_probs)
    nll, loss = train.regularized_loss(out, alpha=2.0, beta=1.0)
    expected_nll = torch.nn.functional.nll_loss(log_probs.view(-1, 7), targets.view(-1))
    expected = expected_nll + 2.0 * (g ** 2).mean() + ((raw[1:] - raw[:-1]) ** 2).mean()
    torch.testing.assert_close(nll, expected_nll)
    torch.testing.assert_close(loss, expected)


def test_max_steps_and_resume_with_more_steps(ptb_slice, tmp_path, tiny_overrides):
    run_dir = tmp_path / "steps"
    assert train.main([PTB, *tiny_overrides, "run.max_steps=7", f"run.dir={run_dir}"]) == 0
    progress = torch.load(run_dir / "last.pt", weights_only=True)["progress"]
    assert progress["step"] == 7 and progress["epoch"] == 1 and progress["position"] > 0
    assert not (run_dir / "metrics.jsonl").exists()
    assert train.main(["--resume", str(run_dir), "run.max_steps=12"]) == 0
    assert torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"] == 12


def test_run_json_records_the_code_each_sitting_trained_on(tmp_path, tiny_overrides, monkeypatch):
    """run.json names the git commit a run started on (and whether tracked files differed from
    it); a sitting resumed on other code adds an entry from the epoch it took over, the same
    code adds none. Seeds trained months apart on changed code can then be told apart."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    run_dir = tmp_path / "code"
    assert train.main([PTB, *tiny_overrides, "run.max_steps=2", f"run.dir={run_dir}"]) == 0
    code = json.loads((run_dir / "run.json").read_text())["code"]
    assert len(code) == 1 and code[0]["from_epoch"] == 1 and code[0]["commit"] == head
    assert isinstance(code[0]["modified"], bool)
    assert train.main(["--resume", str(run_dir), "run.max_steps=3"]) == 0
    assert json.loads((run_dir / "run.json").read_text())["code"] == code          # the same code
    info = json.loads((run_dir / "run.json").read_text())
    info["code"][0]["commit"] = "0" * 40                                           # as if older code
    (run_dir / "run.json").write_text(json.dumps(info))
    assert train.main(["--resume", str(run_dir), "run.max_steps=4"]) == 0
    code = json.loads((run_dir / "run.json").read_text())["code"]
    assert [entry["commit"] for entry in code] == ["0" * 40, head] and code[1]["from_epoch"] == 1
    # outside a git checkout: the commit is unknown, not an error
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("git")))
    from experiment.loading import code_version
    assert code_version() == {"commit": None}


def test_run_deterministic_trains_with_deterministic_algorithms(tmp_path, tiny_overrides, monkeypatch):
    """run.deterministic: torch's deterministic algorithms, cuBLAS's workspace setting and
    cuDNN without timed algorithm choice, for the whole run (a PLIF head: its own reduction)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen = []
    real_step = train.Trainer.train_step

    def recording_step(self):
        seen.append((torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic))
        return real_step(self)

    monkeypatch.setattr(train.Trainer, "train_step", recording_step)
    try:
        assert train.main([PTB, *tiny_overrides, "head.name=plif", "head.knots=1000", "run.max_steps=2",
                           "run.deterministic=true", f"run.dir={tmp_path / 'det'}"]) == 0
        assert seen == [(True, True)] * 2
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert train.main([PTB, *tiny_overrides, "run.max_steps=1", f"run.dir={tmp_path / 'plain'}"]) == 0
        assert seen[-1] == (False, False)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False


def test_refusals(ptb_slice, tmp_path, tiny_overrides, capsys):
    run_dir = tmp_path / "r"
    assert train.main([PTB, *tiny_overrides, "run.max_steps=2", f"run.dir={run_dir}"]) == 0
    capsys.readouterr()
    # a second run into the same directory
    assert train.main([PTB, *tiny_overrides, "run.max_steps=2", f"run.dir={run_dir}"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    # changing the maths of a run, or its directory, when resuming: refused before the lock is
    # taken, so the directory (its .lock included) is left as it was
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.iterdir()}
    assert train.main(["--resume", str(run_dir), "train.lr=1"]) == 2
    assert "only run.* and data.data_dir can change" in capsys.readouterr().err
    assert train.main(["--resume", str(run_dir), f"run.dir={tmp_path / 'elsewhere'}"]) == 2
    assert "a resumed run stays in" in capsys.readouterr().err
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.iterdir()} == before
    # --resume given a checkpoint file, a missing directory, a run that has saved nothing yet
    assert train.main(["--resume", str(run_dir / "last.pt")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --resume {run_dir / 'last.pt'}: a file; --resume takes "
                                               f"the run directory that holds last.pt ({run_dir})")
    assert train.main(["--resume", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --resume {tmp_path / 'nope'}: no such run directory"
    started = tmp_path / "started"
    started.mkdir()
    (started / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    assert train.main(["--resume", str(started)]) == 2
    assert "this run has not saved one yet" in capsys.readouterr().err
    # a checkpoint whose vocabulary is not the corpus's
    other = tmp_path / "other-data"
    (other / "ptb").mkdir(parents=True)
    for split in ("train", "valid", "test"):
        lines = (ptb_slice / "ptb" / f"{split}.txt").read_text().splitlines(keepends=True)
        (other / "ptb" / f"{split}.txt").write_text("".join(lines[: len(lines) // 2]))
    assert evaluate.main([str(run_dir / "last.pt"), "--data-dir", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert "vocabulary" in err and "\n" not in err
    # a checkpoint whose shapes are not what its config builds
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    ckpt["config"]["model"]["nhid"] = 30
    checkpoint.save_atomic(ckpt, tmp_path / "bad.pt")
    assert evaluate.main([str(tmp_path / "bad.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "has shape" in err and "\n" not in err
    # not a checkpoint at all
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert evaluate.main([str(tmp_path / "junk.pt")]) == 2
    assert f"{tmp_path / 'junk.pt'}: not a PyTorch checkpoint saved by train.py" in capsys.readouterr().err


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(
        ptb_slice, tmp_path, tiny_overrides, monkeypatch, capsys):
    run_dir = tmp_path / "nan"
    target_log_probs = SoftmaxHead.target_log_probs      # what training calls
    calls = {"n": 0}

    def failing_target_log_probs(self, hidden, targets):
        out = target_log_probs(self, hidden, targets)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 12:       # the 12th training forward, i.e. step 12
                return out * float("nan")
        return out

    monkeypatch.setattr(SoftmaxHead, "target_log_probs", failing_target_log_probs)
    code = train.main([PTB, *tiny_overrides, "run.checkpoint_every_steps=5", f"run.dir={run_dir}"])
    assert code == 3
    err = capsys.readouterr().err
    assert "non-finite loss" in err and "step 12" in err
    last = torch.load(run_dir / "last.pt", weights_only=True)
    assert last["progress"]["step"] == 10
    assert all(torch.isfinite(t).all() for t in last["model"].values())


# ---------------------------------------------------------------------- interrupted runs
RESUME_ARGS = ["train.epochs=2", "train.asgd_switch_epoch=1", "train.small_batch_size=2"]


@pytest.fixture(scope="module")
def uninterrupted(ptb_slice, tmp_path_factory):
    from tests.conftest import TINY
    run_dir = tmp_path_factory.mktemp("runs") / "uninterrupted"
    cli("train.py", PTB, f"data.data_dir={ptb_slice}", *TINY, *RESUME_ARGS, f"run.dir={run_dir}")
    return run_dir


def start(run_dir: Path, ptb_slice, *extra) -> subprocess.Popen:
    from tests.conftest import TINY
    return subprocess.Popen([sys.executable, "train.py", PTB, f"data.data_dir={ptb_slice}", *TINY,
                             *RESUME_ARGS, f"run.dir={run_dir}", *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def test_sigkill_at_random_moments_then_resume_is_bit_identical(ptb_slice, tmp_path, uninterrupted):
    run_dir = tmp_path / "killed"
    rng = random.Random(os.getpid())
    proc = start(run_dir, ptb_slice, "run.checkpoint_every_steps=1")
    kills = 0
    while True:
        wait_for(run_dir / "last.pt", proc)
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        proc = subprocess.Popen([sys.executable, "train.py", "--resume", str(run_dir)], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if kills == 3:
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert kills >= 1, "the run finished before it could be killed; the test proved nothing"
    assert_bitwise_equal(model_tensors(run_dir / "last.pt"), model_tensors(uninterrupted / "last.pt"))
    assert_bitwise_equal(model_tensors(run_dir / "best.pt"), model_tensors(uninterrupted / "best.pt"))
    assert [r["val_loss"] for r in metrics(run_dir)][-1] == [r["val_loss"] for r in metrics(uninterrupted)][-1]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sighup_stops_as_sigterm_does_and_a_repeat_is_the_same_request(signum, ptb_slice, tmp_path):
    """SIGHUP (a closed terminal) saves last.pt and stops train.py as SIGTERM does; either one
    twice is one request, not a kill (a scheduler's time limit reaches every process of a job,
    and sweep.py or torchrun above passes it on too)."""
    run_dir = tmp_path / "stopped"
    proc = start(run_dir, ptb_slice, "run.log_interval=1")
    while not proc.stdout.readline().startswith("epoch   1 |"):      # its first step is done
        assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signum)
    time.sleep(0.2)                  # the first one handled (two at once would count as one)
    proc.send_signal(signum)
    err = proc.communicate(timeout=120)[1]
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    step = torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"]
    assert err.strip() == (f"stopped: {name} after step {step}; saved {run_dir / 'last.pt'}; continue "
                           f"with python train.py --resume {run_dir}")


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT])
def test_a_signal_ignored_when_train_py_started_stays_ignored(signum, ptb_slice, tmp_path):
    """`nohup train.py ... &` starts it with SIGHUP ignored, a shell script's `train.py ... &`
    with SIGINT ignored: a closed terminal, or a Ctrl-C meant for the script, must not stop
    a run its user asked to be left alone (train.py's handler used to replace SIG_IGN)."""
    from tests.conftest import TINY
    run_dir = tmp_path / "left-alone"
    proc = subprocess.Popen([sys.executable, "train.py", PTB, f"data.data_dir={ptb_slice}", *TINY,
                             *RESUME_ARGS, "run.log_interval=1", f"run.dir={run_dir}"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signum, signal.SIG_IGN))
    while not proc.stdout.readline().startswith("epoch   1 |"):      # training is under way
        assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1].startswith("done: ")
    assert len(metrics(run_dir)) == 2             # both epochs trained


@pytest.mark.parametrize("signum, line", [
    (signal.SIGINT, "interrupted (Ctrl-C): stopped before the end; run the same command again"),
    (signal.SIGTERM, "stopped (SIGTERM): stopped before the end; run the same command again")])
def test_a_stop_before_training_starts_is_one_line(signum, line, ptb_slice, tmp_path):
    """Ctrl-C or SIGTERM while train.py loads the corpus (or validates a finetuning's starting
    weights), before its own handler is set: one line and 128 + N, as evaluate.py says it (was a
    KeyboardInterrupt traceback, or for SIGTERM a silent death)."""
    from tests.conftest import TINY
    run_dir = tmp_path / "stopped-early"
    script = ("import os, runpy, signal, sys, time\n"
              "import experiment.training_run as training_run\n"
              "def loading(*args, **kwargs):\n"
              f"    os.kill(os.getpid(), {int(signum)})\n"
              "    time.sleep(10)\n"
              "training_run.load_corpus = loading\n"
              "sys.argv = sys.argv[1:]\n"
              "runpy.run_path('train.py', run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", script, "train.py", PTB, f"data.data_dir={ptb_slice}",
                             *TINY, f"run.dir={run_dir}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr.strip()) == (128 + signum, line)
    assert not run_dir.exists()


def test_sighup_from_a_terminal_that_closed_still_saves_and_exits_129(ptb_slice, tmp_path):
    """A closed terminal sends SIGHUP and refuses every later write (EIO): train.py, printing its
    progress bar there, still stops after the step with last.pt saved and exits 128 + 1, its
    output gone to /dev/null (not exit 1, "cannot write", at its next line of output)."""
    import fcntl
    import select
    import struct
    import termios
    import threading
    from tests.conftest import TINY
    run_dir = tmp_path / "in-a-terminal"
    master, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))    # 80 columns
    proc = subprocess.Popen([sys.executable, "train.py", PTB, f"data.data_dir={ptb_slice}", *TINY,
                             *RESUME_ARGS, f"run.dir={run_dir}"], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=terminal, stderr=terminal)
    os.close(terminal)
    seen, closing = [b""], threading.Event()

    def drain():                     # what a terminal does: read, so that no write blocks
        while not closing.is_set():
            if select.select([master], [], [], 0.05)[0]:
                try:
                    seen[0] += os.read(master, 65536)
                except OSError:      # the train.py side is closed: it ended
                    return

    reader = threading.Thread(target=drain)
    reader.start()
    deadline = time.time() + 120
    while b"epoch 1:" not in seen[0]:            # its progress bar: training is under way
        assert proc.poll() is None and time.time() < deadline, seen[0].decode(errors="replace")
        time.sleep(0.02)
    closing.set()
    reader.join()
    os.close(master)                             # the terminal closes...
    proc.send_signal(signal.SIGHUP)              # ...and says so
    assert proc.wait(timeout=120) == 128 + signal.SIGHUP
    assert torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"] > 0


def test_sigterm_saves_a_checkpoint_that_resumes_exactly(ptb_slice, tmp_path, uninterrupted):
    run_dir = tmp_path / "terminated"
    proc = start(run_dir, ptb_slice, "run.checkpoint_every_steps=40")
    wait_for(run_dir / "last.pt", proc)           # training is under way
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped: SIGTERM after step" in err and "--resume" in err
    progress = torch.load(run_dir / "last.pt", weights_only=True)["progress"]
    assert progress["step"] > 0
    cli("train.py", "--resume", str(run_dir))
    assert_bitwise_equal(model_tensors(run_dir / "last.pt"), model_tensors(uninterrupted / "last.pt"))


def test_finetune_starts_from_the_best_model_with_asgd_and_stops_when_not_improving(
        et_run, tmp_path, capsys):
    run_dir = tmp_path / "finetuned"
    code = train.main(["--finetune", str(et_run), "train.epochs=6", "train.nonmono=1",
                       f"run.dir={run_dir}"])
    assert code == 0
    config = load_config(run_dir / "config.yaml")
    assert config.train.asgd_trigger == "start" and config.train.init_from == str(et_run / "best.pt")
    records = metrics(run_dir)
    assert all(r["optimizer"] == "ASGD" for r in records)
    # NT rule with nonmono=1: stop after the first epoch i whose loss is worse than the best
    # of epochs 0..i-2; otherwise run all 6 epochs.
    losses = [r["val_loss"] for r in records]
    fires = [i for i in range(len(losses)) if i > 1 and losses[i] > min(losses[: i - 1])]
    assert len(records) == (fires[0] + 1 if fires else 6)
    assert bool(records[-1].get("early_stop")) == bool(fires)
    assert torch.load(run_dir / "last.pt", weights_only=True)["progress"]["finished"]
    # The first epoch starts from best.pt's weights, not from a fresh init.
    best = torch.load(et_run / "best.pt", weights_only=True)["model"]
    torch.manual_seed(0)
    assert train.main(["--finetune", str(et_run), "run.max_steps=0", f"run.dir={tmp_path / 'f0'}"]) == 2
    assert "run.max_steps: expected a value > 0" in capsys.readouterr().err
    assert train.main(["--finetune", str(et_run), "run.max_steps=1", f"run.dir={tmp_path / 'f1'}"]) == 0
    moved = torch.load(tmp_path / "f1" / "last.pt", weights_only=True)["model"]
    start_diff = (moved["body.encoder.weight"] - best["body.encoder.weight"]).abs().max()
    assert 0 < start_diff < 0.5


def test_finetune_of_a_run_in_use_is_refused(et_run, tmp_path, capsys):
    """A run another process holds (still training, or read by evaluate.py) may replace its
    best.pt: a finetuning begun then would start from weights that are not the run's final ones,
    unsaid. One line, exit 2, nothing written."""
    from experiment.run_directory import RunLock
    run_dir = tmp_path / "finetuned"
    with RunLock(et_run):
        assert train.main(["--finetune", str(et_run), f"run.dir={run_dir}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --finetune {et_run}: the run is in use by another process (training, or "
                   f"evaluate.py or rank.py reading it): finetune it once that has ended, from its final best.pt")
    assert not run_dir.exists()


def test_finetune_keeps_the_starting_weights_as_best_until_an_epoch_beats_them(et_run, tmp_path, capsys):
    """[AWD]/[MoS] finetune.py validate the loaded model first and save only improvements on it:
    a finetuning epoch that makes the model worse must not replace it in finetune/best.pt."""
    start = torch.load(et_run / "best.pt", weights_only=True)
    run_dir = tmp_path / "ruined"
    # lr 2000 with clip 0.25: steps of norm up to 500, which wreck the tiny model.
    assert train.main(["--finetune", str(et_run), "train.lr=2000", "train.epochs=1",
                       f"run.dir={run_dir}"]) == 0
    assert f"starting weights ({et_run / 'best.pt'}): valid ppl {math.exp(start['val_loss']):.2f}" in capsys.readouterr().out
    [record] = metrics(run_dir)
    assert record["val_loss"] > start["val_loss"]
    assert record["best_val_ppl"] == pytest.approx(math.exp(start["val_loss"]), rel=1e-6)
    best = torch.load(run_dir / "best.pt", weights_only=True)
    assert_bitwise_equal(best["model"], start["model"])
    assert (best["epoch"], best["step"], best["averaged"]) == (0, 0, False)
    # stopped before its first validation, it still has a best.pt (the starting weights)
    stopped = tmp_path / "stopped"
    assert train.main(["--finetune", str(et_run), "run.max_steps=1", f"run.dir={stopped}"]) == 0
    out = capsys.readouterr().out
    assert "evaluate with python evaluate.py" in out and "no best.pt yet" not in out
    assert best["val_loss"] == pytest.approx(start["val_loss"], rel=1e-6)
    # An ordinary finetuning epoch (the trained lr) that does beat them replaces them.
    run_dir = tmp_path / "improved"
    assert train.main(["--finetune", str(et_run), "train.epochs=1", f"run.dir={run_dir}"]) == 0
    [record] = metrics(run_dir)
    best = torch.load(run_dir / "best.pt", weights_only=True)
    if record["val_loss"] < start["val_loss"]:
        assert (best["epoch"], best["averaged"]) == (1, True) and best["step"] > 0
        assert best["val_loss"] == pytest.approx(record["val_loss"], rel=1e-6)
    else:
        assert best["step"] == 0
    assert best["val_loss"] == pytest.approx(min(record["val_loss"], start["val_loss"]), rel=1e-6)


def test_finetune_takes_the_trained_configs_finetune_lr(ptb_slice, tmp_path):
    """MoS's README finetunes at lr 25 (PTB) after training at 20; [AWD] at its training lr."""
    assert load_config("configs/ptb/mos.yaml").train.finetune_lr == 25
    assert load_config("configs/wt2/mos.yaml").train.finetune_lr == 20
    assert load_config(PTB).train.finetune_lr is None
    from tests.conftest import TINY
    source = tmp_path / "source"
    assert train.main([PTB, f"data.data_dir={ptb_slice}", *TINY, "train.epochs=1", "train.finetune_lr=7.5",
                       f"run.dir={source}"]) == 0
    assert load_config(source / "config.yaml").train.lr == load_config(PTB).train.lr   # training: train.lr
    assert train.main(["--finetune", str(source), "run.max_steps=1", f"run.dir={tmp_path / 'f'}"]) == 0
    assert load_config(tmp_path / "f" / "config.yaml").train.lr == 7.5
    # A train.lr on the command line still wins.
    assert train.main(["--finetune", str(source), "train.lr=3", "run.max_steps=1",
                       f"run.dir={tmp_path / 'g'}"]) == 0
    assert load_config(tmp_path / "g" / "config.yaml").train.lr == 3
    # a step limit of the trained run (a smoke test's) does not cap its finetuning
    limited = tmp_path / "limited"
    assert train.main([PTB, f"data.data_dir={ptb_slice}", *TINY, "train.epochs=1", "run.max_steps=2",
                       f"run.dir={limited}"]) == 0
    from experiment.run_directory import finetune_config
    assert finetune_config(limited).run.max_steps is None
    assert finetune_config(limited, ["run.max_steps=5"]).run.max_steps == 5
    assert train.main([PTB, f"data.data_dir={ptb_slice}", *TINY, "train.finetune_lr=0", "--dry-run"]) == 2


@pytest.fixture
def restore_float32_flags():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("tf32", [False, True])
def test_run_tf32_sets_the_cudnn_and_matmul_precision(tf32, ptb_slice, tmp_path, tiny_overrides,
                                                      restore_float32_flags):
    """PyTorch's default lets cuDNN LSTMs use TF32; runs are float32 unless asked."""
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = not tf32
    overrides = [f"run.tf32={str(tf32).lower()}"] if tf32 else []
    assert train.main([PTB, *tiny_overrides, *overrides, "--dry-run", f"run.dir={tmp_path}"]) == 0
    assert torch.backends.cudnn.allow_tf32 is tf32 and torch.backends.cuda.matmul.allow_tf32 is tf32


def test_loaded_models_are_evaluated_in_float32(tiny_run, restore_float32_flags):
    from experiment.loading import load_trained
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    load_trained(tiny_run, torch.device("cpu"))
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32


FAULTS_PER_ALLOCATION = """
import resource, sys, threading, torch
from experiment.loading import keep_freed_host_memory, one_heap_for_every_thread
if sys.argv[1] == "keep" and not keep_freed_host_memory():
    sys.exit(3)
if sys.argv[1] == "keep" and sys.argv[2] == "thread" and not one_heap_for_every_thread():
    sys.exit(3)
size = 1400 * 10_000                                  # 56 MB of float32: PTB's V, 1,400 tokens

def allocate(faults):
    for _ in range(10):                               # the heap grows to hold it (on a thread,
        torch.empty(size).fill_(1.0)                  # seen as late as the 7th time)
    for _ in range(10):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        torch.empty(size).fill_(1.0)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

faults = []
if sys.argv[2] == "thread":                           # as a group's members side by side
    worker = threading.Thread(target=allocate, args=(faults,))
    worker.start()
    worker.join()
else:
    allocate(faults)
print(*faults)
"""


def faults_per_allocation(mode: str, where: str = "main") -> list[int] | None:
    """Minor page faults of each of ten allocations of a step's log-probabilities, in a fresh
    process (on its main thread, or on a thread of its own): the heap of this one holds whatever
    the tests before left in it, and a hole too small for the next tensor makes the heap grow (one
    fresh mapping) at a moment no test controls."""
    proc = subprocess.run([sys.executable, "-c", FAULTS_PER_ALLOCATION, mode, where], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode == 3:
        return None
    assert proc.returncode == 0, proc.stderr
    return [int(f) for f in proc.stdout.split()]


@pytest.mark.parametrize("where", ["main", "thread"])
def test_freed_host_memory_stays_in_the_heap_for_the_next_step(where):
    """After keep_freed_host_memory (train.py, evaluate.py, rank.py call it), freeing and
    making again a tensor of the size of a step's log-probabilities costs no page faults: the
    memory is reused, not mapped and zero-filled anew by the kernel (~13,700 faults a tensor of
    4 KiB pages, which is what every allocation costs without it: the check can tell). Also on a
    thread other than the main one, as a group's members step side by side on a CPU, with
    one_heap_for_every_thread (a thread's own glibc arena maps such a tensor anew each time)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt is not available here")
    kept = faults_per_allocation("keep", where)
    if kept is None:
        pytest.skip("glibc's mallopt is not available here")
    assert sum(f < 1000 for f in kept) >= 9, kept     # one growth of the heap at most
    assert all(f > 10_000 for f in faults_per_allocation("default", where)), "the faults are not counted"


@pytest.mark.parametrize("losses, window, gain, expected", [
    ([5.0, 4.0, 3.0], 2, 0.01, False),             # ppl fell by 1 - e^-2 over 2 epochs
    ([5.0, 4.0, 4.0, 3.999], 2, 0.01, True),       # by 0.1%
    ([5.0, 4.0, 4.2, 4.1], 2, 0.01, True),         # not at all: the best is epoch 2's
    ([4.0, 3.0], 2, 0.01, False),                  # fewer than window + 1 epochs
    ([4.0, 4.0, 4.0 - math.log(1 / 0.99) + 1e-9], 2, 0.01, True),   # just under 1%
    ([4.0, 4.0, 4.0 - math.log(1 / 0.99) - 1e-9], 2, 0.01, False),  # just over
])
def test_plateaued_compares_the_best_ppl_with_the_best_window_epochs_ago(losses, window, gain, expected):
    assert train.plateaued(losses[-1], losses[:-1], window, gain) == expected


def test_plateau_stop_ends_training_on_asgd_only_and_is_logged(ptb_slice, tmp_path):
    """plateau_gain 0.99: any epoch with 2 before it (window 2) has improved by less than 99%,
    so the run stops at the first averaged epoch with a window behind it, not on SGD."""
    from tests.conftest import TINY
    run_dir = tmp_path / "plateau"
    argv = [PTB, f"data.data_dir={ptb_slice}", *TINY, "train.epochs=9", "train.asgd_switch_epoch=3",
            "train.plateau_gain=0.99", "train.plateau_window=2", f"run.dir={run_dir}"]
    assert train.main(argv) == 0
    records = metrics(run_dir)
    assert [r["optimizer"] for r in records] == ["SGD", "SGD", "SGD", "ASGD"]
    assert records[-1].get("early_stop") and not any(r.get("early_stop") for r in records[:-1])
    assert torch.load(run_dir / "last.pt", weights_only=True)["progress"]["finished"]


@pytest.mark.parametrize("value", ["0", "1", "-0.1", "1.5"])
def test_impossible_plateau_gain_is_one_line(value, tmp_path, capsys):
    code = train.main([PTB, f"train.plateau_gain={value}", f"run.dir={tmp_path / 'x'}", "--dry-run"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "plateau_gain" in err and "fraction in (0, 1)" in err and len(err.splitlines()) == 1


def test_a_loss_worse_than_a_uniform_guess_is_warned_once(ptb_slice, tmp_path, capsys):
    """A finite training loss above log(V) + 1 (a learned scalar blowing up at lr 20, say) is
    divergence the non-finite check does not see: one warning on stderr, training goes on."""
    import math
    from types import SimpleNamespace
    trainer = make_trainer(ptb_slice, tmp_path)
    uniform = math.log(trainer.vocab["vocab_size"])
    losses = iter([uniform + 0.5, None, uniform + 1.5, uniform + 3.0])
    trainer.display = SimpleNamespace(update=lambda step, position, nll: next(losses))
    trainer.run_log = SimpleNamespace(scalar=lambda *args: None)
    trainer.after_step(0.0)
    trainer.after_step(0.0)
    assert capsys.readouterr().err == ""                    # at the uniform level: a fresh model
    trainer.after_step(0.0)
    trainer.after_step(0.0)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: training loss {uniform + 1.5:.2f} at step ")
    assert f"above log(vocabulary size) + 1 = {uniform + 1:.2f}" in err[0]
