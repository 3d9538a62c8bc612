"""The CUDA random state a checkpoint keeps: the training device's only, so a run resumes with
other GPUs visible (fake device counts: no GPU is needed)."""
from __future__ import annotations

import pytest
import torch

from experiment import checkpoint
from experiment.checkpoint import CheckpointError
from model.random_stream import GlobalRandomStream


def stream(device: str | torch.device) -> GlobalRandomStream:
    """The process's generators as a run on `device` draws from them."""
    return GlobalRandomStream(torch.device(device))


class FakeCuda:
    """torch.cuda's random-state functions for `count` visible GPUs, recording what is set."""

    def __init__(self, count: int):
        self.count = count
        self.states = [torch.full((16,), i, dtype=torch.uint8) for i in range(count)]
        self.restored: dict[int, torch.Tensor] = {}

    def index(self, device) -> int:
        device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        index = 0 if device.index is None else device.index
        if index >= self.count:
            raise IndexError(f"no GPU {index} of {self.count}")
        return index

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.states[self.index(device)])
        monkeypatch.setattr(torch.cuda, "set_rng_state",
                            lambda state, device="cuda": self.restored.__setitem__(self.index(device), state))
        monkeypatch.setattr(torch.cuda, "set_rng_state_all",
                            lambda states: [self.restored.__setitem__(self.index(i), s)
                                            for i, s in enumerate(states)])


class Sampler:
    def state_dict(self):
        return {"position": 3}

    def load_state_dict(self, state):
        assert state == {"position": 3}


def resumed_with_one_gpu(saved: dict, monkeypatch) -> torch.Tensor:
    """The CUDA state restored from `saved` on cuda:0 of a machine showing one GPU (the only one set)."""
    one = FakeCuda(1)
    one.install(monkeypatch)
    checkpoint.restore_rng_state(saved, Sampler(), stream("cuda:0"), "last.pt")
    assert list(one.restored) == [0]
    return one.restored[0]


def test_a_checkpoint_of_8_visible_gpus_resumes_with_one(monkeypatch):
    eight = FakeCuda(8)
    eight.install(monkeypatch)
    old_format = {"torch": torch.get_rng_state(), "sampler": Sampler().state_dict(),
                  "cuda": torch.cuda.get_rng_state_all()}          # what older checkpoints hold
    assert torch.equal(resumed_with_one_gpu(old_format, monkeypatch), eight.states[0])


def test_only_the_training_devices_state_is_saved_and_restored(monkeypatch):
    gpus = FakeCuda(8)
    gpus.install(monkeypatch)
    saved = checkpoint.rng_state(Sampler(), stream("cuda:5"))
    assert torch.equal(saved["cuda"], gpus.states[5])
    assert torch.equal(resumed_with_one_gpu(saved, monkeypatch), gpus.states[5])


def test_an_old_checkpoint_without_the_devices_entry_is_one_line(monkeypatch):
    two = FakeCuda(2)
    two.install(monkeypatch)
    old_format = {"torch": torch.get_rng_state(), "sampler": {}, "cuda": torch.cuda.get_rng_state_all()}
    FakeCuda(4).install(monkeypatch)
    with pytest.raises(CheckpointError, match=r"last.pt: holds the CUDA random states of 2 GPU\(s\).*cuda:3"):
        checkpoint.training_device_cuda_state(old_format, torch.device("cuda", 3), "last.pt")


def test_cpu_runs_save_no_cuda_state_and_ignore_a_saved_one(monkeypatch):
    gpus = FakeCuda(2)
    gpus.install(monkeypatch)
    assert checkpoint.rng_state(Sampler(), stream("cpu"))["cuda"] is None
    saved = {"torch": torch.get_rng_state(), "sampler": Sampler().state_dict(), "cuda": gpus.states[1]}
    checkpoint.restore_rng_state(saved, Sampler(), stream("cpu"), "last.pt")
    assert gpus.restored == {}


def test_train_py_refuses_a_resume_on_a_gpu_the_checkpoint_has_no_state_for(tiny_run, tmp_path, monkeypatch,
                                                                            capsys):
    """An older last.pt with the CUDA states of 2 visible GPUs, resumed on cuda:3 of 4: one line,
    exit 2, nothing written."""
    import shutil

    import train
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    last = torch.load(run_dir / "last.pt", weights_only=True)
    last["rng"]["cuda"] = FakeCuda(2).states
    checkpoint.save_atomic(last, run_dir / "last.pt")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}
    FakeCuda(4).install(monkeypatch)
    assert train.main(["--resume", str(run_dir), "run.device=cuda:3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {run_dir / 'last.pt'}: holds the CUDA random states of 2 GPU(s)")
    assert "\n" not in err
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"} == before
