"""A first check of a new GPU machine: what this repository needs from it, in a few minutes.

    python -m benchmarks.gpu_check                 # on the default device (CUDA when present)
    python -m benchmarks.gpu_check --device cpu    # the same checks on the CPU
    python -m benchmarks.gpu_check --fast          # tiny shapes and 2 steps (what CI runs)
    python -m benchmarks.gpu_check --only group    # one section (scripts/gpu_group_check.sh)

Prints, one section after another: torch, CUDA, cuDNN and the GPUs; the cuDNN LSTM against the
CPU LSTM on the same weights (largest difference); each head's compiled kernels, working or fallen
back to eager; PTB training steps of every head with s/step and the s/epoch they imply beside
[SB]'s V100 seconds per epoch (Table 2); one batched group step (train.py --group) against the
solo steps of its runs from the same weights and masks; the peak memory of rank.py's decomposition (PTB and
WikiText-2 vocabularies) and of MoS with the neural cache under their memory bounds; with two
GPUs or more, a 2-process NCCL run against one process. Without a GPU every check runs on the
CPU and the report says that no GPU was found. Exit code 0 when every check passed, 1 otherwise.
The corpora are not needed: training and evaluation read random words of the PTB vocabulary size.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import resource
import subprocess
import sys
import tempfile
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.published import TABLE2  # noqa: E402
from benchmarks.common import TrainerStep, median_step, synchronize  # noqa: E402
from data.corpus import Corpus  # noqa: E402
from experiment.config import ConfigError, load_config, overrides_setting  # noqa: E402
from experiment.loading import select_device, set_float32_precision  # noqa: E402
from model import build_model  # noqa: E402
from model.heads import HEADS  # noqa: E402
from model.kernels import mixture  # noqa: E402
from model.kernels.compiled import FusedKernel  # noqa: E402
from spectrum import StreamingSingularValues  # noqa: E402
from spectrum.streaming import full_rate_float64, torch_backend_bytes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PTB_TRAIN_TOKENS = 929_589
VOCABULARIES = {"PTB": 10_000, "WikiText-2": 33_278}
ROWS_PER_UPDATE = 512            # rows of log-probabilities fed to the decomposition at once
CACHE_CHUNK = 5000                 # the neural cache's positions per forward (evaluate.py --cache)
LSTM_TOLERANCE = 1e-4              # cuDNN against the CPU in IEEE float32: ~1e-6 expected
DDP_TOLERANCE = 1e-6               # 2 processes against one (docs/gpus.md, Multiple GPUs)
SECTIONS = ("lstm", "kernels", "training", "group", "memory", "distributed")   # in this order
# The CI mode: shapes a CPU runs in seconds.
FAST = ["model.emsize=16", "model.nhid=24", "model.nhidlast=16", "train.batch_size=4", "train.bptt=8",
        "train.eval_batch_size=2"]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def gib(nbytes: float) -> str:
    """Bytes as GiB, or MiB below one GiB."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


class Report:
    def __init__(self):
        self.checks: list[Check] = []

    def section(self, title: str) -> None:
        print(f"\n== {title}", flush=True)

    def line(self, text: str) -> None:
        print(f"  {text}", flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))
        print(f"  [{'ok' if ok else 'FAILED'}] {name}: {detail}", flush=True)


# ---------------------------------------------------------------------- environment

def environment(report: Report, device: torch.device) -> None:
    report.section("environment")
    report.line(f"torch {torch.__version__}, built for CUDA {torch.version.cuda or '-'}, "
                f"cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else '-'}")
    if not torch.cuda.is_available():
        report.line("no GPU found: every check below runs on the CPU")
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(index)
        gpu = torch.device("cuda", index)
        report.line(f"cuda:{index} {props.name}, {gib(props.total_memory)}, compute capability "
                    f"{props.major}.{props.minor}, float64 at "
                    f"{'full' if full_rate_float64(gpu) else 'reduced (rank.py --dtype float64 runs on the CPU)'} rate")
    report.line(f"checks run on {device}")


# ---------------------------------------------------------------------- LSTM

def lstm_agreement(report: Report, device: torch.device, fast: bool) -> None:
    """The same nn.LSTM on the device (cuDNN on a GPU) and on the CPU, in IEEE float32."""
    report.section("LSTM: device against the CPU")
    size, hidden, steps, batch = (16, 24, 8, 4) if fast else (400, 1150, 70, 20)
    torch.manual_seed(0)
    lstm = nn.LSTM(size, hidden)
    x = torch.randn(steps, batch, size)
    with torch.no_grad():
        on_cpu, _ = lstm(x)
        on_device, _ = lstm.to(device)(x.to(device))
    difference = (on_device.cpu() - on_cpu).abs().max().item()
    backend = "cuDNN" if device.type == "cuda" and torch.backends.cudnn.is_available() else device.type
    report.check("LSTM", difference <= LSTM_TOLERANCE,
                 f"{backend} vs CPU, {steps} x {batch} x {size} -> {hidden}: max difference {difference:.2e}")


# ---------------------------------------------------------------------- compiled kernels

def head_config(name: str) -> str:
    return f"configs/ptb/{name}.yaml"


def small(name: str) -> list[str]:
    """FAST and the head's own small options (fewer components, knots), compiled or not as the
    config says."""
    options = dataclasses.asdict(HEADS[name].small_options())
    options.pop("compile", None)
    return [*FAST, *overrides_setting("head", options)]


def compiled_kernels(report: Report, device: torch.device) -> None:
    """Each head whose options have `compile`: a forward and backward compiled against eager."""
    report.section("compiled kernels (torch.compile) per head")
    for name, head_class in HEADS.items():
        if "compile" not in getattr(head_class.Options, "__dataclass_fields__", {}):
            report.line(f"{name}: no compiled kernels")
            continue
        FusedKernel._compile_failed = False
        results = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for compiled in (False, True):
                config = load_config(head_config(name), [*small(name), f"head.compile={str(compiled).lower()}",
                                                         "run.device=cpu"])
                torch.manual_seed(0)
                model = build_model(config, 50).to(device).eval()
                ids = torch.randint(50, (8, 2), generator=torch.Generator().manual_seed(1)).to(device)
                hidden = model.init_hidden(2)
                out = model(ids[:-1], hidden, ids[1:])
                out.target_log_probs.sum().backward()
                results.append((out.target_log_probs.detach(), model.body.encoder.weight.grad))
        fell_back = FusedKernel._compile_failed
        difference = max((a - b).abs().max().item() for a, b in zip(*results))
        reason = next((str(w.message) for w in caught if "torch.compile failed" in str(w.message)), "")
        report.check(f"{name} kernels", not fell_back and difference < 1e-4,
                     f"fell back to eager ({reason})" if fell_back else
                     f"compiled, max difference to eager {difference:.1e}")


# ---------------------------------------------------------------------- training speed

def random_corpus(vocab: int, tokens: int, seed: int = 0) -> Corpus:
    """Random words of a `vocab`-word vocabulary: the shapes of a corpus without its text."""
    generator = torch.Generator().manual_seed(seed)
    splits = [torch.randint(vocab, (tokens,), generator=generator) for _ in range(3)]
    return Corpus("ptb", [f"w{i}" for i in range(vocab)], *splits)


def published_seconds() -> dict[str, float]:
    """[SB] Table 2's seconds per epoch on a V100, PTB, by head."""
    return {row.head: row.seconds for row in TABLE2.rows if row.dataset == "ptb" and row.seconds}


def training_speed(report: Report, device: torch.device, steps: int, fast: bool) -> None:
    report.section(f"training: {steps} PTB steps per head, s/step and implied s/epoch")
    reference = published_seconds()
    for name in HEADS:
        overrides = small(name) if fast else []
        config = load_config(head_config(name), [*overrides, f"run.device={device}"])
        t = config.train
        corpus = random_corpus(VOCABULARIES["PTB"] if not fast else 50, (steps + 4) * t.batch_size * t.bptt)
        step = TrainerStep(head_config(name), corpus, device, overrides)
        step()                                                   # compilation, allocation
        per_step = median_step(step, steps, device)
        per_epoch = per_step * PTB_TRAIN_TOKENS / (t.batch_size * t.bptt)
        published = reference.get(name)
        beside = f"[SB] V100 {published:.0f} s/epoch" if published else "[SB]: no figure"
        report.check(f"{name} training", math.isfinite(per_step),
                     f"{per_step * 1000:.1f} ms/step, implied {per_epoch:,.0f} s/epoch"
                     f"{' (tiny shapes)' if fast else ''} | {beside}")


# ---------------------------------------------------------------------- group runs

GROUP_TOLERANCE = 1e-5           # relative, float32: a batched step against the solo steps
ROUNDING_FACTOR = 4              # ... or within this many times two solo float32 LSTM kernels' difference


@contextmanager
def other_lstm_kernel(device: torch.device):
    """The device's other float32 LSTM kernel: native CUDA instead of cuDNN, native CPU code
    instead of oneDNN's."""
    if device.type == "cuda":
        with torch.backends.cudnn.flags(enabled=False):
            yield
        return
    with warnings.catch_warnings():   # oneDNN's flags warn that TF32 needs an Intel GPU
        warnings.simplefilter("ignore", UserWarning)
        with torch.backends.mkldnn.flags(enabled=False):
            with warnings.catch_warnings():
                warnings.simplefilter("default")
                yield


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def group_agreement(report: Report, device: torch.device, fast: bool) -> None:
    """One batched group step (train.py --group's on a GPU: model/group.py's bodies, then
    experiment/group.py's heads and losses) against each member's solo step, from the same weights
    and masks: Softmax (its batched head), MoS and Mixtape of the miniature, of three lengths (the
    group pads and stops each at its own), their losses and gradients; the group's step with each
    way of the LSTM's products (grouped_lstm.PRODUCT_WAYS; "streams" on CUDA only).

    Float32 rounding differs per parameter (MoS's gradients are worse conditioned than Softmax's),
    so its scale is measured: the solo step is also computed with the device's other LSTM kernel
    (other_lstm_kernel), and a parameter whose gradient differs from the solo step's by more than
    1e-5 still agrees if that is within ROUNDING_FACTOR times the two solo kernels' difference. All
    gradients together must agree to 1e-5."""

    from experiment.group import grouped_losses
    from model.group import grouped_forward
    from model.kernels import grouped_lstm
    from model.random_stream import RandomStream
    from train import regularized_loss
    report.section("group runs: one batched step against the solo steps, same weights and masks")
    heads, lengths, batch, vocab = ("softmax", "mos", "mixtape"), (70, 64, 53), 20, VOCABULARIES["PTB"]
    if fast:
        lengths, batch, vocab = (8, 6, 5), 4, 50
    members = []
    for seed, (name, length) in enumerate(zip(heads, lengths)):
        config = load_config(f"configs/ptb_mini/{name}.yaml", FAST if fast else [])
        torch.manual_seed(seed)
        model = build_model(config, vocab).to(device).train()
        ids = torch.randint(vocab, (length + 1, batch), generator=torch.Generator().manual_seed(seed)).to(device)
        members.append((name, model, RandomStream(device), ids[:-1], ids[1:], config.train))

    def solo_step(model, stream, inputs, targets, t, kernel):
        start = stream.state()
        with stream, kernel:
            loss = regularized_loss(model(inputs, model.init_hidden(batch), targets), t.alpha, t.beta)[1]
            loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        stream.restore(start["torch"], start["cuda"])
        return loss.item(), grads
    solo = [solo_step(*member[1:], nullcontext()) for member in members]
    other = [solo_step(*member[1:], other_lstm_kernel(device))[1] for member in members]
    draws = []
    for name, model, stream, inputs, *_ in members:
        with stream:
            draws.append(model.body.draw_random(*inputs.shape))
    # Each way of the time loops' products (model/kernels/grouped_lstm.py's PRODUCT) from the same
    # draws, each member's stream where the draws left it (MoS's and Mixtape's heads draw from it).
    after_draws = [member[2].state() for member in members]
    # ("streams" is per_member off CUDA: the same rows again)
    ways = [way for way in grouped_lstm.PRODUCT_WAYS if way != "streams" or device.type == "cuda"]
    for product in ways:
        for member, state in zip(members, after_draws):
            member[1].zero_grad(set_to_none=True)
            member[2].restore(state["torch"], state["cuda"])
        chosen, grouped_lstm.PRODUCT = grouped_lstm.PRODUCT, product
        try:
            bodies = grouped_forward([m[1].body for m in members], [m[3] for m in members],
                                     [m[1].init_hidden(batch) for m in members], draws)
            _, losses = grouped_losses([m[1] for m in members], bodies, [m[4] for m in members],
                                       [m[2] for m in members], [(m[5].alpha, m[5].beta) for m in members])
            losses.sum().backward()
        finally:
            grouped_lstm.PRODUCT = chosen
        way = {"batched": "", "per_member": ", one product per member",
               "gate_split": ", backward split by gate", "streams": ", one product per member on its own stream"}[product]
        for (name, model, _, inputs, *_), loss, (solo_loss, solo_grads), other_grads in zip(members, losses, solo, other):
            loss_difference = abs(loss.item() - solo_loss) / abs(solo_loss)
            names = [n for n, _ in model.named_parameters()]
            grads = [p.grad for p in model.parameters()]
            overall = relative(torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in solo_grads]))
            apart = [relative(g, s) for g, s in zip(grads, solo_grads)]
            rounding = [relative(o, s) for o, s in zip(other_grads, solo_grads)]
            worst = max(range(len(names)), key=lambda k: apart[k] / max(GROUP_TOLERANCE, ROUNDING_FACTOR * rounding[k]))
            ok = (loss_difference <= GROUP_TOLERANCE and overall <= GROUP_TOLERANCE
                  and all(a <= max(GROUP_TOLERANCE, ROUNDING_FACTOR * r) for a, r in zip(apart, rounding)))
            report.check(f"group {name}{way}", ok,
                         f"{inputs.size(0)} steps of {len(members)} lengths: loss {loss_difference:.1e}, "
                         f"gradients {overall:.1e} relative to the solo step's (bound {GROUP_TOLERANCE:.0e}); "
                         f"per parameter at most {max(apart):.1e}, {names[worst]} {apart[worst]:.1e} with the solo "
                         f"step's two LSTM kernels {rounding[worst]:.1e} apart there (bound: the larger of "
                         f"{GROUP_TOLERANCE:.0e} and {ROUNDING_FACTOR}x that)")


# ---------------------------------------------------------------------- memory

def peak_bytes(fn, device: torch.device) -> int:
    """Peak memory fn() adds: the CUDA allocator's peak on a GPU; on the CPU the growth of the
    process's resident high-water mark (exact in a fresh process; a lower bound after larger
    earlier peaks)."""
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024


def rank_peak(vocab: int, device: torch.device, budget: int | None, full: bool) -> tuple[StreamingSingularValues, int]:
    """One block and the final SVD of rank.py's float32 decomposition of a `vocab`-column
    matrix on `device` under `budget`; the stream and its peak memory."""
    sv = StreamingSingularValues(vocab, dtype=np.float32, device=device, max_memory=budget)

    def decompose():
        generator = torch.Generator(device=device).manual_seed(0)
        for _ in range(math.ceil((sv.block_rows + 1) / ROWS_PER_UPDATE)):
            sv.update(torch.randn(ROWS_PER_UPDATE, vocab, generator=generator, device=device))
        if full:
            sv.singular_values()

    return sv, peak_bytes(decompose, device)


def mos_cache_peak(config_path: str, vocab: int, device: torch.device, positions: int = CACHE_CHUNK,
                   overrides=()) -> tuple[int, int]:
    """Peak memory of MoS's no-gradient log p(target) over one neural-cache chunk, and its bound:
    two logits blocks (the eager fallback's logsumexp makes the second) and, outside the blocks,
    four (positions, K x d_emb) tensors of contexts, plus 64 MiB."""
    config = load_config(config_path, [*overrides, "run.device=cpu"])
    torch.manual_seed(0)
    model = build_model(config, vocab).to(device).eval()
    hidden = torch.randn(positions, 1, config.model.nhidlast or config.model.emsize, device=device)
    targets = torch.randint(vocab, (positions, 1), device=device)

    def score():
        with torch.no_grad():
            model.head.target_log_probs(hidden, targets)

    components = model.head.options.components
    logits = min(mixture.NO_GRAD_LOGITS_BYTES, positions * components * vocab * 4)
    contexts = positions * components * config.model.emsize * 4
    return peak_bytes(score, device), 2 * logits + 4 * contexts + (64 << 20)


def memory_bounds(report: Report, device: torch.device, fast: bool, full_svd: bool) -> None:
    import rank
    report.section("memory under the bounds (rank.py, MoS with the neural cache)")
    vocabularies = {"tiny": 1000} if fast else VOCABULARIES
    for label, vocab in vocabularies.items():
        if device.type == "cpu" and vocab > 10_000 and not full_svd:
            report.line(f"rank.py {label} (V = {vocab:,}): not run on the CPU, where R alone takes "
                        f"{gib(vocab * vocab * 4)} of host memory (--full-svd runs it)")
            continue
        budget = rank.decomposition_budget(device, 0.01 if fast else None)
        sv, peak = rank_peak(vocab, device, budget, full=full_svd or fast or vocab <= 10_000)
        bound = torch_backend_bytes(vocab, sv.block_rows, 4) if sv.backend == "torch" else None
        # The LAPACK backend takes no budget (rank.py refuses --max-memory on the CPU): naming
        # --fast's 10 MiB beside its larger peak read as a bound broken and passed.
        where = (f"torch backend on {sv.device}, blocks of {sv.block_rows:,} rows, bound {gib(bound)}; "
                 f"budget {gib(budget) if budget else 'none'}"
                 if bound else f"LAPACK backend on the CPU (R: {gib(vocab * vocab * 4)} of host memory), "
                               f"which takes no budget")
        rows = 2 * ROWS_PER_UPDATE * vocab * 4                 # the random rows fed in
        ok = bound is None or sv.device.type != device.type or peak <= bound + rows
        report.check(f"rank.py {label} (V = {vocab:,})", ok, f"{where}; measured peak {gib(peak)}")
    for label, vocab in vocabularies.items():
        config_path = "configs/ptb/mos.yaml" if label != "WikiText-2" else "configs/wt2/mos.yaml"
        peak, bound = mos_cache_peak(config_path, vocab, device, overrides=small("mos") if fast else ())
        report.check(f"MoS cache chunk {label} (V = {vocab:,}, {CACHE_CHUNK} positions)", peak <= bound,
                     f"measured peak {gib(peak)}, bound {gib(bound)} (logits blocks of at most "
                     f"{gib(mixture.NO_GRAD_LOGITS_BYTES)}, twice in the eager fallback)")


# ---------------------------------------------------------------------- several processes

def write_random_corpus(folder: Path, vocab: int = 200) -> Path:
    """A ptb/ folder of random words (data.allow_modified_corpus=true reads it)."""
    rng = np.random.default_rng(0)
    (folder / "ptb").mkdir(parents=True)
    for split, lines in (("train", 60), ("valid", 12), ("test", 12)):
        words = rng.integers(vocab, size=(lines, 20))
        (folder / "ptb" / f"{split}.txt").write_text("\n".join(" ".join(f"w{w}" for w in row) for row in words))
    return folder


def parameters_of(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def distributed_agreement(report: Report, device: torch.device) -> None:
    """2 processes (NCCL on GPUs, gloo on the CPU) against one with half-batch chunks, without
    dropout: the same parameters to DDP_TOLERANCE."""
    backend = "NCCL" if device.type == "cuda" else "gloo"
    report.section(f"2 processes ({backend}) against one")
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        report.line(f"skipped: {torch.cuda.device_count()} GPU visible, the check needs 2")
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = write_random_corpus(Path(tmp) / "data")
        common = ["configs/ptb/softmax.yaml", f"data.data_dir={data}", "data.allow_modified_corpus=true",
                  *FAST[:6], "train.epochs=1", "run.tensorboard=false", "model.dropout=0", "model.dropouth=0",
                  "model.dropouti=0", "model.dropoute=0", "model.wdrop=0"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        two, one = Path(tmp) / "two", Path(tmp) / "one"
        runs = [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                 "train.py", *common, f"run.device={device.type}", f"run.dir={two}"],
                [sys.executable, "train.py", *common, "train.small_batch_size=2",
                 f"run.device={device.type if device.type == 'cpu' else 'cuda:0'}", f"run.dir={one}"]]
        for command in runs:
            proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                lines = (proc.stderr.strip().splitlines() or ["(no output)"])
                report.check(f"{backend} run", False, f"exit {proc.returncode}: {lines[-1][:200]}")
                return
        a, b = parameters_of(two / "last.pt"), parameters_of(one / "last.pt")
        difference = max((a[key] - b[key]).abs().max().item() for key in a)
        report.check(f"{backend} 2 processes", difference <= DDP_TOLERANCE,
                     f"largest parameter difference to 1 process {difference:.1e} (tolerance {DDP_TOLERANCE:g})")


# ---------------------------------------------------------------------- main

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per head (default 20)")
    parser.add_argument("--fast", action="store_true", help="tiny shapes and 2 steps: a quick run (CI)")
    parser.add_argument("--full-svd", action="store_true",
                        help="also the final SVD of WikiText-2's 33,278 x 33,278 R (on the CPU's LAPACK, as "
                             "rank.py runs it: past cuSOLVER gesvd's n = 26,711; minutes)")
    parser.add_argument("--skip-distributed", action="store_true", help="leave out the 2-process check")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                        help=f"only these sections ({', '.join(SECTIONS)}); the environment always")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps: expected an integer >= 1, got {args.steps}")
    if args.fast:
        args.steps = min(args.steps, 2)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        device = select_device(args.device, "--device")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    set_float32_precision(False)          # IEEE float32, as train.py, evaluate.py and rank.py
    report = Report()
    environment(report, device)
    sections = {"lstm": lambda: lstm_agreement(report, device, args.fast),
                "kernels": lambda: compiled_kernels(report, device),
                "training": lambda: training_speed(report, device, args.steps, args.fast),
                "group": lambda: group_agreement(report, device, args.fast),
                "memory": lambda: memory_bounds(report, device, args.fast, args.full_svd),
                "distributed": lambda: None if args.skip_distributed else distributed_agreement(report, device)}
    for name in args.only or SECTIONS:
        sections[name]()
    failed = [c.name for c in report.checks if not c.ok]
    print(f"\n{len(report.checks) - len(failed)} of {len(report.checks)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
