"""How a sweep stops: SIGTERM, SIGINT and SIGHUP to sweep.py reach every process it started.

Each command of a sweep (train.py, torchrun, evaluate.py, rank.py) runs in a session of its own,
so that a signal meant for the sweep (Ctrl-C or a closed terminal, `timeout`, `kill`) reaches
sweep.py alone, and sweep.py passes each one on, once, to every command still running: train.py
finishes its step, saves last.pt and exits as it does alone (torchrun passes the signal on to
its processes). After the first signal no command starts; once the running ones have ended the
sweep raises `SweepStopped`, sweep.py exits with 128 + the signal, and the same command
continues the runs. (A Slurm time limit signals every process of the job itself, the commands
too: train.py takes a repeated SIGTERM or SIGHUP for the same request, see StopSignals in
experiment/training_run.py.) On SIGHUP, output that a closed terminal no longer takes goes to
/dev/null (experiment/cli.py), so that sweep.py still ends with 128 + 1.

    with PassingOnStopSignals():       # sweep.py, around everything that starts commands
        proc = start(command, ...)      # launch/runs.py's run_command
        ... wait for proc ...
        ended(proc)                     # raises SweepStopped once a signal has come
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading

from experiment.cli import handle_stop_signal, leave_a_closed_terminal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SweepStopped(Exception):
    """A stop signal came, and the commands the sweep had started have ended."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Commands:
    """The commands a sweep has running, and the stop signals it has received. A signal handler
    only queues the signal (SimpleQueue.put may be called from one): a thread of its own passes
    it on, so that the handler never waits for a lock held by the code it interrupted."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self.first: int | None = None               # the first stop signal received
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()     # those not yet passed on

    def start(self, command: list[str], **options) -> subprocess.Popen:
        """Popen(command, **options) in a session of its own, unless a stop signal has come."""
        with self._lock:
            self.check()
            proc = subprocess.Popen(command, start_new_session=True, **options)
            self._running.add(proc)
        return proc

    def ended(self, proc: subprocess.Popen) -> None:
        """`proc` has ended (and was waited for); SweepStopped if a stop signal has come."""
        with self._lock:
            self._running.discard(proc)
        self.check()

    def check(self) -> None:
        """SweepStopped (with the first signal) once a stop signal has come."""
        if self.first is not None:
            raise SweepStopped(self.first)

    def receive(self, signum: int, frame=None) -> None:
        """The signal handler."""
        if self.first is None:
            self.first = signum
        if signum == signal.SIGHUP:
            leave_a_closed_terminal()
        self._incoming.put(signum)

    def pass_on(self) -> None:
        """Each queued signal to every running command, until None is queued. Not through
        Popen.send_signal, which would reap a finished child that run_command waits for."""
        while (signum := self._incoming.get()) is not None:
            with self._lock:
                for proc in self._running:
                    if proc.returncode is None:
                        try:
                            os.kill(proc.pid, signum)
                        except ProcessLookupError:      # it ended a moment ago
                            pass

    def close(self) -> None:
        """Pass on what is still queued, then stop passing on."""
        self._incoming.put(None)


_commands = Commands()        # the sweep's: a fresh one inside each PassingOnStopSignals


def start(command: list[str], **options) -> subprocess.Popen:
    return _commands.start(command, **options)


def ended(proc: subprocess.Popen) -> None:
    _commands.ended(proc)


def check() -> None:
    _commands.check()


class PassingOnStopSignals:
    """While it is entered, SIGTERM, SIGINT and SIGHUP are passed on to the commands started
    with `start`; on leaving, SweepStopped if one came (and nothing else went wrong). One that
    sweep.py was started with ignored (SIGHUP under `nohup`) stays ignored (handle_stop_signal)."""

    def __enter__(self) -> "PassingOnStopSignals":
        global _commands
        self.outside, _commands = _commands, Commands()
        self.commands = _commands
        self.thread = threading.Thread(target=self.commands.pass_on, daemon=True)
        self.thread.start()
        self.previous = {signum: handle_stop_signal(signum, self.commands.receive) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        global _commands
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.commands.close()
        self.thread.join()
        _commands = self.outside
        if kind is None:
            self.commands.check()
        return False
