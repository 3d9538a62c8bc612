"""Training progress: the record a run's last.pt saves, and what a person watching sees.

`TrainingProgress` is where a run stands (epoch, position in the epoch, steps, carried hidden
states, validation history, ...): saved in last.pt and restored as one unit, so that a resumed run
continues exactly, and read by everything that asks how far a run got (evaluate.py, the sweeps).

`EpochProgress` is what a person sees during an epoch. In a terminal (stdout is a TTY) a tqdm bar
counts real tokens (positions x batch size). In a log file (Slurm, nohup, the sweep's logs) a bar
shows nothing until the epoch ends, so a plain line is printed every run.log_interval steps
instead, as the original AWD-LSTM does:

  epoch   3 |   300/  663 batches | step     1623 |   151.2 ms/step |    9,252 tok/s | loss  5.123 | ppl   167.85 | lr 20 | left: epoch 0:01:12, run 6:02:11

"batches" counts the epoch's progress in units of bptt positions, as the original's batch
counter does (a step's length varies around bptt); speed, loss and perplexity are those of the
steps since the previous line; the time left is the training time at this epoch's pace so far
(validation adds a few percent) to the end of the epoch and to the end of the run
(train.epochs, or run.max_steps when that comes first). `SilentProgress` is what the other ranks
of a torchrun show: nothing.

`RunLog` is what rank 0 records of each epoch: its line on stdout, its record in metrics.jsonl
(`epoch_record`; `keep_epochs` cuts the file to the epochs a resumed last.pt has completed) and,
with run.tensorboard, TensorBoard's scalars.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from evaluation.loop import perplexity
from .config import ConfigError
from .run_directory import write_text_atomic


def clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds) now; the CPU seconds are this process's, every thread's, user
    and system (under torchrun, one rank's)."""
    return time.time(), time.process_time()


@dataclass
class TrainingProgress:
    """Where a training run stands; last.pt holds it as the plain dict `to_dict` gives."""

    epoch: int = 1                          # the epoch in progress
    position: int = 0                       # index into the training batches of the next step's input
    step: int = 0                           # optimizer steps taken so far
    hidden: Optional[list] = None           # per column chunk, [(h, c) per layer], carried across steps
    epoch_nll_sum: float = 0.0              # training NLL summed over the epoch's tokens so far
    epoch_tokens: int = 0
    epoch_seconds: float = 0.0              # wall seconds of the epoch's training steps (its speed)
    epoch_cpu_seconds: float = 0.0          # this process's CPU seconds on the epoch, training and
                                            # validation (its cost; a killed sitting keeps its epochs');
                                            # in last.pt every rank's sum, resumed by rank 0
    val_history: list = field(default_factory=list)   # validation loss of every finished epoch
    best_val: float = math.inf
    asgd_start_epoch: Optional[int] = None  # the first epoch trained with averaging
    finished: bool = False                  # all epochs done, or stopped by early_stop_nonmono

    @property
    def completed_epochs(self) -> int:
        return self.epoch - 1

    @property
    def saved_where(self) -> str:
        """Where in training a checkpoint of this progress was saved, for a message: "after epoch
        30, step 20581" at an epoch's end (its `epoch` is then already the next one, 31, which
        read as if epoch 31 were done), else "within epoch 31, step 20900"."""
        if self.position == 0 and self.completed_epochs:
            return f"after epoch {self.completed_epochs}, step {self.step}"
        return f"within epoch {self.epoch}, step {self.step}"

    @property
    def epoch_train_nll(self) -> float:
        return self.epoch_nll_sum / max(self.epoch_tokens, 1)

    def start_next_epoch(self) -> None:
        """The epoch is done: move to the next one, from the start of the training stream."""
        self.epoch += 1
        self.position, self.hidden = 0, None
        self.epoch_nll_sum, self.epoch_tokens = 0.0, 0
        self.epoch_seconds, self.epoch_cpu_seconds = 0.0, 0.0

    def add_time(self, since: tuple[float, float], training: bool = True) -> None:
        """Charge the time since `since` (a clock()) to the epoch: its CPU seconds always, its
        wall seconds only for training steps (the speed figure leaves validation out)."""
        wall, cpu = clock()
        self.add_seconds(wall - since[0], cpu - since[1], training)

    def add_seconds(self, wall: float, cpu: float, training: bool = True) -> None:
        """Charge `wall` and `cpu` seconds to the epoch (a group charges each run its share)."""
        if training:
            self.epoch_seconds += wall
        self.epoch_cpu_seconds += cpu

    def to_dict(self) -> dict:
        out = dataclasses.asdict(dataclasses.replace(self, hidden=None))
        out["hidden"] = None if self.hidden is None else [list(map(list, h)) for h in self.hidden]
        return out

    @classmethod
    def from_dict(cls, saved: dict, device: torch.device | str = "cpu") -> "TrainingProgress":
        # A field a saved record lacks (none so far) keeps its default.
        progress = cls(**{f.name: saved[f.name] for f in dataclasses.fields(cls) if f.name in saved})
        progress.val_history = list(progress.val_history)
        if progress.hidden is not None:
            progress.hidden = [[(h.to(device), c.to(device)) for h, c in chunk]
                               for chunk in progress.hidden]
        return progress

    @classmethod
    def read(cls, path: str | Path) -> "TrainingProgress":
        """The progress of the last.pt at `path`, without reading its model and optimizer tensors
        (mmap: only the pages of the small progress record are touched)."""
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return cls.from_dict(ckpt["progress"])


def reset_peak_gpu_memory(device: torch.device | str) -> None:
    """Start `peak_gpu_memory`'s count afresh (train.py: at each epoch's start); nothing off CUDA."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gpu_memory(device: torch.device | str) -> int | None:
    """The CUDA allocator's peak bytes on `device` since its last reset (reset_peak_gpu_memory);
    None off CUDA, where there is no such counter."""
    device = torch.device(device)
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


class EpochProgress:
    def __init__(self, config, epoch: int, step: int, position: int, last_position: int,
                 interactive: bool | None = None, device: torch.device | str = "cpu",
                 label: str | None = None):
        train, run = config.train, config.run
        self.device = device
        # A group's runs (label: the run's name) share the terminal: lines, not bars, each named.
        self.prefix = f"{label} | " if label else ""
        interactive = False if label else interactive
        self.interval, self.lr = run.log_interval, train.lr
        self.batch_size, self.bptt = train.batch_size, train.bptt
        self.epoch, self.epochs, self.max_steps = epoch, train.epochs, run.max_steps
        self.last_position = last_position          # the epoch ends when position reaches it
        self.interactive = sys.stdout.isatty() if interactive is None else interactive
        self.position = min(position, last_position)
        self.start = self.window = (time.time(), step, self.position)
        self.nll_sum, self.nll_count = 0.0, 0
        self.bar = None
        if self.interactive:
            self.bar = tqdm(total=last_position * self.batch_size,
                            initial=self.position * self.batch_size, unit="tok", unit_scale=True,
                            desc=f"epoch {epoch}", leave=False, dynamic_ncols=True)

    def update(self, step: int, position: int, nll: float) -> float | None:
        """Record one step; every log_interval steps report and return the mean NLL since the
        last report (else None)."""
        position = min(position, self.last_position)
        if self.bar is not None:
            self.bar.update((position - self.position) * self.batch_size)
        self.position = position
        self.nll_sum, self.nll_count = self.nll_sum + nll, self.nll_count + 1
        if step % self.interval:
            return None
        mean = self.nll_sum / self.nll_count
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{mean:.3f}", ppl=f"{perplexity(mean):.1f}")
        else:
            print(self.line(step, mean), flush=True)
        self.window = (time.time(), step, position)
        self.nll_sum, self.nll_count = 0.0, 0
        return mean

    def line(self, step: int, mean_nll: float) -> str:
        now = time.time()
        window_time, window_step, window_position = self.window
        seconds = max(now - window_time, 1e-9)
        ms_per_step = 1000 * seconds / max(step - window_step, 1)
        tokens_per_s = (self.position - window_position) * self.batch_size / seconds
        start_time, start_step, start_position = self.start
        per_position = (now - start_time) / max(self.position - start_position, 1)
        epoch_left = (self.last_position - self.position) * per_position
        run_left = epoch_left + (self.epochs - self.epoch) * self.last_position * per_position
        if self.max_steps:
            per_step = (now - start_time) / max(step - start_step, 1)
            run_left = min(run_left, (self.max_steps - step) * per_step)
        return (f"{self.prefix}epoch {self.epoch:3d} | {self.position // self.bptt:5d}/"
                f"{self.last_position // self.bptt:5d} batches | step {step:8d} | "
                f"{ms_per_step:7.1f} ms/step | {tokens_per_s:8,.0f} tok/s | loss {mean_nll:6.3f} | "
                f"ppl {perplexity(mean_nll):8.2f} | lr {self.lr:g} | "
                f"left: epoch {duration(epoch_left)}, run {duration(run_left)}"
                + (f" | peak {gib(peak)}" if (peak := peak_gpu_memory(self.device)) is not None else ""))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def duration(seconds: float) -> str:
    return str(timedelta(seconds=round(max(seconds, 0))))


class SilentProgress:
    """What the ranks other than 0 show of an epoch: nothing (rank 0 reports for all)."""

    def update(self, step: int, position: int, nll: float) -> None:
        return None

    def close(self) -> None:
        pass


def epoch_record(progress: TrainingProgress, val_loss: float, optimizer: str, lr: float,
                 cpu_seconds: float, peak_memory: int | None = None) -> dict:
    """metrics.jsonl's line for the epoch `progress` has just trained, validated with `val_loss`;
    `cpu_seconds` is its CPU time (every process's, under torchrun); `peak_memory` the epoch's
    peak GPU bytes (training and validation; rank 0's GPU), recorded on CUDA only."""
    train_nll = progress.epoch_train_nll
    memory = {} if peak_memory is None else {"peak_gpu_memory_bytes": peak_memory}
    return {"epoch": progress.epoch, "step": progress.step, "optimizer": optimizer,
            "lr": lr, "seconds": round(progress.epoch_seconds, 3),
            "cpu_seconds": round(cpu_seconds, 3),
            "train_loss": train_nll, "train_ppl": perplexity(train_nll),
            "val_loss": val_loss, "val_ppl": perplexity(val_loss),
            "best_val_ppl": perplexity(progress.best_val), **memory}


class RunLog:
    """What rank 0 records of the epochs in the run directory: a line on stdout and one in
    metrics.jsonl each, and with run.tensorboard TensorBoard's scalars (the step losses too)."""

    def __init__(self, run_dir: Path, label: str | None = None):
        self.run_dir, self.writer = run_dir, None
        self.prefix = f"{label} | " if label else ""      # a group's run: its name first

    def open_tensorboard(self, step: int) -> None:
        SummaryWriter = tensorboard_writer()
        log_dir = self.run_dir / "tensorboard"
        wait_for_a_later_event_file_name(log_dir)
        # purge_step: events logged after last.pt was saved are dropped; they are logged again.
        self.writer = SummaryWriter(str(log_dir), purge_step=step + 1, flush_secs=30)

    def scalar(self, name: str, value: float, step: int) -> None:
        if self.writer is not None:
            self.writer.add_scalar(name, value, step)

    def log_epoch(self, record: dict) -> None:
        line = (f"{self.prefix}epoch {record['epoch']:4d} | step {record['step']:7d} | "
                f"train ppl {record['train_ppl']:8.2f} | valid ppl {record['val_ppl']:8.2f} | "
                f"lr {record['lr']:g} | {record['seconds']:7.1f} s | {record['optimizer']}"
                + (f" | peak {gib(record['peak_gpu_memory_bytes'])}" if "peak_gpu_memory_bytes" in record else "")
                + (" | switching to ASGD" if record.get("switched_to_asgd") else "")
                + (" | no longer improving: done" if record.get("early_stop") else ""))
        tqdm.write(line)
        sys.stdout.flush()                 # a log file shows the epoch now, not at exit
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        for key in ("train_ppl", "val_ppl", "seconds"):
            self.scalar(f"epoch/{key}", record[key], record["step"])
        # The optimizer this epoch trained with, as metrics.jsonl says (not the one it switched to).
        self.scalar("epoch/asgd", float(record["optimizer"] == "ASGD"), record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def tensorboard_writer():
    """torch's SummaryWriter, imported only when run.tensorboard asks for it (the import is slow).
    ConfigError, one line naming the setting, where TensorBoard cannot be imported: train.py checks
    this before it writes anything, since the run would otherwise stop at its first step, with a
    traceback, after config.yaml and run.json were written."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ConfigError(f"run.tensorboard=true, but TensorBoard cannot be imported ({e}); install it "
                          f"(pip install tensorboard, as requirements.txt does) or set "
                          f"run.tensorboard=false") from None
    return SummaryWriter


def wait_for_a_later_event_file_name(log_dir: Path) -> None:
    """Wait, if need be, until a new event file's name sorts after every one in `log_dir`.

    TensorBoard reads a run's event files in the order of their names,
    events.out.tfevents.<whole seconds>.<host>.<pid>.<counter>, and a resumed run's purge
    (its first event) drops only the events read before it. A resume within the same second
    as the previous writer (in one process: counter 9 after 10 sorts first) would be read
    first and purged by the older file instead: the new epochs would vanish from TensorBoard.
    A strictly later second orders the files whatever follows it; the wait is under a second.
    """
    seconds = [int(second) for p in log_dir.glob("events.out.tfevents.*")
               if (second := p.name.split(".")[3]).isdigit()]
    later = max(seconds, default=-1) + 1
    while time.time() < later:
        time.sleep(later - time.time())


def keep_epochs(path: Path, completed: int) -> None:
    """Cut metrics.jsonl to the epochs the checkpoint has completed (a run killed after an
    epoch's line but before that epoch's last.pt redoes the epoch and writes the line again)."""
    if not path.is_file():
        return
    lines, kept = path.read_text(encoding="utf-8").splitlines(keepends=True), []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            break                      # a line cut short by a crash: it and what follows go
        if not line.endswith("\n") or record.get("epoch", completed + 1) > completed:
            break
        kept.append(line)
    if len(kept) < len(lines):
        write_text_atomic(path, "".join(kept))
