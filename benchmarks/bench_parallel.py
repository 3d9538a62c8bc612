"""Several runs on one device, and one run across processes (DDP): what each gives.

    AWD_DATA_DIR=../shared/data python benchmarks/bench_parallel.py                # CPU: gloo, tiny shapes
    AWD_DATA_DIR=../shared/data python benchmarks/bench_parallel.py --device cuda  # PTB Softmax as configured
    python benchmarks/bench_parallel.py --steps 50 model.nhid=400 train.batch_size=40  # other shapes

1. Concurrent runs: K = 1, 2, 4 processes train the PTB Softmax model (train.py's own
   Trainer.train_step, at seq_len = bptt) on the same device at once; their summed tokens/s
   against one run's is what `sweep.py --mode gpus --runs-per-gpu K` gains.
2. DDP: one run in N = 1, 2 processes (torchrun's environment; NCCL with a GPU per process, gloo
   on the CPU) with the same global batch; its step time against the single process's is what
   `torchrun --nproc_per_node N train.py` gains (N = 1: the cost of DDP alone).

3. Jobs against threads (--jobs-vs-threads C): C runs at one thread each against one run at C
   threads, on the CPU: what `sweep.py --jobs C` gains over running the plan's runs one after
   another with all the cores (goal at the miniature size, C = 2: at least 1.6x the tokens/s):

       python benchmarks/bench_parallel.py --config configs/ptb_mini/softmax.yaml --shapes config \
           --concurrent --ddp --jobs-vs-threads 2

Every figure is a median over --steps steps, timed in each process after every process has done
its --warmup steps, so start-up does not count. On the CPU each process uses --threads threads
(default 1): on a machine with C cores, more than C processes share them.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import TrainerStep, corpus_of, median_step, run_benchmark  # noqa: E402
from experiment.cli import ArgumentParser, integer_at_least_0, integer_at_least_1  # noqa: E402
from experiment.config import load_config  # noqa: E402
from experiment.distributed import World, exit_process  # noqa: E402
from experiment.loading import select_device  # noqa: E402

TINY = ["model.emsize=64", "model.nhid=128", "model.nhidlast=64", "train.batch_size=8", "train.bptt=35"]


def built_step(args, device: torch.device, world: World | None = None) -> TrainerStep:
    corpus = corpus_of(load_config(args.config, args.overrides))
    step = TrainerStep(args.config, corpus, device, args.overrides, world)
    for _ in range(args.warmup):
        step()
    return step


# ---------------------------------------------------------------------- in the worker processes

def concurrent_worker(args) -> None:
    """One of K runs: warm up, say so, wait for the others (the --go file), time its steps."""
    device = torch.device(args.device)
    step = built_step(args, device)
    print("ready", flush=True)
    while not Path(args.go).exists():
        time.sleep(0.01)
    seconds = median_step(step, args.steps, device)
    print(json.dumps({"step_s": seconds, "tokens": step.tokens}), flush=True)


def ddp_worker(args) -> None:
    """One rank of a DDP run; rank 0 reports the step time of the whole run."""
    import torch.distributed as dist
    world = World.from_environment()
    with world.joined():
        device = world.device("cuda" if args.device.startswith("cuda") else args.device)
        world.connect(device)
        step = built_step(args, device, world)
        dist.barrier()
        seconds = median_step(step, args.steps, device)
        if world.is_main:
            print(json.dumps({"step_s": seconds, "tokens": step.tokens}), flush=True)


# ---------------------------------------------------------------------- in the parent

def worker_command(kind: str, args) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--device", args.device,
            "--config", args.config, "--steps", str(args.steps), "--warmup", str(args.warmup),
            *(["--go", args.go] if args.go else []), *args.overrides]


def output_of(proc: subprocess.Popen) -> str:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"error: a worker failed (exit {proc.returncode}): {err.strip()[-2000:]}")
    return out


def result_of(proc: subprocess.Popen) -> dict:
    return json.loads(output_of(proc).strip().splitlines()[-1])


def concurrent_runs(k: int, args, env: dict) -> float:
    """Summed tokens/s of k runs training at once on the device."""
    with tempfile.TemporaryDirectory() as folder:
        args.go = str(Path(folder) / "go")
        procs = [subprocess.Popen(worker_command("concurrent", args), env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(k)]
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                result_of(proc)                        # reports the worker's error
        Path(args.go).touch()
        results = [result_of(proc) for proc in procs]
        args.go = None
    return sum(r["tokens"] / r["step_s"] for r in results)


def ddp_step_seconds(n: int, args, env: dict) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(n)}
    procs = [subprocess.Popen(worker_command("ddp", args), text=True,
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in range(n)]
    outputs = [output_of(proc) for proc in procs]
    return json.loads(outputs[0].strip().splitlines()[-1])["step_s"]


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, auto (CUDA when present), or cuda / cuda:I (DDP uses GPUs 0..N-1)")
    parser.add_argument("--config", default="configs/ptb/softmax.yaml")
    parser.add_argument("--shapes", choices=("tiny", "config"),
                        help=f"tiny: {' '.join(TINY)}; config: the config's (default: tiny on the CPU)")
    parser.add_argument("--concurrent", type=integer_at_least_1, nargs="*", default=[1, 2, 4], metavar="K",
                        help="numbers of concurrent runs to time (none: skip)")
    parser.add_argument("--ddp", type=integer_at_least_1, nargs="*", default=[1, 2], metavar="N",
                        help="DDP world sizes to time (none: skip)")
    parser.add_argument("--jobs-vs-threads", type=integer_at_least_1, metavar="C",
                        help="also time C runs at 1 thread each against 1 run at C threads")
    parser.add_argument("--steps", type=integer_at_least_1, default=20, help="timed steps of each process (median)")
    parser.add_argument("--warmup", type=integer_at_least_0, default=3)
    parser.add_argument("--threads", type=integer_at_least_1, default=1, help="CPU threads of each process")
    parser.add_argument("--worker", choices=("concurrent", "ddp"), help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (after --shapes')")
    args = parser.parse_args()
    if args.worker:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        (concurrent_worker if args.worker == "concurrent" else ddp_worker)(args)
        return
    # Checked here, not in the workers, whose failure would end this in their traceback.
    args.device = str(select_device(args.device, "--device"))
    shapes = args.shapes or ("tiny" if args.device == "cpu" else "config")
    args.overrides = (TINY if shapes == "tiny" else []) + args.overrides
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    config = load_config(args.config, args.overrides)
    print(f"{args.config} on {args.device} | {shapes} shapes: batch {config.train.batch_size} x bptt "
          f"{config.train.bptt}, emsize {config.model.emsize}, nhid {config.model.nhid} | "
          f"{args.steps} steps after {args.warmup} | {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}", flush=True)

    result = {"device": args.device, "shapes": shapes, "overrides": args.overrides,
              "steps": args.steps, "threads": args.threads}
    if args.concurrent:
        throughput = {k: concurrent_runs(k, args, env) for k in args.concurrent}
        one = throughput.get(1) or next(iter(throughput.values()))
        print("concurrent runs: " + " | ".join(f"{k}: {tps:,.0f} tok/s ({tps / one:.2f}x)"
                                               for k, tps in throughput.items()), flush=True)
        result.update(concurrent_tokens_per_s=throughput,
                      concurrent_ratio={k: round(t / one, 3) for k, t in throughput.items()})
    if args.ddp:
        single = result.get("concurrent_tokens_per_s", {}).get(1) or concurrent_runs(1, args, env)
        single_step = config.train.batch_size * config.train.bptt / single
        ddp = {}
        for n in args.ddp:
            if args.device.startswith("cuda") and n > torch.cuda.device_count():
                print(f"DDP N={n}: skipped, {torch.cuda.device_count()} GPU(s) visible")
                continue
            ddp[n] = ddp_step_seconds(n, args, env)
        print(f"DDP step time: single process {single_step * 1000:.1f} ms | "
              + " | ".join(f"N={n}: {s * 1000:.1f} ms ({s / single_step:.2f}x)" for n, s in ddp.items()))
        result.update(single_step_s=round(single_step, 5), ddp_step_s={n: round(s, 5) for n, s in ddp.items()},
                      ddp_ratio={n: round(s / single_step, 3) for n, s in ddp.items()})
    if args.jobs_vs_threads:
        c = args.jobs_vs_threads
        one_run = concurrent_runs(1, args, {**env, "OMP_NUM_THREADS": str(c), "MKL_NUM_THREADS": str(c)})
        c_runs = concurrent_runs(c, args, {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        print(f"jobs against threads: 1 run at {c} threads {one_run:,.0f} tok/s | {c} runs at 1 thread "
              f"{c_runs:,.0f} tok/s ({c_runs / one_run:.2f}x)", flush=True)
        result.update(one_run_c_threads_tokens_per_s=round(one_run, 1),
                      c_runs_one_thread_tokens_per_s=round(c_runs, 1),
                      jobs_vs_threads={"cores": c, "ratio": round(c_runs / one_run, 3)})
    print(json.dumps(result))


if __name__ == "__main__":
    run_benchmark(main)
    exit_process(0)
