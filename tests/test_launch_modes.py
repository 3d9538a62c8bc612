"""launch/modes.py: what a dry run finds out about run directories without writing into them
(another process's run lock or sweep claim), and which GPU each child of --mode gpus is given
under a parent's CUDA_VISIBLE_DEVICES (no GPU needed: torch's view and the commands are stubbed).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sweep
from launch import LaunchError
from launch import modes as launch_modes
from launch import runs as launch_runs
from experiment.run_directory import held_elsewhere
from launch.modes import child_gpu_ids, in_progress_elsewhere, visible_gpus
from tests.test_sweep import CONFIG, in_process, overrides  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parent.parent


def snapshot(folder: Path) -> dict:
    """Every file under `folder`, with its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


class Holder:
    """Another process holding a flock on `lock_file`: a RunLock on its folder (as a train.py
    does) or a sweep's claim (as launch.runs.claimed takes it)."""

    def __init__(self, lock_file: Path, run_lock: bool):
        take = (f"from experiment.run_directory import RunLock; RunLock({str(lock_file.parent)!r}).acquire()"
                if run_lock else
                f"import fcntl, os; fd = os.open({str(lock_file)!r}, os.O_RDWR | os.O_CREAT); "
                f"fcntl.flock(fd, fcntl.LOCK_EX)")
        self.proc = subprocess.Popen([sys.executable, "-c", f"import sys, time; sys.path.insert(0, '.'); {take}; "
                                      "print('held', flush=True); time.sleep(60)"],
                                     cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def end(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def unfinished_runs(overrides, tmp_path, monkeypatch) -> Path:
    """Two runs of seeds 1 and 2 stopped after 3 steps (last.pt, no evaluation): the dry run
    would resume them."""
    monkeypatch.setattr(launch_runs, "run_command", in_process([]))
    out = tmp_path / "sweep"
    assert sweep.main([CONFIG, *overrides, "run.max_steps=3", "--seeds", "1", "2", "--out", str(out)]) == 0
    for seed in (1, 2):
        assert (out / f"ptb-softmax-seed{seed}" / "last.pt").is_file()
    return out


# ---------------------------------------------------------------------- dry runs write nothing

@pytest.mark.parametrize("group", [[], ["--group", "2"]])
def test_a_dry_run_leaves_the_run_directories_as_they_are(unfinished_runs, overrides, group, capsys):
    """--group 2 --dry-run took each unfinished run's lock to see whether another process held
    it, which rewrote its .lock with the dry run's PID and command."""
    for seed in (1, 2):   # as a train.py that ended left it: the dry run must not replace it
        (unfinished_runs / f"ptb-softmax-seed{seed}" / ".lock").write_text("4242 (train.py earlier)\n")
    before = snapshot(unfinished_runs)
    capsys.readouterr()
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "2", "--out", str(unfinished_runs),
                       *group, "--dry-run"]) == 0
    assert snapshot(unfinished_runs) == before
    printed = capsys.readouterr().out
    assert printed.count(": resume") == 2 and ("--group" in printed) == bool(group)


def test_held_elsewhere_sees_another_processes_lock_without_writing(tmp_path):
    lock_file = tmp_path / ".lock"
    assert not held_elsewhere(lock_file) and not lock_file.exists()      # nothing is created
    holder = Holder(lock_file, run_lock=True)
    try:
        written = lock_file.read_bytes(), lock_file.stat().st_mtime_ns
        assert held_elsewhere(lock_file)
        assert (lock_file.read_bytes(), lock_file.stat().st_mtime_ns) == written
    finally:
        holder.end()
    assert not held_elsewhere(lock_file)          # the holder ended: its lock went with it


def test_in_progress_elsewhere_is_what_process_group_would_find(tmp_path):
    """Another sweep's claim counts whatever is left; a run lock only for a run with work left
    (process_group does not ask a finished run for its lock)."""
    class Run:             # what in_progress_elsewhere reads of a PlannedRun
        dir = tmp_path

    for lock_name, run_lock, when_finished in ((launch_runs.CLAIM_NAME, False, True), (".lock", True, False)):
        assert not in_progress_elsewhere(Run, work_left=True)
        holder = Holder(tmp_path / lock_name, run_lock)
        try:
            assert in_progress_elsewhere(Run, work_left=True)
            assert in_progress_elsewhere(Run, work_left=False) == when_finished
        finally:
            holder.end()


@pytest.mark.parametrize("lock_name, run_lock", [(launch_runs.CLAIM_NAME, False), (".lock", True)])
def test_a_dry_run_says_a_held_run_is_in_progress_elsewhere(unfinished_runs, overrides, lock_name, run_lock, capsys):
    """The real sweep skips a run another process holds (another sweep's claim, or a train.py's
    run lock); the dry run said it would resume it, and grouped a claimed run with the others."""
    holder = Holder(unfinished_runs / "ptb-softmax-seed1" / lock_name, run_lock=run_lock)
    try:
        capsys.readouterr()
        assert sweep.main([CONFIG, *overrides, "--seeds", "1", "2", "--out", str(unfinished_runs),
                           "--group", "2", "--dry-run"]) == 0
    finally:
        holder.end()
    printed = capsys.readouterr().out
    assert "ptb-softmax-seed1: in progress elsewhere: skip" in printed and "ptb-softmax-seed2: resume" in printed
    assert "--group" not in printed


# ---------------------------------------------------------------------- --gpus under CUDA_VISIBLE_DEVICES

@pytest.mark.parametrize("gpus, parent, count, children", [
    (["0", "1"], None, 4, ["0", "1"]),              # no parent list: the machine's numbers
    (["1", "0"], "2,3", 2, ["3", "2"]),             # torch's numbers: positions in the parent's list
    (["0", "1"], "2,3", None, ["2", "3"]),          # no CUDA here: the parent's list still bounds them
    (["0"], "GPU-aaaa,GPU-bbbb", 2, ["GPU-aaaa"]),
    (["GPU-bb"], "GPU-aaaa,GPU-bbbb", 2, ["GPU-bbbb"]),   # a UUID's prefix, as CUDA takes it
    (["0", "1"], None, None, ["0", "1"]),           # CPU runs: the ids only name worker slots
    (["0", "1"], "", None, ["", ""]),               # ... and a parent with no GPU gives none to a child
])
def test_gpu_ids_are_torchs_numbers_mapped_to_the_parents_gpus(gpus, parent, count, children):
    assert child_gpu_ids(gpus, parent, count) == children


@pytest.mark.parametrize("gpus, parent, count, message", [
    (["0", "2"], "2,3", 2, "--gpus: no GPU 2 here: CUDA_VISIBLE_DEVICES=2,3 gives this process 2 GPUs, "
                           "numbered 0..1 as torch does"),
    (["1"], "2,3", None, None),                        # fine: for contrast with the next
    (["2"], "2,3", None, "--gpus: no GPU 2 here"),
    (["1"], "2,99", 1, "--gpus: no GPU 1 here: CUDA_VISIBLE_DEVICES=2,99 gives this process 1 GPU, "
                       "numbered 0..0"),                   # CUDA stopped at the entry it could not use
    (["GPU-cccc"], "GPU-aaaa,GPU-bbbb", 2, "--gpus: GPU-cccc is not one of the GPUs in "
                                           "CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb"),
    (["GPU-aaaa"], "0,1", 2, "--gpus: GPU-aaaa is not one of the GPUs in CUDA_VISIBLE_DEVICES=0,1"),
    (["0", "GPU-aaaa"], "GPU-aaaa,GPU-bbbb", 2, "--gpus: 0,GPU-aaaa names GPU-aaaa of "
                                                "CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb twice"),
    (["4"], None, 4, "--gpus: no GPU 4 on this machine; torch sees 4 (0..3)"),
])
def test_gpu_ids_outside_the_parents_gpus_are_refused(gpus, parent, count, message):
    if message is None:
        child_gpu_ids(gpus, parent, count)
        return
    with pytest.raises(LaunchError) as error:
        child_gpu_ids(gpus, parent, count)
    assert str(error.value).startswith(message)


def gpu_workers(monkeypatch) -> list[tuple[str, str]]:
    """Stubs the workers of --mode gpus: records each one's tag and CUDA_VISIBLE_DEVICES, and
    runs nothing (which worker takes which run is up to the threads)."""
    workers: list[tuple[str, str]] = []

    def record(items, tagged_envs) -> dict:
        workers.extend((tag, env["CUDA_VISIBLE_DEVICES"]) for tag, env in tagged_envs)
        return {}

    monkeypatch.setattr(launch_modes, "run_in_parallel", record)
    return workers


@pytest.mark.parametrize("torch_sees", [2, None])      # torch's count with CUDA, or no CUDA here
def test_gpus_mode_under_a_parents_cuda_visible_devices(overrides, tmp_path, monkeypatch, capsys, torch_sees):
    """CUDA_VISIBLE_DEVICES=2,3 (a Slurm allocation): --gpus 0,1 gave the children 0 and 1, GPUs
    outside the allocation, and --gpus 5 was not checked."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: torch_sees is not None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: torch_sees or 0)
    workers = gpu_workers(monkeypatch)
    for gpus in (["--gpus", "0,1"], []):                  # given, and the default: all visible
        workers.clear()
        assert sweep.main([CONFIG, *overrides, "--seeds", "1", "2", "--out", str(tmp_path / "gpus"),
                           "--mode", "gpus", *gpus]) == 0
        assert workers == [("[gpu 0]", "2"), ("[gpu 1]", "3")]     # the tags say torch's numbers
    assert visible_gpus() == ["0", "1"]
    workers.clear()
    capsys.readouterr()
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(tmp_path / "bad"),
                       "--mode", "gpus", "--gpus", "0,5"]) == 2
    assert capsys.readouterr().err == ("error: --gpus: no GPU 5 here: CUDA_VISIBLE_DEVICES=2,3 gives this "
                                       "process 2 GPUs, numbered 0..1 as torch does\n")
    assert workers == [] and not (tmp_path / "bad").exists()
