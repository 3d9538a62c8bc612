"""Softmax: log p = log_softmax(l), l = W g + b with W tied to the embedding ([AWD])."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..group import stacked
from .base import HeadOutput, OutputHead


class SoftmaxHead(OutputHead):
    label = "Softmax"

    def forward(self, g: torch.Tensor) -> HeadOutput:
        return HeadOutput(F.log_softmax(self.decoder(g), dim=-1), None)

    @classmethod
    def grouped_target_log_probs(cls, heads, g, targets, decoder_weights):
        """All the members' logits as one batched product, their log-softmax and the targets'
        entries as one kernel each: a few launches for the group instead of a few per member."""
        biases = stacked([head.decoder.bias for head in heads])                          # (G, V)
        members, steps, batch, size = g.shape
        logits = torch.baddbmm(biases.unsqueeze(1), g.reshape(members, steps * batch, size),
                               decoder_weights.transpose(1, 2))                          # (G, T B, V)
        picked = F.log_softmax(logits, dim=-1).gather(-1, targets.reshape(members, -1, 1))
        return picked.view(members, steps, batch)
