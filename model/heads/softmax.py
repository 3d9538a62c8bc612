"""Softmax: log p = log_softmax(l), l = W g + b with W tied to the embedding ([AWD])."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import HeadOutput, OutputHead


class SoftmaxHead(OutputHead):
    label = "Softmax"

    def forward(self, g: torch.Tensor) -> HeadOutput:
        return HeadOutput(F.log_softmax(self.decoder(g), dim=-1), None)
