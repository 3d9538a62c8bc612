"""Where a run's random numbers come from: its dropout masks and its embedding noise.

A run trained alone draws them from the process's global generators (seeded with train.seed
before the model is built, so the masks continue the stream the initial weights came from).
A run trained in a group (train.py --group) shares the process with other runs, so each owns a
`RandomStream`: a CPU generator and, on a GPU, one for its device, holding exactly the states
the global generators would hold in its solo run. While a member computes, its stream is made
current (`with stream:`; per thread, so members may compute side by side), and every mask of
the body and the heads (`model.body.keep_mask`, `embedding_noise`) is drawn from it: the
group's member draws the numbers its solo run draws, in the same order.

Both kinds give their state in last.pt's layout ({"torch": CPU state, "cuda": the training
device's state or None}) and take it back, so a run can stop in a group and continue alone, or
the reverse.
"""
from __future__ import annotations

import threading

import torch

_current = threading.local()      # .stream: the RandomStream drawing in this thread (None: global)


def generator_for(device: torch.device) -> torch.Generator | None:
    """The generator a mask on `device` is drawn from: the current stream's, or None (the
    global generator of that device) outside every `with stream:`."""
    stream = getattr(_current, "stream", None)
    return None if stream is None else stream.generator(device)


class GlobalRandomStream:
    """The process's own generators: a run trained alone (every rank of a torchrun too)."""

    def __init__(self, device: torch.device):
        self.device = device

    def state(self) -> dict:
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return {"torch": torch.get_rng_state(), "cuda": cuda}

    def restore(self, cpu_state: torch.Tensor, cuda_state: torch.Tensor | None) -> None:
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, self.device)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


class RandomStream(GlobalRandomStream):
    """A run's own generators, for a run that shares the process (a group's member). Made from
    the global generators' states at the moment its solo run would start drawing from them."""

    def __init__(self, device: torch.device):
        super().__init__(device)
        self.cpu = torch.Generator()
        self.cuda = torch.Generator(device=device) if device.type == "cuda" else None
        now = GlobalRandomStream(device).state()
        self.restore(now["torch"], now["cuda"])

    def generator(self, device: torch.device) -> torch.Generator:
        if device.type == "cpu":
            return self.cpu
        if self.cuda is None:
            raise RuntimeError(f"a mask on {device} drawn from the stream of a run on {self.device}")
        return self.cuda

    def state(self) -> dict:
        return {"torch": self.cpu.get_state(),
                "cuda": None if self.cuda is None else self.cuda.get_state()}

    def restore(self, cpu_state: torch.Tensor, cuda_state: torch.Tensor | None) -> None:
        self.cpu.set_state(cpu_state)
        if cuda_state is not None and self.cuda is not None:
            self.cuda.set_state(cuda_state)

    def __enter__(self):
        self.outer = getattr(_current, "stream", None)
        _current.stream = self
        return self

    def __exit__(self, *exc) -> bool:
        _current.stream = self.outer
        return False
