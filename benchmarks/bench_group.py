"""Tokens/s of a group run (train.py --group) against the solo run, on one device.

    python benchmarks/bench_group.py                              # CUDA when present, else the CPU
    python benchmarks/bench_group.py --device cpu --shapes mini --groups 1 2 --threads 2
    python benchmarks/bench_group.py --cpu-pair                   # the CPU goal's row (below)
    python benchmarks/bench_group.py --cpu-pair-training --steps 150   # the same in training
    python benchmarks/bench_group.py --plan sweeps/cpu_converged_heads.yaml   # a plan's runs
    python benchmarks/bench_group.py --profile 16                 # where a group step's time goes
    python benchmarks/bench_group.py --profile 4 --shapes ptb     # the same at PTB's full shapes
    python benchmarks/bench_group.py --layers --shapes ptb        # a layer: the group's loop or cuDNN's

Rows: the miniature Softmax (configs/ptb_mini/softmax.yaml, d = 32) at G = 1, 2, 4, 8, 16, 32
and PTB's full shapes (configs/ptb/softmax.yaml) at G = 1, 2, 4, 8 (--groups to choose). Each row
is one step of G runs (seeds 0..G-1, train.py's own step: every dropout, AR/TAR, clipping, the
SGD update, the checks; seq_len = bptt, so steps are comparable), its tokens/s (G x batch x bptt
per step) and that against the solo run's on the same device (train.py's Trainer.train_step),
the two timed in turn within the row (the solo run's own tokens/s in the last column).
The goals (issue 44): on an H100 or H200 in IEEE float32, the miniature at G = 16 at least 8x
the solo run's tokens/s and PTB's shapes at G = 4 at least 2x.

--cpu-pair: on a CPU with two cores, a group of 2 at 2 threads (the solo step side by side) against
two solo runs at one thread each, training at the same time in two processes (as sweep.py --jobs 2
runs them), in turn over a few rounds. The goal: at least 0.9x.

--cpu-pair-training: the same goal as train.py trains: one `train.py --group` of seeds 1 and 2 of
the miniature at 2 threads against the two trained at once by two train.py processes at one thread
each, --steps steps each, each seed with its own sampled BPTT lengths (--cpu-pair fixes them at
bptt, so its group never waits for the member with the longer step); tokens/s from the runs'
last.pt, start-up left out.

--plan: for every run of a plan (its configs and overrides, seeds as planned), the solo step's
time, and the step of all of them as one group: what training the plan in one group would cost
against training its runs one after another.

--products: the grouped LSTM's per-time-step products alone (the forward's, each member's h by its
own W_hh transposed, and the backward's, the gates' gradient by W_hh), one time loop of each for
each G, several ways: batched (the recurrence's way below 400 hidden units), weights first (the
product transposed: 4H or H rows a member instead of B), one product per member (the
recurrence's per_member), and the inner dimension split into 2, 4 and 8 parts, G x parts batched
products summed (the backward's split into 4 is the recurrence's gate_split, its way from 400
hidden units up; "-" where the parts do not divide it), and one product per member each on its
own CUDA stream (the recurrence's streams; "-" off CUDA). Which way the library runs fastest for a
few members at each shape (PTB's G = 2, batched, was slower than G = 1 on an H200).

--product WAY: the grouped LSTM's time loops computed one way for every layer (batched,
per_member, gate_split or streams) instead of the default's choice by each layer's size (by_shape;
model/kernels/grouped_lstm.py, PRODUCT), for every table of this run: the whole step's tokens/s
with it.

--layers: one LSTM layer's forward and backward (bptt steps, nhid to nhid, the layer's input
projection included) per G, three ways: the group's recurrence (model/kernels/grouped_lstm.py, its
time loops captured on CUDA), cuDNN's LSTM of each member one after another (what G solo runs
cost), and cuDNN's LSTM of each member on its own CUDA stream (whether keeping the solo run's
kernels and overlapping the members would beat the batched loop where each member's products are
already large, as at PTB's shapes).

--profile G: torch.profiler's tables (self CPU time, then device time) of --steps steps of a group
of G miniature runs (of PTB's full shapes with --shapes ptb): where the step's time goes, for the next speed-up; on a GPU also how many
times a step makes the host wait for the device (one is expected: the checks' read).

Every figure is the median of --steps steps after --warmup steps; --kind chooses the group's
step (auto: batched on CUDA, solo elsewhere; experiment/group.py). Corpora are not needed: the
steps read random words of PTB's vocabulary size.
"""
from __future__ import annotations

import shlex
import statistics
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (GroupStep, TrainerStep, corpus_of, interleaved_times, median_step,  # noqa: E402
                               medians, run_benchmark)
from data.corpus import Corpus  # noqa: E402
from experiment.cli import ArgumentParser, integer_at_least_0, integer_at_least_1  # noqa: E402
from experiment.config import ConfigError, load_config  # noqa: E402
from experiment.group import step_kind  # noqa: E402
from experiment.loading import select_device  # noqa: E402
from model.kernels import grouped_lstm  # noqa: E402
from model.kernels.grouped_lstm import (PRODUCT_WAYS, grouped_lstm_recurrence, product_with,  # noqa: E402
                                        split_inner)

SHAPES = {"mini": ("configs/ptb_mini/softmax.yaml", (1, 2, 4, 8, 16, 32)),
          "ptb": ("configs/ptb/softmax.yaml", (1, 2, 4, 8))}
PTB_VOCABULARY = 10_000
SPLITS = (2, 4, 8)            # --products: the inner dimension split into this many parts
STEPS_OF_STREAM = 64          # the random training stream holds this many steps of the batch


def random_corpus(tokens: int, seed: int = 0) -> Corpus:
    generator = torch.Generator().manual_seed(seed)
    splits = [torch.randint(PTB_VOCABULARY, (tokens,), generator=generator) for _ in range(3)]
    return Corpus("ptb", [f"w{i}" for i in range(PTB_VOCABULARY)], *splits)


def environment(device: torch.device) -> str:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else "-"
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"CPU, {torch.get_num_threads()} threads")
    return (f"device {device} ({where}) | torch {torch.__version__} | CUDA {torch.version.cuda or '-'} "
            f"| cuDNN {cudnn} | IEEE float32")


def tokens_per_second(step, args, device) -> float:
    for _ in range(args.warmup):
        step()
    return step.tokens / median_step(step, args.steps, device)


def shapes_table(args, device: torch.device, kind: str) -> None:
    """Each row times the solo run's step and the group's in turn (--steps of each after --warmup):
    a change of the machine's speed during the table (a GPU host's load moves the solo run by half
    between calls) hits both alike, and the ratio is that row's own."""
    for shape in args.shapes:
        config, default_groups = SHAPES[shape]
        groups = args.groups or default_groups
        corpus = random_corpus(STEPS_OF_STREAM * 20 * 70)
        solo = TrainerStep(config, corpus, device, args.overrides)
        print(f"\n{shape} ({config}), {kind} step: each row's solo run and group timed in turn, "
              f"median of {args.steps} steps each")
        print("| G | group tokens/s | x solo run | per run tokens/s | solo run tokens/s |")
        print("|---|---|---|---|---|")
        for g in groups:
            step = GroupStep([(config, args.overrides)] * g, corpus, device, kind)
            seconds = medians(interleaved_times({"solo": solo, "group": step}, args.steps, args.warmup, device))
            step.close()
            rate, alone = step.tokens / seconds["group"], solo.tokens / seconds["solo"]
            print(f"| {g} | {rate:,.0f} | {rate / alone:.2f}x | {rate / g:,.0f} | {alone:,.0f} |", flush=True)


def rounds(n: int) -> str:
    return f"{n} round{'' if n == 1 else 's'}"


def cpu_pair(args) -> None:
    """A group of 2 at 2 threads against two solo runs at one thread each, training at once in two
    processes (benchmarks/bench_parallel.py's concurrent runs, on the PTB corpus), in turn for
    --rounds rounds (a drift of the machine's speed hits both alike). The group's solo steps
    both ways: side by side (a thread of one core each, experiment/group.py's SideBySide) and one
    after another (each on both cores)."""
    import os
    from argparse import Namespace
    from benchmarks.bench_parallel import concurrent_runs
    config = SHAPES["mini"][0]
    device = torch.device("cpu")
    corpus = corpus_of(load_config(config, args.overrides))   # as the two processes read it
    torch.set_num_threads(2)
    groups = {"side by side": GroupStep([(config, args.overrides)] * 2, corpus, device, "solo", threads=2),
              "one after another": GroupStep([(config, args.overrides)] * 2, corpus, device, "solo", threads=1)}
    workers = Namespace(device="cpu", config=config, steps=args.steps, warmup=args.warmup, go=None,
                        overrides=list(args.overrides))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    ratios: dict[str, list[float]] = {name: [] for name in groups}
    for round_ in range(args.rounds):
        two = concurrent_runs(2, workers, env)
        line = f"round {round_ + 1}: two solo runs at 1 thread each, at once: {two:,.0f} tokens/s"
        for name, group in groups.items():
            torch.set_num_threads(2)
            pair = tokens_per_second(group, args, device)
            ratios[name].append(pair / two)
            line += f"; a group of 2 at 2 threads, {name}: {pair:,.0f} ({pair / two:.2f}x)"
        print(line, flush=True)
    for name, group in groups.items():
        group.close()
        found = sorted(ratios[name])
        print(f"\nCPU pair ({config}, {args.steps} steps after {args.warmup}, {rounds(args.rounds)}), {name}: "
              f"{statistics.median(found):.2f}x the two solo runs' tokens/s (median; {found[0]:.2f}-"
              f"{found[-1]:.2f}x; goal: at least 0.90x)")


def cpu_pair_training(args) -> None:
    """The CPU goal as train.py trains: two miniature runs (seeds 1 and 2, each with its own
    sampled BPTT lengths, which a group's step has to wait for) trained by one `train.py --group`
    at 2 threads, against the same two trained at once by two train.py processes at 1 thread each,
    --steps steps each (run.max_steps), in turn for --rounds rounds. Tokens/s from each run's
    last.pt: its position (x batch size) over the training seconds its progress counts, start-up,
    loading and saving left out; a group's members share its wall time, so the group's tokens/s is
    their tokens over their seconds summed."""
    import os
    import subprocess
    import tempfile
    config = SHAPES["mini"][0]
    batch = load_config(config, list(args.overrides)).train.batch_size
    repo = Path(__file__).resolve().parent.parent

    def run_args(folder: str, seed: int) -> list[str]:
        return [config, f"train.seed={seed}", f"run.max_steps={args.steps}", f"run.dir={folder}/seed{seed}",
                "run.device=cpu", "run.tensorboard=false", *args.overrides]

    def trained(folder: str, seed: int) -> tuple[float, float]:
        progress = torch.load(Path(folder) / f"seed{seed}" / "last.pt", weights_only=True)["progress"]
        return progress["position"] * batch, progress["epoch_seconds"]

    def train_at(commands: list[list[str]], threads: int) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        procs = [subprocess.Popen([sys.executable, str(repo / "train.py"), *command], cwd=repo, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for command in commands]
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"error: train.py ended with {proc.returncode}: {err.strip().splitlines()[-1:]}")

    ratios = []
    for round_ in range(args.rounds):
        with tempfile.TemporaryDirectory() as solo, tempfile.TemporaryDirectory() as grouped:
            train_at([run_args(solo, 1), run_args(solo, 2)], threads=1)
            two = sum(tokens / seconds for tokens, seconds in (trained(solo, 1), trained(solo, 2)))
            train_at([["--group", shlex.join(run_args(grouped, 1)), shlex.join(run_args(grouped, 2))]], threads=2)
            own = [trained(grouped, 1), trained(grouped, 2)]
            pair = sum(tokens for tokens, _ in own) / sum(seconds for _, seconds in own)
        ratios.append(pair / two)
        print(f"round {round_ + 1}: two train.py processes at 1 thread each, at once: {two:,.0f} tokens/s; "
              f"train.py --group of the two at 2 threads: {pair:,.0f} ({pair / two:.2f}x)", flush=True)
    found = sorted(ratios)
    print(f"\nCPU pair in training ({config}, seeds 1 and 2, {args.steps} steps each, {rounds(args.rounds)}): "
          f"the group {statistics.median(found):.2f}x the two processes' tokens/s (median; "
          f"{found[0]:.2f}-{found[-1]:.2f}x; goal: at least 0.90x)")


def plan_table(args, device: torch.device, kind: str) -> None:
    from launch.plans import load_plan
    from launch.runs import plan_runs
    plan = load_plan(args.plan)
    runs = plan_runs(plan.experiments, plan.out, [], None, None)
    members = [(str(run.config_path), [*(o for o in run.overrides if not o.startswith("run.dir")), *args.overrides])
               for run in runs]
    corpus = random_corpus(STEPS_OF_STREAM * 20 * 70)
    print(f"\n{args.plan}: {len(members)} runs, the solo step of each, then one {kind} step of all")
    print("| run | solo step ms |")
    print("|---|---|")
    total = 0.0
    for run, (config, overrides) in zip(runs, members):
        step = TrainerStep(config, corpus, device, overrides)
        for _ in range(args.warmup):
            step()
        seconds = median_step(step, args.steps, device)
        total += seconds
        print(f"| {run.dir.name} | {seconds * 1000:.1f} |", flush=True)
    step = GroupStep(members, corpus, device, kind)
    for _ in range(args.warmup):
        step()
    together = median_step(step, args.steps, device)
    step.close()
    print(f"one after another: {total * 1000:.1f} ms for a step of every run; as one group: "
          f"{together * 1000:.1f} ms ({total / together:.2f}x)")


def synchronizations(step) -> int:
    """How many times one step makes the host wait for the GPU (CUDA's sync debug mode's warnings):
    every wait stops the host queuing the next kernels while the GPU runs."""
    import warnings
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def profile_table(args, device: torch.device, kind: str) -> None:
    from torch.profiler import ProfilerActivity, profile
    config = SHAPES[args.shapes[0]][0]               # the miniature unless --shapes ptb
    step = GroupStep([(config, args.overrides)] * args.profile, random_corpus(STEPS_OF_STREAM * 20 * 70),
                     device, kind)
    for _ in range(max(args.warmup, 1)):
        step()
    seconds = median_step(step, args.steps, device)
    print(f"\n{kind} step of a group of {args.profile} ({config}): {seconds * 1000:.1f} ms (median of {args.steps})")
    if device.type == "cuda":
        print(f"host-device synchronizations in one step: {synchronizations(step)} (the checks' one read expected)")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        for _ in range(args.steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    step.close()
    averages = profiler.key_averages()
    for sort in ["self_cpu_time_total"] + (["self_device_time_total"] if device.type == "cuda" else []):
        print(f"\n{args.steps} steps, by {sort}:")
        print(averages.table(sort_by=sort, row_limit=25, max_name_column_width=60))


def repeat_call(fn, times: int) -> None:
    for _ in range(times):
        fn()


def table_shapes(args):
    """--products' and --layers' shapes: (the shape's config path, its group sizes, B, H, T)."""
    for shape in args.shapes:
        config_path, default_groups = SHAPES[shape]
        config = load_config(config_path)
        yield (shape, config_path, args.groups or default_groups, config.train.batch_size, config.model.nhid,
               config.train.bptt)


def median_ms(ways: list, args, device: torch.device) -> list[str]:
    """Each way's median ms over --steps calls after --warmup, as table cells ("-" and the reason
    for a way given as a string: not run here)."""
    cells = []
    for way in ways:
        if isinstance(way, str):
            cells.append(way)
            continue
        for _ in range(args.warmup):
            way()
        cells.append(f"{median_step(way, args.steps, device) * 1000:.3f}")
    return cells


def products_table(args, device: torch.device) -> None:
    """--products (the module's docstring): ms for one time loop (bptt steps) of the product, the
    median of --steps loops after --warmup, per G and way, at each shape's first layers' sizes;
    the forward's product (h by W_hh^T) and the backward's (the gates' gradient by W_hh)."""
    for shape, config_path, groups, rows, hidden, steps in table_shapes(args):
        for name, inner, outer in (("forward", hidden, 4 * hidden), ("backward", 4 * hidden, hidden)):
            print(f"\n{shape} ({config_path}), the {name} loop's product: (G, {rows}, {inner}) by "
                  f"(G, {inner}, {outer}), {steps} products a loop; ms a loop, median of {args.steps}")
            print("| G | as computed (batched) | weights first (transposed) | one product per member | "
                  + " | ".join(f"inner split in {parts}" for parts in SPLITS) + " | one per member, a stream each |")
            print("|---|---|---|---|" + "---|" * (len(SPLITS) + 1))
            for g in groups:
                bias, a = torch.randn(g, rows, outer, device=device), torch.randn(g, rows, inner, device=device)
                weights = torch.randn(g, 4 * hidden, hidden, device=device)   # W_hh as the loops hold it
                weights = weights.transpose(1, 2) if name == "forward" else weights
                bias_t, a_t, weights_t = (x.transpose(1, 2).contiguous() for x in (bias, a, weights))
                ways = [partial(product_with(weights, "batched"), bias, a),
                        partial(torch.baddbmm, bias_t, weights_t, a_t),
                        partial(product_with(weights, "per_member"), bias, a)]
                ways += [partial(split_inner(weights, parts), bias, a) for parts in SPLITS if inner % parts == 0]
                timed = [partial(repeat_call, way, steps) for way in ways]
                # (powers of 2, ascending: a count that does not divide K is followed by none that does)
                timed += ["-"] * sum(inner % parts != 0 for parts in SPLITS)
                timed.append(partial(repeat_call, partial(product_with(weights, "streams"), bias, a), steps)
                             if device.type == "cuda" else "-")
                cells = median_ms(timed, args, device)
                print(f"| {g} | {' | '.join(cells)} |", flush=True)


class LayerWays:
    """--layers' three ways of G members' LSTM layer (H to H over T steps of B sequences), from the
    same weights and inputs, each a forward and backward into its own leaves' .grad: `grouped`
    (the stacked weights, the group's recurrence), `one_after_another` and `on_streams` (each
    member's torch.nn.LSTM, cuDNN on CUDA; on_streams only on CUDA)."""

    def __init__(self, g: int, steps: int, rows: int, hidden: int, device: torch.device,
                 dtype: torch.dtype = torch.float32, seed: int = 0):
        torch.manual_seed(seed)
        self.lstms = [torch.nn.LSTM(hidden, hidden).to(device, dtype) for _ in range(g)]
        self.inputs = [torch.randn(steps, rows, hidden, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(g)]
        self.grads = [torch.randn(steps, rows, hidden, device=device, dtype=dtype) for _ in range(g)]
        with torch.no_grad():
            def stack(name):
                return torch.stack([getattr(lstm, name) for lstm in self.lstms]).requires_grad_()
            self.w_ih, self.w_hh = stack("weight_ih_l0"), stack("weight_hh_l0")
            self.bias = (torch.stack([l.bias_ih_l0 + l.bias_hh_l0 for l in self.lstms])).requires_grad_()
            self.x = torch.stack(self.inputs).requires_grad_()
        self.d_out = torch.stack(self.grads)
        self.h0 = torch.zeros(g, rows, hidden, device=device, dtype=dtype)
        self.streams = [torch.cuda.Stream(device) for _ in range(g)] if device.type == "cuda" else None

    def grouped(self) -> None:
        g, steps, rows, hidden = self.x.shape
        xw = torch.baddbmm(self.bias.unsqueeze(1), self.x.view(g, steps * rows, hidden), self.w_ih.transpose(1, 2))
        out, _, _ = grouped_lstm_recurrence(xw.view(g, steps, rows, -1), self.h0, self.h0, self.w_hh)
        out.backward(self.d_out)

    def member(self, k: int) -> None:
        out, _ = self.lstms[k](self.inputs[k])
        out.backward(self.grads[k])

    def one_after_another(self) -> None:
        for k in range(len(self.lstms)):
            self.member(k)

    def on_streams(self) -> None:
        main = torch.cuda.current_stream()
        for k, stream in enumerate(self.streams):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                self.member(k)
        for stream in self.streams:
            main.wait_stream(stream)


def layers_table(args, device: torch.device) -> None:
    """--layers (the module's docstring): ms for one layer's forward and backward, the median of
    --steps after --warmup, per G and way, at each shape's middle layer (nhid to nhid)."""
    for shape, config_path, groups, rows, hidden, steps in table_shapes(args):
        print(f"\n{shape} ({config_path}): an LSTM layer {hidden} to {hidden}, {steps} steps of {rows} "
              f"sequences, forward and backward; ms, median of {args.steps}")
        print("| G | the group's recurrence | each member's nn.LSTM (cuDNN on CUDA), one after another "
              "| the same, a CUDA stream each |")
        print("|---|---|---|---|")
        for g in groups:
            ways = LayerWays(g, steps, rows, hidden, device)
            streams = ways.on_streams if ways.streams else "- (no CUDA)"
            print(f"| {g} | {' | '.join(median_ms([ways.grouped, ways.one_after_another, streams], args, device))} |",
                  flush=True)


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides of every run's config")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["mini", "ptb"])
    parser.add_argument("--groups", nargs="+", type=integer_at_least_1, metavar="G", help="group sizes (default: each shape's)")
    parser.add_argument("--kind", choices=("auto", "batched", "solo"), default="auto")
    parser.add_argument("--steps", type=integer_at_least_1, default=10, help="timed steps per row (default 10)")
    parser.add_argument("--warmup", type=integer_at_least_0, default=2,
                        help="untimed steps first (default 2)")
    parser.add_argument("--threads", type=integer_at_least_1, help="CPU threads (default: torch's)")
    parser.add_argument("--cpu-pair", action="store_true", help="only the CPU goal's row (reads PTB: AWD_DATA_DIR)")
    parser.add_argument("--cpu-pair-training", action="store_true",
                        help="only the CPU goal in training: train.py --group of two seeds against two "
                             "train.py processes, --steps steps each (reads PTB: AWD_DATA_DIR)")
    parser.add_argument("--rounds", type=integer_at_least_1, default=3, help="--cpu-pair(-training): rounds of both (default 3)")
    parser.add_argument("--plan", help="only a plan's runs: solo steps against one group step")
    parser.add_argument("--products", action="store_true",
                        help="only the time loop's product, several ways, per G (the docstring)")
    parser.add_argument("--layers", action="store_true",
                        help="only an LSTM layer's forward and backward, three ways, per G (the docstring)")
    parser.add_argument("--product", choices=("by_shape", *PRODUCT_WAYS), default=grouped_lstm.PRODUCT,
                        help="the grouped LSTM's per-step product (the docstring; default by_shape)")
    parser.add_argument("--profile", type=integer_at_least_1, metavar="G",
                        help="only the profiler's tables of a group of G miniature runs' step")
    args = parser.parse_args(argv)
    if args.plan and not Path(args.plan).is_file():
        raise ConfigError(f"--plan {args.plan}: plan file not found")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_pair or args.cpu_pair_training:
        print(environment(torch.device("cpu")))
        (cpu_pair if args.cpu_pair else cpu_pair_training)(args)
        return
    device = select_device(args.device, "--device")
    kind = step_kind(args.kind, device)
    grouped_lstm.PRODUCT = args.product
    # The grouped LSTM's compiled cells are compiled once per hidden size and once more for a
    # group of one; a training process meets two hidden sizes, this table all of its shapes'
    # (four at PTB's and the miniature's): above torch's default of 8 compilations per function,
    # which would leave the last rows' cells uncompiled.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    print(f"{environment(device)} | the grouped LSTM's products: {args.product}")
    if args.plan:
        plan_table(args, device, kind)
    elif args.products:
        products_table(args, device)
    elif args.layers:
        layers_table(args, device)
    elif args.profile:
        profile_table(args, device, kind)
    else:
        shapes_table(args, device, kind)


if __name__ == "__main__":
    run_benchmark(main)
