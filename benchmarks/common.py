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
from model import build_model, word_counts  # noqa: E402


def run_benchmark(main) -> None:
    """A benchmark's entry point: bad input (no corpus where AWD_DATA_DIR points, a config that
    does not load) is one line and exit 2, not a traceback."""
    try:
        main()
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


class TrainerStep:
    """train.py's Trainer.train_step for a config, at seq_len = bptt so steps are comparable
    (in a torchrun world: this rank's share of the step)."""

    def __init__(self, config_path: str, corpus, device: torch.device, overrides=(), world=None,
                 keep_freed_memory: bool = True):
        config = load_config(config_path, ["run.tensorboard=false", f"run.device={device}", *overrides])
        set_float32_precision(config.run.tf32)       # what train.py sets: timed as trained
        if keep_freed_memory:                          # as train.py does
            keep_freed_host_memory()
        torch.manual_seed(0)
        self.model = build_model(config, corpus.vocab_size, word_counts(corpus.train, corpus.vocab_size)).to(device)
        self.trainer = train.Trainer(config, self.model, corpus, Path(tempfile.mkdtemp()), device, world)
        self.trainer.progress.hidden = [self.model.init_hidden(end - start) for start, end in self.trainer.chunks]
        self.trainer.sampler.sample = lambda: config.train.bptt
        self.config = config
        self.tokens = config.train.batch_size * config.train.bptt

    def __call__(self) -> None:
        if self.trainer.progress.position >= self.trainer.train_data.size(0) - 2 - self.config.train.bptt:
            self.trainer.progress.position = 0          # wrap around instead of ending the epoch
        self.trainer.train_step()


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
