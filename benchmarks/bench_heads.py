"""Head-only training-step cost of every output head at its PTB shapes (SPEC section 5).

    python benchmarks/bench_heads.py [--reps 9] [--heads softmax,plif] [--device cuda]

A step is what the head adds to a training step: g (T, B, nhidlast) -> head -> log-probs
-> NLL -> backward into g, the tied embedding and the head's own parameters. Steps of all
heads are interleaved (softmax, ss, ..., softmax, ss, ...) so that drifts in machine speed
hit every head alike; medians are reported. Linear heads run at batch 20, bptt 70,
V 10,000, emsize = nhidlast = 400; MoS/MoC at batch 12, emsize 280, nhidlast 620, K 15,
so they are compared with the Softmax per token.

Also reported, from one extra step per head: the peak memory of the step above what
existed before it (CUDA: the allocator's peak; CPU: the profiler's memory timeline), and
the bytes the step saves for backward per logit (distinct storages seen by
saved_tensors_hooks, the tied weight and other parameters excluded).

Targets: SS and GSS <= 1.05x Softmax; PLIF (K = 100,000) <= 1.15x; MoS per token <= 2.0x
Softmax per token; PLIF saves <= 4 bytes per logit more than the Softmax (the logits).

On CPU with glibc, a freed tensor larger than 32 MB goes back to the OS and the next one
page-faults in afresh, which charges every extra (T, B, V) tensor ~40 ms here; CUDA's
caching allocator has no such cost. MALLOC_MMAP_THRESHOLD_=4294967296 in the environment
makes glibc reuse freed blocks like CUDA does; the header line says which regime ran.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.heads import HEADS  # noqa: E402
from model.heads.mixture import MixtureOptions  # noqa: E402
from model.heads.plif import FrozenPLIFOptions, PLIFOptions  # noqa: E402
from model.heads.sigsoftmax import GSSOptions, SigSoftmaxOptions  # noqa: E402


@dataclass(frozen=True)
class Shape:
    batch: int
    bptt: int
    vocab: int
    emsize: int
    nhidlast: int

    @property
    def tokens(self) -> int:
        return self.batch * self.bptt


LINEAR = Shape(batch=20, bptt=70, vocab=10_000, emsize=400, nhidlast=400)
MIXTURE = Shape(batch=12, bptt=70, vocab=10_000, emsize=280, nhidlast=620)


def ptb_setups(compiled: bool) -> dict[str, tuple[object, Shape]]:
    """name -> (head options, shape), as in [SB]'s PTB settings."""
    return {
        "softmax": (HEADS["softmax"].Options(), LINEAR),
        "ss": (SigSoftmaxOptions(compile=compiled), LINEAR),
        "gss": (GSSOptions(c=-1.5, k=2.5, compile=compiled), LINEAR),
        "plif": (PLIFOptions(compile=compiled), LINEAR),
        "plif_frozen": (FrozenPLIFOptions(compile=compiled), LINEAR),
        "mos": (MixtureOptions(), MIXTURE),
        "moc": (MixtureOptions(), MIXTURE),
    }


class Case:
    """One head with its inputs, ready to run training steps."""

    def __init__(self, name: str, options, shape: Shape, device: torch.device):
        self.name, self.shape = name, shape
        self.embedding = nn.Parameter(torch.empty(shape.vocab, shape.emsize, device=device)
                                      .uniform_(-0.1, 0.1))
        self.head = HEADS[name](options, shape.vocab, shape.emsize, shape.nhidlast,
                                self.embedding).to(device).train()
        self.hidden = torch.randn(shape.bptt, shape.batch, shape.nhidlast, device=device) * 0.5
        self.targets = torch.randint(shape.vocab, (shape.tokens,), device=device)

    def step(self) -> None:
        for p in self.head.parameters():
            p.grad = None
        hidden = self.hidden.detach().requires_grad_()
        log_probs = self.head(hidden).log_probs
        F.nll_loss(log_probs.view(-1, self.shape.vocab), self.targets).backward()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_step_memory(case: Case, device: torch.device) -> int:
    """Bytes allocated at the step's peak beyond what was allocated before it."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        case.step()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        case.step()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # Deprecated in favour of CUDA-only snapshot tools; still the one CPU timeline.
        warnings.simplefilter("ignore", FutureWarning)
        path = os.path.join(tmp, "timeline.json")
        prof.export_memory_timeline(path, device="cpu")
        with open(path) as f:
            _, sizes = json.load(f)   # per event: bytes in each category; the sum is live memory
    return max(sum(row) for row in sizes) - sum(sizes[0])


def saved_bytes_per_logit(case: Case) -> float:
    """Bytes of distinct storages saved for backward by one forward, per logit."""
    params = {p.untyped_storage().data_ptr() for p in case.head.parameters()}
    params.update(b.untyped_storage().data_ptr() for b in case.head.buffers())
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    hidden = case.hidden.detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        case.head(hidden)
    return sum(storages.values()) / (case.shape.tokens * case.shape.vocab)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default=",".join(HEADS), help="comma-separated head names")
    parser.add_argument("--reps", type=int, default=9, help="timed steps per head (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per head first "
                        "(the first compiled step compiles)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--no-compile", action="store_true", help="eager kernels for SS/GSS/PLIF")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    setups = ptb_setups(compiled=not args.no_compile)
    names = args.heads.split(",")
    unknown = [n for n in names if n not in setups]
    if unknown:
        parser.error(f"unknown heads {unknown}; known: {', '.join(setups)}")
    if "softmax" not in names:
        names.insert(0, "softmax")   # every ratio is against the Softmax
    cases = {name: Case(name, *setups[name], device) for name in names}

    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"compile {not args.no_compile}, MALLOC_MMAP_THRESHOLD_="
          f"{os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}")
    for case in cases.values():
        for _ in range(args.warmup):
            case.step()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.reps):
        for name, case in cases.items():
            synchronize(device)
            start = time.perf_counter()
            case.step()
            synchronize(device)
            times[name].append(time.perf_counter() - start)

    base = cases["softmax"]
    base_step = statistics.median(times["softmax"])
    base_token = base_step / base.shape.tokens
    base_saved = saved_bytes_per_logit(base)
    print(f"{'head':<12} {'step ms':>8} {'x Softmax':>9} {'per token':>9} {'peak MB':>8} "
          f"{'saved B/logit':>13} {'vs Softmax':>10}")
    for name, case in cases.items():
        step = statistics.median(times[name])
        saved = saved_bytes_per_logit(case)
        peak = peak_step_memory(case, device) / 2**20
        print(f"{name:<12} {step * 1e3:8.1f} {step / base_step:9.3f} "
              f"{step / case.shape.tokens / base_token:9.3f} {peak:8.0f} {saved:13.2f} "
              f"{saved - base_saved:+10.2f}")


if __name__ == "__main__":
    main()
