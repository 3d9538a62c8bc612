"""Many runs of one config: a set of seeds times a grid of overrides, one run directory each.

Every run is `train.py CONFIG overrides... train.seed=S run.dir=DIR`, then `evaluate.py DIR`
(and `rank.py DIR` when asked). What is left to do is read from DIR itself, so re-issuing the
same sweep after a crash continues where it stopped:

    no last.pt                      -> train from scratch, evaluate (, rank)
    last.pt, run not finished       -> train.py --resume DIR, evaluate (, rank)
    finished, results missing       -> only the missing evaluate / rank
    finished and evaluated (ranked) -> skipped

A run is finished when last.pt's progress says so, or (checkpoints without that flag) when its
epoch is past train.epochs (train.py moves to the next epoch after saving the last one's results).
"""
from __future__ import annotations

import itertools
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

import torch
import yaml

from experiment.config import Config, load_config, parse_override
from . import AnalysisError

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = {name: REPO / f"{name}.py" for name in ("train", "evaluate", "rank")}
# The keys the sweep sets itself for every run.
SWEEP_KEYS = ("train.seed", "run.dir")


@dataclass(frozen=True)
class PlannedRun:
    index: int                   # 0-based, in the order runs are planned (the slurm array index)
    count: int                   # runs in the whole sweep
    name: str
    dir: Path
    overrides: tuple[str, ...]   # after the config: the sweep's, the grid point's, seed, run.dir
    config: Config               # resolved, to validate before anything starts


# ---------------------------------------------------------------------- planning

def parse_grid(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`--grid head.c=-1.5,-1,0` -> [("head.c", ["-1.5", "-1", "0"])], keys in the order given."""
    grid: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, _, values = spec.partition("=")
        key = key.strip()
        items = [v.strip() for v in values.split(",")]
        if not key or not values or not all(items):
            raise AnalysisError(f"--grid {spec!r}: expected key=value1,value2,..., e.g. head.k=2,2.5,3")
        if key in (k for k, _ in grid):
            raise AnalysisError(f"--grid {spec!r}: {key} is given twice")
        grid.append((key, items))
    return grid


def run_name(dataset: str, config_path: Path, point: Sequence[str], seed: int) -> str:
    """<dataset>-<config name>[-key=value...]-seed<seed>, e.g. ptb-gss-head.c=-1.5-head.k=2-seed141.

    Only the grid point is in the name: the sweep's other overrides are shared by all its runs.
    """
    name = "-".join([dataset, config_path.stem, *point, f"seed{seed}"])
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", name)    # a value like a path must not nest folders


def plan_runs(config_path: Path, overrides: Sequence[str], grid: Sequence[tuple[str, list[str]]],
              seeds: Sequence[int] | None, out: Path) -> list[PlannedRun]:
    """Every (grid point, seed) as a run, each config resolved now so a bad key fails before any run."""
    keys = {".".join(parse_override(text)[0]) for text in overrides}
    for key in SWEEP_KEYS:
        if key in keys:
            raise AnalysisError(f"override {key}: the sweep sets it (use --seeds and --out)")
    for key, _ in grid:
        if key in keys:
            raise AnalysisError(f"--grid {key}: also given as an override; keep one")
    if seeds is None:       # the config's own seed
        seeds = [load_config(config_path, overrides).train.seed]
    if len(set(seeds)) != len(seeds):
        raise AnalysisError(f"--seeds: repeated seed in {list(seeds)}")
    points = list(itertools.product(*[[f"{key}={v}" for v in values] for key, values in grid]))
    runs = []
    combinations = list(itertools.product(points, seeds))
    for point, seed in combinations:
        base = [*overrides, *point, f"train.seed={seed}"]
        dataset = load_config(config_path, base).data.dataset
        run_dir = out / run_name(dataset, config_path, point, seed)
        full = (*base, f"run.dir={run_dir}")
        runs.append(PlannedRun(len(runs), len(combinations), run_dir.name, run_dir, full,
                               load_config(config_path, full)))
    if len({run.dir for run in runs}) != len(runs):
        raise AnalysisError("two grid points give the same run directory name; use distinct values")
    return runs


# ---------------------------------------------------------------------- what is left to do

def read_progress(run_dir: Path) -> dict:
    path = run_dir / "last.pt"
    try:
        # mmap: only the progress record is read, not the (large) model and optimizer tensors.
        return dict(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["progress"])
    except Exception as e:
        raise AnalysisError(f"{path}: not a readable last.pt ({type(e).__name__}); "
                            f"move the run directory away to start it again") from None


def comparable(config: dict) -> dict:
    """The parts of a config that make a run what it is: not where it runs or reads its data."""
    out = {section: dict(values) for section, values in config.items() if section != "run"}
    out.get("data", {}).pop("data_dir", None)
    return out


def check_same_run(run: PlannedRun) -> None:
    """Refuse to continue a run directory that holds a different experiment."""
    saved_path = run.dir / "config.yaml"
    if not saved_path.is_file():
        return
    saved = comparable(yaml.safe_load(saved_path.read_text(encoding="utf-8")))
    planned = comparable(yaml.safe_load(run.config.to_yaml()))
    for section in sorted(set(saved) | set(planned)):
        for key in sorted(set(saved.get(section, {})) | set(planned.get(section, {}))):
            a, b = saved.get(section, {}).get(key), planned.get(section, {}).get(key)
            if a != b:
                raise AnalysisError(f"{run.dir} holds a different run ({section}.{key} is {a!r} "
                                    f"there, {b!r} in this sweep); choose another --out")


def resume_overrides(run: PlannedRun) -> list[str]:
    """The sweep's run.* settings and data dir where they differ from the run's saved config
    (they are the only keys train.py lets a resumed run change)."""
    saved = yaml.safe_load((run.dir / "config.yaml").read_text(encoding="utf-8"))
    planned = run.config.to_dict()
    changed = [(f"run.{key}", value) for key, value in planned["run"].items()
               if key != "dir" and saved.get("run", {}).get(key) != value]
    if saved.get("data", {}).get("data_dir") != planned["data"]["data_dir"]:
        changed.append(("data.data_dir", planned["data"]["data_dir"]))
    return [f"{key}={yaml_scalar(value)}" for key, value in changed]


def yaml_scalar(value) -> str:
    """A run.* value as an override reads it back (overrides are parsed as YAML scalars)."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def is_fresh(result: Path, source: Path) -> bool:
    """`result` exists and was written after `source` (an evaluation of the current best.pt)."""
    return result.is_file() and source.is_file() and result.stat().st_mtime >= source.stat().st_mtime


def is_finished(run: PlannedRun) -> bool:
    if not (run.dir / "last.pt").is_file():
        return False
    progress = read_progress(run.dir)
    return bool(progress.get("finished")) or progress["epoch"] > run.config.train.epochs


def pending_commands(run: PlannedRun, config_path: Path, rank_args: list[str] | None) -> list[list[str]]:
    """The commands still needed for `run`, in order (empty: nothing left to do)."""
    py = sys.executable
    commands = []
    if not (run.dir / "last.pt").is_file():
        commands.append([py, str(SCRIPTS["train"]), str(config_path), *run.overrides])
    else:
        check_same_run(run)
        if not is_finished(run):
            commands.append([py, str(SCRIPTS["train"]), "--resume", str(run.dir), *resume_overrides(run)])
    training = bool(commands)
    best = run.dir / "best.pt"
    if training or not is_fresh(run.dir / "eval_best.json", best):
        device = [] if run.config.run.device == "auto" else ["--device", run.config.run.device]
        commands.append([py, str(SCRIPTS["evaluate"]), str(run.dir), *device])
    if rank_args is not None and (training or not is_fresh(run.dir / "rank_test.json", best)):
        commands.append([py, str(SCRIPTS["rank"]), str(run.dir), *rank_args])
    return commands


# ---------------------------------------------------------------------- running

def run_command(command: list[str], env: dict | None = None, log: IO | None = None) -> int:
    """Run one command to its end; its exit code."""
    with subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT if log else None) as proc:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached the child too: let train.py save last.pt before the sweep stops.
            proc.wait()
            raise


def execute(run: PlannedRun, commands: list[list[str]], env: dict | None = None,
            log: IO | None = None) -> str:
    """Run a run's commands in order; "done", "incomplete" or "failed: ..." (why)."""
    for command in commands:
        code = run_command(command, env, log)
        script = Path(command[1]).name
        if code != 0:
            return f"failed: {script} exited with {code}"
        if script == "train.py" and not is_finished(run):
            return "incomplete"   # stopped early (run.max_steps): no best.pt to evaluate yet
    return "done"


def describe(run: PlannedRun, commands: list[list[str]]) -> str:
    if not commands:
        return "finished and evaluated: skip"
    first = commands[0]
    if Path(first[1]).name != "train.py":
        return "finished: " + ", ".join(Path(c[1]).stem for c in commands)
    return "resume" if "--resume" in first else "new"


def process(run: PlannedRun, config_path: Path, rank_args: list[str] | None, tag: str,
            env: dict | None = None, log_to_run_dir: bool = False) -> str:
    """Work out and run what is left of one run; its outcome (see `execute`, or "skipped")."""
    try:
        commands = pending_commands(run, config_path, rank_args)
        print(f"{tag} {run.dir}: {describe(run, commands)}", flush=True)
        if not commands:
            return "skipped"
        if not log_to_run_dir:
            return execute(run, commands, env)
        run.dir.mkdir(parents=True, exist_ok=True)
        with open(run.dir / "sweep.log", "a", encoding="utf-8") as log:
            return execute(run, commands, env, log)
    except AnalysisError as e:      # one bad run directory must not stop the others
        print(f"{tag} {run.dir}: {e}", flush=True)
        return f"failed: {e}"


def sweep_local(runs: Sequence[PlannedRun], config_path: Path, rank_args: list[str] | None) -> dict[str, str]:
    """One run after another; their output goes to this terminal."""
    return {str(run.dir): process(run, config_path, rank_args, f"[{run.index + 1}/{run.count}]")
            for run in runs}


def visible_gpus() -> list[str]:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def sweep_gpus(runs: Sequence[PlannedRun], config_path: Path, rank_args: list[str] | None,
               gpus: Sequence[str]) -> dict[str, str]:
    """One worker per GPU, each taking the next waiting run; output goes to DIR/sweep.log."""
    if not gpus:
        raise AnalysisError("--mode gpus: no GPU is visible; use --mode local or give --gpus")
    waiting: queue.Queue = queue.Queue()
    for run in runs:
        waiting.put(run)
    outcomes: dict[str, str] = {}

    def worker(gpu: str) -> None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        while True:
            try:
                run = waiting.get_nowait()
            except queue.Empty:
                return
            outcome = process(run, config_path, rank_args, f"[gpu {gpu}]", env, log_to_run_dir=True)
            outcomes[str(run.dir)] = outcome
            print(f"[gpu {gpu}] {run.dir}: {outcome}", flush=True)

    threads = [threading.Thread(target=worker, args=(gpu,), daemon=True) for gpu in gpus]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def summary(outcomes: dict[str, str]) -> tuple[str, bool]:
    """A few lines for the end of the sweep, and whether every run succeeded."""
    counts = {kind: sum(o.split(":")[0] == kind for o in outcomes.values())
              for kind in ("done", "skipped", "incomplete", "failed")}
    lines = [", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "no runs"]
    lines += [f"  {run_dir}: {o}" for run_dir, o in outcomes.items() if o.startswith("failed")]
    lines += [f"  {run_dir}: stopped before train.epochs (run.max_steps?); not evaluated"
              for run_dir, o in outcomes.items() if o == "incomplete"]
    return "\n".join(lines), counts["failed"] == 0


# ---------------------------------------------------------------------- slurm

def slurm_script(runs: Sequence[PlannedRun], sweep_command: list[str], out: Path,
                 job_name: str, sbatch_options: Sequence[str], array_limit: int | None) -> str:
    """A job-array script: array task i runs `sweep_command --task i`, i.e. only the i-th run.

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
             f'exec {shlex.join(sweep_command)} --task "$SLURM_ARRAY_TASK_ID"']
    return "\n".join(lines) + "\n"
