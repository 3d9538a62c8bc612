"""The fused log-space mixture of softmaxes (model/heads/mixture.py has the formula).

Two custom autograd functions: `mixture_log_softmax` gives the full mixed log-probabilities
(rank.py, top-5), saving only the component logits; `mixture_target_log_prob`, which training and
perplexity use, gives log p(target) alone, without ever forming the mixed (T, B, V) output, in a
logits buffer reused from step to step (`Workspace`).
"""
from __future__ import annotations

from typing import Optional

import torch

from .compiled import LOGSUMEXP_ROWS, FusedKernel


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


_MIXTURE_FORWARD = FusedKernel(_mixture_forward, varying={0: (0,), 1: (0,)})
_MIXTURE_BACKWARD = FusedKernel(_mixture_backward, varying={i: (0,) for i in range(5)})


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


class Workspace:
    """A buffer that one forward takes and its backward gives back, reused step after step.

    The MoS component logits are the largest tensor of a training step (0.5 GB at the PTB
    shapes). On CPU, glibc returns such a block to the OS when it is freed, and touching a
    fresh one page-faults it in again: 0.2-0.3 s per step here, most of a GEMM over it.
    (CUDA's caching allocator already reuses blocks; the workspace is harmless there.)
    A forward whose graph is dropped without a backward never gives its buffer back; the
    next forward then allocates a new one, so misuse costs time, never correctness.
    """

    def __init__(self):
        self._free: Optional[torch.Tensor] = None

    def take(self, rows: int, cols: int, like: torch.Tensor, grow: bool = True) -> torch.Tensor:
        """A (rows, cols) tensor: the kept buffer if it fits, else a new one. With grow=False
        (evaluation) a kept buffer that is too small stays kept, so that evaluating with a
        bigger batch does not leave training holding a bigger buffer than it needs."""
        numel, buffer = rows * cols, self._free
        if (buffer is not None and buffer.numel() >= numel and buffer.dtype == like.dtype
                and buffer.device == like.device):
            self._free = None
            return buffer[:numel].view(rows, cols)
        if grow:
            self._free = None
        return torch.empty(numel, dtype=like.dtype, device=like.device).view(rows, cols)

    def give_back(self, tensor: torch.Tensor) -> None:
        """Keep `tensor`'s memory for the next take, unless a buffer is kept already."""
        if self._free is None:
            self._free = tensor if tensor._base is None else tensor._base

    def release(self) -> None:
        """Drop the kept buffer (its memory returns to the allocator)."""
        self._free = None


def _softmax_gradient_(logits: torch.Tensor, lse: torch.Tensor, weight: torch.Tensor) -> None:
    """logits <- -weight * softmax(logits) row by row, in place (lse: the rows' logsumexp)."""
    logits.sub_(lse.unsqueeze(-1)).exp_().mul_(weight.neg().unsqueeze(-1))


_SOFTMAX_GRADIENT_ = FusedKernel(_softmax_gradient_, varying={0: (0,), 1: (0,), 2: (0,)})


class _MixtureTargetLogProb(torch.autograd.Function):
    """log p(y) = logsumexp_k(log pi_k + l_ky - logsumexp_v l_kv), l_k = W h_k + b, for the
    target y of each position only.

    The loss needs nothing else, so against forward() + gather this skips the mixed (N, V)
    log-probabilities: one pass over the (N, K, V) logits forward (their logsumexp) and one
    backward, which writes the logits' gradient over the logits themselves. With the posterior
    r_k = exp(joint_k - log p(y)) and the upstream gradient g:
        d/d log pi_k = g r_k,      d/d l_kv = g r_k ([v = y] - softmax_k(l)_v).

    The logits live in the head's Workspace and the bias rides in the GEMMs as a column of
    ones, so the step allocates no (N*K, V) tensor at all. Since backward consumes the logits,
    a second backward through the same graph (retain_graph=True) raises autograd's
    "modified by an inplace operation" error instead of returning a wrong gradient; use
    forward() for that.
    """

    @staticmethod
    def forward(ctx, contexts, weight, bias, log_prior, targets, workspace, compiled, backward):
        # backward: whether a backward pass can follow (grad mode on, an input needs grad)
        n, k, e = contexts.shape
        logits = workspace.take(n * k, weight.size(0), like=contexts, grow=backward)
        # [h | 1] [W | b]^T: the GEMM adds the bias, no separate pass over the logits.
        with_one = torch.cat([contexts, contexts.new_ones(n, k, 1)], dim=2).view(n * k, e + 1)
        torch.mm(with_one, torch.cat([weight, bias.unsqueeze(1)], dim=1).t(), out=logits)
        lse = LOGSUMEXP_ROWS(logits, compiled=compiled).view(n, k)
        index = targets.view(n, 1, 1).expand(n, k, 1)              # the target, per component
        # joint_k = log pi_k + log softmax_k(l)[y]: the log of the mixture's terms for y
        joint = log_prior + logits.view(n, k, -1).gather(2, index).squeeze(2) - lse
        log_p = torch.logsumexp(joint, dim=1)
        if not backward:             # no graph will hold the logits (evaluation)
            workspace.give_back(logits)
            return log_p
        ctx.save_for_backward(logits, with_one, weight, lse, joint, log_p, index)
        ctx.workspace, ctx.compiled = workspace, compiled
        return log_p

    @staticmethod
    def backward(ctx, grad):
        logits, with_one, weight, lse, joint, log_p, index = ctx.saved_tensors
        n, k = joint.shape
        e = weight.size(1)
        weighted_posterior = grad.unsqueeze(1) * torch.exp(joint - log_p.unsqueeze(1))  # (N, K)
        # The logits are dead after this: their gradient overwrites them.
        _SOFTMAX_GRADIENT_(logits, lse.view(-1), weighted_posterior.view(-1), compiled=ctx.compiled)
        logits.view(n, k, -1).scatter_add_(2, index, weighted_posterior.unsqueeze(2))
        grad_contexts = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_contexts = torch.mm(logits, weight).view(n, k, e)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            grad_weight_bias = torch.mm(logits.t(), with_one)   # (V, E + 1): bias in the last column
            grad_weight, grad_bias = grad_weight_bias[:, :e], grad_weight_bias[:, e]
        ctx.workspace.give_back(logits)
        return grad_contexts, grad_weight, grad_bias, weighted_posterior, None, None, None, None


def mixture_target_log_prob(contexts: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                            log_prior: torch.Tensor, targets: torch.Tensor, workspace: Workspace,
                            compiled: bool = False) -> torch.Tensor:
    """contexts (N, K, E), weight (V, E), bias (V), log_prior (N, K), targets (N) ->
    log sum_k pi_k softmax(W h_k + b)[target], shape (N)."""
    inputs = (contexts, weight, bias, log_prior)
    backward = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    if backward:
        return _MixtureTargetLogProb.apply(*inputs, targets, workspace, compiled, backward)
    # Without a backward the rows are independent: score them in blocks whose (rows*K, V)
    # logits fit NO_GRAD_LOGITS_BYTES (the neural cache's 5000-position chunk would otherwise
    # make a 5000 x K x V buffer: 3 GB at PTB's shapes, 10 GB on WikiText-2).
    rows = no_grad_block_rows(contexts.size(1), weight.size(0), contexts.element_size())
    return torch.cat([_MixtureTargetLogProb.apply(contexts[block], weight, bias, log_prior[block],
                                                  targets[block], workspace, compiled, False)
                      for block in (slice(first, first + rows) for first in range(0, contexts.size(0), rows))])


# The memory bound of the no-gradient path's logits buffer; the eager fallback's logsumexp
# makes one more buffer of that size.
NO_GRAD_LOGITS_BYTES = 256 << 20


def no_grad_block_rows(components: int, vocab: int, element_size: int) -> int:
    """Positions per block of the no-gradient path (at least one)."""
    return max(1, NO_GRAD_LOGITS_BYTES // (components * vocab * element_size))
