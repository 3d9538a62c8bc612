"""The ways to run many planned runs, each through `runs.process` (train -> evaluate -> rank):
one after another in this terminal, N at a time on this machine's cores or K at a time on each
GPU (output to DIR/sweep.log), or a Slurm job array whose task i runs the i-th planned run.
With --group G, the work items are groups of up to G runs that train together in one process
(`in_groups`, runs.process_group; train.py --group), in each of the local and GPU modes.
"""
from __future__ import annotations

import os
import queue
import shlex
import threading
from pathlib import Path
from typing import Sequence

import torch

from . import LaunchError
from experiment.run_directory import LOCK_NAME, held_elsewhere
from .runs import CLAIM_NAME, ELSEWHERE, PlannedRun, is_finished, process_group, results_only, say
from .stopping import SweepStopped, check as check_stop_signals


Item = Sequence[PlannedRun]       # a work item: one run, or a group that trains together


def alone(runs: Sequence[PlannedRun]) -> list[Item]:
    return [[run] for run in runs]


def in_groups(runs: Sequence[PlannedRun], size: int) -> list[Item]:
    """The runs as work items: those still to train in groups of up to `size` runs that can
    train together (the same experiment/group.py group_key: shapes, corpus, device), filled in plan order,
    each group where its first run is; the others (trained, only results, or held by another
    process: another sweep, or a train.py started by hand, whose run would fail the whole group)
    alone. Nothing is written (a dry run groups its runs with this too)."""
    from experiment.group import group_key
    items: list[list[PlannedRun]] = []
    open_groups: dict[tuple, list[PlannedRun]] = {}
    for run in runs:
        if results_only(run) or finished_safely(run) or in_progress_elsewhere(run, work_left=True):
            items.append([run])
            continue
        key = group_key(run.config)
        group = open_groups.get(key)
        if group is None or len(group) == size:
            group = open_groups[key] = []
            items.append(group)
        group.append(run)
    return items


def in_progress_elsewhere(run: PlannedRun, work_left: bool) -> bool:
    """Whether `process_group` would skip the run as ELSEWHERE, found without its writes (for
    sweep.py --dry-run): another sweep claims it, or, where `work_left` (it has pending
    commands), another process holds its run lock (a train.py started by hand, or another
    sweep's training). A finished run is not asked for its lock, as process_group does not."""
    return held_elsewhere(run.dir / CLAIM_NAME) or (work_left and held_elsewhere(run.dir / LOCK_NAME))


def finished_safely(run: PlannedRun) -> bool:
    """is_finished, and True for a run whose last.pt cannot be read (processed alone, where its
    error is reported)."""
    try:
        return is_finished(run)
    except LaunchError:
        return True


def tag_of(item: Item) -> str:
    count = item[0].count
    return f"[{', '.join(str(run.index + 1) for run in item)}/{count}]"


def sweep_local(items: Sequence[Item]) -> dict[str, str]:
    """One run (or group) after another; their output goes to this terminal."""
    outcomes: dict[str, str] = {}
    for item in items:
        outcomes.update(process_group(item, tag_of(item)))
    return outcomes


def torch_gpu_count() -> int | None:
    """How many GPUs torch numbers in this process (0, 1, ...), or None where CUDA is not
    available (then only CUDA_VISIBLE_DEVICES says which GPUs the process was given)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else None


def visible_gpus() -> list[str]:
    """The default --gpus: every GPU this process may use, as torch numbers them (0, 1, ...),
    the numbering `child_gpu_ids` maps back to the GPUs of CUDA_VISIBLE_DEVICES."""
    count = torch_gpu_count()
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if count is None and parent is not None:
        count = len(parent_gpu_entries(parent))
    return [str(i) for i in range(count or 0)]


def parent_gpu_entries(listed: str) -> list[str]:
    """The GPUs a CUDA_VISIBLE_DEVICES value lists, in its order."""
    return [g.strip() for g in listed.split(",") if g.strip()]


def child_gpu_ids(gpus: Sequence[str], parent: str | None, count: int | None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value for each of the --gpus ids `gpus`, which number the GPUs as
    torch does in this process: under a parent CUDA_VISIBLE_DEVICES (Slurm, a shared machine),
    id i is the i-th GPU listed there, so the child gets that entry (CUDA_VISIBLE_DEVICES=2,3
    and --gpus 0,1 give the children 2 and 3, not 0 and 1 outside the allocation); without one,
    the ids are the machine's and go unchanged. `count` is torch's GPU count (None: CUDA is not
    available, so the runs train on the CPU: then the parent's list bounds the ids; where it is
    unset or empty, the ids only name worker slots). A GPU-/MIG- UUID must be one of the parent's
    entries (or a prefix of exactly one), where there is a parent list. Anything else is a
    LaunchError."""
    if parent is None:
        missing = [g for g in gpus if g.isdigit() and count is not None and int(g) >= count]
        if missing:
            raise LaunchError(f"--gpus: no GPU {', '.join(missing)} on this machine; torch sees {count}"
                              + (f" (0..{count - 1})" if count else ""))
        return list(gpus)
    entries = parent_gpu_entries(parent)
    if count is None and not entries:
        # the parent may use no GPU and the runs train on the CPU (sweep_gpus checks): the ids
        # only name worker slots, and each child is given no GPU either
        return [parent] * len(gpus)
    # torch counts the entries CUDA accepted (it stops at the first invalid one)
    usable = entries[:count] if count is not None else entries
    allowed = f"CUDA_VISIBLE_DEVICES={parent} gives this process {len(usable)} GPU{'s' * (len(usable) != 1)}"
    allowed += f", numbered 0..{len(usable) - 1} as torch does" if usable else ""
    mapped = []
    for gpu in gpus:
        if gpu.isdigit():
            if int(gpu) >= len(usable):
                raise LaunchError(f"--gpus: no GPU {gpu} here: {allowed}")
            mapped.append(usable[int(gpu)])
            continue
        matches = [entry for entry in usable if entry.startswith(gpu)]
        if len(matches) != 1:
            raise LaunchError(f"--gpus: {gpu} is not one of the GPUs in CUDA_VISIBLE_DEVICES={parent} "
                              f"(a child given it would leave them); give their numbers 0..{len(usable) - 1}"
                              if usable else f"--gpus: {gpu}: {allowed}")
        mapped.append(matches[0])
    twice = sorted({entry for entry in mapped if mapped.count(entry) > 1})
    if twice:      # a number and a UUID of one GPU: two workers would share it unasked
        raise LaunchError(f"--gpus: {','.join(gpus)} names {', '.join(twice)} of "
                          f"CUDA_VISIBLE_DEVICES={parent} twice")
    return mapped


def sweep_gpus(items: Sequence[Item], gpus: Sequence[str], runs_per_gpu: int = 1) -> dict[str, str]:
    """`runs_per_gpu` workers per GPU, each taking the next waiting run, so that each GPU trains
    that many runs at a time (benchmarks/bench_parallel.py measures what several give: nothing
    for the PTB Softmax on an H200, docs/gpus.md; smaller models may gain); output goes to
    DIR/sweep.log. `gpus` are torch's numbers in this process (or UUIDs), mapped to the parent's
    CUDA_VISIBLE_DEVICES by `child_gpu_ids`; the tags say them as given. Where torch sees no
    GPU it refuses, unless every run says run.device=cpu (the runs would train on the CPU, each
    in its own process)."""
    if not torch.cuda.is_available() and any(run.config.run.device != "cpu" for item in items for run in item):
        raise LaunchError("--mode gpus: torch sees no GPU on this machine; give run.device=cpu to "
                          "train on its CPU anyway, or use --mode local (--jobs N: N runs at a time)")
    if not gpus:
        raise LaunchError("--mode gpus: no GPU is visible; use --mode local or give --gpus")
    child_ids = child_gpu_ids(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), torch_gpu_count())
    if runs_per_gpu < 1:
        raise LaunchError(f"--runs-per-gpu: expected an integer >= 1, got {runs_per_gpu}")
    workers = [(f"[gpu {gpu}]", {**os.environ, "CUDA_VISIBLE_DEVICES": child_id})
               for gpu, child_id in zip(gpus, child_ids) for _ in range(runs_per_gpu)]
    return run_in_parallel(items, workers)


def cpu_count() -> int:
    """The cores this process may use (its affinity, as taskset or a Slurm allocation sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                     # not on Linux
        return os.cpu_count() or 1


def thread_share(jobs: int, cores: int) -> int:
    """Threads for each of `jobs` runs at once on `cores` cores: an equal share, at least one."""
    return max(1, cores // jobs)


def sweep_jobs(items: Sequence[Item], jobs: int) -> dict[str, str]:
    """`jobs` runs at a time on this machine, each with its share of the cores as its torch
    threads (OMP_NUM_THREADS): on a CPU several small runs use the cores better than one
    (benchmarks/bench_parallel.py); output goes to DIR/sweep.log."""
    if jobs < 1:
        raise LaunchError(f"--jobs: expected an integer >= 1, got {jobs}")
    threads = str(thread_share(jobs, cpu_count()))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    return run_in_parallel(items, [(f"[job {i + 1}]", env) for i in range(jobs)])


def run_in_parallel(items: Sequence[Item], workers: Sequence[tuple[str, dict]]) -> dict[str, str]:
    """One thread per (tag, environment) worker, each taking the next waiting run (or group)
    until none is left (or a stop signal came: SweepStopped once the runs under way have
    stopped); each run's output goes to DIR/sweep.log, its outcome to this terminal."""
    waiting: queue.Queue = queue.Queue()
    for item in items:
        waiting.put(item)
    outcomes: dict[str, str] = {}

    def worker(tag: str, env: dict) -> None:
        while True:
            try:
                item = waiting.get_nowait()
            except queue.Empty:
                return
            try:
                ended = process_group(item, tag, env, log_to_run_dir=True)
            except SweepStopped:             # a stop signal: take no more runs
                return
            outcomes.update(ended)
            for run_dir, outcome in ended.items():
                say(f"{tag} {run_dir}: {outcome}")

    threads = [threading.Thread(target=worker, args=worker_args, daemon=True) for worker_args in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    check_stop_signals()
    return outcomes


def summary(outcomes: dict[str, str]) -> tuple[str, bool]:
    """A few lines for the end of the sweep, and whether every run succeeded."""
    counts = {kind: sum(o.split(":")[0] == kind for o in outcomes.values())
              for kind in ("done", "skipped", ELSEWHERE, "incomplete", "failed")}
    lines = [", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "no runs"]
    lines += [f"  {run_dir}: {o}" for run_dir, o in outcomes.items() if o.startswith("failed")]
    lines += [f"  {run_dir}: {ELSEWHERE} (another process holds it)"
              for run_dir, o in outcomes.items() if o == ELSEWHERE]
    lines += [f"  {run_dir}: stopped before train.epochs (run.max_steps?); not evaluated"
              for run_dir, o in outcomes.items() if o == "incomplete"]
    return "\n".join(lines), counts["failed"] == 0


# ---------------------------------------------------------------------- slurm

def slurm_script(runs: Sequence[PlannedRun], sweep_command: list[str], out: Path,
                 job_name: str, sbatch_options: Sequence[str], array_limit: int | None) -> str:
    """A job-array script: array task i runs `sweep_command --task i`, i.e. only the i-th run,
    naming that run (--task-run): a plan changed since refuses rather than train another run.

    Re-submitting the script continues unfinished runs and skips finished ones, as locally.
    """
    array = f"0-{len(runs) - 1}" + (f"%{array_limit}" if array_limit else "")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --array={array}",
             f"#SBATCH --output={out.resolve()}/slurm-%A_%a.out",
             *[f"#SBATCH {option}" for option in sbatch_options],
             f"# {len(runs)} runs, one per array task (written by sweep.py):",
             *[f"#   {run.index}: {run.name}" for run in runs],
             "set -euo pipefail",
             f"cd {shlex.quote(str(Path.cwd()))}",
             f"runs=({' '.join(shlex.quote(run.name) for run in runs)})",
             f'exec {shlex.join(sweep_command)} --task "$SLURM_ARRAY_TASK_ID" '
             f'--task-run "${{runs[$SLURM_ARRAY_TASK_ID]}}"']
    return "\n".join(lines) + "\n"
