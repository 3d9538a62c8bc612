"""The command lines of the scripts: their parser, whose every error is one line, and how the
scripts that read runs (evaluate.py, rank.py, generate.py, report.py, synthetic.py) end: with
main()'s exit status, and on Ctrl-C or SIGTERM with one line instead of a traceback from deep in
torch (or, for SIGTERM, a silent exit); train.py's too before it trains (loading the corpus, a
finetuning's starting validation). While training, train.py catches the interruption itself, to
save and to say how to go on, and so does sweep.py."""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from typing import Callable, NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose errors (a missing argument, a value out of range) are one line,
    `PROG: error: MESSAGE`, exit code 2, without argparse's usage block before it (--help
    prints the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_corpus_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """--data-dir and --allow-modified-corpus of the scripts that read a run's corpus again
    (evaluate.py, rank.py, generate.py); `default` says where the folder comes from without it."""
    parser.add_argument("--data-dir", help=f"folder holding ptb/ and wikitext-2/ (default: {default})")
    parser.add_argument("--allow-modified-corpus", action="store_true",
                        help="read split files that are not the published ones (a run trained with "
                             "data.allow_modified_corpus=true reads them without it)")


def number_at_least(kind, lowest, what: str, strict: bool = False):
    """An argparse type: a finite `kind` (int or float) >= lowest (> lowest if strict), else one
    line naming `what` was expected, e.g. number_at_least(int, 1, "an integer >= 1") for a count
    of steps (0 steps was a traceback from deep in the scripts that take a median of them)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or value < lowest or (strict and value == lowest):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


# The argparse types of counts: steps, repetitions, tokens, sizes (at least 1) and untimed warm-up
# steps (at least 0).
integer_at_least_1 = number_at_least(int, 1, "an integer >= 1")
integer_at_least_0 = number_at_least(int, 0, "an integer >= 0")


def seed_argument(text: str) -> int:
    """An argparse type: a random seed in the range train.seed takes (a larger integer was a
    traceback from inside torch's generator)."""
    from .config import seed_problem
    try:
        value = int(text)
    except ValueError:
        value = text
    if problem := seed_problem(value):
        raise argparse.ArgumentTypeError(problem)
    return value


# SIGHUP and SIGINT as the process found them, before a handler of ours replaced them: `nohup`
# starts a command with SIGHUP ignored, and a non-interactive shell its background jobs (`cmd &`)
# with SIGINT ignored. (SIGTERM ignored is no one's request, more likely inherited by accident:
# it stays the scheduler's stop, which saves last.pt.)
_IGNORED_AT_START = frozenset(signum for signum in (signal.SIGHUP, signal.SIGINT)
                              if signal.getsignal(signum) == signal.SIG_IGN)


def handle_stop_signal(signum: int, handler):
    """signal.signal(signum, handler), unless the process was started with `signum` ignored
    (_IGNORED_AT_START): whoever started it asked that a closed terminal or a Ctrl-C meant for
    someone else leave it alone, as Python's own KeyboardInterrupt does. The previous handler."""
    if signum in _IGNORED_AT_START:
        return signal.SIG_IGN
    return signal.signal(signum, handler)


def leave_a_closed_terminal() -> None:
    """On SIGHUP: stdout and stderr that can no longer be written go to /dev/null from now on. A
    closed terminal sends SIGHUP and then refuses every write (EIO), which would turn a clean stop
    (last.pt saved, exit 128 + 1) into a failure at the next line printed. A write of nothing tells:
    a live terminal, a file or a pipe keeps the output."""
    for fd in (1, 2):
        try:
            os.write(fd, b"")
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)


class _ReaderMayLeave:
    """stdout or stderr whose reader may go away (`train.py ... | head`, a pager quit): a write
    that finds the pipe closed sends this and every later write to /dev/null, as a closed terminal
    does (leave_a_closed_terminal), instead of a BrokenPipeError from a progress line in the
    middle of a training step."""

    def __init__(self, stream):
        self._stream = stream

    def _to_null(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_null()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_null()
            self._stream.flush()           # what was buffered goes to /dev/null

    def __getattr__(self, name):
        return getattr(self._stream, name)


def keep_training_without_a_reader() -> None:
    """train.py's output may outlive its reader: training goes on, and saves, unheard."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _ReaderMayLeave):
            setattr(sys, name, _ReaderMayLeave(stream))


class Terminated(BaseException):
    """SIGTERM (a scheduler's stop, `kill`), raised in the main thread as Ctrl-C raises
    KeyboardInterrupt, so that it ends the script the same way. A BaseException, as
    KeyboardInterrupt is, so that no `except Exception` on its way up (a compiled kernel's
    fallback to eager, say) takes the stop for an error and carries on."""


def _terminated(signum, frame) -> NoReturn:
    raise Terminated


def stdout_closed() -> NoReturn:
    """The reader of stdout went away (`sweep.py PLAN --dry-run | head`): no traceback, and no
    second one when Python flushes stdout on the way out; 141 = 128 + SIGPIPE, as a Unix tool
    ends there."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    sys.exit(141)


def _interrupted_while_starting(kind, value, traceback) -> None:
    if issubclass(kind, KeyboardInterrupt):
        print("interrupted (Ctrl-C) while starting: nothing was done", file=sys.stderr)
    else:
        sys.__excepthook__(kind, value, traceback)


def quiet_interrupt_while_starting() -> None:
    """A Ctrl-C while a script imports its modules (torch's import alone takes a second or more)
    ends with one line instead of a traceback from inside torch's import. Python still ends the
    process by SIGINT (exit status 130 in a shell). The first thing each script does, undone by
    main_begins."""
    sys.excepthook = _interrupted_while_starting


def main_begins() -> None:
    """From here a script's main() handles Ctrl-C itself (run_script, sweep.py), and an
    interruption that escapes it would be a fault to see whole: Python's traceback again."""
    if sys.excepthook is _interrupted_while_starting:
        sys.excepthook = sys.__excepthook__


def started_by_torchrun_in_several_processes(environ=os.environ) -> bool:
    """torchrun's own mark (TORCHELASTIC_RUN_ID) and a WORLD_SIZE above 1: RANK, WORLD_SIZE or
    LOCAL_RANK alone may be a cluster's environment (a Kubernetes PyTorchJob's pod, say) that a
    plain `python evaluate.py` inherits, and is no reason to refuse it."""
    try:
        return "TORCHELASTIC_RUN_ID" in environ and int(environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def refuse_several_torchrun_processes(exit: Callable[[int], NoReturn] = sys.exit) -> None:
    """A script of one process that torchrun started several times: one line from rank 0, exit 2
    in each, before it reads anything."""
    if started_by_torchrun_in_several_processes():
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {os.path.basename(sys.argv[0])} runs in one process; start it with python, "
                  f"not torchrun (train.py is the script that trains across processes; sweep.py "
                  f"--nproc starts it so)", file=sys.stderr)
        exit(2)


def run_script(main: Callable[[], int], exit: Callable[[int], NoReturn] = sys.exit,
               one_process: bool = True) -> NoReturn:
    """main(), then exit(its status) (train.py's: experiment.distributed.exit_process). A script
    of one process (all but train.py) that torchrun started several times is refused with one
    line from rank 0, exit 2: the copies would each do the whole job into the same run directory,
    all but one refused its lock, and torchrun would stop that one with a SIGTERM."""
    main_begins()
    if one_process:
        refuse_several_torchrun_processes(exit)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        code = main()
    except BrokenPipeError:
        stdout_closed()
    except (KeyboardInterrupt, Terminated) as stop:
        # Their result files are written whole at the end (or one by one, each whole), and the
        # run directory's lock is released on the way out: the same command starts over.
        interrupted = isinstance(stop, KeyboardInterrupt)
        how, code = ("interrupted (Ctrl-C)", 130) if interrupted else ("stopped (SIGTERM)", 143)
        print(f"{how}: stopped before the end; run the same command again", file=sys.stderr)
    finally:
        # Not where train.py, stopped by a signal, ignores a repeat of it until it has exited.
        if signal.getsignal(signal.SIGTERM) is _terminated:
            signal.signal(signal.SIGTERM, previous)
    exit(code)
