"""One cell of the synthetic experiment: sample P*, fit a head to it, measure the fit.

The output layer alone, without an LSTM ([LMS] section 5.1): N true distributions
P*(.|c_j) ~ Dirichlet(alpha) over M words; a word embedding matrix E (M x D) shared by all
contexts and one free context vector g_j (D) per distribution; Q(.|c_j) = head(g_j) with E as
the head's tied decoder (the repository's head modules, unchanged). [LMS]'s models have no
per-word bias (eq. 1: exp(h_j^T w_i) / sum_s exp(h_j^T w_s); eq. 11 and eq. 12 likewise), so by
default the decoder's bias b (l = E g + b, a Parameter in every head) is held at zero and not
trained; `decoder_bias=True` keeps it trainable, as the language model has it (the logits
E g + b then have rank up to D + 1). All parameters minimise the mean cross-entropy
-sum_i P*_ij log Q_ij over the N contexts, which differs from the mean KL(P*||Q) by the fixed
entropy of P*.
"""
from __future__ import annotations

import dataclasses
import math
import time
import typing
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from experiment.config import _coerce, _type_name, parse_override
from model.heads import HEADS
from model.heads.base import OutputHead

from .monotone import MonotoneHead


def sample_targets(contexts: int, words: int, alpha: float, seed: int,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """P* (N x M), each row ~ Dirichlet(alpha, ..., alpha), reproducible from `seed`.

    Drawn as normalised Gamma(alpha) variables in float64 on the CPU (the same numbers on every
    device), then stored in float32. With small alpha many entries are below float32's range
    and become exactly 0; they add nothing to the cross-entropy or the KL (0 log 0 = 0).
    """
    generator = torch.Generator().manual_seed(seed)
    concentration = torch.full((contexts, words), float(alpha), dtype=torch.float64)
    gamma = torch._standard_gamma(concentration, generator=generator)
    # A row whose every Gamma draw underflowed (possible only for tiny alpha and M): its mass
    # goes to one word drawn uniformly, the limit of the Dirichlet as alpha -> 0.
    empty = gamma.sum(1) == 0
    if empty.any():
        pick = torch.randint(words, (int(empty.sum()),), generator=generator)
        gamma[empty.nonzero().squeeze(1), pick] = 1.0
    return (gamma / gamma.sum(1, keepdim=True)).float().to(device)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """H(P*) per row, in float64 (0 log 0 = 0)."""
    p = p.double()
    return -torch.xlogy(p, p).sum(-1)


def mode_match(p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Per row: argmax P* == argmax Q (ties broken towards the lower index, as torch.argmax)."""
    return p.argmax(-1) == log_q.argmax(-1)


def kl_divergence(p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(P*||Q) per row in float64: sum_i P*_i (log P*_i - log Q_i), with 0 log 0 = 0."""
    p = p.double()
    return (torch.xlogy(p, p) - p * log_q.double()).sum(-1)


# The heads of the experiment: every head of the registry, plus the monotone network of eq. 14
# (which the paper's synthetic experiment calls LMS).
SYNTHETIC_HEADS: dict[str, type[OutputHead]] = {**HEADS, "lms": MonotoneHead}


# Options that differ from the heads' language-model defaults. The mixtures: no dropout (this is
# a fit, not a generalisation problem) and 4 components, since MoS's cost grows with K (K x N x M
# logits); MoC keeps MoS's K so that the two compare.
HEAD_DEFAULTS: dict[str, dict] = {
    "mos": {"components": 4, "dropoutl": 0.0},
    "moc": {"components": 4, "dropoutl": 0.0},
    "mixtape": {"dropoutl": 0.0},        # K = 4 by default; its other dropouts default to 0
    "lms": {"units": 10},
    "gss": {"c": -1.5, "k": 2.5},        # [SB]'s PTB shape; GSS has no default
}

# Head options that the language model's training reads and `fit` does not: setting one would
# change nothing (PLIF's `lr`, its slopes' own SGD learning rate: `fit` steps every parameter
# with one Adam at FitSettings.lr).
FIT_IGNORES: dict[str, str] = {
    "lr": "unused here (the head's own lr in language-model training; the fit's one Adam takes --lr)",
}

# What a `--set` value must be, by the option's type; other types are named as the config names them.
_EXPECTED = {int: "int", float: "a finite number in float32's range", bool: "bool"}


def head_options(head: str, overrides: dict[str, str] | None = None, compile: bool = True):
    """The Options of a synthetic head: its Options defaults, then HEAD_DEFAULTS, then
    `overrides` ({field: text}, e.g. {"components": "8"}, from `synthetic.py --set
    mos.components=8`), each text read and typed as train.py reads and types `head.FIELD=TEXT`.
    An unknown field or a value of the wrong type is a ValueError naming it; so is an impossible
    value (the Options check themselves)."""
    options_class = SYNTHETIC_HEADS[head].Options
    types = typing.get_type_hints(options_class)
    known = [f.name for f in dataclasses.fields(options_class)]
    values = dict(HEAD_DEFAULTS.get(head, {}))
    if "compile" in known:
        values["compile"] = compile
    for name, text in (overrides or {}).items():
        if name not in known:
            raise ValueError(f"{head}.{name}: not an option of this head "
                             f"(options: {', '.join(known) or 'none'})")
        if name in FIT_IGNORES:
            raise ValueError(f"{head}.{name}: {FIT_IGNORES[name]}: leave it out")
        _, value = parse_override(f"{name}={text}")
        try:
            values[name] = _coerce(types[name], value)
        except TypeError:
            expected = _EXPECTED.get(types[name]) or _type_name(types[name])
            raise ValueError(f"{head}.{name}: expected {expected}, got {text!r}") from None
    try:
        return options_class(**values)
    except ValueError as error:
        raise ValueError(f"{head}.{error}") from None


class SyntheticModel(nn.Module):
    """E (M x D), g (N x D) and a head: Q(.|c_j) = head(g_j) with E as the tied decoder.

    Without `decoder_bias` ([LMS]'s models) the head's decoder bias b is a zero buffer rather
    than a Parameter: the head's code still adds it (zeros, so the logits are exactly E g), but
    it is not among parameters(), so the optimizer neither sees nor moves it. b starts at zero
    and draws no random numbers either way, so every other parameter starts the same with and
    without it."""

    def __init__(self, head_class: type[OutputHead], head_options, contexts: int, words: int,
                 dim: int, decoder_bias: bool = False):
        super().__init__()
        # N(0, 1/D) entries: initial logits of order 1 whatever D is. Drawn from torch's global
        # generator, as the heads draw theirs (seed it first: torch.manual_seed).
        scale = 1.0 / math.sqrt(dim)
        self.word_embeddings = nn.Parameter(torch.randn(words, dim) * scale)
        self.context_vectors = nn.Parameter(torch.randn(contexts, dim) * scale)
        self.head = head_class(head_options, words, dim, dim, self.word_embeddings)
        if not decoder_bias:
            decoder = self.head.decoder
            zeros = torch.zeros_like(decoder.bias, requires_grad=False)
            del decoder.bias                       # the Parameter, out of parameters()
            decoder.register_buffer("bias", zeros)  # what the heads' code reads as b

    def log_probs(self, rows: slice) -> torch.Tensor:
        """log Q for the contexts in `rows`, (rows, M). The heads take (T, B, D); T = 1 here."""
        return self.head(self.context_vectors[rows].unsqueeze(0)).log_probs.squeeze(0)


@dataclass(frozen=True)
class FitSettings:
    lr: float = 0.05             # Adam, every parameter
    max_steps: int = 500         # full-batch steps at most
    # Stop when the mean KL fell by less than tol (relative) over the last `window` steps. A
    # looser rule (1e-3 over 10) stopped the monotone network on its early plateau, before its
    # f became non-linear (M = 10,000, D = 8: at step 48, at the Softmax's KL).
    tol: float = 1e-4
    window: int = 20
    # Adam at a constant lr ends in a band of oscillation whose width grows with lr (the
    # monotone network's KL went up and down by ~1% there). On each stall the lr is divided by
    # 10, at most `lr_drops` times, before the fit counts as converged.
    lr_drops: int = 2
    batch_contexts: int = 1000   # contexts per chunk of the full-batch gradient (memory only)

    def __post_init__(self):
        checks = [("lr", self.lr > 0 and math.isfinite(self.lr), "a finite value > 0"),
                  ("max_steps", self.max_steps >= 1, "an integer >= 1"),
                  ("tol", self.tol >= 0 and math.isfinite(self.tol), "a finite value >= 0"),
                  ("window", self.window >= 1, "an integer >= 1"),
                  ("lr_drops", self.lr_drops >= 0, "an integer >= 0"),
                  ("batch_contexts", self.batch_contexts >= 1, "an integer >= 1")]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"{name}: expected {expected}, got {getattr(self, name)}")


@dataclass(frozen=True)
class FitResult:
    mode_match: float      # % of contexts with argmax P* = argmax Q
    kl: float              # mean KL(P*||Q) over contexts, nats
    steps: int             # optimiser steps taken
    converged: bool        # the stopping rule fired before max_steps
    seconds: float


def _chunks(n: int, size: int):
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def evaluate(model: SyntheticModel, targets: torch.Tensor, batch_contexts: int):
    """(mode match %, mean KL) of the model's Q against P*, chunk by chunk, without gradients."""
    matches, kl_sum = 0, 0.0
    with torch.no_grad():
        for rows in _chunks(targets.shape[0], batch_contexts):
            log_q = model.log_probs(rows)
            matches += int(mode_match(targets[rows], log_q).sum())
            kl_sum += float(kl_divergence(targets[rows], log_q).sum())
    n = targets.shape[0]
    return 100.0 * matches / n, kl_sum / n


def fit(model: SyntheticModel, targets: torch.Tensor, settings: FitSettings,
        on_step: Optional[Callable[[int, float], None]] = None) -> FitResult:
    """Minimise the mean cross-entropy to P* with full-batch Adam, then measure the fit.

    Each step's gradient is the exact full-batch gradient, accumulated over chunks of
    `batch_contexts` contexts so that memory stays bounded; the loss of that pass decides the
    stopping rule (mean KL = cross-entropy - H(P*), relative decrease over `window` steps; on a
    stall the lr is first divided by 10, `lr_drops` times). The metrics are those of the
    parameters after the last step.
    """
    start = time.perf_counter()
    n = targets.shape[0]
    mean_entropy = float(entropy(targets).mean())
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    history: list[float] = []    # mean KL since the last lr drop
    converged = False
    drops = 0
    model.train()
    for step in range(1, settings.max_steps + 1):
        optimizer.zero_grad(set_to_none=True)
        cross_entropy = 0.0
        for rows in _chunks(n, settings.batch_contexts):
            loss = -(targets[rows] * model.log_probs(rows)).sum() / n
            loss.backward()
            cross_entropy += loss.item()
        kl = cross_entropy - mean_entropy     # before this step's update
        if not math.isfinite(kl):
            raise FloatingPointError(f"the loss became non-finite at step {step} (lr {settings.lr})")
        optimizer.step()
        history.append(kl)
        if on_step is not None:
            on_step(step, kl)
        if len(history) > settings.window:
            before = history[-1 - settings.window]
            if before - kl < settings.tol * abs(kl):
                if drops == settings.lr_drops:
                    converged = True
                    break
                drops += 1
                for group in optimizer.param_groups:
                    group["lr"] *= 0.1
                history.clear()
    model.eval()
    matched, mean_kl = evaluate(model, targets, settings.batch_contexts)
    return FitResult(matched, mean_kl, step, converged, time.perf_counter() - start)
