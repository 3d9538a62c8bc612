"""The one interface every output head implements.

A head maps the (dropped) last-layer LSTM output g, shape (T, B, nhidlast), to
log-probabilities over the vocabulary, shape (T, B, V). Heads that apply a pointwise
function f to the logits l = W g + b (SS, GSS, PLIF) also return f(l): rank.py needs it.
Training and perplexity need only the targets' log-probabilities: `target_log_probs` gives
them, by default from forward(); a head may compute them more cheaply (MoS does).

Heads are configured by a small frozen dataclass of their own options (the keys a
config file may set under `head:` besides `name`). A head with no options uses
`NoOptions`. The config loader validates user input against that dataclass, so a key
the chosen head does not use is an error, never silently ignored.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, ClassVar, NamedTuple, Optional

import torch
from torch import nn


class HeadOutput(NamedTuple):
    log_probs: torch.Tensor                      # (T, B, V)
    transformed_logits: Optional[torch.Tensor]   # (T, B, V) f(l), or None where the head has none


@dataclass(frozen=True)
class NoOptions:
    """Options of a head that has none.

    A head's Options dataclass checks its own values in __post_init__ and raises
    ValueError("<field>: <what was expected>") for an impossible value; the config loader
    turns that into a one-line error naming the config key.
    """


class OutputHead(nn.Module):
    """Base class: subclasses set `Options` and implement `forward`.

    Constructor arguments are the same for every head:
      options       an instance of cls.Options (validated)
      vocab_size    V
      emsize        d_emb, the size of the tied decoder rows
      nhidlast      size of g, the last LSTM layer's output
      tied_weight   the embedding matrix (V x d_emb), shared as the decoder weight
    """

    Options: ClassVar[type] = NoOptions
    # Linear heads project g straight onto the tied embedding rows, so g must have size d_emb.
    requires_nhidlast_equal_emsize: ClassVar[bool] = True

    def __init__(self, options, vocab_size: int, emsize: int, nhidlast: int,
                 tied_weight: nn.Parameter):
        super().__init__()
        self.options = options
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> HeadOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def target_log_probs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(target) at every position, (T, B): all that the loss and perplexity need.

        The same values as gathering forward()'s log-probabilities (which is what this does);
        a head whose full (T, B, V) output is costly overrides it (MoS)."""
        log_probs = self(hidden).log_probs
        return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    def extra_param_groups(self) -> list[dict]:
        """Optimizer groups with their own base learning rate, e.g. PLIF's slopes.

        Each entry is {'params': [...], 'lr': float}. Parameters listed here are left out
        of the main group. The training loop rescales every group's lr by seq_len / bptt.
        """
        return []


class FusedKernel:
    """A per-logit tensor function that runs through torch.compile when asked.

    SS, GSS and PLIF apply a transform to all T*B*V logits; as separate tensor ops each op
    is a full pass over memory, while inductor fuses the whole function into one pass. The
    function is plain PyTorch, so the eager call computes the same expression (up to float
    rounding): compiling is a speed matter only. If compiling or running the compiled code
    fails (no C++ compiler, an unsupported platform), one warning is printed and every
    kernel runs eagerly from then on.
    """

    _compile_failed: ClassVar[bool] = False

    def __init__(self, fn: Callable):
        self.fn = fn
        self._compiled: Optional[Callable] = None

    def __call__(self, *args, compiled: bool):
        if compiled and not FusedKernel._compile_failed:
            try:
                if self._compiled is None:
                    # dynamic: one kernel for every sequence length the variable BPTT draws.
                    self._compiled = torch.compile(self.fn, dynamic=True)
                return self._compiled(*args)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as error:  # whatever the compiler stack raises, eager still works
                FusedKernel._compile_failed = True
                reason = (str(error).strip().splitlines() or [""])[0]
                warnings.warn(f"torch.compile failed ({type(error).__name__}: {reason}); output "
                              "heads use their eager kernels from now on (same results, slower)",
                              RuntimeWarning, stacklevel=2)
        return self.fn(*args)
