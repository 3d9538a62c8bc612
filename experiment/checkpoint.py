"""Checkpoints: atomic writes, safe loads, and the checks that a checkpoint fits a model.

A checkpoint is a dict of tensors and plain data only (the config as a mapping, never a
pickled object), written to a temporary file and renamed into place, and read back with
torch.load(weights_only=True).

train.py writes two kinds into a run directory (the end of this file has their layout): best.pt,
the weights that validated best so far, and last.pt, everything a resumed run needs to continue
exactly (optimizer, progress, every process's random numbers and hidden states).
"""
from __future__ import annotations

import dataclasses
import pickle
import zipfile
from pathlib import Path

import torch

from .averaged_sgd import AveragedSGD, make_optimizer
from .progress import TrainingProgress
from .run_directory import runs_held, write_atomic

FORMAT = "awd-lstm-heads/1"


class CheckpointError(Exception):
    """A checkpoint that cannot be used; str(error) is one line naming the file and the problem."""


def save_atomic(obj: dict, path: str | Path) -> None:
    """Write `obj` to `path` so that a crash at any moment leaves either the old file or the new;
    a failed write (a full disk) raises RunDirectoryError and leaves no temporary file."""
    write_atomic(path, lambda f: torch.save(obj, f))


EXPECTED = "expected the best.pt or last.pt of a run directory"
ZIP_MAGIC = b"PK\x03\x04"      # torch.save writes a zip archive


def load(path: str | Path, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"{path}: {unreadable_reason(path, e)}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: a PyTorch file, but not a checkpoint saved by train.py "
                              f"(no format {FORMAT!r} in it); {EXPECTED}")
    return ckpt


def saved_processes(path: str | Path) -> int:
    """How many processes saved the last.pt at `path`: only as many can resume it (it holds each
    one's random numbers and hidden states; a single process and a 1-process torchrun are one).
    Memory-mapped, so asking costs no read of the weights. CheckpointError if it is unreadable."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise CheckpointError(f"{path}: {unreadable_reason(Path(path), e)}") from None
    return ckpt.get("world_size", 1) if isinstance(ckpt, dict) else 1


def unreadable_reason(path: Path, error: Exception) -> str:
    """Why torch.load failed on `path`, in words. What torch says is kept only where it can
    mean something: for a text file or any other foreign file it is whatever the unpickler
    tripped over first ("pop from empty list", "KeyError: 101"), so the file's kind is said
    instead."""
    with open(path, "rb") as f:
        start = f.read(len(ZIP_MAGIC))
    if not start:
        return f"an empty file, not a checkpoint saved by train.py; {EXPECTED}"
    if start != ZIP_MAGIC:
        return f"not a PyTorch checkpoint saved by train.py; {EXPECTED}"
    if not zipfile.is_zipfile(path):
        return ("a truncated or damaged PyTorch file (its zip archive is incomplete; train.py "
                "writes whole files only: was it cut short while being copied?)")
    with zipfile.ZipFile(path) as archive:
        if not any(name.endswith("data.pkl") for name in archive.namelist()):
            return f"a zip archive, not a PyTorch checkpoint saved by train.py; {EXPECTED}"
    if isinstance(error, pickle.UnpicklingError):
        # torch.load(weights_only=True) refuses pickled objects other than tensors and plain data
        return (f"a PyTorch file holding objects other than tensors and plain data, not a "
                f"checkpoint saved by train.py; {EXPECTED}")
    first_sentence = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0]
    return f"a damaged PyTorch file ({first_sentence[:200]})"


def resolve_checkpoint_path(path: str | Path, name: str = "best.pt") -> Path:
    """A run directory means its `name` checkpoint; a file is taken as it is."""
    path = Path(path)
    return path / name if path.is_dir() else path


def require_kind(ckpt: dict, kind: str, path, why: str) -> None:
    """A best.pt holds weights only; continuing a run needs a last.pt (optimizer, progress)."""
    if ckpt.get("kind") != kind:
        raise CheckpointError(f"{path}: a {ckpt.get('kind')!r} checkpoint, not a {kind!r} one; "
                              f"{why}")


def optimizer_tensors(ckpt: dict) -> dict:
    """The tensors of a last.pt's optimizer state (the ASGD averages among them), by name."""
    state = ckpt["optimizer"]["state"]["state"]
    return {f"optimizer.{i}.{key}": value for i, entry in state.items() for key, value in entry.items()}


def saved_nothing_yet(run_dir: Path) -> bool:
    """A run directory train.py started (its config.yaml) that has finished no epoch and holds no
    result files: in its first epoch, or killed in it (not a results/ run without checkpoints)."""
    return (run_dir.is_dir() and (run_dir / "config.yaml").is_file()
            and not any((run_dir / f).is_file() for f in ("metrics.jsonl", "eval_best.json")))


def existing_checkpoint(path: str | Path, name: str = "best.pt") -> Path:
    """resolve_checkpoint_path, and a CheckpointError when there is no such file; a run stopped
    before its first validation (last.pt, no best.pt) is told apart from a missing checkpoint."""
    resolved = resolve_checkpoint_path(path, name)
    if resolved.is_file():
        return resolved
    run_dir = Path(path)
    if name == "best.pt" and run_dir.is_dir() and (run_dir / "last.pt").is_file():
        raise CheckpointError(f"{run_dir}: the run has no validated model yet (train.py writes best.pt "
                              f"when it first validates, at the end of epoch 1); "
                              f"{run_dir / 'last.pt'}, the weights where training stands, can be given instead")
    if saved_nothing_yet(run_dir):
        raise CheckpointError(f"{resolved}: checkpoint not found; {run_dir} holds a run that has not saved "
                              f"a checkpoint yet (train.py writes last.pt at the end of each epoch and when "
                              f"stopped): if it is not training, start it again with its train.py command")
    if run_dir.is_dir() and (run_dir / "config.yaml").is_file():
        # A committed run of results/ (or a copy): its result files, never its checkpoints.
        raise CheckpointError(f"{resolved}: checkpoint not found; {run_dir} holds a run's result files "
                              f"without its checkpoints (results/ commits none): the plan that made it "
                              f"trains it again elsewhere (python sweep.py PLAN --out DIR)")
    if not run_dir.exists() and run_dir.suffix != ".pt":
        raise CheckpointError(f"{run_dir}: no such run directory ({EXPECTED})")
    if run_dir.is_dir():
        runs = runs_held(run_dir, name)
        inside = f" (it holds runs: {runs})" if runs else ""
        raise CheckpointError(f"{run_dir}: not a run directory, no {name} and no config.yaml{inside}; "
                              f"give one run's directory or checkpoint")
    raise CheckpointError(f"{resolved}: checkpoint not found")


def check_vocabulary(ckpt: dict, corpus, path) -> None:
    if ckpt["vocab_size"] != corpus.vocab_size or ckpt["vocab_sha256"] != corpus.vocab_sha256:
        # As many words, other ones or in another order (ids number words in order of first
        # appearance over train, valid, test): "2353 words, not 2353 words" said nothing.
        size = (f"{corpus.vocab_size} words, as many but other words or in another order (vocabulary "
                f"sha256 {corpus.vocab_sha256[:12]}..., the checkpoint's {ckpt['vocab_sha256'][:12]}...)"
                if ckpt["vocab_size"] == corpus.vocab_size else f"{corpus.vocab_size} words")
        raise CheckpointError(
            f"{path}: the checkpoint's vocabulary ({ckpt['vocab_size']} words) is not the "
            f"vocabulary of the {corpus.name} corpus in use ({size}); "
            f"check data.dataset and the data directory")


def check_finite(tensors: dict, path, what: str = "weights") -> None:
    """CheckpointError if any tensor of `tensors` holds a NaN or an infinity."""
    bad = [key for key, t in tensors.items()
           if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise CheckpointError(f"{path}: non-finite {what} ({len(bad)} of {len(tensors)} tensors "
                              f"hold NaN or inf, e.g. {bad[0]}); the training that wrote it diverged")


def load_model_state(model: torch.nn.Module, state: dict, path) -> None:
    """load_state_dict with a one-line error for missing, unexpected, mis-shaped or non-finite
    entries."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise CheckpointError(f"{path}: checkpoint does not fit the model: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise CheckpointError(f"{path}: {key} has shape {tuple(state[key].shape)} in the "
                                  f"checkpoint but {tuple(tensor.shape)} in the model the config builds")
    check_finite(state, path)
    model.load_state_dict(state)


def rng_state(sampler, stream) -> dict:
    """The random-number state a run continues from: its stream's (model/random_stream.py: the
    CPU's and, on a GPU, the training device's CUDA state only, for the other visible GPUs'
    streams are not the run's, and they may not be visible when it resumes) and the sampler's."""
    return {**stream.state(), "sampler": sampler.state_dict()}


def training_device_cuda_state(state: dict, device: torch.device, path) -> torch.Tensor | None:
    """The saved CUDA state to restore on `device`: the single state of the training device, or
    from an older checkpoint's list of every visible GPU's states, the training device's entry;
    None when there is nothing to restore (a CPU run, or a run moved between CPU and GPU).
    CheckpointError when that entry does not exist."""
    saved = state.get("cuda")
    if device.type != "cuda":
        return None
    if saved is None or torch.is_tensor(saved):
        return saved
    if not saved:                      # an older checkpoint written without a GPU
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= len(saved):
        raise CheckpointError(
            f"{path}: holds the CUDA random states of {len(saved)} GPU(s) (cuda:0 ... "
            f"cuda:{len(saved) - 1}), none for the training device cuda:{index}; resume on one "
            f"of those devices (run.device=cuda:N)")
    return saved[index]


def restore_rng_state(state: dict, sampler, stream, path) -> None:
    stream.restore(state["torch"], training_device_cuda_state(state, stream.device, path))
    sampler.load_state_dict(state["sampler"])


def rank_rng_state(ckpt: dict, rank: int) -> dict:
    """The random-number state last.pt holds for process `rank`."""
    return [ckpt["rng"], *ckpt.get("rng_of_other_ranks", [])][rank]


# ---------------------------------------------------------------------- train.py's best.pt and last.pt
# `trainer` is train.py's Trainer: what these files hold is its config, model, optimizer (and
# whether it averages), progress, random-number streams and hidden states.

def save_best(trainer, val_loss: float) -> None:
    """best.pt: the model as it was validated (the ASGD averages once averaging), no optimizer;
    before the first step (a run from train.init_from scores its starting weights), epoch 0."""
    p = trainer.progress
    trained = p.step > 0
    save_atomic({
        "format": FORMAT, "kind": "best", "config": trainer.config.to_dict(),
        **trainer.vocab, "model": trainer.model.state_dict(),
        "epoch": p.epoch if trained else 0, "step": p.step, "val_loss": val_loss,
        "averaged": trainer.averaging and trained}, trainer.run_dir / "best.pt")


def save_last(trainer) -> None:
    """last.pt, written by rank 0 with every rank's random-number state and hidden states
    (the hidden states in rank order: those of the single-process run's chunks)."""
    p = trainer.progress
    hidden = None if p.hidden is None else [[(h.cpu(), c.cpu()) for h, c in chunk] for chunk in p.hidden]
    ranks = trainer.world.gather((rng_state(trainer.sampler, trainer.random_stream), hidden))
    # The epoch's CPU seconds so far of every rank (metrics.jsonl's cpu_seconds is their sum): a
    # mid-epoch last.pt with rank 0's alone would count rank 0's N times once resumed.
    epoch_cpu_seconds = trainer.world.sum(p.epoch_cpu_seconds)
    if not trainer.world.is_main:
        return
    rngs, hiddens = zip(*ranks)
    hidden = None if p.hidden is None else [chunk for rank_hidden in hiddens for chunk in rank_hidden]
    save_atomic({
        "format": FORMAT, "kind": "last", "config": trainer.config.to_dict(),
        **trainer.vocab, "model": trainer.model.state_dict(),
        "optimizer": {"averaged": trainer.averaging, "state": trainer.optimizer.state_dict()},
        "progress": dataclasses.replace(p, hidden=hidden, epoch_cpu_seconds=epoch_cpu_seconds).to_dict(),
        "world_size": trainer.world.size, "rng": rngs[0], "rng_of_other_ranks": list(rngs[1:])},
        trainer.run_dir / "last.pt")


def load_last(trainer, ckpt: dict, path: Path) -> None:
    """Continue from last.pt (saved by as many processes as this run has: see
    experiment/training_run.py's check_world_size), each rank with its own random numbers and hidden states."""
    load_model_state(trainer.model, ckpt["model"], path)
    kind = AveragedSGD if ckpt["optimizer"]["averaged"] else torch.optim.SGD
    trainer.optimizer = make_optimizer(trainer.model, trainer.config.train, kind)
    trainer.optimizer.load_state_dict(ckpt["optimizer"]["state"])
    trainer.progress = TrainingProgress.from_dict(ckpt["progress"], trainer.device)
    if not trainer.world.is_main:
        trainer.progress.epoch_cpu_seconds = 0.0     # rank 0 holds every rank's sum (save_last)
    if trainer.progress.hidden is not None:
        first = trainer.world.rank * len(trainer.chunks)
        trainer.progress.hidden = trainer.progress.hidden[first: first + len(trainer.chunks)]
    restore_rng_state(rank_rng_state(ckpt, trainer.world.rank), trainer.sampler, trainer.random_stream, path)
