"""Softmax: log_softmax(W g + b) with W tied to the embedding."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from .base import HeadOutput, OutputHead


class TiedDecoder(nn.Module):
    """l = W g + b with W the embedding matrix (shared Parameter) and b initialised to 0."""

    def __init__(self, vocab_size: int, tied_weight: nn.Parameter):
        super().__init__()
        self.weight = tied_weight
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight, self.bias)


class SoftmaxHead(OutputHead):
    def __init__(self, options, vocab_size, emsize, nhidlast, tied_weight):
        super().__init__(options, vocab_size, emsize, nhidlast, tied_weight)
        self.decoder = TiedDecoder(vocab_size, tied_weight)

    def forward(self, hidden: torch.Tensor) -> HeadOutput:
        return HeadOutput(F.log_softmax(self.decoder(hidden), dim=-1), None)
