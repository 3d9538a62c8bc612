"""A stopped sweep leaves no training behind: SIGTERM, SIGINT or SIGHUP to sweep.py alone, in
each of its modes that runs on a CPU (one after another, --jobs, --mode gpus with run.device=cpu, --group,
--nproc under torchrun, a Slurm array task's --task), reaches every process it started; each
training saves last.pt, sweep.py exits with 128 + the signal once they have ended, no process
of the sweep is left, and the same command then resumes the runs to their end.

Each test starts the real sweep.py in a subprocess on tiny runs (ten epochs, a few seconds: long
enough that a run started first cannot finish before a slower-starting one has begun), waits until
every training has printed its first progress line (its signal handler is set by then), signals
sweep.py only and re-runs it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from launch.runs import run_command
from launch.stopping import PassingOnStopSignals, SweepStopped
from tests.conftest import TINY

REPO = Path(__file__).resolve().parent.parent
CONFIG = "configs/ptb/softmax.yaml"
TRAINING = "epoch   1 |"            # the first progress line (run.log_interval=1: after step 1)


@pytest.fixture
def overrides(small_data) -> list[str]:
    return [f"data.data_dir={small_data}", *TINY, "run.log_interval=1", "train.epochs=10"]


def processes_naming(folder: Path) -> list[str]:
    """The command lines of the live processes that name `folder` (a sweep's commands name
    their run directories)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:                   # it ended while being looked at
            continue
        if str(folder) in command:
            found.append(f"{entry.name}: {command}")
    return found


@pytest.fixture
def start_sweep():
    """Starts sweep.py in a subprocess; one that a failed test leaves running is stopped (with
    SIGTERM, which it passes on) when the test ends."""
    started = []

    def start(arguments: list[str]) -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "sweep.py", *arguments], cwd=REPO, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"}))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def read_until_training(proc: subprocess.Popen) -> str:
    """The sweep's output up to its training's first progress line."""
    lines = []
    while TRAINING not in "".join(lines[-1:]):
        line = proc.stdout.readline()
        assert line, "the sweep ended before training started:\n" + "".join(lines)
        lines.append(line)
    return "".join(lines)


def wait_until_training(logs: list[Path], proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until each of `logs` (RUN/sweep.log) shows its training's first progress line."""
    deadline = time.time() + timeout
    while not all(log.is_file() and TRAINING in log.read_text() for log in logs):
        assert proc.poll() is None, "the sweep ended before training started:\n" + proc.stdout.read()
        assert time.time() < deadline, "no training started"
        time.sleep(0.05)


def stop(proc: subprocess.Popen, signum: int, out: Path, runs: list[Path], before: str = "") -> str:
    """Signal the sweep and check how it stopped: its exit code and last line, no process of it
    left, each of `runs` stopped by the signal with its last.pt saved; all the training output
    of the sitting (the sweep's own, `before` included, and the runs' sweep.log)."""
    os.kill(proc.pid, signum)
    output = before + proc.communicate(timeout=180)[0]
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, output
    assert output.splitlines()[-1] == (f"stopped by {name}: the commands under way have ended (a "
                                       f"training saves its last.pt); run the same command again to continue")
    assert processes_naming(out) == [], output
    trained = output + "".join((run / "sweep.log").read_text() for run in runs if (run / "sweep.log").is_file())
    for run in runs:
        assert (run / "last.pt").is_file(), output
        step = torch.load(run / "last.pt", weights_only=True)["progress"]["step"]
        assert f"stopped: {name} after step {step}; saved {run / 'last.pt'}" in trained, trained
        assert not (run / "eval_best.json").exists()
    return trained


def rerun(arguments: list[str], out: Path, resumed: list[Path], runs: int) -> None:
    """The same command again: it resumes `resumed` and finishes all `runs` runs."""
    again = subprocess.run([sys.executable, "sweep.py", *arguments], cwd=REPO, text=True,
                           capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"sweep: {runs} done" in again.stdout, again.stdout
    for run in resumed:
        assert f"{run}: resume" in again.stdout, again.stdout
        assert (run / "eval_best.json").is_file()
    assert processes_naming(out) == []


def two_runs(out: Path) -> list[Path]:
    return [out / f"ptb-softmax-seed{seed}" for seed in (1, 2)]


# ---------------------------------------------------------------------- passing signals on

# A command that says when it is ready, counts the signals it gets for half a second after the
# first, and exits with 128 + that signal (as train.py does after its step).
COUNTING = """
import signal, sys, time
got = []
for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, lambda signum, frame: got.append(signum))
open(sys.argv[1], "w").close()
while not got:
    time.sleep(0.01)
time.sleep(0.5)
print(*got)
sys.exit(128 + got[0])
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_each_stop_signal_is_passed_on_once_and_no_command_starts_after_it(signum, tmp_path, capfd):
    """The signal to the sweep's process alone: the running command gets it once (a second
    Ctrl-C would kill a train.py before it saved), the sweep raises SweepStopped once it has
    ended, and starts nothing more."""
    ready = tmp_path / "ready"

    def signal_the_sweep():
        while not ready.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signum)

    signaller = threading.Thread(target=signal_the_sweep)
    with pytest.raises(SweepStopped) as stopped:
        with PassingOnStopSignals():
            signaller.start()
            run_command([sys.executable, "-c", COUNTING, str(ready)])
    signaller.join()
    assert stopped.value.signum == signum
    assert capfd.readouterr().out.split() == [str(int(signum))]
    with PassingOnStopSignals():       # a fresh sweep starts commands again
        assert run_command([sys.executable, "-c", "pass"]) == 0
    with pytest.raises(SweepStopped):
        with PassingOnStopSignals():
            os.kill(os.getpid(), signum)
            run_command([sys.executable, "-c", f"open({str(tmp_path / 'started')!r}, 'w')"])
    assert not (tmp_path / "started").exists()


def test_sighup_under_nohup_does_not_stop_the_sweep(tmp_path):
    """`nohup sweep.py ... &`, its terminal then closed: sweep.py, started with SIGHUP ignored,
    keeps it ignored, neither stopping nor passing it on (its handler used to replace SIG_IGN)."""
    sweep = ("import os, signal, sys, time\n"
             "from launch.runs import run_command\n"
             "from launch.stopping import PassingOnStopSignals\n"
             "with PassingOnStopSignals():\n"
             "    os.kill(os.getpid(), signal.SIGHUP)\n"
             "    time.sleep(0.2)\n"
             "    sys.exit(run_command([sys.executable, '-c', 'pass']))\n")
    result = subprocess.run([sys.executable, "-c", sweep], cwd=REPO, capture_output=True, text=True,
                            timeout=120, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------- each mode, for real

def test_one_after_another(overrides, tmp_path, start_sweep):
    arguments = [CONFIG, *overrides, "--seeds", "1", "--out", str(tmp_path)]
    run = tmp_path / "ptb-softmax-seed1"
    proc = start_sweep(arguments)
    stop(proc, signal.SIGINT, tmp_path, [run], read_until_training(proc))
    rerun(arguments, tmp_path, [run], runs=1)


def test_jobs(overrides, tmp_path, start_sweep):
    arguments = [CONFIG, *overrides, "--seeds", "1", "2", "--out", str(tmp_path), "--jobs", "2"]
    proc = start_sweep(arguments)
    wait_until_training([run / "sweep.log" for run in two_runs(tmp_path)], proc)
    stop(proc, signal.SIGHUP, tmp_path, two_runs(tmp_path))
    rerun(arguments, tmp_path, two_runs(tmp_path), runs=2)


def test_gpus_mode_on_the_cpu(overrides, tmp_path, start_sweep):
    """--mode gpus with two GPU ids and run.device=cpu: two runs at once, as on two GPUs."""
    arguments = [CONFIG, *overrides, "--seeds", "1", "2", "--out", str(tmp_path), "--mode", "gpus",
                 "--gpus", "0,1"]
    proc = start_sweep(arguments)
    wait_until_training([run / "sweep.log" for run in two_runs(tmp_path)], proc)
    stop(proc, signal.SIGTERM, tmp_path, two_runs(tmp_path))
    rerun(arguments, tmp_path, two_runs(tmp_path), runs=2)


def test_a_slurm_array_task(overrides, tmp_path, start_sweep):
    """--task 1, what array task 1 runs: only the second planned run."""
    arguments = [CONFIG, *overrides, "--seeds", "1", "2", "--out", str(tmp_path), "--task", "1"]
    first, second = two_runs(tmp_path)
    proc = start_sweep(arguments)
    stop(proc, signal.SIGTERM, tmp_path, [second], read_until_training(proc))
    rerun(arguments, tmp_path, [second], runs=1)
    assert not first.exists()


def test_torchrun(overrides, tmp_path, start_sweep):
    """--nproc 2: the signal reaches torchrun, which passes it on to both processes (SIGHUP too:
    train.py stops on it as on SIGTERM)."""
    arguments = [CONFIG, *overrides, "--seeds", "1", "--out", str(tmp_path), "--nproc", "2"]
    run = tmp_path / "ptb-softmax-seed1"
    proc = start_sweep(arguments)
    trained = stop(proc, signal.SIGHUP, tmp_path, [run], read_until_training(proc))
    assert f"continue with torchrun --standalone --nproc_per_node 2 train.py --resume {run} (2 processes in all)" in trained
    rerun(arguments, tmp_path, [run], runs=1)


def test_a_group(overrides, tmp_path, start_sweep):
    """--group 2: both runs train in one train.py --group; the signal stops it, and each run
    saves its last.pt."""
    arguments = [CONFIG, *overrides, "--seeds", "1", "2", "--out", str(tmp_path), "--group", "2"]
    proc = start_sweep(arguments)
    trained = stop(proc, signal.SIGTERM, tmp_path, two_runs(tmp_path), read_until_training(proc))
    assert "training 2 runs as one group" in trained
    rerun(arguments, tmp_path, two_runs(tmp_path), runs=2)
