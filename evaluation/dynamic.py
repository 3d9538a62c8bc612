"""Dynamic evaluation ([DynEval]: Krause, Kahembwe, Murray, Renals, ICML 2018), the "RMS with
decay to the global prior" rule that the MoS authors evaluate with.

1. Gradient statistics. Over the training split, with the model in eval mode (no dropout) and
   nothing updated, the gradient g_b of each batch's mean NLL, per parameter entry:
   S = sqrt(sum_b g_b^2). The batches are the whole training split read as 100 columns
   (`ms_batch_size`) in segments of `bptt` positions (5), the hidden state carried: N_b = 1,859
   batches on PTB, 4,177 on WikiText-2 (`ms_batches` reads only the first N).
2. The text (validation, then test, each from the trained weights theta_0) is read at batch size
   1 in segments s_1, s_2, ... of `bptt` positions, the hidden state carried. Each segment is
   scored first, then the weights take one step on that segment's mean NLL:

       theta <- theta - lr * g(s_i) / (S + epsilon) + min(lambda * S / sum_k mean(S_k), 1) * (theta_0 - theta)

   with sum_k mean(S_k) the sum over the model's K parameter tensors of each one's mean S. The
   model adapts to what it has just read and relaxes back towards the trained weights, never
   past them (the pull is capped at 1).

Units. This is the paper's rule, theta <- theta - eta g / (sqrt(MS_g) + eps') + lambda' (theta_0 -
theta) RMS / avg(RMS), with MS_g = S^2 / N_b the mean squared gradient and avg the mean of the
tensors' mean RMS, written in the units of the code the published settings were found with (the
original dynamic-evaluation code that the MoS repository ships, which its authors later noted
scales these terms differently from the paper's equations): eta = lr / sqrt(N_b), eps' = epsilon /
sqrt(N_b), lambda' = lambda / K. So `--dynamic-lr 0.002 --dynamic-lambda 0.075 --dynamic-epsilon
0.001` mean what they meant for MoS's published 48.33 / 47.69; `paper_units` gives the
equivalents for a run.

Every trainable parameter of the model adapts (a head's own ones included: PLIF's slopes, MoS's
prior and latent layers); buffers (frozen PLIF slopes) do not. The model in memory is changed and
restored by `reset`; nothing is written to the checkpoint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch

from data.batching import batchify
from .loop import iterate_chunks, mean_nll


@dataclass(frozen=True)
class DynamicSettings:
    lr: float
    lam: float               # lambda: the decay towards the trained weights
    epsilon: float
    bptt: int = 5            # positions per segment (the published results: 5)
    ms_batch_size: int = 100     # columns of the training batches the statistics come from
    ms_batches: int | None = None   # at most this many training batches (None: the whole split)

    def __post_init__(self):
        for name, value, ok, expected in (
                ("lr", self.lr, math.isfinite(self.lr) and self.lr >= 0, "a finite number >= 0"),
                ("lambda", self.lam, math.isfinite(self.lam) and self.lam >= 0, "a finite number >= 0"),
                ("epsilon", self.epsilon, math.isfinite(self.epsilon) and self.epsilon > 0, "a number > 0"),
                ("bptt", self.bptt, self.bptt >= 1, "an integer >= 1"),
                ("ms-batch-size", self.ms_batch_size, self.ms_batch_size >= 1, "an integer >= 1"),
                ("ms-batches", self.ms_batches, self.ms_batches is None or self.ms_batches >= 1,
                 "an integer >= 1")):
            if not ok:
                raise ValueError(f"--dynamic-{name}: expected {expected}, got {value}")


# [DynEval] on MoS, as the MoS authors ran it (valid / test): PTB 48.33 / 47.69, WikiText-2
# 42.41 / 40.68.
PUBLISHED = {"ptb": DynamicSettings(lr=0.002, lam=0.075, epsilon=0.001),
             "wikitext-2": DynamicSettings(lr=0.002, lam=0.02, epsilon=0.002)}


def adapted_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def training_batches(train_ids: torch.Tensor, settings: DynamicSettings) -> int:
    """How many training batches `gradient_statistics` reads."""
    steps = train_ids.numel() // settings.ms_batch_size
    batches = math.ceil((steps - 1) / settings.bptt)
    return min(batches, settings.ms_batches) if settings.ms_batches else batches


def gradients(loss: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """d loss / d p for every p (zeros for one the loss does not depend on)."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


@dataclass
class GradientStatistics:
    root_sum_squares: list[torch.Tensor]    # S = sqrt(sum_b g_b^2), one tensor per parameter
    batches: int                            # N_b


def gradient_statistics(model, train_ids: torch.Tensor, settings: DynamicSettings,
                        progress=None) -> GradientStatistics:
    """S = sqrt(sum_b g_b^2) over the training batches, per parameter entry (step 1)."""
    params = adapted_parameters(model)
    data = batchify(train_ids, settings.ms_batch_size, params[0].device)
    squares = [torch.zeros_like(p) for p in params]
    batches = 0
    for out, _ in iterate_chunks(model, data, settings.bptt, targets_only=True, grad=True):
        for total, g in zip(squares, gradients(-out.target_log_probs.mean(), params)):
            total.addcmul_(g, g)
        batches += 1
        if progress is not None:
            progress.update(1)
        if settings.ms_batches and batches >= settings.ms_batches:
            break
    return GradientStatistics([torch.sqrt(total) for total in squares], batches)


def paper_units(settings: DynamicSettings, statistics: GradientStatistics) -> dict:
    """The settings as eta, epsilon and lambda of the paper's equation (see the module docstring)."""
    root_batches = math.sqrt(statistics.batches)
    return {"eta": settings.lr / root_batches, "epsilon": settings.epsilon / root_batches,
            "lambda": settings.lam / len(statistics.root_sum_squares),
            "training_batches": statistics.batches, "parameter_tensors": len(statistics.root_sum_squares)}


class DynamicEvaluator:
    """Step 2 for a model whose gradient statistics are known, one split at a time."""

    def __init__(self, model, statistics: GradientStatistics, settings: DynamicSettings):
        self.model, self.settings = model, settings
        self.params = adapted_parameters(model)
        self.trained = [p.detach().clone() for p in self.params]            # theta_0
        roots = statistics.root_sum_squares
        self.step = [settings.lr / (s + settings.epsilon) for s in roots]   # per unit of gradient
        scale = sum(s.mean() for s in roots)                                # sum_k mean(S_k)
        # The pull towards theta_0, at most 1 (where every gradient was zero: none).
        self.pull = [torch.clamp(settings.lam * s / scale, max=1.0) if scale > 0
                     else torch.zeros_like(s) for s in roots]

    @torch.no_grad()
    def reset(self) -> None:
        """The trained weights back (before the next split, and when done)."""
        for p, p0 in zip(self.params, self.trained):
            p.copy_(p0)

    def segment_log_probs(self, source: torch.Tensor) -> Iterator[torch.Tensor]:
        """log p(target) of each segment of a batch-size-1 split, (bptt, 1), in order: scored
        with the weights as they were before the segment, yielded once they stepped on it.
        Starts from the trained weights."""
        if source.size(1) != 1:
            raise ValueError("dynamic evaluation reads the text at batch size 1")
        self.reset()
        for out, _ in iterate_chunks(self.model, source, self.settings.bptt, targets_only=True, grad=True):
            log_p = out.target_log_probs
            grads = gradients(-log_p.mean(), self.params)
            with torch.no_grad():
                for p, g, p0, step, pull in zip(self.params, grads, self.trained, self.step, self.pull):
                    p.addcmul_(pull, p0 - p).addcmul_(step, g, value=-1.0)
            yield log_p.detach()

    def nll(self, source: torch.Tensor, progress=None) -> float:
        """Mean negative log-likelihood per token (nats) of a batch-size-1 split."""
        return mean_nll(self.segment_log_probs(source), progress)
