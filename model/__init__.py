"""The language model: the AWD-LSTM body followed by one output head from the registry."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .body import AWDLSTMBody, BodyOutput
from .heads import HEADS, HeadOutput


class ModelOutput(NamedTuple):
    log_probs: torch.Tensor | None          # (T, B, V); None when targets were given
    transformed_logits: torch.Tensor | None # (T, B, V) f(l) for heads that have one
    hidden: list                            # (h, c) per layer, to carry to the next chunk
    dropped_output: torch.Tensor            # g, the head's input, for AR
    last_raw_output: torch.Tensor           # last LSTM layer before dropout, for TAR
    target_log_probs: torch.Tensor | None = None   # (T, B) log p(target); when targets were given


class LanguageModel(nn.Module):
    def __init__(self, body: AWDLSTMBody, head: nn.Module):
        super().__init__()
        self.body = body
        self.head = head

    def init_hidden(self, batch_size: int) -> list:
        return self.body.init_hidden(batch_size)

    def forward(self, ids: torch.Tensor, hidden: list, targets: torch.Tensor | None = None) -> ModelOutput:
        """Full log-probabilities, or with `targets` (T, B) only the targets' log-probabilities
        (what the loss needs; cheaper for some heads)."""
        return self.apply_head(self.body(ids, hidden), targets)

    def apply_head(self, body: BodyOutput, targets: torch.Tensor | None = None) -> ModelOutput:
        """The rest of forward() once the body has run (a group computes its bodies together)."""
        if targets is not None:
            return ModelOutput(None, None, body.hidden, body.output, body.last_raw_output,
                               self.head.target_log_probs(body.output, targets))
        head: HeadOutput = self.head(body.output)
        return ModelOutput(head.log_probs, head.transformed_logits, body.hidden,
                           body.output, body.last_raw_output)


def build_model(config, vocab_size: int, word_counts: torch.Tensor | None = None) -> LanguageModel:
    """Build the model a resolved Config describes (see experiment/config.py). A model to be
    trained gets `word_counts`, every word's count in the training split (Mixtape's gate sharing
    needs them); one whose weights come from a checkpoint does not."""
    m = config.model
    body = AWDLSTMBody(vocab_size, m.emsize, m.nhid, m.nhidlast, m.nlayers,
                       m.dropout, m.dropouth, m.dropouti, m.dropoute, m.wdrop, m.emb_noise)
    head = HEADS[config.head_name](config.head, vocab_size, m.emsize, m.nhidlast,
                                   body.encoder.weight)
    if word_counts is not None:
        head.set_word_counts(word_counts)
    return LanguageModel(body, head)


def word_counts(train: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Every word's count in the training split's ids (V,)."""
    return torch.bincount(train, minlength=vocab_size)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
