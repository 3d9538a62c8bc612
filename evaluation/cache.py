"""The continuous cache ([Cache]: Grave, Joulin, Usunier, ICLR 2017), as evaluation method.

At position t, with h_t the last LSTM layer's output (eval mode) and the model's p_model(w):

    p(w) = (1 - lambda) p_model(w) + lambda p_cache(w)
    p_cache(w) = sum_{i in W(t), y_i = w} exp(theta <h_t, h_i>) / sum_{i in W(t)} exp(theta <h_t, h_i>)

W(t) holds the last `window` positions strictly before t, y_i the word that followed position i.
Only the target's probability is needed, so every head works through its targets'
log-probabilities (no V-sized distribution is formed). Everything is in log space:
log p = logsumexp(log(1 - lambda) + log p_model, log lambda + log p_cache), with log p_cache a
difference of two logsumexps of theta <h_t, h_i>, so no probability underflows.

Where the cache starts being used (`start`):
- "reference" (the default), AWD-LSTM's pointer.py, with which the published numbers were
  computed: position t mixes in the cache only once more than `window` positions of history
  precede it in the pointer's memory (which holds the chunk's earlier positions and at most
  `window` positions of earlier chunks). So the first `window` + 1 positions of a split use
  p = p_model, and so does the first position of every later chunk (its memory holds exactly
  `window` positions there). Wherever the cache is used, W(t) is the full window.
- "available": the definition above taken literally: W(t) holds the min(t, window) positions
  there are, from the second position on (at the first, where it is empty, p = p_model). It
  differs from "reference" on the first `window` positions of a split and at the first
  position of each later chunk only.

The text is read at batch size 1 in chunks of `bptt` positions, the hidden state carried, and the
(h_i, y_i) of the last `window` positions are carried from chunk to chunk. With "available" the
chunk length changes memory and speed, not the result; with "reference" it also decides which
positions start a chunk (AWD-LSTM's pointer.py commands: 5000 on PTB, 2000 on WikiText-2, the
published settings below). No more than `window` past states are kept.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from .loop import iterate_chunks, mean_nll

# Rows of a chunk scored at once; each block looks at window + ROW_BLOCK keys at most.
ROW_BLOCK = 512
# Where the cache starts being used (see the module docstring).
START_RULES = ("reference", "available")


@dataclass(frozen=True)
class CacheSettings:
    window: int
    theta: float
    lam: float            # lambda, the cache's weight in the mixture
    bptt: int = 5000      # positions per forward pass (pointer.py's default chunk length)
    start: str = "reference"   # where the cache starts being used: START_RULES

    def __post_init__(self):
        if self.start not in START_RULES:
            raise ValueError(f"--cache-start: expected one of {', '.join(START_RULES)}, got {self.start!r}")
        for name, value, ok, expected in (
                ("window", self.window, self.window >= 1, "an integer >= 1"),
                ("theta", self.theta, math.isfinite(self.theta) and self.theta >= 0, "a finite number >= 0"),
                # lambda = 1 would leave p_cache alone: p = 0 for every word not in the window.
                ("lambda", self.lam, 0 <= self.lam < 1, "a number in [0, 1)"),
                ("bptt", self.bptt, self.bptt >= 1, "an integer >= 1")):
            if not ok:
                raise ValueError(f"--cache-{name}: expected {expected}, got {value}")


# [Cache] and AWD-LSTM's settings for each dataset, its README's pointer.py commands (AWD-LSTM
# after finetuning, valid / test: PTB 53.2 / 52.5, WikiText-2 52.2 / 50.6).
PUBLISHED = {"ptb": CacheSettings(window=500, theta=1.0, lam=0.1, bptt=5000),
             "wikitext-2": CacheSettings(window=3785, theta=0.662, lam=0.1279, bptt=2000)}


# The scores theta <h_t, h_i> are computed in the model's precision, float32, as pointer.py
# computes them (a float64 product would only take larger thetas, none of them a published or
# searched one, at the cost of float64's speed on GPUs); past float32's range they overflow and
# the mixture is NaN, which evaluate.py refuses (largest_safe_theta says where).
FLOAT32_MAX = torch.finfo(torch.float32).max


def largest_safe_theta(hidden_size: int) -> float:
    """The largest theta whose scores cannot overflow float32: h is an LSTM's output, every entry
    in (-1, 1), so |<h_t, h_i>| < hidden_size (the last layer's size)."""
    return FLOAT32_MAX / hidden_size


def mix(log_p_model: torch.Tensor, log_p_cache: torch.Tensor, lam: float) -> torch.Tensor:
    """log((1 - lambda) p_model + lambda p_cache), elementwise; -inf in log_p_cache is p = 0."""
    if lam == 0:
        return log_p_model
    terms = torch.stack([log_p_model + math.log1p(-lam), log_p_cache + math.log(lam)])
    return torch.logsumexp(terms, dim=0)


def cache_log_probs(scores: torch.Tensor, allowed: torch.Tensor, matches: torch.Tensor) -> torch.Tensor:
    """log p_cache(y_t) per row: scores (T, N) = theta <h_t, h_j>, allowed (T, N) marks j in W(t),
    matches (T, N) marks y_j = y_t. -inf where no j in W(t) had y_t next (p_cache = 0)."""
    minus_inf = scores.new_tensor(-math.inf)
    normaliser = torch.logsumexp(torch.where(allowed, scores, minus_inf), dim=1)
    return torch.logsumexp(torch.where(allowed & matches, scores, minus_inf), dim=1) - normaliser


class _History:
    """The last `window` (h_i, y_i, position i) of the text read so far."""

    def __init__(self, window: int):
        self.window = window
        self.hidden = self.targets = self.positions = None

    def extend(self, hidden: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor):
        """The keys the chunk's rows may look at (the history, then the chunk) and how many of
        them are history; the history then keeps the last `window` of them."""
        if self.hidden is None:
            keys, before = (hidden, targets, positions), 0
        else:
            keys = (torch.cat([self.hidden, hidden]), torch.cat([self.targets, targets]),
                    torch.cat([self.positions, positions]))
            before = self.hidden.size(0)
        self.hidden, self.targets, self.positions = (k[-self.window:] for k in keys)
        return keys, before


@torch.no_grad()
def chunk_log_probs(model, source: torch.Tensor, window: int, thetas: Sequence[float],
                    lambdas: Sequence[float], bptt: int, start: str = "reference") -> Iterator[torch.Tensor]:
    """log p(target) under the cache mixture for every (theta, lambda) pair, chunk by chunk of a
    batch-size-1 split: float64 tensors (len(thetas), len(lambdas), chunk length). One pass of
    the model serves every pair (the history does not depend on them). `start`: START_RULES."""
    if source.size(1) != 1:
        raise ValueError("the cache reads the text at batch size 1")
    history = _History(window)
    offset = 0                                   # the split position of the chunk's first row
    for out, targets in iterate_chunks(model, source, bptt, targets_only=True):
        hidden = out.last_raw_output[:, 0]                 # the last LSTM layer, before any dropout
        targets, log_p_model = targets[:, 0], out.target_log_probs[:, 0]
        length = targets.numel()
        positions = torch.arange(offset, offset + length, device=targets.device)
        (keys, key_targets, key_positions), before = history.extend(hidden, targets, positions)
        chunk = torch.empty(len(thetas), len(lambdas), length, dtype=torch.float64, device=targets.device)
        for first in range(0, length, ROW_BLOCK):
            rows = slice(first, min(first + ROW_BLOCK, length))
            # Row r is key number before + r and sees the `window` keys just before it, so the
            # rows first..last see no key outside before + first - window .. before + last - 1.
            near = slice(max(0, before + rows.start - window), before + rows.stop - 1)
            gaps = positions[rows, None] - key_positions[None, near]            # t - i
            allowed = (gaps >= 1) & (gaps <= window)
            matches = key_targets[None, near] == targets[rows, None]
            dots = hidden[rows] @ keys[near].t()
            uses_cache = (allowed.any(dim=1) if start == "available"
                          else before + torch.arange(rows.start, rows.stop, device=targets.device) > window)
            model_part = log_p_model[rows].double()
            for a, theta in enumerate(thetas):
                log_p_cache = cache_log_probs(theta * dots, allowed, matches).double()
                for b, lam in enumerate(lambdas):
                    mixed = mix(model_part, log_p_cache, lam)
                    chunk[a, b, rows] = torch.where(uses_cache, mixed, model_part)
        yield chunk
        offset += length


def positions_mixed(length: int, window: int, bptt: int, start: str = "reference") -> int:
    """How many of a split's `length` target positions mix in the cache under `start` (the others
    use p_model alone): chunk_log_probs's rule counted without the model. Under "reference" a split
    no longer than window + 1 positions never uses the cache."""
    if start == "available":
        return max(0, length - 1)
    mixed = 0
    for offset in range(0, length, bptt):
        before = min(window, offset)          # the history carried into the chunk
        mixed += max(0, min(bptt, length - offset) - max(0, window + 1 - before))
    return mixed


def cache_nll(model, source: torch.Tensor, settings: CacheSettings, progress=None) -> float:
    """Mean negative log-likelihood per token (nats) of a batch-size-1 split with the cache."""
    chunks = chunk_log_probs(model, source, settings.window, [settings.theta], [settings.lam], settings.bptt,
                             settings.start)
    return mean_nll((chunk[0, 0] for chunk in chunks), progress)


# The grid of --cache-search, around the published values (which it contains).
SEARCH_THETAS = (0.1, 0.25, 0.5, 0.662, 0.75, 1.0, 1.25, 1.5)
SEARCH_LAMBDAS = (0.05, 0.1, 0.1279, 0.15, 0.2, 0.25, 0.3)


def search(model, source: torch.Tensor, window: int, bptt: int, thetas: Sequence[float] = SEARCH_THETAS,
           lambdas: Sequence[float] = SEARCH_LAMBDAS, progress=None,
           start: str = "reference") -> tuple[CacheSettings, torch.Tensor]:
    """The (theta, lambda) of the grid with the lowest NLL on `source` (the validation split, as
    the papers tuned them), and the grid's mean NLLs (len(thetas), len(lambdas))."""
    total, count = 0.0, 0
    for chunk in chunk_log_probs(model, source, window, thetas, lambdas, bptt, start):
        total = total - chunk.sum(dim=2)
        count += chunk.size(2)
        if progress is not None:
            progress.update(chunk.size(2))
    nll = total / count
    a, b = divmod(int(torch.argmin(nll)), len(lambdas))
    return CacheSettings(window, thetas[a], lambdas[b], bptt, start), nll
