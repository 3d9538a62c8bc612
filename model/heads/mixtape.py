"""Mixtape ([Mixtape]: Yang, Luong, Salakhutdinov, Le, NeurIPS 2019; docs/reference.md section 4).

From g (T, B, nhidlast), K context vectors and, for every word x, K gate priors:

    h_k    = tanh(H_k g + c_k)                      k = 1..K, size d_emb (MoS's latent vectors)
    z_kx   = w_x . h_k                              component logits, w_x the tied embedding row
    l_xj   = v_x . tanh(U_j g + a_j) + u_j . g + b_xj     x frequent, j = 1..K-1, U_j: -> d2
    l_xj   = u_j . g                                x infrequent (gate sharing)
    pi_xk  = the sigmoid tree's leaf k: the product of sigmoid(l_xj) (left) or 1 - sigmoid(l_xj)
             (right) over the inner nodes j on the way from the root; K = 4:
             pi_1 = s1 s2, pi_2 = s1 (1 - s2), pi_3 = (1 - s1) s3, pi_4 = (1 - s1)(1 - s3)
    s_x    = sum_k pi_xk z_kx + b_x                 one softmax of the gated logits
    log p  = log_softmax(s)

The frequent words are the round(frequent_fraction * V) most frequent of the training split
(`set_word_counts`; ties by id); every other word has the same priors pi_k(g), so that its gated
logit is w_x . (sum_k pi_k h_k) + b_x: one GEMM with a prior-mixed context, as MoC's, and the
K-fold work is confined to the frequent words. Dropouts, in training, one mask per sequence
shared by every position: `dropoutl` on the K * d_emb units of the h_k (MoS's); `dropout_gates`
on the gate features tanh(U_j g + a_j); `dropout_logits` on the component logits z_kx, a mask
per (sequence, k, x) for the frequent words and one per (sequence, k) that all the infrequent
words share, as they share their gates (a per-word mask would cost the K-fold work for every
word). docs/reference.md section 4 gives the source of each choice.

`reference` is the formula above word by word, with plain autograd (K gated logits per word);
forward() and target_log_probs(), which training and perplexity use, run the frequent /
infrequent split (model/kernels/mixtape.py). The tests check the two against each other.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from ..body import keep_mask, locked_dropout
from ..kernels.mixtape import gated_logits, narrow_linear, sigmoid_tree, target_log_probs
from .base import HeadOutput, OutputHead


@dataclass(frozen=True)
class MixtapeOptions:
    components: int = 4             # K, the sigmoid tree's leaves: a power of two
    gate_dim: int = 64              # d2, the size of the gate features tanh(U_j g + a_j)
    frequent_fraction: float = 0.1  # the share of the vocabulary with gates of its own
    dropoutl: float = 0.29          # locked dropout on the K context vectors h_k (as MoS's)
    dropout_gates: float = 0.0      # locked dropout on the gate features
    dropout_logits: float = 0.0     # locked dropout on the component logits z_kx
    compile: bool = True            # fuse the frequent words' gating with torch.compile (eager fallback)

    def __post_init__(self):
        k = self.components
        if not (isinstance(k, int) and k >= 1 and k & (k - 1) == 0):
            raise ValueError(f"components: expected a power of two (1, 2, 4, 8, ...), got {k}")
        if self.gate_dim < 1:
            raise ValueError(f"gate_dim: expected an integer >= 1, got {self.gate_dim}")
        if not 0.0 <= self.frequent_fraction <= 1.0:
            raise ValueError(f"frequent_fraction: expected a fraction in [0, 1], got {self.frequent_fraction}")
        for name in ("dropoutl", "dropout_gates", "dropout_logits"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}: expected a probability in [0, 1), got {getattr(self, name)}")


class MixtapeHead(OutputHead):
    Options = MixtapeOptions
    label = "Mixtape"
    # The contexts h_k have size d_emb whatever nhidlast is.
    requires_nhidlast_equal_emsize = False

    def __init__(self, options, vocab_size: int, emsize: int, nhidlast: int,
                 tied_weight: nn.Parameter):
        super().__init__(options, vocab_size, emsize, nhidlast, tied_weight)
        k, d2 = options.components, options.gate_dim
        self.emsize = emsize
        self.frequent = round(options.frequent_fraction * vocab_size)
        self.contexts = nn.Linear(nhidlast, k * emsize)                  # H_k, c_k
        if k > 1:
            self.shared_gates = nn.Linear(nhidlast, k - 1, bias=False)   # u_j
        if k > 1 and self.frequent:
            self.gate_features = nn.Linear(nhidlast, (k - 1) * d2)       # U_j, a_j
            nn.init.zeros_(self.gate_features.bias)
            # v_x as nn.Linear initialises a d2 -> F map; b_xj = 0, so a frequent word starts
            # with the shared priors plus a small word-specific term.
            bound = 1.0 / math.sqrt(d2)
            self.gate_embedding = nn.Parameter(torch.empty(self.frequent, d2).uniform_(-bound, bound))
            self.gate_bias = nn.Parameter(torch.zeros(self.frequent, k - 1))
        # The word ids by training-set frequency, most frequent first (the first `frequent` have
        # gates of their own), and each id's place in that order. Saved with the model: a trained
        # model keeps the split it was trained with.
        self.register_buffer("order", torch.arange(vocab_size))
        self.register_buffer("place", torch.arange(vocab_size))

    @classmethod
    def small_options(cls):
        return cls.Options(components=4, gate_dim=3, frequent_fraction=0.4, dropoutl=0.2,
                           dropout_gates=0.2, dropout_logits=0.2, compile=False)

    def set_word_counts(self, counts: torch.Tensor) -> None:
        order = torch.argsort(-counts.to(torch.int64), stable=True)     # ties: the smaller id first
        self.order.copy_(order)
        self.place.copy_(torch.argsort(order))

    # ---------------------------------------------------------------- the parts of both paths
    def _parts(self, g: torch.Tensor):
        """The dropped contexts h (T, B, K, d_emb); the shared gate logits u_j . g (T, B, K-1);
        the frequent words' v_x . tanh(U_j g + a_j) (T, B, K-1, F); and the component-logit
        masks, one per sequence: (1, B, K, F) for the frequent words, (1, B, K, 1) shared by
        the others. None where there are none. Every random mask is drawn here, in this order."""
        o, (t, b) = self.options, g.shape[:2]
        k = o.components
        contexts = locked_dropout(torch.tanh(self.contexts(g)), o.dropoutl, self.training)
        contexts = contexts.view(t, b, k, self.emsize)
        shared = self.shared_gates(g) if k > 1 else None
        products = None
        if k > 1 and self.frequent:
            features = locked_dropout(torch.tanh(self.gate_features(g)), o.dropout_gates, self.training)
            # 2-D products throughout (F.linear, narrow_linear, torch.bmm): torch.matmul picks its kernel by whether
            # autograd records, and the same scores must come out with and without a graph.
            products = narrow_linear(features.view(t, b, k - 1, o.gate_dim), self.gate_embedding)
        frequent_mask = infrequent_mask = None
        if self.training and o.dropout_logits > 0:
            if self.frequent:
                frequent_mask = keep_mask((1, b, k, self.frequent), o.dropout_logits, g)
            infrequent_mask = keep_mask((1, b, k, 1), o.dropout_logits, g)
        return contexts, shared, products, frequent_mask, infrequent_mask

    # ---------------------------------------------------------------- the formula, word by word
    def reference(self, g: torch.Tensor) -> HeadOutput:
        contexts, shared, products, frequent_mask, infrequent_mask = self._parts(g)
        t, b, k, _ = contexts.shape
        v, frequent_ids = self.vocab_size, self.order[:self.frequent]
        component_logits = torch.matmul(contexts, self.decoder.weight.t())          # (T, B, K, V)
        if infrequent_mask is not None:
            mask = infrequent_mask.expand(1, b, k, v).clone()
            if frequent_mask is not None:
                mask[..., frequent_ids] = frequent_mask
            component_logits = component_logits * mask
        priors = self._word_priors(shared, products, component_logits)
        gated = (priors * component_logits).sum(-2) + self.decoder.bias
        return HeadOutput(F.log_softmax(gated, dim=-1), None)

    def _word_priors(self, shared, products, like: torch.Tensor) -> torch.Tensor:
        """pi_xk for every word x in id order, shaped like the (T, B, K, V) `like`."""
        t, b, k, v = like.shape
        if k == 1:
            return torch.ones_like(like)
        gates = shared.unsqueeze(-1).expand(t, b, k - 1, v)
        if products is not None:
            frequent_gates = products + shared.unsqueeze(-1) + self.gate_bias.t()
            gates = gates.index_copy(-1, self.order[:self.frequent], frequent_gates)
        return sigmoid_tree(gates)

    def priors(self, g: torch.Tensor) -> torch.Tensor:
        """The gate priors pi_xk of every word at every position, (T, B, K, V) in id order."""
        contexts, shared, products, _, _ = self._parts(g)
        t, b, k, _ = contexts.shape
        return self._word_priors(shared, products, contexts.new_empty(t, b, k, self.vocab_size))

    # ---------------------------------------------------------------- the frequent / infrequent split
    def gated_logits_by_frequency(self, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """s of the frequent words (N, F) and of the others (N, V - F), each block in `order`:
        the frequent words' K component logits gated by their own priors; the others' from one
        GEMM with the prior-mixed context."""
        contexts, shared, products, frequent_mask, infrequent_mask = self._parts(g)
        t, b, k, e = contexts.shape
        n, weight, bias = t * b, self.decoder.weight, self.decoder.bias
        frequent_ids, infrequent_ids = self.order[:self.frequent], self.order[self.frequent:]
        shared_priors = (sigmoid_tree(shared.unsqueeze(-1)).squeeze(-1) if k > 1
                         else contexts.new_ones(t, b, 1))                          # (T, B, K)
        if infrequent_mask is not None:
            shared_priors = shared_priors * infrequent_mask.squeeze(-1)
        mixed = torch.bmm(shared_priors.view(n, 1, k), contexts.view(n, k, e)).view(n, e)  # sum_k pi_k h_k
        infrequent = F.linear(mixed, weight[infrequent_ids], bias[infrequent_ids])
        if not self.frequent:
            return mixed.new_empty(n, 0), infrequent
        component_logits = narrow_linear(contexts, weight[frequent_ids])         # (T, B, K, F)
        if frequent_mask is not None:
            component_logits = component_logits * frequent_mask
        component_logits = component_logits.view(n, k, self.frequent)
        if k == 1:
            frequent = component_logits[:, 0]
        else:
            frequent = gated_logits(component_logits, products.view(n, k - 1, self.frequent),
                                    shared.view(n, k - 1), self.gate_bias.t(), self.options.compile)
        return frequent + bias[frequent_ids], infrequent

    def forward(self, g: torch.Tensor) -> HeadOutput:
        gated = torch.cat(self.gated_logits_by_frequency(g), dim=-1)
        log_p = F.log_softmax(gated, dim=-1).index_select(-1, self.place)        # back to id order
        return HeadOutput(log_p.view(*g.shape[:2], self.vocab_size), None)

    def target_log_probs(self, g: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        frequent, infrequent = self.gated_logits_by_frequency(g)
        return target_log_probs(frequent, infrequent, self.place[targets].reshape(-1),
                                self.options.compile).view(targets.shape)
