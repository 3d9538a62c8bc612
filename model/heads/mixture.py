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
from .base import FusedKernel, HeadOutput, OutputHead
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


@dataclass(frozen=True)
class MoSOptions(MixtureOptions):
    compile: bool = True     # fuse the mixture's per-logit passes with torch.compile (eager fallback)


def _mixture_forward(logits: torch.Tensor, log_prior: torch.Tensor):
    """log p_v = logsumexp_k(log pi_k + l_kv - lse_k), lse_k = logsumexp_v l_kv.

    Returns log p (N, V) and shift_k = log pi_k - lse_k (N, K), which backward needs."""
    shift = log_prior - torch.logsumexp(logits, dim=-1)
    return torch.logsumexp(logits + shift.unsqueeze(-1), dim=1), shift


def _mixture_backward(logits, shift, log_p, log_prior, grad):
    """Gradients for logits (N, K, V) and log_prior (N, K).

    With a_kv = log pi_k + l_kv - lse_k and the posterior r_kv = exp(a_kv - log p_v):
    d log p_v / d a_kv = r_kv and d a_kv / d l_kw = [v = w] - softmax_k(l)_w, so
    grad l_kw = g_w r_kw - softmax_kw s_k and grad log pi_k = s_k, s_k = sum_v g_v r_kv."""
    weighted = grad.unsqueeze(1) * torch.exp(logits + shift.unsqueeze(-1) - log_p.unsqueeze(1))
    s = weighted.sum(-1)
    lse = log_prior - shift
    return weighted - torch.exp(logits - lse.unsqueeze(-1)) * s.unsqueeze(-1), s


_MIXTURE_FORWARD = FusedKernel(_mixture_forward)
_MIXTURE_BACKWARD = FusedKernel(_mixture_backward)


class _MixtureLogSoftmax(torch.autograd.Function):
    """log sum_k pi_k softmax(l_k), in log space, saving only the logits and two small tensors.

    Autograd through separate ops would keep the (N, K, V) log_softmax output and the
    (N, K, V) sum inside logsumexp, and make some ten passes over them; this function keeps
    the logits alone (4 bytes per component logit) and, compiled, makes about four."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, log_prior: torch.Tensor, compiled: bool) -> torch.Tensor:
        log_p, shift = _MIXTURE_FORWARD(logits, log_prior, compiled=compiled)
        ctx.save_for_backward(logits, shift, log_p, log_prior)
        ctx.compiled = compiled
        return log_p

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, shift, log_p, log_prior = ctx.saved_tensors
        grad_logits, grad_prior = _MIXTURE_BACKWARD(logits, shift, log_p, log_prior,
                                                    grad.contiguous(), compiled=ctx.compiled)
        return grad_logits, grad_prior, None


def mixture_log_softmax(logits: torch.Tensor, log_prior: torch.Tensor, compiled: bool = False):
    """logits (..., K, V), log_prior (..., K) -> log sum_k pi_k softmax(logits_k), shape (..., V)."""
    lead = logits.shape[:-2]
    k, v = logits.shape[-2:]
    log_p = _MixtureLogSoftmax.apply(logits.reshape(-1, k, v), log_prior.reshape(-1, k), compiled)
    return log_p.view(*lead, v)


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
    Options = MoSOptions

    def forward(self, hidden: torch.Tensor) -> HeadOutput:
        prior_logits, contexts = self.components(hidden)
        log_prior = F.log_softmax(prior_logits, dim=-1)                    # (T, B, K)
        # In log space rather than log(sum_k pi_k p_k): no underflow to log(0) for rare words.
        log_p = mixture_log_softmax(self.decoder(contexts), log_prior, self.options.compile)
        return HeadOutput(log_p, None)


class MoCHead(_MixtureHead):
    def forward(self, hidden: torch.Tensor) -> HeadOutput:
        prior_logits, contexts = self.components(hidden)
        prior = F.softmax(prior_logits, dim=-1).unsqueeze(-1)               # (T, B, K, 1)
        context = (prior * contexts).sum(dim=2)                             # (T, B, d_emb)
        return HeadOutput(F.log_softmax(self.decoder(context), dim=-1), None)
