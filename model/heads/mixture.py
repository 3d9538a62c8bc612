"""Mixture of Softmaxes (MoS) and Mixture of Contexts (MoC) ([MoS]; docs/reference.md section 4).

Both compute, from g (T, B, nhidlast), a prior over K components and K context vectors:

    pi  = softmax(W_pi g)                      W_pi: nhidlast -> K, no bias
    h_k = tanh(W_h g + b_h), split into K      W_h:  nhidlast -> K * d_emb
          vectors of size d_emb, with locked dropout `dropoutl` on them

    MoS:  log p = log sum_k pi_k softmax(W h_k + b)      (computed in log space)
    MoC:  log p = log_softmax(W (sum_k pi_k h_k) + b)

W is the embedding matrix (tied), b the decoder bias. `mos_reference` is the MoS formula with
plain autograd (it keeps K log-softmax outputs of size V per position); MoS runs fused kernels of
it (model/kernels/mixture.py): forward() the full mixed log-probabilities (rank.py, top-5), and
target_log_probs(), which training and perplexity use, log p(target) alone, without ever forming
the mixed (T, B, V) output. The tests check both against the reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from ..body import locked_dropout
from ..kernels.mixture import Workspace, mixture_log_softmax, mixture_target_log_prob
from .base import HeadOutput, OutputHead


def mos_reference(logits: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """logits (..., K, V) = W h_k + b, log_prior (..., K) = log pi ->
    log sum_k pi_k softmax(logits_k), in log space so that no probability underflows to log(0)."""
    return torch.logsumexp(log_prior.unsqueeze(-1) + F.log_softmax(logits, dim=-1), dim=-2)


@dataclass(frozen=True)
class MixtureOptions:
    components: int = 15     # K
    dropoutl: float = 0.29   # locked dropout on the K context vectors
    # multiplies the latent layer's initial weights (1: PyTorch's nn.Linear init, as the MoS
    # code's); a diagnosis of MoC's training (docs/results_cpu.md), not a setting of [MoS] or [SB]
    latent_scale: float = 1.0

    def __post_init__(self):
        if self.components < 1:
            raise ValueError(f"components: expected an integer >= 1, got {self.components}")
        if not 0.0 <= self.dropoutl < 1.0:
            raise ValueError(f"dropoutl: expected a probability in [0, 1), got {self.dropoutl}")
        if not (math.isfinite(self.latent_scale) and self.latent_scale > 0):
            raise ValueError(f"latent_scale: expected a finite value > 0, got {self.latent_scale}")


@dataclass(frozen=True)
class MoSOptions(MixtureOptions):
    compile: bool = True     # fuse the mixture's per-logit passes with torch.compile (eager fallback)


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
        if options.latent_scale != 1.0:
            with torch.no_grad():
                self.latent.weight.mul_(options.latent_scale)
        # The decoder's bias stays the last parameter, after prior and latent: last.pt keeps
        # the optimizer's state by parameter position.
        self.register_module("decoder", self._modules.pop("decoder"))

    @classmethod
    def small_options(cls):
        return cls.Options(components=3)

    def components(self, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prior logits W_pi g (T, B, K) and the dropped contexts h (T, B, K, d_emb)."""
        contexts = torch.tanh(self.latent(g))
        # One mask per sequence over all K * d_emb units, shared by every time step.
        contexts = locked_dropout(contexts, self.options.dropoutl, self.training)
        return self.prior(g), contexts.view(*g.shape[:2], -1, self.emsize)


class MoSHead(_MixtureHead):
    Options = MoSOptions
    label = "MoS"

    def __init__(self, options, vocab_size: int, emsize: int, nhidlast: int,
                 tied_weight: nn.Parameter):
        super().__init__(options, vocab_size, emsize, nhidlast, tied_weight)
        self.workspace = Workspace()      # the training step's (N*K, V) logits, reused

    @classmethod
    def small_options(cls):
        return cls.Options(components=3, compile=False)

    def reference(self, g: torch.Tensor) -> HeadOutput:
        prior_logits, contexts = self.components(g)
        return HeadOutput(mos_reference(self.decoder(contexts), F.log_softmax(prior_logits, -1)), None)

    def forward(self, g: torch.Tensor) -> HeadOutput:
        prior_logits, contexts = self.components(g)
        log_prior = F.log_softmax(prior_logits, dim=-1)                    # (T, B, K)
        log_p = mixture_log_softmax(self.decoder(contexts), log_prior, self.options.compile)
        return HeadOutput(log_p, None)

    def target_log_probs(self, g: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        prior_logits, contexts = self.components(g)
        log_prior = F.log_softmax(prior_logits, dim=-1)
        n, k = targets.numel(), self.options.components
        log_p = mixture_target_log_prob(contexts.reshape(n, k, self.emsize), self.decoder.weight,
                                        self.decoder.bias, log_prior.reshape(n, k),
                                        targets.reshape(n), self.workspace, self.options.compile)
        return log_p.view(targets.shape)


class MoCHead(_MixtureHead):
    label = "MoC"

    def forward(self, g: torch.Tensor) -> HeadOutput:
        prior_logits, contexts = self.components(g)
        prior = F.softmax(prior_logits, dim=-1).unsqueeze(-1)               # (T, B, K, 1)
        context = (prior * contexts).sum(dim=2)                             # (T, B, d_emb)
        return HeadOutput(F.log_softmax(self.decoder(context), dim=-1), None)
