"""Evaluation: eval mode, plain bptt chunks, hidden state carried across chunks (docs/reference.md section 3).

One loop serves validation during training, evaluate.py and rank.py, so every perplexity and
every log-P row is computed the same way.
"""
from __future__ import annotations

import math
from typing import Iterable, Iterator

import torch

from data.batching import get_batch


def iterate_chunks(model, source: torch.Tensor, bptt: int, targets_only: bool = False,
                   grad: bool = False) -> Iterator[tuple]:
    """Yield (ModelOutput, targets) for consecutive bptt chunks of a batchified split; with
    `targets_only` the model computes only the targets' log-probabilities. With `grad` each
    chunk's output keeps its graph (dynamic evaluation takes a gradient step after each chunk);
    the hidden state carried to the next chunk is detached either way."""
    model.eval()
    hidden = model.init_hidden(source.size(1))
    for i in range(0, source.size(0) - 1, bptt):
        inputs, targets = get_batch(source, i, bptt)
        with torch.set_grad_enabled(grad):
            out = model(inputs, hidden, targets if targets_only else None)
        hidden = [(h.detach(), c.detach()) for h, c in out.hidden]
        yield out, targets


def evaluate_nll(model, source: torch.Tensor, bptt: int, progress=None) -> float:
    """Mean negative log-likelihood per token (nats) of a batchified split."""
    chunks = iterate_chunks(model, source, bptt, targets_only=True)
    return mean_nll((out.target_log_probs for out, _ in chunks), progress)


def mean_nll(chunks: Iterable[torch.Tensor], progress=None) -> float:
    """Mean negative log-likelihood per token (nats) from the targets' log-probabilities, chunk
    by chunk ((T, B) or (T,)), summed in float64. The evaluation methods (evaluation/cache.py,
    evaluation/dynamic.py) reduce their chunks here too, so in their limits they give plain
    evaluation's number: the cache at lambda = 0 bit for bit, dynamic evaluation at lr = 0 up to
    float32 rounding (it scores with gradients on, where the CPU's LSTM kernel rounds its last
    bit differently). The sum stays on the model's device
    and is read once at the end: a read per chunk would make the host wait for the device at
    every chunk (at every 5-token segment of dynamic evaluation)."""
    total, count = None, 0
    for log_p in chunks:
        chunk_sum = log_p.double().sum()
        total = -chunk_sum if total is None else total - chunk_sum
        count += log_p.numel()
        if progress is not None:
            progress.update(log_p.size(0))
    return float(total) / count


def perplexity(nll: float) -> float:
    """exp(nll): inf past float64's range (709.78 nats), NaN for a NaN loss (never a number)."""
    try:
        return math.exp(nll)
    except OverflowError:
        return math.inf
