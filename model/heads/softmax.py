"""Softmax: log p = log_softmax(l), l = W g + b with W tied to the embedding ([AWD])."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import HeadOutput, OutputHead, TiedDecoder


class SoftmaxHead(OutputHead):
    label = "Softmax"

    def __init__(self, options, vocab_size, emsize, nhidlast, tied_weight):
        super().__init__(options, vocab_size, emsize, nhidlast, tied_weight)
        self.decoder = TiedDecoder(vocab_size, tied_weight)

    def forward(self, hidden: torch.Tensor) -> HeadOutput:
        return HeadOutput(F.log_softmax(self.decoder(hidden), dim=-1), None)
