"""The one interface every output head implements.

A head maps g, the (dropped) last-layer LSTM output of shape (T, B, nhidlast), to
log-probabilities over the vocabulary, shape (T, B, V). Every head has the tied decoder
l = W g + b (`self.decoder`, made here). Heads that apply a pointwise function f to the logits
(SS, GSS, PLIF) also return f(l): rank.py needs it; `PointwiseTransformHead` is their common
form. Training and perplexity need only the targets' log-probabilities: `target_log_probs`
gives them, by default from forward(); a head may compute them more cheaply (MoS does).

A head class is the single source of what the rest of the repository needs to know about it:
its config options (`Options`, a small frozen dataclass: the keys a config may set under
`head:` besides `name`; validated, so a key the head does not use is an error), its name in
tables and figures (`label`), whether it returns transformed logits, options small enough for
tests (`small_options`), and its maths written plainly (`reference`), which the tests compare
with the (possibly fused) `forward`. The config loader, the result tables, the benchmarks, the
synthetic experiment and the tests read these.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional

import torch
from torch import nn
import torch.nn.functional as F


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


class TiedDecoder(nn.Module):
    """l = W g + b with W the embedding matrix (shared Parameter) and b initialised to 0."""

    def __init__(self, vocab_size: int, tied_weight: nn.Parameter):
        super().__init__()
        self.weight = tied_weight
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return F.linear(g, self.weight, self.bias)


class OutputHead(nn.Module):
    """Base class: subclasses set `Options` and `label` and implement `forward`.

    Constructor arguments are the same for every head:
      options       an instance of cls.Options (validated)
      vocab_size    V
      emsize        d_emb, the size of the tied decoder rows
      nhidlast      size of g, the last LSTM layer's output
      tied_weight   the embedding matrix (V x d_emb), shared as the weight of `self.decoder`
    """

    Options: ClassVar[type] = NoOptions
    label: ClassVar[str]                  # the head's name in tables and figures, e.g. "LMS-PLIF†"
    # Linear heads project g straight onto the tied embedding rows, so g must have size d_emb.
    requires_nhidlast_equal_emsize: ClassVar[bool] = True
    # forward() returns f(l) besides the log-probabilities (rank.py ranks both).
    has_transformed_logits: ClassVar[bool] = False

    def __init__(self, options, vocab_size: int, emsize: int, nhidlast: int,
                 tied_weight: nn.Parameter):
        super().__init__()
        self.options = options
        self.vocab_size = vocab_size
        self.decoder = TiedDecoder(vocab_size, tied_weight)

    @classmethod
    def small_options(cls):
        """Options for tiny test and smoke-test models (eager kernels, few parameters)."""
        return cls.Options()

    def forward(self, g: torch.Tensor) -> HeadOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def reference(self, g: torch.Tensor) -> HeadOutput:
        """The head's equation written plainly, with plain autograd: the same values and
        gradients as forward() (tests check it), however forward computes them. A head whose
        forward is already the plain formula keeps this default."""
        return self(g)

    def target_log_probs(self, g: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(target) at every position, (T, B): all that the loss and perplexity need.

        The same values as gathering forward()'s log-probabilities (which is what this does);
        a head whose full (T, B, V) output is costly overrides it (MoS)."""
        log_probs = self(g).log_probs
        return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    @classmethod
    def grouped_target_log_probs(cls, heads: list, g: torch.Tensor, targets: torch.Tensor,
                                 decoder_weights: torch.Tensor) -> Optional[torch.Tensor]:
        """log p(target) of several heads of this class at once (a group run's members, each with
        its own weights): (G, T, B) from g (G, T, B, nhidlast), targets (G, T, B) and the heads'
        decoder weights stacked (G, V, d_emb), the same values as each head's target_log_probs.
        None for a head without this batched form (the default): each member's head then runs on
        its own, in its own random stream. A head that draws random numbers keeps the default."""
        return None

    def set_word_counts(self, counts: torch.Tensor) -> None:
        """Called once on a new model with every word's count in the training split (V,), before
        training. A head whose structure depends on word frequencies (Mixtape's gate sharing)
        keeps what it needs in buffers, which a trained model's checkpoint restores; the others
        ignore it."""

    def extra_param_groups(self) -> list[dict]:
        """Optimizer groups with their own base learning rate, e.g. PLIF's slopes.

        Each entry is {'params': [...], 'lr': float}. Parameters listed here are left out
        of the main group. The training loop rescales every group's lr by seq_len / bptt.
        """
        return []


class PointwiseTransformHead(OutputHead):
    """log p = log_softmax(f(l)), l = W g + b, for a pointwise f; forward() returns f(l) too.

    A subclass gives f twice: `transform` as forward runs it (a fused kernel, say) and
    `transform_reference` as written, for `reference()`; a plain f needs only `transform`.
    """

    has_transformed_logits = True

    def transform(self, logits: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def transform_reference(self, logits: torch.Tensor) -> torch.Tensor:
        return self.transform(logits)

    def forward(self, g: torch.Tensor) -> HeadOutput:
        return _log_softmax_of(self.transform(self.decoder(g)))

    def reference(self, g: torch.Tensor) -> HeadOutput:
        return _log_softmax_of(self.transform_reference(self.decoder(g)))


def _log_softmax_of(transformed: torch.Tensor) -> HeadOutput:
    return HeadOutput(F.log_softmax(transformed, dim=-1), transformed)
