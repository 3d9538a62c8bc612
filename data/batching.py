"""Batching as in the AWD-LSTM code: columns of the token stream, BPTT chunks, variable length."""
from __future__ import annotations

import torch


def batchify(ids: torch.Tensor, batch_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Cut a 1-D token stream into `batch_size` contiguous columns: shape (steps, batch_size).

    The tail that does not fill a whole row is dropped, as in the original code.
    """
    steps = ids.size(0) // batch_size
    if steps < 2:
        raise ValueError(f"batchify: {ids.size(0)} tokens are too few for batch size {batch_size}")
    return ids[: steps * batch_size].view(batch_size, steps).t().contiguous().to(device)


def get_batch(source: torch.Tensor, i: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs source[i : i+seq_len] and the next-token targets, both (seq_len', B).

    seq_len' is shortened at the end of the stream so every input has a target.
    """
    seq_len = min(seq_len, source.size(0) - 1 - i)
    return source[i: i + seq_len], source[i + 1: i + 1 + seq_len]


class SequenceLengthSampler:
    """Variable BPTT ([AWD] section 4.1, docs/reference.md section 3).

    With probability 0.95 the base length is bptt, else bptt / 2; the step's length is
    max(5, int(Normal(base, 5))), capped at bptt + max_seq_len_delta. The sampler owns its
    own generator so its stream is saved in and restored from checkpoints exactly.
    """

    def __init__(self, bptt: int, max_seq_len_delta: int, seed: int):
        self.bptt = bptt
        self.max_len = bptt + max_seq_len_delta
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self) -> int:
        base = self.bptt if torch.rand((), generator=self.generator).item() < 0.95 else self.bptt / 2
        drawn = torch.normal(float(base), 5.0, size=(1,), generator=self.generator).item()
        return min(max(5, int(drawn)), self.max_len)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
