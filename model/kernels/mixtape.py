"""Mixtape's gating (model/heads/mixtape.py has the formula).

`sigmoid_tree` gives the priors of every leaf, as the formula reads (the head's reference and
its shared priors use it). `gated_logits` is what the frequent words run: their K component
logits gated by their own sigmoid-tree priors, sum_k pi_kx z_kx, in one custom autograd
function that saves only its inputs and, compiled, makes one pass over them forward and one
backward: autograd through the separate ops keeps every level's sigmoids and products, some
3 K values per frequent word and position, and makes about fifteen passes over them.
`target_log_probs` is log p(target) from the two blocks of gated logits, without joining them
into one (N, V) tensor. `narrow_linear` is F.linear for the frequent words' rows and gate
embedding, with the weight's gradient computed in the layout a CPU's BLAS runs fast.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .compiled import LOGSUMEXP_ROWS, FusedKernel


def sigmoid_tree(gate_logits: torch.Tensor) -> torch.Tensor:
    """(..., K-1, X) gate logits of the tree's inner nodes in heap order (node j's children are
    2j and 2j + 1, counting from 1) -> (..., K, X) priors of its leaves, left to right: each
    the product of sigmoid(l_j) for a left turn and 1 - sigmoid(l_j) for a right one."""
    k = gate_logits.size(-2) + 1
    priors = gate_logits.new_ones(*gate_logits.shape[:-2], 1, gate_logits.size(-1))
    width = 1
    while width < k:          # one level of the tree: its `width` nodes are j = width..2 width - 1
        gamma = torch.sigmoid(gate_logits[..., width - 1:2 * width - 1, :])
        priors = torch.stack([priors * gamma, priors * (1 - gamma)], dim=-2).flatten(-3, -2)
        width *= 2
    return priors


# The tree evaluated bottom-up: a node's value is s_j * left + (1 - s_j) * right, s_j the sigmoid
# of its gate logit, the leaves' values the component logits; the root's value is
# sum_k pi_k z_k. Its gradient flows top-down: d root / d l_j = reach_j s_j (1 - s_j)
# (left_j - right_j), reach_j the product of the branch weights from the root to node j.

def _levels(component_logits, products, shared, bias):
    """The tree's levels from the leaves up: per level (sigmoids, left values, right values),
    with the gate logits l = products + shared + bias; and the root's value."""
    gate_logits = products + shared.unsqueeze(-1) + bias
    values, width, levels = component_logits, component_logits.size(1), []
    while width > 1:
        width //= 2
        s = torch.sigmoid(gate_logits[:, width - 1:2 * width - 1])
        left, right = values[:, 0::2], values[:, 1::2]
        levels.append((s, left, right))
        values = right + s * (left - right)
    return levels, values[:, 0]


def _gated_forward(component_logits, products, shared, bias):
    return _levels(component_logits, products, shared, bias)[1]


def _gated_backward(component_logits, products, shared, bias, grad):
    levels, _ = _levels(component_logits, products, shared, bias)
    reach, gate_grads = grad.unsqueeze(1), []
    for s, left, right in reversed(levels):              # the root's level first
        gate_grads.append(reach * s * (1 - s) * (left - right))
        reach = torch.stack([reach * s, reach * (1 - s)], dim=2).flatten(1, 2)
    grad_gates = torch.cat(gate_grads, dim=1)             # (N, K-1, F) in heap order
    return reach, grad_gates, grad_gates.sum(-1), grad_gates.sum(0)


_GATED_FORWARD = FusedKernel(_gated_forward, varying={0: (0,), 1: (0,), 2: (0,)})
_GATED_BACKWARD = FusedKernel(_gated_backward, varying={0: (0,), 1: (0,), 2: (0,), 4: (0,)})


class _GatedLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, component_logits, products, shared, bias, compiled):
        ctx.save_for_backward(component_logits, products, shared, bias)
        ctx.compiled = compiled
        return _GATED_FORWARD(component_logits, products, shared, bias, compiled=compiled)

    @staticmethod
    def backward(ctx, grad):
        grads = _GATED_BACKWARD(*ctx.saved_tensors, grad.contiguous(), compiled=ctx.compiled)
        return (*grads, None)


def gated_logits(component_logits: torch.Tensor, products: torch.Tensor, shared: torch.Tensor,
                 bias: torch.Tensor, compiled: bool = False) -> torch.Tensor:
    """component_logits (N, K, F), the gate logits' parts v_x . tanh(U_j g + a_j) (N, K-1, F),
    u_j . g (N, K-1) and b_xj (K-1, F) -> sum_k pi_kx z_kx (N, F), with K >= 2."""
    return _GatedLogits.apply(component_logits.contiguous(), products.contiguous(), shared.contiguous(),
                              bias.contiguous(), compiled)


def _softmax_times(logits, lse, grad):
    """d lse / d logits times the upstream gradient: softmax(logits) * grad, row by row."""
    return torch.exp(logits - lse.unsqueeze(1)) * grad.unsqueeze(1)


_SOFTMAX_TIMES = FusedKernel(_softmax_times, varying={0: (0,), 1: (0,), 2: (0,)})


class _TargetLogProbs(torch.autograd.Function):
    """log p(target) = s_target - logsumexp over the blocks of s, the vocabulary cut into
    consecutive blocks (the frequent words, the others). Forward: one compiled logsumexp pass
    over each block; backward: each block's gradient -g softmax(s) in one compiled pass, and +g
    added in place at the targets (no zero-filled (N, V) gradient for a gather, no extra sum)."""

    @staticmethod
    def forward(ctx, places, compiled, *blocks):
        lse = torch.logsumexp(torch.stack([LOGSUMEXP_ROWS(b, compiled=compiled) for b in blocks]), dim=0)
        target = lse.new_empty(lse.shape)
        rows = torch.arange(places.numel(), device=places.device)
        first, in_block = 0, []
        for block in blocks:
            inside = (places >= first) & (places < first + block.size(1))
            at = rows[inside], places[inside] - first
            target[at[0]] = block[at]
            in_block.append(at)
            first += block.size(1)
        ctx.save_for_backward(lse, *blocks)
        ctx.in_block, ctx.compiled = in_block, compiled
        return target - lse

    @staticmethod
    def backward(ctx, grad):
        lse, *blocks = ctx.saved_tensors
        grad = grad.contiguous()
        grads = []
        for block, (rows, cols) in zip(blocks, ctx.in_block):
            block_grad = _SOFTMAX_TIMES(block, lse, -grad, compiled=ctx.compiled)
            block_grad.index_put_((rows, cols), grad[rows], accumulate=True)
            grads.append(block_grad)
        return (None, None, *grads)


def target_log_probs(frequent: torch.Tensor, infrequent: torch.Tensor, places: torch.Tensor,
                     compiled: bool = False) -> torch.Tensor:
    """The gated logits of the frequent words (N, F) and of the others (N, V - F), and each
    target's place in that order (N) -> log p(target) (N), without joining the two blocks into
    one (N, V) tensor."""
    blocks = [b.contiguous() for b in (frequent, infrequent) if b.size(1)]
    return _TargetLogProbs.apply(places, compiled, *blocks)


class _NarrowLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, weight):
        ctx.save_for_backward(inputs, weight)
        return F.linear(inputs, weight)

    @staticmethod
    def backward(ctx, grad):
        inputs, weight = ctx.saved_tensors
        grad = grad.reshape(-1, grad.size(-1))
        grad_inputs = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_inputs = torch.mm(grad, weight).view(inputs.shape)
        if ctx.needs_input_grad[1]:
            # (x^T g)^T, not autograd's g^T x: the same sum, but with g^T as the left operand a
            # CPU's BLAS takes up to 10 times as long when the weight has few columns (one thread,
            # Mixtape's gate embedding at the miniature's shapes, (1000 x 4200) by (4200 x 8):
            # 42 ms against 4 ms; the frequent rows at d = 32: 11 ms against 7 ms).
            grad_weight = torch.mm(inputs.reshape(-1, inputs.size(-1)).t(), grad).t().contiguous()
        return grad_inputs, grad_weight


def narrow_linear(inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(inputs, weight) without a bias, for a weight (out, in) with few columns, `in`
    (Mixtape's gate embedding, d2 = 8 at the miniature, and the frequent words' embedding rows):
    the same values, the weight's gradient computed as (x^T g)^T."""
    return _NarrowLinear.apply(inputs, weight)
