"""Every output head's training-step cost at its PTB config's shapes or the miniature's (docs/reference.md section 5).

    AWD_DATA_DIR=... python benchmarks/bench_heads.py [--reps 5] [--heads softmax,plif] [--device cuda]
    AWD_DATA_DIR=... python benchmarks/bench_heads.py --shapes mini --mos-components 15 --heads softmax,mos,mixtape

--shapes mini times the heads with the sizes of configs/ptb_mini/ (the CPU studies) instead of
configs/ptb/; --mos-components K gives MoS K components instead of its config's (the miniature's
MoS has K = 4; Mixtape's goal is set against MoS at [SB]'s K = 15).

Two timings per head, each with steps of all heads interleaved (softmax, ss, ..., softmax,
ss, ...) so that drifts in machine speed hit every head alike; medians are reported:
  full step  train.py's own Trainer.train_step with configs/ptb/<head>.yaml (body and head,
             every dropout, AR/TAR, clipping, SGD) at a fixed seq_len = bptt (70); MoS/MoC
             run at their config's batch 12 and sizes, so they are compared per token;
             every registered head is timed, with the options and shapes of its PTB config;
  head step  what the head alone adds: g (T, B, nhidlast) -> head -> targets' log-probs -> NLL ->
             backward into g, the tied embedding and the head's own parameters, at the batch
             size, emsize and nhidlast of the head's PTB config (linear heads: batch 20,
             emsize = nhidlast = 400; MoS/MoC: batch 12, emsize 280, nhidlast 620).

A second Softmax, `softmax-again`, is timed in the same rounds as a control: its ratio to the
first Softmax is the run's noise floor (on a shared 2-core VM, several percent either way).

Also reported, from one extra step per head: the peak memory of the step above what
existed before it, the last step's gradients freed first (CUDA: the allocator's peak; CPU:
the profiler's memory timeline), and
the bytes the step saves for backward per logit (distinct storages seen by
saved_tensors_hooks, the tied weight and other parameters excluded).

Targets (full step): SS and GSS <= 1.05x Softmax; PLIF (K = 100,000) <= 1.15x; MoS per
token <= 2.0x Softmax per token; PLIF saves <= 4 bytes per logit more than the Softmax;
Mixtape per token <= 1.35x Softmax's and <= 0.5x MoS's (K = 15), at both shapes.

On CPU with glibc, a freed tensor larger than 32 MB goes back to the OS and the next one
page-faults in afresh: every extra (T, B, V) tensor (56 MB) costs ~40 ms here, a fresh
0.5 GB block 160-230 ms against ~35 ms to fill a reused one, and neither
MALLOC_MMAP_THRESHOLD_=4294967296 nor MALLOC_MMAP_MAX_=0 with a large MALLOC_TRIM_THRESHOLD_
removed that cost here. CUDA's caching allocator has no such cost; the MoS head keeps its
0.5 GB buffer from step to step for this reason.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import TrainerStep, interleaved_times, medians, run_benchmark, synchronize  # noqa: E402
from data import load_corpus  # noqa: E402
from experiment.cli import ArgumentParser, integer_at_least_0, integer_at_least_1  # noqa: E402
from experiment.config import load_config  # noqa: E402
from experiment.loading import select_device  # noqa: E402
from model.heads import HEADS  # noqa: E402



CONTROL = "softmax-again"
PTB_VOCAB = 10_000


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


CONFIG_FOLDERS = {"ptb": "configs/ptb", "mini": "configs/ptb_mini"}


def head_overrides(name: str, compiled: bool, mos_components: int | None) -> list[str]:
    """The config overrides a head is timed with: --no-compile, --mos-components."""
    fields = HEADS[name].Options.__dataclass_fields__
    overrides = [f"head.compile={str(compiled).lower()}"] if "compile" in fields else []
    if name == "mos" and mos_components:
        overrides.append(f"head.components={mos_components}")
    return overrides


def setups_of(shapes: str, compiled: bool, mos_components: int | None) -> dict[str, tuple[str, object, Shape]]:
    """name -> (config path, head options, shape) of every registered head, from
    configs/ptb/<name>.yaml ([SB]'s PTB settings: batch size, emsize, nhidlast and the head's own
    options) or configs/ptb_mini/<name>.yaml."""
    setups = {}
    for name in HEADS:
        path = f"{CONFIG_FOLDERS[shapes]}/{name}.yaml"
        config = load_config(path, head_overrides(name, compiled, mos_components))
        setups[name] = (path, config.head, Shape(batch=config.train.batch_size, bptt=config.train.bptt,
                                                 vocab=PTB_VOCAB, emsize=config.model.emsize,
                                                 nhidlast=config.model.nhidlast))
    return setups


class Case:
    """One head with its inputs, ready to run training steps."""

    def __init__(self, name: str, options, shape: Shape, device: torch.device):
        self.name, self.shape = name, shape
        self.embedding = nn.Parameter(torch.empty(shape.vocab, shape.emsize, device=device)
                                      .uniform_(-0.1, 0.1))
        self.head = HEADS[name](options, shape.vocab, shape.emsize, shape.nhidlast,
                                self.embedding).to(device).train()
        self.hidden = torch.randn(shape.bptt, shape.batch, shape.nhidlast, device=device) * 0.5
        self.targets = torch.randint(shape.vocab, (shape.bptt, shape.batch), device=device)

    def release_gradients(self) -> None:
        for p in self.head.parameters():
            p.grad = None

    def step(self) -> None:
        """What train.py does with the head: the targets' log-probs, mean NLL, backward."""
        self.release_gradients()
        hidden = self.hidden.detach().requires_grad_()
        (-self.head.target_log_probs(hidden, self.targets).mean()).backward()


@contextlib.contextmanager
def profiler_start_and_stop_unsaid():
    """torch's profiler (its Kineto library, in C++, past sys.stderr) writes a line to the
    process's stderr as it starts and as it stops, `USDT:... profiler_start` and `profiler_stop`,
    two lines a head among the table's: those two are dropped, any other line it writes is passed on."""
    sys.stderr.flush()
    kept_stderr = os.dup(2)
    with tempfile.TemporaryFile() as written:
        os.dup2(written.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(kept_stderr, 2)
            os.close(kept_stderr)
            written.seek(0)
            for line in written.read().decode(errors="replace").splitlines():
                if not (line.startswith("USDT:") and line.endswith(("profiler_start", "profiler_stop"))):
                    print(line, file=sys.stderr)


def peak_step_memory(case: Case, device: torch.device) -> int:
    """Bytes allocated at the step's peak beyond what was allocated before it."""
    workspace = getattr(case.head, "workspace", None)
    if workspace is not None:
        workspace.release()     # count MoS's reusable logits buffer as the step's memory
    # The last step's gradients go before the count starts, not inside the step: the CPU's profiler
    # sees no free of a block allocated before it started, so they would have stayed counted there
    # (the CUDA count saw them go), and both count a step that starts without gradients.
    case.release_gradients()
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        case.step()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile
    with profiler_start_and_stop_unsaid(), profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                                                   record_shapes=True, with_stack=True) as prof:
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
        case.head.target_log_probs(hidden, case.targets)
    return sum(storages.values()) / (case.shape.tokens * case.shape.vocab)


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default=",".join(HEADS), help="comma-separated head names")
    parser.add_argument("--reps", type=integer_at_least_1, default=5, help="timed steps per head (median)")
    parser.add_argument("--warmup", type=integer_at_least_0, default=2, help="untimed steps per head first "
                        "(the first compiled step compiles)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    parser.add_argument("--threads", type=integer_at_least_1, default=None, help="torch CPU threads")
    parser.add_argument("--no-compile", action="store_true", help="eager kernels for SS/GSS/PLIF")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--head-only", action="store_true", help="skip the full-model steps")
    parser.add_argument("--shapes", choices=sorted(CONFIG_FOLDERS), default="ptb",
                        help="the sizes of configs/ptb/ (default) or of the miniature configs/ptb_mini/")
    parser.add_argument("--mos-components", type=integer_at_least_1, metavar="K",
                        help="MoS with K components instead of its config's")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = select_device(args.device, "--device")
    setups = setups_of(args.shapes, not args.no_compile, args.mos_components)
    names = args.heads.split(",")
    unknown = [n for n in names if n not in setups]
    if unknown:
        parser.error(f"unknown heads {unknown}; known: {', '.join(setups)}")
    if "softmax" not in names:
        names.insert(0, "softmax")   # every ratio is against the Softmax
    # A second, independent Softmax in the same rounds: its ratio to the first is this run's
    # noise floor (the same work timed twice), against which the other ratios can be read.
    head_of = {**{name: name for name in names}, CONTROL: "softmax"}
    names.append(CONTROL)
    cases = {name: Case(head_of[name], *setups[head_of[name]][1:], device) for name in names}

    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"compile {not args.no_compile}, shapes {args.shapes}"
          + (f", MoS K = {args.mos_components}" if args.mos_components else ""))
    corpus = None if args.head_only else load_corpus("ptb")   # before any timing: a missing corpus stops it at once
    head_times = medians(interleaved_times({n: c.step for n, c in cases.items()}, args.reps, args.warmup, device))
    full = {}
    if corpus is not None:
        full = {name: TrainerStep(setups[head_of[name]][0], corpus, device,
                                  head_overrides(head_of[name], not args.no_compile, args.mos_components))
                for name in names}
        full_times = medians(interleaved_times(full, args.reps, args.warmup, device))

    base = cases["softmax"]
    base_saved = saved_bytes_per_logit(base)
    header = f"{'head':<15} {'head ms':>8} {'x Softmax':>9} {'per token':>9}"
    if full:
        header += f" {'full ms':>8} {'x Softmax':>9} {'per token':>9}"
    print(header + f" {'head peak MB':>12} {'saved B/logit':>13} {'vs Softmax':>10}")
    results = {}
    for name, case in cases.items():
        ratio = head_times[name] / head_times["softmax"]
        per_token = ratio * base.shape.tokens / case.shape.tokens
        line = f"{name:<15} {head_times[name] * 1e3:8.1f} {ratio:9.3f} {per_token:9.3f}"
        row = {"head_step_s": head_times[name], "head_ratio": ratio, "head_ratio_per_token": per_token}
        if full:
            f_ratio = full_times[name] / full_times["softmax"]
            f_per_token = f_ratio * full["softmax"].tokens / full[name].tokens
            line += f" {full_times[name] * 1e3:8.1f} {f_ratio:9.3f} {f_per_token:9.3f}"
            row.update(full_step_s=full_times[name], full_ratio=f_ratio, full_ratio_per_token=f_per_token)
        saved = saved_bytes_per_logit(case)
        peak = peak_step_memory(case, device) / 2**20
        print(line + f" {peak:12.0f} {saved:13.2f} {saved - base_saved:+10.2f}")
        row.update(head_peak_mb=peak, saved_bytes_per_logit=saved, saved_vs_softmax=saved - base_saved)
        results[name] = {k: round(v, 4) for k, v in row.items()}
    print(json.dumps(results))


if __name__ == "__main__":
    run_benchmark(main)
