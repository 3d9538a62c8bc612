"""A run directory: one process writing at a time, every file replaced whole or not at all.

Every process that writes into a run directory (train.py, evaluate.py, rank.py) holds an
exclusive lock on RUN_DIR/.lock for as long as it runs. The lock is an flock(2) on an open
file, so the operating system releases it when the process ends in any way, SIGKILL included:
a lock is never left behind. The lock file itself stays; it holds the PID and command of its
last holder, which the error message of a second process quotes.

Files are written to a hidden temporary name beside their target and renamed over it, so a
crash or a full disk leaves either the old file or the new one. Temporaries orphaned by a
SIGKILL are removed by the next process that takes the lock (no one else writes there then).

What a run directory is called is here too: `run_name` (the one naming rule, for the launcher's
runs and train.py's default run.dir, which `default_run_name` marks for a miniature config) and
FINETUNE_DIR, where a run's finetuning goes.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import sys
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from .config import Config, load_config

LOCK_NAME = ".lock"
_TEMP_NAME = re.compile(r"\..+\.tmp[0-9]+")        # what temp_path() gives


class RunDirectoryError(Exception):
    """A run directory that cannot be used or written; str(error) is one line."""


class WriteFailed(RunDirectoryError):
    """A file could not be written into the run directory (a full disk, say): the scripts exit
    with 1 for it, not with 2, bad input's (error_exit_code)."""


def error_exit_code(error: Exception) -> int:
    """A script's exit code for a one-line error: 1 where a file could not be written (train.py's
    checkpoints, config.yaml and run.json, evaluate.py's and rank.py's results), 2 for bad input."""
    return 1 if isinstance(error, WriteFailed) else 2


def check_run_dir_usable(run_dir: Path, name: str = "run.dir") -> None:
    """RunDirectoryError (one line) if the folder `run_dir` cannot be made or written: it is a
    file, lies under one, or its nearest existing folder is not writable (`name`: the setting
    that gave it, for the message). Checked before --dry-run returns, so that the dry run says
    what the run would."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirectoryError(f"{name} {run_dir}: a file, not a folder; choose another {name}")
    existing = next(parent for parent in (run_dir, *run_dir.parents) if parent.exists())
    if not existing.is_dir():
        raise RunDirectoryError(f"{name} {run_dir}: {existing} is a file, not a folder; choose another {name}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirectoryError(f"{name} {run_dir}: {existing} is not writable; choose another {name}")


def runs_held(folder: Path, checkpoint_name: str = "last.pt") -> str | None:
    """The first few runs `folder` holds (its subfolders with a `checkpoint_name`), as text for a
    message ("a, b, c, ..."), or None where it holds none."""
    runs = sorted(p.parent.name for p in folder.glob(f"*/{checkpoint_name}"))[:3]
    return f"{', '.join(runs)}{', ...' if len(runs) == 3 else ''}" if runs else None


def folder_of_runs(folder: Path) -> str | None:
    """What `folder` is where it is a folder of runs rather than a run directory (`runs` given for
    `runs/NAME`: no last.pt or config.yaml of its own, runs' directories inside), for a message;
    else None. A run started or resumed there would mix its files with the runs' folders."""
    if (folder / "last.pt").is_file() or (folder / "config.yaml").is_file():
        return None
    runs = runs_held(folder)
    return f"a folder of runs, not a run directory (it holds {runs})" if runs else None


def make_run_dir(run_dir: Path) -> None:
    """mkdir -p, its failure (a read-only file system, say) one line."""
    check_run_dir_usable(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirectoryError(f"run.dir {run_dir}: cannot be made ({e.strerror or e}); "
                                f"choose another run.dir") from None


FINETUNE_DIR = "finetune"
# One JSON line per command sweep.py ran in the run directory, with its CPU time (launch/runs.py
# writes it, report.py cost adds it up; a run trained over several sittings has a line for each).
CPU_TIMES = "cpu_times.jsonl"
# How a run's last sitting in a group ended (experiment/group.py writes it as the run leaves the
# group, sweep.py reads it); every sitting removes an earlier one's as it starts.
GROUP_EXIT = "group_exit.json"


def finetune_config(source: Path, overrides: Sequence[str] = ()) -> Config:
    """A trained run's config (SOURCE/config.yaml) made its finetuning ([AWD] finetune.py): start
    from its best weights, average from the first step, stop when the validation loss no longer
    improves (the NT rule), in SOURCE/finetune, at the config's train.finetune_lr where it sets
    one (MoS's README: 25 on PTB after training at 20), without the trained run's run.max_steps;
    then `overrides`. `train.py --finetune
    SOURCE` and the sweep's finetuning of a plan's best run both use it. Raises ConfigError."""
    trained = load_config(source / "config.yaml")
    lr = [] if trained.train.finetune_lr is None else [f"train.lr={trained.train.finetune_lr}"]
    # run.max_steps is the trained run's own stop (a smoke test's), not the finetuning's.
    return load_config(None, [f"train.init_from={source / 'best.pt'}", "train.asgd_trigger=start",
                              "train.early_stop_nonmono=true", *lr, f"run.dir={source / FINETUNE_DIR}",
                              "run.max_steps=null", *overrides], base=trained.to_dict())


def run_name(dataset: str, config_path: Path, point: Sequence[str], seed: int) -> str:
    """<dataset>-<config name>[-key=value...]-seed<seed>, e.g. ptb-gss-head.c=-1.5-head.k=2-seed141.

    Only the grid point is in the name: the sweep's other overrides are shared by all its runs.
    """
    name = "-".join([dataset, config_path.stem, *point, f"seed{seed}"])
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", name)    # a value like a path must not nest folders


def default_run_name(dataset: str, config_path: Path, seed: int) -> str:
    """train.py's run directory name where run.dir is not given: `run_name`'s, with the variant of a
    config folder configs/<dataset folder>_<variant>/ after the dataset, so that the miniature's
    runs are not taken for the full-size rows': configs/ptb/softmax.yaml gives ptb-softmax-seed141,
    the name sweep.py gives the run, configs/ptb_mini/softmax.yaml ptb_mini-softmax-seed141.
    A folder is a variant only beside the folder it varies (ptb_mini beside ptb): a config in
    my_configs/ is not a "configs" variant of anything. (sweep.py names runs by `run_name` alone:
    a plan's folder says which runs it holds.)"""
    folder = config_path.parent
    varied, _, variant = folder.name.partition("_")
    if variant and varied and (folder.parent / varied).is_dir():
        dataset = f"{dataset}_{variant}"
    return run_name(dataset, config_path, (), seed)


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def write_atomic(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Call write(file) on a temporary file and rename it to `path` once it is on disk.

    A failure (a full disk, say) removes the temporary file, leaves `path` as it was and
    raises RunDirectoryError naming `path` and the reason."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:   # torch.save reports a failed write as RuntimeError
        kept = f"{path} is as it was" if path.exists() else f"{path} was not written"
        raise WriteFailed(f"cannot write {path} ({_reason(e)}); {kept}") from None
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)   # make the rename itself durable
    finally:
        os.close(dir_fd)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def _reason(error: BaseException) -> str:
    """The OSError behind `error` when there is one (torch wraps it in a RuntimeError)."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


LOCK_COMMAND_CHARS = 2000      # of the holder's command line, kept in the lock file for the message


def held_elsewhere(lock_file: Path) -> bool:
    """Whether another live process holds `lock_file`'s flock (a run directory's RunLock or a
    sweep's claim), found without writing: a dry run must leave the run directories as they are,
    so nothing is created, truncated or written (taking the lock, as RunLock does, would write
    this process's PID into it). A missing or unreadable file, or a file system without flock,
    counts as not held: the real run reports those itself.

    The probe is a shared, non-blocking flock on a read-only descriptor, released at once: it
    conflicts only with an exclusive lock (which is held elsewhere exactly when it fails), and
    only for the microseconds it is held. flock is per open file, so a lock this process holds
    through another descriptor also counts as held, as it does for RunLock.acquire."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)                  # closing the descriptor releases the probe's shared lock
    return False


# The most a lock file's "PID (command)" line can take, in UTF-8 bytes.
LOCK_TEXT_BYTES = 4 * LOCK_COMMAND_CHARS + 64
WAIT_OR_ANOTHER = "wait for it to end or choose another directory"


def in_use(run_dir: Path, holder: bytes, way_out: str) -> RunDirectoryError:
    """The refusal of a run directory whose lock another process holds, naming it by the
    "PID (command)" line it wrote into the lock file (`holder`)."""
    text = holder.decode("utf-8", "replace").strip()
    by = f"PID {text}" if text else "another process (it has not written its PID yet)"
    return RunDirectoryError(f"{run_dir} is in use by {by}; one process at a time writes into a "
                             f"run directory: {way_out}")


def refuse_if_in_use(run_dir: Path, way_out: str = WAIT_OR_ANOTHER) -> None:
    """What RunLock.acquire would refuse, found without writing (held_elsewhere): a dry run says
    that the directory is in use, not what it would say of the run inside."""
    path = run_dir / LOCK_NAME
    if held_elsewhere(path):
        try:
            with open(path, "rb") as lock_file:
                holder = lock_file.read(LOCK_TEXT_BYTES)
        except OSError:
            holder = b""
        raise in_use(run_dir, holder, way_out)


class RunLock:
    """Exclusive use of a run directory for the life of this object (or of the process).

        with RunLock(run_dir):
            ... write into run_dir ...
    """

    def __init__(self, run_dir: str | Path, way_out: str = WAIT_OR_ANOTHER):
        self.run_dir = Path(run_dir)
        self.way_out = way_out          # what the error of a run directory in use suggests
        self.fd: int | None = None

    def acquire(self) -> None:
        path = self.run_dir / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise RunDirectoryError(f"{self.run_dir}: cannot create the lock file {path} "
                                    f"({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, LOCK_TEXT_BYTES, 0)
            os.close(fd)
            raise in_use(self.run_dir, holder, self.way_out) from None
        except OSError as e:         # a file system without flock (some network or FUSE mounts)
            os.close(fd)
            raise RunDirectoryError(f"{self.run_dir}: cannot lock {path} ({e.strerror or e}); "
                                    f"run directories need a file system with flock(2) locks, "
                                    f"e.g. a local disk or NFSv4") from None
        try:   # who holds the lock, for the message of a second process; the lock does not need it
            os.ftruncate(fd, 0)
            command = " ".join(sys.argv)          # whole, so that its run.dir is in it
            shown = command if len(command) <= LOCK_COMMAND_CHARS else command[:LOCK_COMMAND_CHARS] + " ..."
            os.pwrite(fd, f"{os.getpid()} ({shown})\n".encode("utf-8"), 0)
        except OSError:
            pass
        self.fd = fd
        remove_orphaned_temp_files(self.run_dir)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)        # closing the file releases the flock
            self.fd = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def analysis_lock(checkpoint: Path, script: str) -> RunLock:
    """The lock evaluate.py and rank.py take on the folder of the checkpoint they read, where they
    write their results; while a training holds it, the way out is a copy of the checkpoint."""
    return RunLock(checkpoint.parent, way_out=f"wait for it to end, or copy {checkpoint} into a "
                                              f"folder of its own and run {script} on the copy")


def remove_orphaned_temp_files(run_dir: Path) -> list[Path]:
    """Delete the temporaries of write_atomic left in `run_dir` by a killed process. Only call
    this holding the run directory's lock: then no write is under way there."""
    orphans = [p for p in run_dir.iterdir() if _TEMP_NAME.fullmatch(p.name) and p.is_file()]
    for path in orphans:
        path.unlink(missing_ok=True)
    return orphans


def trained_corpus(run_dir: Path) -> dict | None:
    """run.json's record of the text the run trained on (data.corpus.Corpus.record()); None for
    a run without one (no run.json, an unreadable one, or written before the record was kept)."""
    path = Path(run_dir) / "run.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("corpus") if path.is_file() else None
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
