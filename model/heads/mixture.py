"""Mixture of Softmaxes (MoS) and Mixture of Contexts (MoC) ([MoS]; SPEC section 4).

Both compute, from g (T, B, nhidlast), a prior over K components and K context vectors:

    pi  = softmax(W_pi g)                      W_pi: nhidlast -> K, no bias
    h_k = tanh(W_h g + b_h), split into K      W_h:  nhidlast -> K * d_emb
          vectors of size d_emb, with locked dropout `dropoutl` on them

    MoS:  log p = log sum_k pi_k softmax(W h_k + b)      (computed in log space)
    MoC:  log p = log_softmax(W (sum_k pi_k h_k) + b)

W is the embedding matrix (tied), b the decoder bias.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from ..body import locked_dropout
from .base import HeadOutput, OutputHead
from .softmax import TiedDecoder


@dataclass(frozen=True)
class MixtureOptions:
    components: int = 15     # K
    dropoutl: float = 0.29   # locked dropout on the K context vectors

    def __post_init__(self):
        if self.components < 1:
            raise ValueError(f"components: expected an integer >= 1, got {self.components}")
        if not 0.0 <= self.dropoutl < 1.0:
            raise ValueError(f"dropoutl: expected a probability in [0, 1), got {self.dropoutl}")


class _MixtureHead(OutputHead):
    Options = MixtureOptions
    # The contexts h_k have size d_emb whatever nhidlast is.
    requires_nhidlast_equal_emsize = False

    def __init__(self, options, vocab_size: int, emsize: int, nhidlast: int,
                 tied_weight: nn.Parameter):
        super().__init__(options, vocab_size, emsize, nhidlast, tied_weight)
        self.emsize = emsize
        self.prior = nn.Linear(nhidlast, options.components, bias=False)
        self.latent = nn.Linear(nhidlast, options.components * emsize)
        self.decoder = TiedDecoder(vocab_size, tied_weight)

    def components(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prior logits W_pi g (T, B, K) and the dropped contexts h (T, B, K, d_emb)."""
        contexts = torch.tanh(self.latent(hidden))
        # One mask per sequence over all K * d_emb units, shared by every time step.
        contexts = locked_dropout(contexts, self.options.dropoutl, self.training)
        return self.prior(hidden), contexts.view(*hidden.shape[:2], -1, self.emsize)


class MoSHead(_MixtureHead):
    def forward(self, hidden: torch.Tensor) -> HeadOutput:
        prior_logits, contexts = self.components(hidden)
        log_prior = F.log_softmax(prior_logits, dim=-1).unsqueeze(-1)       # (T, B, K, 1)
        log_components = F.log_softmax(self.decoder(contexts), dim=-1)      # (T, B, K, V)
        # logsumexp rather than log(sum_k pi_k p_k): no underflow to log(0) for rare words.
        return HeadOutput(torch.logsumexp(log_prior + log_components, dim=2), None)


class MoCHead(_MixtureHead):
    def forward(self, hidden: torch.Tensor) -> HeadOutput:
        prior_logits, contexts = self.components(hidden)
        prior = F.softmax(prior_logits, dim=-1).unsqueeze(-1)               # (T, B, K, 1)
        context = (prior * contexts).sum(dim=2)                             # (T, B, d_emb)
        return HeadOutput(F.log_softmax(self.decoder(context), dim=-1), None)
