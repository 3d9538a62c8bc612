"""Per-logit functions that run through torch.compile when asked, with an eager fallback."""
from __future__ import annotations

import warnings
from typing import Callable, ClassVar, Mapping, Optional

import torch


class FusedKernel:
    """A per-logit tensor function that runs through torch.compile when asked.

    SS, GSS and PLIF apply a transform to all T*B*V logits; as separate tensor ops each op
    is a full pass over memory, while inductor fuses the whole function into one pass. The
    function is plain PyTorch, so the eager call computes the same expression (up to float
    rounding): compiling is a speed matter only. If compiling or running the compiled code
    fails (no C++ compiler, an unsupported platform), one warning is printed and every
    kernel runs eagerly from then on.

    `varying` names, per positional argument, the dimensions whose size changes from call to
    call (the rows: positions x batch, which the variable BPTT length changes); they are
    compiled as symbols, so one kernel serves every sequence length. Every other size (the
    vocabulary, K) stays a constant of the kernel, which the compiler specialises for
    (dynamic=True would make them symbols too).
    """

    _compile_failed: ClassVar[bool] = False

    def __init__(self, fn: Callable, varying: Optional[Mapping[int, tuple[int, ...]]] = None):
        self.fn = fn
        self.varying = dict(varying or {})
        self._compiled: Optional[Callable] = None

    def __call__(self, *args, compiled: bool):
        if compiled and not FusedKernel._compile_failed:
            try:
                if self._compiled is None:
                    self._compiled = torch.compile(self.fn, dynamic=False)
                self.mark_varying(args)
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

    def mark_varying(self, args) -> None:
        for index, dims in self.varying.items():
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(args[index], dim)


def _logsumexp_rows(logits: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(logits, dim=-1)


# logsumexp over the last dimension of (N, V) logits: compiled, two reads of the logits and no
# (N, V) temporary (eager logsumexp makes one for exp(l - max)). MoS and Mixtape use it.
LOGSUMEXP_ROWS = FusedKernel(_logsumexp_rows, varying={0: (0,)})
