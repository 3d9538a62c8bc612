"""What the benchmarks share: train.py's own training step at a fixed length, and timing."""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import train  # noqa: E402
from data.download import DataError  # noqa: E402
from experiment.config import ConfigError, load_config  # noqa: E402
from experiment.loading import keep_freed_host_memory, set_float32_precision  # noqa: E402
from data import load_corpus  # noqa: E402
from model import build_model, word_counts  # noqa: E402


def run_benchmark(main) -> None:
    """A benchmark's entry point: bad input (no corpus where AWD_DATA_DIR points, a config that
    does not load) is one line and exit 2, not a traceback."""
    try:
        main()
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def corpus_of(config):
    """The corpus of a loaded config as train.py reads it: from its data.data_dir (else
    AWD_DATA_DIR, else corpora/), with its data.allow_modified_corpus, so that a benchmark given
    `data.data_dir=DIR` reads DIR (it read AWD_DATA_DIR, the override silently left out)."""
    return load_corpus(config.data.dataset, config.data.data_dir, allow_modified=config.data.allow_modified_corpus)


def bench_trainer(config_path: str, corpus, device: torch.device, overrides=(), world=None,
                  seed: int = 0) -> "train.Trainer":
    """train.py's Trainer for a config in a temporary run directory, its model built from `seed`,
    its steps at seq_len = bptt so that steps are comparable, its hidden states ready."""
    config = load_config(config_path, ["run.tensorboard=false", f"run.device={device}", *overrides])
    set_float32_precision(config.run.tf32)       # what train.py sets: timed as trained
    torch.manual_seed(seed)
    model = build_model(config, corpus.vocab_size, word_counts(corpus.train, corpus.vocab_size)).to(device)
    trainer = train.Trainer(config, model, corpus, Path(tempfile.mkdtemp()), device, world)
    trainer.progress.hidden = [model.init_hidden(end - start) for start, end in trainer.chunks]
    trainer.sampler.sample = lambda: config.train.bptt
    return trainer


def rewind(trainer) -> None:
    """Wrap around to the stream's start instead of ending the epoch."""
    if trainer.progress.position >= trainer.train_data.size(0) - 2 - trainer.config.train.bptt:
        trainer.progress.position = 0


class TrainerStep:
    """train.py's Trainer.train_step for a config, at seq_len = bptt so steps are comparable
    (in a torchrun world: this rank's share of the step)."""

    def __init__(self, config_path: str, corpus, device: torch.device, overrides=(), world=None,
                 keep_freed_memory: bool = True):
        if keep_freed_memory:                          # as train.py does
            keep_freed_host_memory()
        self.trainer = bench_trainer(config_path, corpus, device, overrides, world)
        self.model, self.config = self.trainer.model, self.trainer.config
        self.tokens = self.config.train.batch_size * self.config.train.bptt

    def __call__(self) -> None:
        rewind(self.trainer)
        self.trainer.train_step()


class GroupStep:
    """One step of a group (train.py --group): every member's step, the bodies computed together
    (`kind` batched) or each member's own step side by side (solo), as experiment/group.py takes
    it. `members`: (config, overrides) per run; each model built from its own seed."""

    def __init__(self, members, corpus, device: torch.device, kind: str, threads: int | None = None):
        from experiment.group import SideBySide, batched_steps
        from experiment.loading import one_heap_for_every_thread
        from model.random_stream import RandomStream
        keep_freed_host_memory()
        if kind != "batched" and device.type == "cpu" and (threads or torch.get_num_threads()) > 1:
            one_heap_for_every_thread()                # side by side, as train.py --group does
        self.trainers = []
        for seed, (config_path, overrides) in enumerate(members):
            trainer = bench_trainer(config_path, corpus, device, overrides, seed=seed)
            trainer.random_stream = RandomStream(device)
            self.trainers.append(trainer)
        self.step = batched_steps if kind == "batched" else SideBySide(threads or torch.get_num_threads())
        self.tokens = sum(t.config.train.batch_size * t.config.train.bptt for t in self.trainers)

    def __call__(self) -> None:
        for trainer in self.trainers:
            rewind(trainer)
        for result in self.step(self.trainers):
            if isinstance(result, Exception):
                raise result

    def close(self) -> None:
        from model.kernels.grouped_lstm import Loops
        if hasattr(self.step, "close"):
            self.step.close()
        Loops.release()                     # the next group's shapes are others: free the captures


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device | None = None) -> float:
    """Seconds that fn() takes (with the device's queued work finished on both sides)."""
    if device is not None:
        synchronize(device)
    start = time.perf_counter()
    fn()
    if device is not None:
        synchronize(device)
    return time.perf_counter() - start


def median_step(step, steps: int, device: torch.device) -> float:
    """The median seconds of `steps` calls of step() (each with the device's queued work finished)."""
    return statistics.median(timed(step, device) for _ in range(steps))


def interleaved_times(steps: dict, reps: int, warmup: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds of each step, run round-robin so drifts in machine speed hit all alike."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(reps):
        for name, step in steps.items():
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(t) for name, t in times.items()}
