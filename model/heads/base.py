"""The one interface every output head implements.

A head maps the (dropped) last-layer LSTM output g, shape (T, B, nhidlast), to
log-probabilities over the vocabulary, shape (T, B, V). Heads that apply a pointwise
function f to the logits l = W g + b (SS, GSS, PLIF) also return f(l): rank.py needs it.

Heads are configured by a small frozen dataclass of their own options (the keys a
config file may set under `head:` besides `name`). A head with no options uses
`NoOptions`. The config loader validates user input against that dataclass, so a key
the chosen head does not use is an error, never silently ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional

import torch
from torch import nn


class HeadOutput(NamedTuple):
    log_probs: torch.Tensor                      # (T, B, V)
    transformed_logits: Optional[torch.Tensor]   # (T, B, V) f(l), or None where the head has none


@dataclass(frozen=True)
class NoOptions:
    """Options of a head that has none.

    A head's Options dataclass checks its own values in __post_init__ and raises
    ValueError("<field>: <what was expected>") for an impossible value; the config loader
    turns that into a one-line error naming the config key.
    """


class OutputHead(nn.Module):
    """Base class: subclasses set `Options` and implement `forward`.

    Constructor arguments are the same for every head:
      options       an instance of cls.Options (validated)
      vocab_size    V
      emsize        d_emb, the size of the tied decoder rows
      nhidlast      size of g, the last LSTM layer's output
      tied_weight   the embedding matrix (V x d_emb), shared as the decoder weight
    """

    Options: ClassVar[type] = NoOptions
    # Linear heads project g straight onto the tied embedding rows, so g must have size d_emb.
    requires_nhidlast_equal_emsize: ClassVar[bool] = True

    def __init__(self, options, vocab_size: int, emsize: int, nhidlast: int,
                 tied_weight: nn.Parameter):
        super().__init__()
        self.options = options
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> HeadOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def extra_param_groups(self) -> list[dict]:
        """Optimizer groups with their own base learning rate, e.g. PLIF's slopes.

        Each entry is {'params': [...], 'lr': float}. Parameters listed here are left out
        of the main group. The training loop rescales every group's lr by seq_len / bptt.
        """
        return []
