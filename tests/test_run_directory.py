"""experiment/run_directory.py: the run-directory lock, atomic writes, orphaned temporaries."""
from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from experiment import checkpoint, run_directory
from experiment.run_directory import (LOCK_NAME, RunDirectoryError, RunLock, temp_path,
                                      write_text_atomic)
from tests.conftest import enospc_after

# A process that takes the lock of argv[1], says so, and sleeps until it is killed.
HOLDER = ("import sys, time; from experiment.run_directory import RunLock; "
          "RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(600)")


def hold_lock(run_dir: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), *extra], stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parent.parent)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_holder_is_refused_naming_the_directory_and_the_pid(tmp_path):
    holder = hold_lock(tmp_path)
    try:
        with pytest.raises(RunDirectoryError) as info:
            RunLock(tmp_path).acquire()
        message = str(info.value)
        assert message.startswith(f"{tmp_path} is in use by PID {holder.pid} ")
        assert "\n" not in message
    finally:
        holder.kill()
        holder.wait()


def test_the_holders_command_is_named_whole_up_to_its_run_dir(tmp_path):
    """A long command (a group's configs and overrides) was cut at 300 characters, its run.dir lost."""
    long = [f"train.lr={i}" for i in range(60)] + [f"run.dir={tmp_path}/the-end"]
    holder = hold_lock(tmp_path, *long)
    try:
        with pytest.raises(RunDirectoryError) as info:
            RunLock(tmp_path).acquire()
        assert f"run.dir={tmp_path}/the-end)" in str(info.value) and "\n" not in str(info.value)
    finally:
        holder.kill()
        holder.wait()


def test_sigkill_never_leaves_a_stale_lock(tmp_path):
    holder = hold_lock(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / LOCK_NAME).exists()          # the file stays; the lock went with the process
    with RunLock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text().startswith(f"{os.getpid()} ")


def test_the_lock_is_released_on_exit_and_excludes_within_one_process(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunDirectoryError, match=f"in use by PID {os.getpid()}"):
            RunLock(tmp_path).acquire()
    with RunLock(tmp_path):
        pass


def test_taking_the_lock_removes_temporaries_orphaned_by_a_killed_writer(tmp_path):
    orphans = [tmp_path / ".last.pt.tmp4242", tmp_path / ".metrics.jsonl.tmp17"]
    for path in orphans:
        path.write_bytes(b"half a checkpoint")
    kept = [tmp_path / "last.pt", tmp_path / "notes.tmp1", tmp_path / ".hidden"]
    for path in kept:
        path.write_bytes(b"x")
    with RunLock(tmp_path):
        assert not any(p.exists() for p in orphans)
        assert all(p.exists() for p in kept)


def test_temporaries_have_the_name_the_cleanup_removes(tmp_path):
    path = temp_path(tmp_path / "best.pt")
    path.write_bytes(b"x")
    with RunLock(tmp_path):
        assert not path.exists()


def test_disk_full_while_saving_is_one_line_and_leaves_the_old_file_and_no_temporary(
        tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    old = {"format": checkpoint.FORMAT, "model": {"w": torch.zeros(3)}}
    checkpoint.save_atomic(old, path)
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", enospc_after(1000))
    with pytest.raises(RunDirectoryError) as info:
        checkpoint.save_atomic({"format": checkpoint.FORMAT, "model": {"w": torch.ones(10_000)}}, path)
    assert str(info.value) == f"cannot write {path} (No space left on device); {path} is as it was"
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_text_files_are_replaced_whole(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    write_text_atomic(path, "a: 1\n")
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(RunDirectoryError, match="No space left on device"):
        write_text_atomic(path, "a: 2\n")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert path.read_text() == "a: 1\n" and len(list(tmp_path.iterdir())) == 1


def test_lock_holder_text_names_the_command(tmp_path):
    holder = hold_lock(tmp_path)
    try:
        deadline = time.time() + 10
        while not (tmp_path / LOCK_NAME).read_text() and time.time() < deadline:
            time.sleep(0.01)
        assert (tmp_path / LOCK_NAME).read_text().startswith(f"{holder.pid} (-c ")
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_that_has_not_written_its_pid_yet_is_still_named(tmp_path):
    (tmp_path / LOCK_NAME).touch()
    with open(tmp_path / LOCK_NAME) as held:         # taken, its PID not written yet
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RunDirectoryError) as info:
            RunLock(tmp_path).acquire()
    assert str(info.value).startswith(f"{tmp_path} is in use by another process (it has not "
                                      f"written its PID yet)")


def test_a_file_system_without_locks_is_one_line(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(run_directory.fcntl, "flock", no_locks)
    with pytest.raises(RunDirectoryError) as info:
        RunLock(tmp_path).acquire()
    assert str(info.value).startswith(f"{tmp_path}: cannot lock {tmp_path / LOCK_NAME} "
                                      f"(No locks available); run directories need a file system")
