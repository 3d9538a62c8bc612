"""Guard rails of train.py, evaluate.py and rank.py for runs left alone for weeks: nothing
non-finite is written, one process per run directory, resumes that validate before they
write, the corpus meant, one-line refusals that write nothing, progress in log files."""
from __future__ import annotations

import json
import re
import shutil
import signal
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import evaluate
import rank
import train
from data.download import file_sha256
from experiment import checkpoint
from experiment.run_directory import RunLock
from model.heads.softmax import SoftmaxHead
from tests.conftest import TINY, disk_full, enospc_after
from tests.test_train import metrics, tensorboard_scalars, wait_for

PTB = "configs/ptb/softmax.yaml"
REPO_ROOT = Path(__file__).resolve().parent.parent
REPO = Path(__file__).resolve().parent.parent


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def snapshot(run_dir: Path) -> dict:
    """Every file of a run directory with its bytes (the lock file aside)."""
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.fixture
def small(small_data) -> list[str]:
    """TINY on `small_data`: an epoch is ~50 steps."""
    return [f"data.data_dir={small_data}", *TINY]


# ---------------------------------------------------------------------- nothing non-finite
@pytest.mark.parametrize("multi_tensor", [False, True])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), None])
def test_the_weight_checks_are_finite_exactly_when_every_weight_is(multi_tensor, bad):
    """train.extremes both ways (per tensor on a CPU, one multi-tensor reduction on a GPU, run
    here on the CPU): a NaN or an infinity anywhere in any tensor makes a value non-finite, huge
    finite weights do not (nothing overflows)."""
    import math
    weights = [torch.full((3, 4), 3e38), torch.randn(5), torch.randn(2, 2)]
    if bad is not None:
        weights[1][3] = bad
    values = train.extremes(weights, multi_tensor=multi_tensor).tolist()
    assert all(map(math.isfinite, values)) == (bad is None)



def test_a_non_finite_update_after_a_finite_loss_writes_no_checkpoint(small, tmp_path, capsys):
    """lr = 1e30 and a checkpoint every step: step 2's loss is still finite (~1e28), the
    weights after its update are not."""
    run_dir = tmp_path / "huge-lr"
    code = train.main([PTB, *small, "train.lr=1.0e+30", "run.checkpoint_every_steps=1",
                       f"run.dir={run_dir}"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "non-finite weights after the update" in err and "at step 2 (epoch 1)" in err
    assert f"the last checkpoint, {run_dir / 'last.pt'} (within epoch 1, step 1), is untouched" in err
    last = torch.load(run_dir / "last.pt", weights_only=True)
    assert last["progress"]["step"] == 1
    assert all(torch.isfinite(t).all() for t in last["model"].values())


def test_with_epoch_checkpoints_only_the_message_says_none_exists_yet(small, tmp_path, capsys):
    run_dir = tmp_path / "no-checkpoint"
    assert train.main([PTB, *small, "train.lr=1.0e+30", f"run.dir={run_dir}"]) == 3
    assert f"no checkpoint has been written yet (none in {run_dir})" in capsys.readouterr().err
    assert not (run_dir / "last.pt").exists() and not (run_dir / "best.pt").exists()


def after_update(monkeypatch, n: int, action) -> None:
    """Call action(optimizers) right after train.py's n-th optimizer update."""
    real_step, calls = train.step_optimizers, {"n": 0}

    def step(optimizers):
        real_step(optimizers)
        calls["n"] += 1
        if calls["n"] == n:
            action(optimizers)
    monkeypatch.setattr(train, "step_optimizers", step)


def test_the_message_names_the_last_checkpoint_that_exists(small, tmp_path, capsys, monkeypatch):
    """Weights turned infinite by the 5th update, with a checkpoint every 2 steps."""
    run_dir = tmp_path / "diverged"
    def weights_to_infinity(optimizers):
        with torch.no_grad():
            optimizers[0].param_groups[0]["params"][0].mul_(float("inf"))
    after_update(monkeypatch, 5, weights_to_infinity)
    code = train.main([PTB, *small, "run.checkpoint_every_steps=2", f"run.dir={run_dir}"])
    err = capsys.readouterr().err
    assert code == 3 and "non-finite weights after the update" in err and "step 5 " in err
    assert f"the last checkpoint, {run_dir / 'last.pt'} (within epoch 1, step 4), is untouched" in err
    last = torch.load(run_dir / "last.pt", weights_only=True)
    assert last["progress"]["step"] == 4
    assert all(torch.isfinite(t).all() for t in last["model"].values())


@pytest.mark.parametrize("clip", ["0.25", "0"])
def test_a_non_finite_gradient_with_a_finite_loss_stops_the_run(clip, small, tmp_path, capsys,
                                                                  monkeypatch):
    run_dir = tmp_path / f"clip{clip}"
    target_log_probs, calls = SoftmaxHead.target_log_probs, {"n": 0}   # what training calls

    def with_a_bad_gradient(self, hidden, targets):
        out = target_log_probs(self, hidden, targets)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 3:              # step 3: the loss is finite, its gradient is not
                out.register_hook(lambda grad: grad * float("inf"))
        return out

    monkeypatch.setattr(SoftmaxHead, "target_log_probs", with_a_bad_gradient)
    code = train.main([PTB, *small, f"train.clip={clip}", "run.checkpoint_every_steps=1",
                       f"run.dir={run_dir}"])
    err = capsys.readouterr().err
    assert code == 3 and "non-finite gradient norm" in err and "with a finite loss" in err
    assert "at step 3 (epoch 1)" in err and "(within epoch 1, step 2), is untouched" in err
    last = torch.load(run_dir / "last.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in last["model"].values())


def with_a_nan(source: Path, target: Path, key: str = "body.encoder.weight") -> Path:
    ckpt = torch.load(source, weights_only=True)
    ckpt["model"][key][0, 0] = float("nan")
    checkpoint.save_atomic(ckpt, target)
    return target


def test_evaluate_rank_and_resume_refuse_non_finite_weights(small, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "run.max_steps=2", f"run.dir={run_dir}"]) == 0
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    with_a_nan(run_dir / "last.pt", copy / "last.pt")
    capsys.readouterr()
    assert evaluate.main([str(copy / "last.pt"), "--device", "cpu"]) == 2
    assert "non-finite weights (2 of 15 tensors" in one_line_error(capsys)   # the tied pair
    assert rank.main([str(copy / "last.pt"), "--device", "cpu", "--contexts", "20"]) == 2
    assert "body.encoder.weight" in one_line_error(capsys)
    before = snapshot(copy)
    assert train.main(["--resume", str(copy)]) == 2
    assert "non-finite weights" in one_line_error(capsys)
    assert snapshot(copy) == before


# ---------------------------------------------------------------------- one directory, one run

def test_a_second_process_is_refused_and_sigkill_leaves_no_stale_lock(small, tmp_path, capsys):
    run_dir = tmp_path / "busy"
    first = subprocess.Popen([sys.executable, "train.py", PTB, *small, "train.epochs=1000",
                              f"run.dir={run_dir}"],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(run_dir / "config.yaml", first)       # training, no checkpoint yet
        config = (run_dir / "config.yaml").read_bytes()
        # Another seed into the same directory (once trained and wrote config.yaml and run.json)
        assert train.main([PTB, *small, "train.seed=7", "run.max_steps=3", f"run.dir={run_dir}"]) == 2
        assert f"error: {run_dir} is in use by PID {first.pid} (train.py " in one_line_error(capsys)
        wait_for(run_dir / "last.pt", first)           # epoch 1 done
        assert train.main(["--resume", str(run_dir), "run.max_steps=3"]) == 2
        assert f"in use by PID {first.pid}" in one_line_error(capsys)
        assert evaluate.main([str(run_dir / "last.pt"), "--device", "cpu"]) == 2
        assert f"in use by PID {first.pid}" in one_line_error(capsys)
        assert (run_dir / "config.yaml").read_bytes() == config
        assert json.loads((run_dir / "run.json").read_text())["seed"] == 141
        assert not (run_dir / "eval_last.json").exists()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    step = torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"]
    assert train.main(["--resume", str(run_dir), f"run.max_steps={step + 2}"]) == 0
    assert torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"] == step + 2
    assert [r["epoch"] for r in metrics(run_dir)] == list(range(1, len(metrics(run_dir)) + 1))


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_run_dir_that_cannot_be_a_folder_is_one_line(dry_run, small, tmp_path, capsys, monkeypatch):
    """A file, a path under a file, a folder that cannot be made: they were tracebacks (exit 1),
    and --dry-run passed them."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    for run_dir, reason in ((a_file, "a file, not a folder"),
                            (a_file / "sub", f"{a_file} is a file, not a folder")):
        assert train.main([PTB, *small, "run.max_steps=1", f"run.dir={run_dir}", *dry_run]) == 2
        assert one_line_error(capsys) == f"error: run.dir {run_dir}: {reason}; choose another run.dir"
    if not dry_run:
        def read_only(self, *args, **kwargs):
            raise OSError(30, "Read-only file system")
        monkeypatch.setattr(Path, "mkdir", read_only)
        run_dir = tmp_path / "new"
        assert train.main([PTB, *small, "run.max_steps=1", f"run.dir={run_dir}"]) == 2
        assert one_line_error(capsys) == (f"error: run.dir {run_dir}: cannot be made (Read-only file system); "
                                          f"choose another run.dir")
    assert a_file.read_text() == "not a folder"


def test_a_dry_run_refuses_what_the_run_would(small, tmp_path, capsys):
    """--dry-run exited 0 for a train.init_from that is not there, or is a folder, and for a
    run.dir that already holds a run; the run itself refuses each."""
    for init_from, reason in ((tmp_path / "none.pt", "checkpoint not found"), (tmp_path, "is a folder")):
        assert train.main([PTB, *small, f"train.init_from={init_from}", f"run.dir={tmp_path / 'x'}", "--dry-run"]) == 2
        assert reason in one_line_error(capsys)
    run_dir = tmp_path / "held"
    assert train.main([PTB, *small, "run.max_steps=1", f"run.dir={run_dir}"]) == 0
    capsys.readouterr()
    assert train.main([PTB, *small, f"run.dir={run_dir}", "--dry-run"]) == 2
    assert f"{run_dir} already holds a run; continue it with" in one_line_error(capsys)
    # while another process trains there, the run would say so, not "continue it with --resume"
    before = snapshot(run_dir)
    with RunLock(run_dir):
        assert train.main([PTB, *small, f"run.dir={run_dir}", "--dry-run"]) == 2
    assert one_line_error(capsys).startswith(f"error: {run_dir} is in use by PID {os.getpid()} (")
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_size_beyond_memory_is_one_line_naming_the_sizes(dry_run, small, tmp_path, capsys):
    """head.knots with a typo's zeros was the CPU allocator's RuntimeError traceback. 2**60
    knots (4 * 2**60 bytes) are beyond any address space, so no machine tries to fill them."""
    run_dir = tmp_path / "run"
    assert train.main(["configs/ptb/plif.yaml", *small, f"head.knots={2**60}", "head.compile=false",
                       f"run.dir={run_dir}", *dry_run]) == 2
    message = one_line_error(capsys)
    assert message.startswith(f"error: the model does not fit in this machine's memory (building it asked for "
                              f"a tensor of {4 * 2**60:,} bytes): its integer sizes are model.emsize=16 ")
    assert message.endswith(f"head.knots={2**60}; is one too large?")
    assert not run_dir.exists()


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_tensorboard_not_installed_is_one_line_before_anything_is_written(dry_run, small, tmp_path, capsys,
                                                                          monkeypatch):
    """run.tensorboard=true (the full-size configs' default) without TensorBoard was an ImportError
    traceback at the first step, after config.yaml and run.json were written. None in sys.modules
    makes the import fail as a missing package does."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "run.tensorboard=true", "run.max_steps=1", f"run.dir={run_dir}", *dry_run]) == 2
    message = one_line_error(capsys)
    assert message.startswith("error: run.tensorboard=true, but TensorBoard cannot be imported (")
    assert message.endswith("or set run.tensorboard=false")
    assert not run_dir.exists()


def test_the_same_command_again_after_a_run_finished_says_it_has_finished(small, tmp_path, capsys):
    """It said "continue it with python train.py --resume", which for a finished run trains
    nothing; the line names what can be done with it, the directory untouched."""
    run_dir = tmp_path / "finished"
    command = [PTB, *small, "train.epochs=1", f"run.dir={run_dir}"]
    assert train.main(command) == 0
    capsys.readouterr()
    def files():                 # (not .lock, which the refusing process held while it checked)
        return {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != ".lock"}
    before = files()
    assert train.main(command) == 2
    assert one_line_error(capsys) == (
        f"error: {run_dir} already holds a finished run; evaluate it with python evaluate.py {run_dir}, "
        f"train on from its best model with python train.py --finetune {run_dir}, or choose another run.dir")
    assert files() == before


def test_early_stops_that_cannot_act_are_named(small, tmp_path, capsys):
    """train.asgd_trigger=never with an early stop (the miniature's base sets plateau_gain): the
    stops act on ASGD only, so they were silently without effect."""
    argv = [PTB, *small, "train.asgd_trigger=never", "train.plateau_gain=0.01", f"run.dir={tmp_path}", "--dry-run"]
    assert train.main(argv) == 0
    assert ("warning: train.plateau_gain stop a run on ASGD only, and train.asgd_trigger=never never switches "
            "to it: it stops nothing here (the run trains train.epochs epochs)") in capsys.readouterr().err
    assert train.main([*argv, "train.early_stop_nonmono=true"]) == 0
    assert "train.plateau_gain and train.early_stop_nonmono stop a run on ASGD only" in capsys.readouterr().err
    assert train.main([PTB, *small, "train.plateau_gain=0.01", f"run.dir={tmp_path}", "--dry-run"]) == 0
    assert "warning: train.plateau_gain" not in capsys.readouterr().err


def test_a_reader_that_goes_away_does_not_stop_training(small, tmp_path):
    """`train.py ... | head -2`: the pipe closes after two lines; training goes on to the end
    unheard and saves (it stopped at the next progress line, blaming the run directory, with the
    steps since the last checkpoint lost)."""
    run_dir = tmp_path / "piped"
    proc = subprocess.Popen([sys.executable, "train.py", PTB, *small, "train.epochs=2", "run.log_interval=1",
                             f"run.dir={run_dir}"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc.stdout.readline()
    proc.stdout.readline()
    proc.stdout.close()                                    # what `head -2` does
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()
    assert [r["epoch"] for r in metrics(run_dir)] == [1, 2]
    assert torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"] == metrics(run_dir)[-1]["step"]


def test_resume_checks_the_checkpoint_before_writing_anything(small, ptb_slice, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "run.max_steps=2", f"run.dir={run_dir}"]) == 0
    before = snapshot(run_dir)
    capsys.readouterr()
    # ptb_slice has another vocabulary than small_data, the run's corpus
    assert train.main(["--resume", str(run_dir), f"data.data_dir={ptb_slice}",
                       "run.log_interval=3"]) == 2
    assert "vocabulary" in one_line_error(capsys)
    assert snapshot(run_dir) == before           # config.yaml keeps the setting the run has


def test_a_last_pt_of_another_run_is_refused(small, tmp_path, capsys):
    runs = {}
    for name, extra in (("a", ["train.seed=1"]), ("b", ["train.seed=2"]),
                        ("c", ["train.seed=1", "head.name=ss", "head.compile=false"])):
        runs[name] = tmp_path / name
        assert train.main([PTB, *small, *extra, "run.max_steps=1", f"run.dir={runs[name]}"]) == 0
    capsys.readouterr()
    for other, complaint in (("b", "seed is 2 in the checkpoint but 1 in"),
                             ("c", "head is 'ss' in the checkpoint but 'softmax' in")):
        shutil.copy(runs[other] / "last.pt", runs["a"] / "last.pt")
        before = snapshot(runs["a"])
        assert train.main(["--resume", str(runs["a"])]) == 2
        err = one_line_error(capsys)
        assert complaint in err and str(runs["a"] / "run.json") in err
        assert snapshot(runs["a"]) == before


def test_resume_refuses_another_run_dir_and_a_best_pt(small, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "train.epochs=1", f"run.dir={run_dir}"]) == 0
    capsys.readouterr()
    assert train.main(["--resume", str(run_dir), f"run.dir={tmp_path / 'elsewhere'}"]) == 2
    assert f"a resumed run stays in {run_dir}" in one_line_error(capsys)
    assert not (tmp_path / "elsewhere").exists()
    # a finished run resumed says it is finished (it read "resumed at epoch 2" for a 1-epoch run)
    # and writes nothing: it rewrote config.yaml (with the sitting's run.* overrides), run.json's
    # code and a TensorBoard file of no events
    before = snapshot(run_dir)
    assert train.main(["--resume", str(run_dir), "run.tensorboard=true", "run.log_interval=3"]) == 0
    out = capsys.readouterr().out
    assert "| resumed: finished after epoch 1, step " in out and "done: " in out
    assert snapshot(run_dir) == before
    shutil.copy(run_dir / "best.pt", run_dir / "last.pt")      # a user's attempt to go back
    assert train.main(["--resume", str(run_dir)]) == 2
    assert "a 'best' checkpoint, not a 'last' one" in one_line_error(capsys)
    # the folder holding the runs (a plan's out), given in place of one run: named as such
    assert train.main(["--resume", str(tmp_path)]) == 2
    assert one_line_error(capsys).endswith(f"--resume {tmp_path}: a folder of runs, not a run directory (it "
                                           f"holds run); give one run's directory, or continue a plan's runs "
                                           f"with sweep.py PLAN")


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_new_run_in_a_folder_of_runs_is_refused_and_writes_nothing(dry_run, tiny_run, tmp_path, small, capsys):
    """run.dir=runs (meant as "under runs/") trained a run into the folder holding the other runs,
    its last.pt and config.yaml among their folders; the folder is named as --resume names it."""
    runs = tmp_path / "runs"
    shutil.copytree(tiny_run, runs / "ptb-softmax")
    (runs / "notes.txt").write_text("mine")
    before = snapshot(runs)
    assert train.main([PTB, *small, "run.max_steps=1", f"run.dir={runs}", *dry_run]) == 2
    assert one_line_error(capsys) == (f"error: run.dir {runs}: a folder of runs, not a run directory (it holds "
                                      f"ptb-softmax); give the run a folder of its own, e.g. run.dir={runs / 'NAME'}")
    assert snapshot(runs) == before and not (runs / ".lock").exists()


def test_a_finetuning_into_the_run_it_finetunes_is_refused_naming_where_it_goes(tiny_run, capsys):
    """--finetune RUN run.dir=RUN said RUN "already holds a finished run; ... train on from its best
    model with python train.py --finetune RUN", the command just given."""
    before = snapshot(tiny_run)
    assert train.main(["--finetune", str(tiny_run), f"run.dir={tiny_run}/"]) == 2
    assert one_line_error(capsys) == (f"error: run.dir={tiny_run}/: the run being finetuned; a finetuning is a run "
                                      f"of its own, written into {tiny_run / 'finetune'} unless run.dir names "
                                      f"another folder")
    assert snapshot(tiny_run) == before


def test_init_from_a_run_of_another_head_or_size_names_the_settings_that_differ(tiny_run, small, tmp_path, capsys):
    """A checkpoint of another head or size was refused with its missing keys or a mismatched
    shape only; the line now ends with the settings that make the models differ."""
    from tests.conftest import head_overrides
    init = f"train.init_from={tiny_run / 'best.pt'}"
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "model.emsize=8", "model.nhidlast=8", init, f"run.dir={run_dir}"]) == 2
    assert one_line_error(capsys).endswith("in the model the config builds; it is of a run with model.emsize=16 "
                                           "model.nhidlast=16, this config has model.emsize=8 model.nhidlast=8")
    assert train.main([PTB, *small, *head_overrides("mos"), init, f"run.dir={run_dir}"]) == 2
    assert one_line_error(capsys).endswith("; it is of a run with head.name=softmax model.nhidlast=16, this config "
                                           "has head.name=mos model.nhidlast=12")
    assert not run_dir.exists()


def test_a_resume_on_a_modified_corpus_does_not_suggest_allowing_it(small, small_data, tmp_path, capsys, monkeypatch):
    """A run on the published text resumed on a modified one was told to "set
    data.allow_modified_corpus=true", which --resume then refused as a change of a fixed key. Here
    `small_data` stands for the published corpus while the run starts, and is a modified one after."""
    from data import download
    published = {f"{split}.txt": file_sha256(small_data / "ptb" / f"{split}.txt") for split in ("train", "valid", "test")}
    run_dir = tmp_path / "run"
    with monkeypatch.context() as as_published:
        as_published.setitem(download.CHECKSUMS, "ptb", published)
        assert train.main([PTB, *small, "data.allow_modified_corpus=false", "run.max_steps=1", f"run.dir={run_dir}"]) == 0
    capsys.readouterr()
    before = snapshot(run_dir)
    assert train.main(["--resume", str(run_dir), "run.max_steps=2"]) == 2
    message = one_line_error(capsys)
    assert message.startswith(f"error: {small_data / 'ptb' / 'train.txt'}: ") and message.endswith("; restore the file")
    assert snapshot(run_dir) == before


class Killed(BaseException):
    """Stands for SIGKILL: nothing in train.py handles it."""


@pytest.mark.parametrize("every", [None, 1, 7])
def test_after_a_crash_metrics_and_tensorboard_hold_each_epoch_once(every, small, tmp_path,
                                                                    monkeypatch):
    """Killed after epoch 1's metrics line and TensorBoard scalars, before its last.pt."""
    argv = [PTB, *small, "train.epochs=2", "run.tensorboard=true", "run.log_interval=5",
            *([f"run.checkpoint_every_steps={every}"] if every else [])]
    straight = tmp_path / "straight"
    assert train.main([*argv, f"run.dir={straight}"]) == 0
    run_dir = tmp_path / "crashed"
    save_last = train.Trainer.save_last

    def save_last_then_die(self):
        if self.progress.epoch == 2 and self.progress.position == 0:     # the save that ends epoch 1
            raise Killed
        save_last(self)

    monkeypatch.setattr(train.Trainer, "save_last", save_last_then_die)
    with pytest.raises(Killed):
        train.main([*argv, f"run.dir={run_dir}"])
    monkeypatch.undo()
    assert [r["epoch"] for r in metrics(run_dir)] == [1]
    if every:                                      # continue from the last step checkpoint
        assert train.main(["--resume", str(run_dir)]) == 0
    else:                                          # nothing saved yet: the same command again
        assert train.main([*argv, f"run.dir={run_dir}"]) == 0
    assert [r["epoch"] for r in metrics(run_dir)] == [1, 2]
    assert [r["val_loss"] for r in metrics(run_dir)] == [r["val_loss"] for r in metrics(straight)]
    for tag in ("epoch/val_ppl", "epoch/asgd", "epoch/train_ppl"):
        assert tensorboard_scalars(run_dir, tag) == tensorboard_scalars(straight, tag), tag
    # Each logged step once (the first mean after a resume covers only the steps since it).
    steps = [step for step, _ in tensorboard_scalars(run_dir, "train/step_loss")]
    assert steps == [step for step, _ in tensorboard_scalars(straight, "train/step_loss")]


def test_metrics_are_cut_to_the_completed_epochs_and_to_whole_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1}\n{"epoch": 2}\n{"epoch": 3, "val_lo')    # the disk filled up
    train.keep_epochs(path, completed=5)
    assert path.read_text() == '{"epoch": 1}\n{"epoch": 2}\n'
    train.keep_epochs(path, completed=1)
    assert path.read_text() == '{"epoch": 1}\n'
    train.keep_epochs(path, completed=0)
    assert path.read_text() == ""


def test_disk_full_while_checkpointing_is_one_line_and_keeps_the_last_checkpoint(
        small, tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "full"
    real_save, full, calls = torch.save, enospc_after(4096), {"n": 0}

    def save(obj, f):                      # the first last.pt fits, the second does not
        calls["n"] += 1
        (real_save if calls["n"] == 1 else full)(obj, f)

    monkeypatch.setattr(torch, "save", save)
    code = train.main([PTB, *small, "run.checkpoint_every_steps=3", f"run.dir={run_dir}"])
    assert code == 1
    err = one_line_error(capsys)
    path = run_dir / "last.pt"
    assert err == (f"error: cannot write {path} (No space left on device); {path} is as it was; "
                   f"training stopped at step 6")
    assert torch.load(path, weights_only=True)["progress"]["step"] == 3
    assert not [p.name for p in run_dir.iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize("full", ["text", "checkpoint"])
def test_disk_full_as_the_run_starts_is_exit_code_1_not_bad_input(full, small, tiny_run, tmp_path, capsys,
                                                                  monkeypatch):
    """The first files a run writes (config.yaml; a run from trained weights, best.pt holding
    them before the first step) on a full disk: exit code 1, a write failed, as while training
    (it was 2, bad input, which a script would not retry)."""
    run_dir = tmp_path / "full"
    argv = [PTB, *small, f"run.dir={run_dir}"]
    if full == "text":
        written = run_dir / "config.yaml"
        monkeypatch.setattr(os, "fsync", disk_full)
    else:
        written = run_dir / "best.pt"
        argv.append(f"train.init_from={tiny_run / 'best.pt'}")
        monkeypatch.setattr(torch, "save", enospc_after(0))
    assert train.main(argv) == 1
    assert one_line_error(capsys) == (f"error: cannot write {written} (No space left on device); "
                                      f"{written} was not written")
    assert not (run_dir / "last.pt").exists()


def test_temporaries_left_by_a_killed_write_are_removed_at_the_next_start(small, tmp_path):
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "run.max_steps=2", f"run.dir={run_dir}"]) == 0
    orphans = [run_dir / f".last.pt.tmp{12345}", run_dir / ".best.pt.tmp7"]
    for orphan in orphans:
        orphan.write_bytes(b"the first half of a checkpoint")
    assert train.main(["--resume", str(run_dir), "run.max_steps=3"]) == 0
    assert not any(p.exists() for p in orphans)


# ---------------------------------------------------------------------- the corpus meant

def test_a_modified_corpus_needs_the_config_key_which_the_config_records(ptb_slice, tmp_path, capsys):
    refused = tmp_path / "refused"
    tiny = [o for o in TINY if not o.startswith("data.allow_modified_corpus")]
    assert train.main([PTB, f"data.data_dir={ptb_slice}", *tiny, "run.max_steps=1",
                       f"run.dir={refused}"]) == 2
    err = one_line_error(capsys)
    assert f"{ptb_slice / 'ptb' / 'train.txt'}: " in err and "expected 929,589 tokens" in err
    assert not refused.exists()
    accepted = tmp_path / "accepted"
    assert train.main([PTB, f"data.data_dir={ptb_slice}", *tiny, "data.allow_modified_corpus=true",
                       "run.max_steps=1", f"run.dir={accepted}"]) == 0
    assert "allow_modified_corpus: true" in (accepted / "config.yaml").read_text()


def other_text_same_words(small_data: Path, root: Path, split: str) -> Path:
    """A copy of small_data whose `split` has lines of train.txt added: other text, the same
    vocabulary (every added word is already in train.txt), so the vocabulary check passes it."""
    shutil.copytree(small_data, root)
    train_lines = (small_data / "ptb" / "train.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    with open(root / "ptb" / f"{split}.txt", "a", encoding="utf-8") as f:
        f.writelines(train_lines[:20])
    return root


def test_a_run_resumes_only_on_the_text_it_trained_on(small_data, tmp_path, capsys):
    """A modified corpus of the same words passed the vocabulary check: a run resumed on other
    training text trained its later epochs on it, recorded as one corpus. run.json keeps the
    hashes; other text is refused, a copy of the same text in another folder is not."""
    run_dir = tmp_path / "run"
    assert train.main([PTB, f"data.data_dir={small_data}", *TINY, "run.max_steps=2", f"run.dir={run_dir}"]) == 0
    recorded = json.loads((run_dir / "run.json").read_text())["corpus"]
    assert recorded["published"] is False and recorded["folder"] == str(small_data / "ptb")
    assert recorded["sha256"]["train"] == file_sha256(small_data / "ptb" / "train.txt")
    capsys.readouterr()
    for split in ("train", "valid"):
        other = other_text_same_words(small_data, tmp_path / f"other-{split}", split)
        before = snapshot(run_dir)
        assert train.main(["--resume", str(run_dir), f"data.data_dir={other}", "run.max_steps=4"]) == 2
        err = one_line_error(capsys)
        assert f"{run_dir}: the run trained on other text: {split}.txt (sha256 " in err
        assert f"in {other / 'ptb'}, " in err and f"in {small_data / 'ptb'} at training)" in err
        assert snapshot(run_dir) == before
    same = tmp_path / "same-text"
    shutil.copytree(small_data, same)
    assert train.main(["--resume", str(run_dir), f"data.data_dir={same}", "run.max_steps=3"]) == 0


def test_a_vocabulary_of_as_many_other_words_is_named_as_such(tiny_run, small_data, tmp_path, capsys):
    """valid.txt and test.txt swapped: the same words numbered in another order. The message
    said "(N words) is not the vocabulary ... (N words)"."""
    swapped = tmp_path / "swapped"
    shutil.copytree(small_data, swapped)
    for split, other in (("valid", "test"), ("test", "valid")):
        shutil.copy(small_data / "ptb" / f"{other}.txt", swapped / "ptb" / f"{split}.txt")
    assert evaluate.main([str(tiny_run), "--device", "cpu", "--data-dir", str(swapped)]) == 2
    err = one_line_error(capsys)
    assert "words, as many but other words or in another order (vocabulary sha256 " in err


def test_a_relative_data_dir_is_kept_as_the_folder_it_named(small_data, tmp_path, monkeypatch):
    """config.yaml is read again from other working directories (evaluate.py, rank.py, --resume):
    a data.data_dir kept as typed named other folders there."""
    monkeypatch.chdir(small_data.parent)
    run_dir = tmp_path / "run"
    assert train.main([str(REPO_ROOT / PTB), f"data.data_dir={small_data.name}", *TINY, "run.max_steps=1",
                       f"run.dir={run_dir}"]) == 0
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["data_dir"] == str(small_data)


@pytest.fixture
def empty_valid(small_data, tmp_path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(small_data, root)
    (root / "ptb" / "valid.txt").write_text("")
    return root


@pytest.mark.parametrize("case, overrides, expected", [
    ("empty valid", ["train.epochs=1"], "valid.txt: 0 tokens, too few for train.eval_batch_size=2"),
    ("train", ["train.batch_size=100000"], "train.txt: "),
    ("test", ["train.test_batch_size=100000"], "too few for train.test_batch_size=100000"),
])
def test_splits_too_short_are_one_line_before_anything_is_written(case, overrides, expected, small,
                                                                   small_data, empty_valid,
                                                                   tmp_path, capsys):
    data_dir = empty_valid if case == "empty valid" else small_data
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, f"data.data_dir={data_dir}", *overrides,
                       f"run.dir={run_dir}"]) == 2
    assert expected in one_line_error(capsys)
    assert not run_dir.exists()


def test_evaluate_batch_sizes_too_large_are_one_line(small, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "run.max_steps=1", f"run.dir={run_dir}"]) == 0
    capsys.readouterr()
    assert evaluate.main([str(run_dir / "last.pt"), "--test-batch-size", "100000"]) == 2
    assert "test.txt: " in one_line_error(capsys)
    assert not list(run_dir.glob("eval_*"))


# ---------------------------------------------------------------------- one-line refusals

@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.mark.parametrize("override, expected", [
    ("run.device=cuda:abc", "run.device: expected auto, cpu, mps, cuda or cuda:N"),
    ("run.device=mps", "run.device: 'mps' requested but the Apple MPS backend is not available"),
    ("run.device=cuda:1", "run.device: 'cuda:1' requested but CUDA is not available here"),
])
def test_unusable_devices_are_one_line_and_write_nothing(override, expected, small, tmp_path,
                                                         capsys, no_gpu):
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, override, f"run.dir={run_dir}"]) == 2
    assert expected in one_line_error(capsys)
    assert not run_dir.exists()


def test_config_paths_that_are_no_yaml_files_are_one_line(small, tmp_path, capsys):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(Path(PTB).read_bytes() + "# déjà vu\n".encode("latin-1"))
    for config, expected in ((tmp_path, "is a directory"), (latin1, "not UTF-8 text")):
        assert train.main([str(config), *small, f"run.dir={tmp_path / 'run'}"]) == 2
        assert f"error: {config}: {expected}" in one_line_error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("script", [evaluate, rank])
@pytest.mark.parametrize("device, expected", [
    ("gpu", "--device: expected auto, cpu, mps, cuda or cuda:N"),
    ("cuda:0", "--device: 'cuda:0' requested but CUDA is not available"),
])
def test_evaluate_and_rank_check_the_device(script, device, expected, small, tmp_path, capsys, no_gpu):
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "run.max_steps=1", f"run.dir={run_dir}"]) == 0
    before = snapshot(run_dir)
    capsys.readouterr()
    assert script.main([str(run_dir / "last.pt"), "--device", device]) == 2
    assert expected in one_line_error(capsys)
    assert snapshot(run_dir) == before


# ---------------------------------------------------------------------- progress

LINE = re.compile(r"epoch +1 \| +\d+/ +\d+ batches \| step +(\d+) \| +[\d.]+ ms/step \| +[\d,]+ tok/s \| "
                  r"loss +[\d.]+ \| ppl +[\d.]+ \| lr 20 \| left: epoch \d+:\d\d:\d\d, run \d+:\d\d:\d\d")


def test_a_log_file_gets_a_progress_line_every_log_interval(small, tmp_path, capsys):
    assert train.main([PTB, *small, "run.log_interval=4", "run.max_steps=21",
                       f"run.dir={tmp_path / 'run'}"]) == 0
    out = capsys.readouterr().out             # captured: not a terminal, as in a log file
    steps = [int(m.group(1)) for m in map(LINE.fullmatch, out.splitlines()) if m]
    assert steps == [4, 8, 12, 16, 20]


def test_in_a_terminal_the_bar_counts_real_tokens(small, small_data, tmp_path, monkeypatch):
    import tqdm
    bars, close = [], tqdm.tqdm.close

    def record_and_close(self):
        if not getattr(self, "recorded", False):
            self.recorded = True
            bars.append((self.n, self.total, self.unit))
        close(self)

    monkeypatch.setattr(tqdm.tqdm, "close", record_and_close)
    for stream in (sys.stdout, sys.stderr):            # a terminal
        monkeypatch.setattr(stream, "isatty", lambda: True)
    run_dir = tmp_path / "tty"
    assert train.main([PTB, *small, "run.max_steps=7", f"run.dir={run_dir}"]) == 0
    monkeypatch.undo()
    batch, position = 4, torch.load(run_dir / "last.pt", weights_only=True)["progress"]["position"]
    tokens = sum(len(line.split()) + 1 for line in (small_data / "ptb" / "train.txt").open())
    rows = tokens // batch
    assert ("train.batch_size=4" in TINY) and bars[0] == (position * batch, (rows - 2) * batch, "tok")


def test_training_on_the_cpu_by_default_warns_once(small, tmp_path, capsys, no_gpu):
    big = ["model.emsize=400", "model.nhidlast=400", "model.nhid=400", "run.max_steps=1"]
    assert train.main([PTB, *small, *big, "run.device=auto", f"run.dir={tmp_path / 'a'}"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "found no usable CUDA GPU" in warnings[0] and "trains on the CPU" in warnings[0]
    assert "times slower than on a GPU" in warnings[0] and "min an epoch" in warnings[0]
    for argv in ([*big, "run.device=cpu"], ["run.device=auto", "run.max_steps=1"]):   # chosen; small
        assert train.main([PTB, *small, *argv, f"run.dir={tmp_path / str(len(argv))}"]) == 0
        assert "warning" not in capsys.readouterr().err


# ---------------------------------------------------------------------- rank.py

def test_rank_says_which_epochs_weights_it_ranked_and_whether_averaged(small, tmp_path, capsys):
    """As evaluate.py: best.pt after averaging from the first step holds the ASGD averages,
    last.pt the raw weights; both after epoch 1, not "epoch 2"."""
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "train.asgd_trigger=start", "train.epochs=1",
                       f"run.dir={run_dir}"]) == 0
    step = metrics(run_dir)[-1]["step"]
    for name, weights, words in (
            ("best.pt", "averaged", f"weights after epoch 1 (step {step}), the ASGD averages"),
            ("last.pt", "raw", f"weights after epoch 1 (step {step}), raw (not the ASGD averages")):
        capsys.readouterr()
        assert rank.main([str(run_dir / name), "--contexts", "20", "--device", "cpu", "--json"]) == 0
        out = capsys.readouterr().out.strip().splitlines()
        result = json.loads(out[-1])
        assert (result["epoch"], result["step"], result["epoch_complete"], result["weights"]) == (
            1, step, True, weights)
        assert words in out[0]
        assert json.loads((run_dir / "rank_test.json").read_text())["weights"] == weights


# ---------------------------------------------------------------------- rank.py --plot

def test_rank_plot_refuses_computing_options_and_writes_next_to_the_runs(small, tmp_path,
                                                                         monkeypatch, capsys):
    runs = []
    for seed in (1, 2):
        run_dir = tmp_path / "runs" / f"seed{seed}"
        assert train.main([PTB, *small, f"train.seed={seed}", "run.max_steps=1",
                           f"run.dir={run_dir}"]) == 0
        assert rank.main([str(run_dir / "last.pt"), "--contexts", "30", "--device", "cpu"]) == 0
        runs.append(run_dir)
    capsys.readouterr()
    for option in (["--contexts", "2000"], ["--dtype", "float64"], ["--split", "valid"], ["--json"]):
        with pytest.raises(SystemExit) as info:
            rank.main(["--plot", str(runs[0]), *option])
        assert info.value.code == 2
        assert f"{option[0]} belongs to computing ranks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rank.main([str(runs[0]), "--out", "x.png"])
    assert "--out belongs to --plot" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert rank.main(["--plot", str(runs[0])]) == 0
    assert (runs[0] / "spectra.png").is_file()
    assert rank.main(["--plot", *map(str, runs)]) == 0
    assert (tmp_path / "runs" / "spectra.png").is_file()
    assert not (tmp_path / "spectra.png").exists()


def test_report_checks_the_device_too(small, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train.main([PTB, *small, "run.max_steps=1", f"run.dir={run_dir}"]) == 0
    capsys.readouterr()
    import report
    assert report.main(["top5", str(run_dir), "--positions", "3", "--device", "gpu"]) == 2
    assert "--device: expected auto, cpu, mps, cuda or cuda:N (N a GPU index), got 'gpu'" in one_line_error(capsys)


# ---------------------------------------------------------------------- what the messages say

@pytest.fixture(scope="module")
def stopped_early(small_data, tmp_path_factory) -> Path:
    """A run stopped by run.max_steps before its first validation: last.pt, no best.pt."""
    run_dir = tmp_path_factory.mktemp("early") / "run"
    assert train.main([PTB, f"data.data_dir={small_data}", *TINY, "run.max_steps=3",
                       f"run.dir={run_dir}"]) == 0
    return run_dir


def not_a_checkpoint_files(folder: Path, stopped_early: Path) -> dict[str, tuple[Path, str]]:
    """Files that are no checkpoint of train.py, each with what the message must say of it."""
    folder.mkdir(exist_ok=True)
    text, empty, truncated, listed = (folder / n for n in ("notes.txt", "empty.pt", "cut.pt", "list.pt"))
    text.write_text("epoch 1 loss 2\n")      # torch's unpickler: "pop from empty list"
    empty.write_bytes(b"")
    whole = (stopped_early / "last.pt").read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2])
    torch.save([1, 2], listed)
    expected = "expected the best.pt or last.pt of a run directory"
    return {"text": (text, f"{text}: not a PyTorch checkpoint saved by train.py; {expected}"),
            "empty": (empty, f"{empty}: an empty file, not a checkpoint saved by train.py; {expected}"),
            "truncated": (truncated, f"{truncated}: a truncated or damaged PyTorch file (its zip "
                                     f"archive is incomplete"),
            "another PyTorch file": (listed, f"{listed}: a PyTorch file, but not a checkpoint saved "
                                             f"by train.py (no format 'awd-lstm-heads/1' in it); {expected}")}


@pytest.mark.parametrize("kind", ["text", "empty", "truncated", "another PyTorch file"])
def test_a_file_that_is_no_checkpoint_is_named_for_what_it_is(kind, stopped_early, tmp_path, capsys):
    path, message = not_a_checkpoint_files(tmp_path, stopped_early)[kind]
    assert evaluate.main([str(path), "--device", "cpu"]) == 2
    err = one_line_error(capsys)
    assert err == f"error: {message}" or err.startswith(f"error: {message}"), err
    assert "pop from empty list" not in err and "readable" not in err


def test_every_command_that_reads_a_checkpoint_says_a_text_file_is_none(small, stopped_early, tmp_path,
                                                                         capsys):
    import generate
    text = tmp_path / "notes.txt"
    text.write_text("epoch 1 loss 2\n")
    message = f"{text}: not a PyTorch checkpoint saved by train.py"
    resumed = tmp_path / "resumed"
    shutil.copytree(stopped_early, resumed)
    shutil.copy(text, resumed / "last.pt")
    commands = {"evaluate.py": lambda: evaluate.main([str(text), "--device", "cpu"]),
                "generate.py": lambda: generate.main([str(text)]),
                "rank.py": lambda: rank.main([str(text), "--device", "cpu"]),
                "train.init_from": lambda: train.main([PTB, *small, f"train.init_from={text}",
                                                       f"run.dir={tmp_path / 'init'}"]),
                "--resume": lambda: train.main(["--resume", str(resumed)])}
    capsys.readouterr()
    for name, command in commands.items():
        assert command() == 2, name
        err = one_line_error(capsys)
        expected = message.replace(str(text), str(resumed / "last.pt")) if name == "--resume" else message
        assert expected in err and "pop from empty list" not in err, (name, err)
        assert err.startswith("error: train.init_from: ") == (name == "train.init_from"), err
    assert train.main(["--finetune", str(text)]) == 2          # it takes a run directory
    assert f"--finetune {text}: not a run directory" in one_line_error(capsys)
    # and train.init_from a checkpoint, which a run directory given there is pointed to
    assert train.main([PTB, *small, f"train.init_from={stopped_early}", f"run.dir={tmp_path / 'init2'}"]) == 2
    assert one_line_error(capsys) == (f"error: train.init_from: {stopped_early} is a folder; give a checkpoint "
                                      f"file, e.g. {stopped_early / 'best.pt'}")


def test_a_run_stopped_before_its_first_validation_points_to_its_last_pt(stopped_early, tmp_path,
                                                                         capsys):
    import generate
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_early, run_dir)
    last = run_dir / "last.pt"
    for name, command in (("evaluate.py", evaluate.main), ("generate.py", generate.main),
                          ("rank.py", rank.main)):
        extra = ["--words", "5"] if name == "generate.py" else ["--device", "cpu"]
        assert command([str(run_dir), *extra]) == 2, name
        err = one_line_error(capsys)
        assert err == (f"error: {run_dir}: the run has no validated model yet (train.py writes "
                       f"best.pt when it first validates, at the end of epoch 1); {last}, the "
                       f"weights where training stands, can be given instead"), err
        assert command([str(last), *extra]) == 0, name        # and it can
        capsys.readouterr()
    assert train.main(["--finetune", str(run_dir)]) == 2
    assert (f"--finetune {run_dir}: the run has no validated model yet (no best.pt, which "
            f"finetuning starts from") in one_line_error(capsys)


def test_run_max_steps_says_whether_there_is_a_best_pt_yet(small, tmp_path, capsys):
    early, later = tmp_path / "early", tmp_path / "later"
    assert train.main([PTB, *small, "run.max_steps=3", f"run.dir={early}"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == (f"stopped: run.max_steps=3 reached (step 3, epoch 1 of 500), before the first "
                    f"validation, so there is no best.pt yet; continue with python train.py --resume "
                    f"{early} run.max_steps=null (or a larger run.max_steps), or evaluate the weights "
                    f"where it stands with python evaluate.py {early / 'last.pt'}")
    # the continuation the line names trains on (a plain --resume would stop at step 3 again)
    assert train.main(["--resume", str(early), "run.max_steps=5"]) == 0
    assert torch.load(early / "last.pt", weights_only=True)["progress"]["step"] == 5
    capsys.readouterr()
    assert train.main([PTB, *small, "run.max_steps=60", f"run.dir={later}"]) == 0    # an epoch is ~50
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("stopped: run.max_steps=60 reached (step 60, epoch 2 of 500); best valid ppl ")
    assert line.endswith(f"; evaluate with python evaluate.py {later} (its best.pt), or continue "
                         f"with python train.py --resume {later} run.max_steps=null (or a larger "
                         f"run.max_steps)")


def test_a_signal_stop_names_the_signal_once(small, tmp_path, capsys, monkeypatch):
    """SIGTERM sent to this process during step 3: the step ends, last.pt is saved, one line."""
    import os
    run_dir = tmp_path / "run"
    after_update(monkeypatch, 3, lambda optimizers: os.kill(os.getpid(), signal.SIGTERM))
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        assert train.main([PTB, *small, f"run.dir={run_dir}"]) == 128 + signal.SIGTERM
    finally:          # stopped, train.py ignores SIGTERM and SIGHUP on its way out: not this process
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert capsys.readouterr().err.strip() == (
        f"stopped: SIGTERM after step 3; saved {run_dir / 'last.pt'}; continue with python train.py "
        f"--resume {run_dir}")
    assert torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"] == 3


def test_an_et_switch_after_the_last_epoch_is_said(small, tmp_path, capsys):
    """ET-ASGD switches after train.asgd_switch_epoch; a run whose train.epochs ends there or
    before (a full-size config shortened to 100 epochs, its switch at 200) never averages, which
    its numbers did not say."""
    argv = [PTB, *small, "train.asgd_trigger=et", "train.asgd_switch_epoch=5", f"run.dir={tmp_path}", "--dry-run"]
    assert train.main([*argv, "train.epochs=3"]) == 0
    assert ("note: train.asgd_trigger=et switches to averaged SGD after epoch 5 (train.asgd_switch_epoch), "
            "and train.epochs=3 ends the run before: it trains with plain SGD throughout\n") in capsys.readouterr().err
    assert train.main([*argv, "train.epochs=5", "train.plateau_gain=0.01"]) == 0
    assert ("and train.epochs=5 ends the run there: it trains with plain SGD throughout; train.plateau_gain, "
            "which acts on ASGD only, stops nothing\n") in capsys.readouterr().err
    for others in (["train.epochs=6"], ["train.epochs=3", "train.asgd_trigger=nt"]):
        assert train.main([*argv, *others]) == 0
        assert "plain SGD throughout" not in capsys.readouterr().err
