"""Planning runs, and the one routine that takes a run directory to its results.

A run is one config with overrides and a seed, in its own directory named by `run_name`
(experiment/run_directory.py: the only naming rule; sweep.py and the row scripts use it, and
train.py's default run.dir, which marks a miniature config's runs). Every run is `train.py
CONFIG overrides... train.seed=S run.dir=DIR`, then `evaluate.py DIR` (and `rank.py DIR` when
asked). What is left to do is read from DIR itself, so re-issuing the same sweep after a crash
continues where it stopped:

    no last.pt                      -> train from scratch, evaluate (, rank)
    last.pt, run not finished       -> train.py --resume DIR, evaluate (, rank)
    finished, results missing       -> only the missing evaluate / rank
    finished and evaluated (ranked) -> skipped

A run is finished when last.pt's progress says so, or when it has completed train.epochs epochs.
Only the run.* settings and data.data_dir may differ from the run directory's config.yaml (they
are passed on to train.py --resume); a sweep that plans any other value there, a larger
train.epochs included, is refused before any run starts ("holds a different run": a longer
training is another run, in another --out).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import importlib
import io
import itertools
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

import yaml

from experiment.checkpoint import CheckpointError, saved_processes
from experiment.config import Config, ConfigError, config_from_dict, load_config, parse_override
from experiment.distributed import World
from experiment.loading import processor_name
from experiment.progress import TrainingProgress
from experiment.run_directory import (CPU_TIMES, FINETUNE_DIR, GROUP_EXIT, LOCK_NAME, finetune_config,
                                     held_elsewhere, run_name)
from . import LaunchError, stopping

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = {name: REPO / f"{name}.py" for name in ("train", "evaluate", "rank")}
# The keys the sweep sets itself for every run.
SWEEP_KEYS = ("train.seed", "run.dir")
# Sweeps sharing a run folder claim a run for the time they work on it with a flock on this file
# (released by the operating system however the sweep ends); a run another live process holds is
# left to it.
CLAIM_NAME = ".sweep.lock"
ELSEWHERE = "in progress elsewhere"

_SAYING = threading.Lock()


def say(line: str) -> None:
    """One line to the terminal, whole: sweep.py --jobs's workers report from several threads, and
    print() writes a line and its newline apart (a newcomer read '[job 2] ...: new[job 1] ...: new')."""
    with _SAYING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


@dataclass(frozen=True)
class Analysis:
    """A command run on a trained run directory, `python SCRIPT.py DIR ARGS`, needed unless its
    `result` file there is newer than best.pt."""
    script: str                  # "evaluate" or "rank"
    args: tuple[str, ...]
    result: str                  # e.g. rank_test.json


def options_refused(analysis: Analysis) -> str | None:
    """What the analysis's script says of its options (its error line, without the `SCRIPT.py:
    error:`), or None when it takes them: a plan's or a sweep's options for rank.py and
    evaluate.py are checked before any run trains, not once the training is paid for."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            importlib.import_module(analysis.script).parse_args(["RUN", *analysis.args])
    except SystemExit:
        return said.getvalue().strip().splitlines()[-1].split(" error: ", 1)[-1]
    return None


def rank_analysis(rank_args: Sequence[str], robustness: bool = False) -> Analysis:
    """rank.py with these options (--robustness: SM section 5's algorithms instead of the ranks).
    --robustness among the options themselves is refused: rank.py would write robustness_*.json
    while the sweep waits for rank_*.json, and would run it again every time."""
    args = tuple(rank_args)
    # argparse takes any unique prefix of an option; --r is rank.py's only option starting so
    robustness_flag = next((a for a in args if len(a) > 2 and "--robustness".startswith(a.split("=")[0])), None)
    if robustness_flag and not robustness:
        raise LaunchError(f"{robustness_flag}: rank.py --robustness writes robustness_*.json, not the "
                          f"rank_*.json the sweep waits for; give it as a plan's `robustness:` key "
                          f"(e.g. robustness: [])")
    split = args[args.index("--split") + 1] if "--split" in args[:-1] else "test"
    if robustness:
        return Analysis("rank", ("--robustness", *args), f"robustness_{split}.json")
    return Analysis("rank", args, f"rank_{split}.json")


def evaluate_analysis(evaluate_args: Sequence[str]) -> Analysis:
    """evaluate.py with these options: its result is eval_best_<method>.json for --cache (and
    --cache-search) and --dynamic, eval_best.json without a method."""
    args = tuple(evaluate_args)
    method = next((m for m in ("cache", "dynamic") if any(a.startswith(f"--{m}") for a in args)), None)
    return Analysis("evaluate", args, f"eval_best_{method}.json" if method else "eval_best.json")


@dataclass(frozen=True)
class FinetuneBest:
    """After all of an experiment's runs: finetune the one with the lowest validation perplexity
    (train.py --finetune, into RUN/finetune) and evaluate the finetuned model with `analyses`
    (e.g. the neural cache and dynamic evaluation), as [AWD] and [MoS] do with their best model."""
    overrides: tuple[str, ...] = ()             # for the finetuning, e.g. train.epochs=3
    analyses: tuple[Analysis, ...] = ()         # after its plain evaluate.py


@dataclass(frozen=True)
class Experiment:
    """One config over seeds and a grid of overrides: what `sweep.py CONFIG` runs; a plan file
    (launch/plans.py) lists several."""
    config: Path
    overrides: tuple[str, ...] = ()                          # shared by all its runs
    grid: tuple[tuple[str, tuple[str, ...]], ...] = ()      # (key, values): their cartesian product
    seeds: tuple[int, ...] | None = None                     # None: the config's own seed
    analyses: tuple[Analysis, ...] = ()                      # run after evaluate.py (rank.py, ...)
    finetune_best: FinetuneBest | None = None                # the second stage, after all its runs


@dataclass(frozen=True)
class PlannedRun:
    index: int                   # 0-based, in the order runs are planned (the slurm array index)
    count: int                   # runs in the whole sweep
    name: str
    dir: Path
    config_path: Path
    overrides: tuple[str, ...]   # after the config: the sweep's, the grid point's, seed, run.dir
                                 # (a finetuning: its own, after what --finetune sets)
    config: Config               # resolved, to validate before anything starts
    analyses: tuple[Analysis, ...] = ()   # what runs on it after training and evaluate.py
    experiment: Experiment | None = None  # the experiment it belongs to
    finetune_of: Path | None = None       # the trained run it finetunes (train.py --finetune)
    train_processes: int = 1              # > 1: train.py under torchrun in that many processes (DDP)


# ---------------------------------------------------------------------- planning

def parse_grid(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`--grid head.c=-1.5,-1,0` -> [("head.c", ["-1.5", "-1", "0"])], keys in the order given."""
    grid: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, _, values = spec.partition("=")
        key = key.strip()
        items = [v.strip() for v in values.split(",")]
        if not key or not values or not all(items):
            raise LaunchError(f"--grid {spec!r}: expected key=value1,value2,..., e.g. head.k=2,2.5,3")
        if key in (k for k, _ in grid):
            raise LaunchError(f"--grid {spec!r}: {key} is given twice")
        grid.append((key, items))
    return grid


def check_distinct_values(key: str, values: Sequence[str]) -> None:
    """Refuse grid values that are one value as a run reads them (0, 0.0 and -0 are the number 0):
    they would train one configuration in several run directories."""
    parsed = [parse_override(f"{key}={value}")[1] for value in values]
    for i, value in enumerate(parsed):
        # True == 1 in Python: a bool is told apart from a number by its type
        same = [values[j] for j, other in enumerate(parsed)
                if (isinstance(other, bool), other) == (isinstance(value, bool), value)]
        if len(same) > 1:
            raise LaunchError(f"grid key {key} (--grid, or a plan's grid:): the values {', '.join(same)} "
                              f"are one value; give each value once")


def plan_runs(experiments: Sequence[Experiment], out: Path, overrides: Sequence[str] = (),
              seeds: Sequence[int | str] | None = None, limit: int | None = None) -> list[PlannedRun]:
    """Every (experiment, grid point, seed) as a run, each config resolved now so a bad key fails
    before any run. `overrides` go to every run (after the experiment's own), `seeds` replace
    every experiment's, and `limit` keeps the first runs of each experiment (a smoke test)."""
    planned = []
    for experiment in experiments:
        planned += _experiment_runs(experiment, out, overrides, seeds)[:limit]
    seen = set()
    for run in planned:
        if run.dir in seen:
            # --seeds replaces every experiment's seeds: two experiments that differed only there collide
            cause = ("--seeds replaces each experiment's own seeds, so experiments that differed only in "
                     "their seeds are the same runs; add the seed to the plan's seeds instead"
                     if seeds and len(experiments) > 1 else "an experiment or a grid value given twice?")
            raise LaunchError(f"two planned runs get the same run directory, {run.dir} ({cause}); "
                              f"give each run distinct values")
        seen.add(run.dir)
    return [dataclasses.replace(run, index=i, count=len(planned)) for i, run in enumerate(planned)]


def _experiment_runs(experiment: Experiment, out: Path, extra: Sequence[str],
                     seeds: Sequence[int | str] | None) -> list[PlannedRun]:
    config_path, overrides = experiment.config, [*experiment.overrides, *extra]
    keys = {".".join(parse_override(text)[0]) for text in overrides}
    for key in SWEEP_KEYS:
        if key in keys:
            raise LaunchError(f"override {key}: the sweep sets it (use --seeds and --out)")
    for key, values in experiment.grid:
        if key in SWEEP_KEYS:
            raise LaunchError(f"grid key {key} (--grid, or a plan's grid:): the sweep sets it for each run; "
                              f"give seeds with --seeds (or a plan's seeds:) and the folder with --out")
        if key in keys:
            raise LaunchError(f"grid key {key} (--grid, or a plan's grid:): also given as an override; keep one")
        check_distinct_values(key, values)
    own = load_config(config_path, overrides).train.seed if (not seeds or "config" in seeds) else None
    # --seeds config 1 2: `config` is the config's own seed, as in a plan's seeds
    seeds = [own if s == "config" else s for s in seeds] if seeds else experiment.seeds or [own]
    if len(set(seeds)) != len(seeds):
        raise LaunchError(f"--seeds: repeated seed in {list(seeds)}")
    points = list(itertools.product(*[[f"{key}={v}" for v in values] for key, values in experiment.grid]))
    runs = []
    for point, seed in itertools.product(points, seeds):
        base = [*overrides, *point, f"train.seed={seed}"]
        dataset = load_config(config_path, base).data.dataset
        run_dir = out / run_name(dataset, config_path, point, seed)
        full = (*base, f"run.dir={run_dir}")
        runs.append(PlannedRun(0, 0, run_dir.name, run_dir, config_path, full,
                               load_config(config_path, full), experiment.analyses, experiment))
    return runs


def validation_ppl(run: PlannedRun) -> float | None:
    """The validation perplexity evaluate.py measured on the run's best.pt, once it has."""
    path = run.dir / "eval_best.json"
    if results_only(run):           # its result files alone: the evaluation of the best.pt it had
        evaluated = recorded_finished(run) and path.is_file()
    else:
        evaluated = is_finished(run) and is_fresh(path, run.dir / "best.pt")
    if not evaluated:
        return None
    try:
        return float(json.loads(path.read_text(encoding="utf-8"))["val_ppl"])
    except (ValueError, KeyError, TypeError):
        raise LaunchError(f"{path}: no val_ppl in it; run python evaluate.py {run.dir} again") from None


def finetune_runs(runs: Sequence[PlannedRun]) -> tuple[list[PlannedRun], list[str]]:
    """The second stage of the experiments that have one: for each, the finetuning of its run
    with the lowest validation perplexity, as a run in BEST/finetune (`finetune_config`); and, for those whose runs are not all evaluated yet, what they wait for."""
    ready, waiting = [], []
    experiments = list(dict.fromkeys(run.experiment for run in runs
                                     if run.experiment is not None and run.experiment.finetune_best))
    for experiment in experiments:
        members = [run for run in runs if run.experiment is experiment]
        scores = [validation_ppl(run) for run in members]
        if None in scores:
            unready = [run for run, score in zip(members, scores) if score is None]
            stale = [run.name for run in unready if is_finished(run) and (run.dir / "eval_best.json").is_file()]
            note = (f" ({', '.join(stale)}: eval_best.json is older than best.pt; run evaluate.py "
                    f"again)") if stale else ""
            waiting.append(f"finetuning the best of {len(members)} {experiment.config} runs: "
                           f"waits for {len(unready)} of them to be trained and evaluated{note}")
            continue
        best = min(zip(scores, (run.index for run in members), members))[2]
        finetune_dir = best.dir / FINETUNE_DIR
        # One finetuning an experiment: a sweep with other seeds (--seeds 3 after [1, 2]), or added
        # seeds that changed which run is best, would otherwise make a second one, and report.py
        # would pool both as one cell.
        earlier = [run_dir / FINETUNE_DIR for run_dir in experiment_run_dirs(members)
                   if run_dir != best.dir and (run_dir / FINETUNE_DIR).is_dir()]
        if earlier:
            waiting.append(f"finetuning the best of {len(members)} {experiment.config} runs: the experiment "
                           f"has a finetuning already, {earlier[0]}; the best of the runs planned now is "
                           f"{best.name}: to finetune it instead, move {earlier[0]} away first")
            continue
        started = any((finetune_dir / name).is_file() for name in ("last.pt", "eval_best.json"))
        if not (best.dir / "best.pt").is_file() and not started:
            waiting.append(f"finetuning the best of {len(members)} {experiment.config} runs: the "
                           f"best, {best.name}, has its result files but no best.pt to finetune; "
                           f"copy its checkpoints back in, or move its directory away and train it again")
            continue
        overrides = experiment.finetune_best.overrides
        try:
            config = finetune_config(best.dir, overrides)
        except ConfigError as e:
            raise LaunchError(f"finetune_best of {experiment.config}: {e}") from None
        ready.append(PlannedRun(0, 0, f"{best.name}/{FINETUNE_DIR}", finetune_dir,
                                best.dir / "config.yaml", overrides, config,
                                experiment.finetune_best.analyses, finetune_of=best.dir,
                                train_processes=best.train_processes))
    return [dataclasses.replace(run, index=i, count=len(ready)) for i, run in enumerate(ready)], waiting


def experiment_run_dirs(members: Sequence[PlannedRun]) -> list[Path]:
    """The run directories in the members' folder of their config and grid points, whatever their
    seed: those planned now and those an earlier sweep with other seeds left there."""
    found = {run.dir for run in members}
    for run in members:
        # run_name ends with seed<seed>: the same name with another seed is another seed's run
        stem = run.name[:-len(f"seed{run.config.train.seed}")] + "seed"
        found.update(path for path in run.dir.parent.glob(f"{glob.escape(stem)}*")
                     if path.name[len(stem):].lstrip("-").isdigit() and path.is_dir())
    return sorted(found)


# ---------------------------------------------------------------------- what is left to do

def read_progress(run_dir: Path) -> TrainingProgress:
    path = run_dir / "last.pt"
    try:
        return TrainingProgress.read(path)
    except Exception as e:
        raise LaunchError(f"{path}: not a readable last.pt ({type(e).__name__}); "
                          f"move the run directory away to start it again") from None


def comparable(config: dict) -> dict:
    """The parts of a config that make a run what it is: not where it runs or reads its data."""
    out = {section: dict(values) for section, values in config.items() if section != "run"}
    out.get("data", {}).pop("data_dir", None)
    return out


def check_same_experiment(run: PlannedRun) -> None:
    """Refuse to continue a run directory that holds a different experiment."""
    saved_path = run.dir / "config.yaml"
    if not saved_path.is_file():
        return
    try:   # read as a config, so that keys added since the run was made take their defaults
        saved_config = config_from_dict(yaml.safe_load(saved_path.read_text(encoding="utf-8")),
                                        source=str(saved_path))
    except ConfigError as e:
        raise LaunchError(f"{run.dir} holds a run whose config.yaml this code cannot read ({e}); "
                          f"choose another --out") from None
    saved = comparable(yaml.safe_load(saved_config.to_yaml()))
    planned = comparable(yaml.safe_load(run.config.to_yaml()))
    for section in sorted(set(saved) | set(planned)):
        for key in sorted(set(saved.get(section, {})) | set(planned.get(section, {}))):
            a, b = saved.get(section, {}).get(key), planned.get(section, {}).get(key)
            if a != b:
                raise LaunchError(f"{run.dir} holds a different run ({section}.{key} is {a!r} "
                                    f"there, {b!r} in this sweep); choose another --out")


def check_process_count(run: PlannedRun) -> None:
    """Refuse, before any run starts, a run that train.py would refuse to train in
    run.train_processes processes (sweep.py --nproc): a batch they do not divide, or an unfinished
    run started with another number of processes (its last.pt holds each one's random numbers and
    hidden states). Without this each such run would start torchrun only to fail in it."""
    last = run.dir / "last.pt"
    try:
        if results_only(run) or is_finished(run):
            return                               # nothing left to train
        saved = saved_processes(last) if last.is_file() else None
    except CheckpointError:        # (is_finished has read the progress: unreadable, it said so)
        return
    processes = run.train_processes
    # The saved count first: it divides the batch, and the batch of a started run cannot change.
    if saved is not None and saved != processes:
        raise LaunchError(f"--nproc {processes}: {last} was saved by {saved} process(es), and a run "
                          f"resumes only with as many as it started with; give --nproc {saved}")
    try:
        World(size=processes).columns(run.config.train.batch_size)     # train.py's own rule
    except ConfigError as e:
        raise LaunchError(f"--nproc {processes}: {run.dir}: {e}") from None


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
    return progress.finished or progress.completed_epochs >= run.config.train.epochs


def results_only(run: PlannedRun) -> bool:
    """The run directory holds a run's evaluation but no checkpoint: the result files of a run
    trained elsewhere, as this repository commits them (results/cpu_*: everything but the
    checkpoints), or a run whose last.pt was lost. (A run killed before its first last.pt has
    no evaluation: it is trained again from the start, as train.py does with the same command.)"""
    return (run.dir / "eval_best.json").is_file() and not (run.dir / "last.pt").is_file()


def check_results_only(run: PlannedRun) -> list:
    """Nothing to do for a results-only run that finished with every result the plan asks of it;
    otherwise a LaunchError naming what is missing. Training it again here would start its
    metrics.jsonl over beside the old run's evaluation, and its analyses need the checkpoint it
    does not have."""
    check_same_experiment(run)
    missing = [analysis.result for analysis in run.analyses if not (run.dir / analysis.result).is_file()]
    if not recorded_finished(run):
        missing.insert(0, "the rest of its training")
    if not missing:
        return []
    raise LaunchError(f"{run.dir} holds a run's result files but not its checkpoint (last.pt), so "
                      f"{', '.join(missing)} cannot be done here; copy its last.pt and best.pt back "
                      f"in, or move the directory away to train it again")


def recorded_finished(run: PlannedRun) -> bool:
    """Whether metrics.jsonl's last epoch ended the run (its early stop, or the last epoch)."""
    try:
        last = json.loads((run.dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])
        return bool(last.get("early_stop")) or int(last["epoch"]) >= run.config.train.epochs
    except (IndexError, ValueError, KeyError, TypeError):
        return False


def check_corpora(runs: Sequence[PlannedRun]) -> None:
    """Each corpus the runs with work left read, there (or downloaded) before any of them starts:
    a missing one is one line, not the same error from every run in turn."""
    from data.corpus import resolve_data_dir
    from data.download import DataError, ensure_corpus

    def work_left(run: PlannedRun) -> bool:
        try:
            return bool(pending_commands(run))
        except LaunchError:          # a run directory it cannot go on with: process_group says so
            return False
    needed = {(run.config.data.dataset, resolve_data_dir(run.config.data.data_dir))
              for run in runs if work_left(run)}
    for dataset, root in sorted(needed):
        try:
            ensure_corpus(dataset, root)
        except DataError as e:
            raise LaunchError(f"the runs' corpus: {e}") from None


def pending_commands(run: PlannedRun) -> list[list[str]]:
    """The commands still needed for `run`, in order (empty: nothing left to do): training (or
    resuming it), evaluate.py, then each of the run's analyses whose result is missing or older
    than best.pt."""
    py = sys.executable
    commands = []
    if results_only(run):
        return check_results_only(run)
    # torchrun's standalone mode: one machine, a free rendezvous port of its own
    train = [py, *(["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={run.train_processes}"]
                   if run.train_processes > 1 else []), str(SCRIPTS["train"])]
    if not (run.dir / "last.pt").is_file():
        source = ["--finetune", str(run.finetune_of)] if run.finetune_of else [str(run.config_path)]
        commands.append([*train, *source, *run.overrides])
    else:
        check_same_experiment(run)
        if not is_finished(run):
            commands.append([*train, "--resume", str(run.dir), *resume_overrides(run)])
    training = bool(commands)
    best = run.dir / "best.pt"
    device = () if run.config.run.device == "auto" else ("--device", run.config.run.device)
    for analysis in (Analysis("evaluate", device, "eval_best.json"), *run.analyses):
        if training or not is_fresh(run.dir / analysis.result, best):
            commands.append([py, str(SCRIPTS[analysis.script]), str(run.dir), *analysis.args])
    return commands


# ---------------------------------------------------------------------- running

def run_command(command: list[str], env: dict | None = None, log: IO | None = None,
                account: Path | Sequence[Path] | None = None) -> int:
    """Run one command to its end; its exit code. With `account`, append to that file the
    command's script, its CPU seconds (user and system, from wait4: the process and the
    children it waited for) and its wall seconds, also when a signal stopped it; with several
    files (the runs of a group, trained by one command), each its equal share. The sweep's
    stop signals are passed on to the command, which then ends the sweep (SweepStopped,
    launch/stopping.py)."""
    started = time.time()
    with stopping.start(command, env=env, stdout=log, stderr=subprocess.STDOUT if log else None) as proc:
        code, usage = _wait(proc)
    accounts = [account] if isinstance(account, Path) or account is None else list(account)
    for path in accounts:
        record_cpu_time(path, command, usage, started, share=len(accounts))
    stopping.ended(proc)
    return code


def _wait(proc: subprocess.Popen):
    """The exit code and the resource usage of the finished child (None where wait4 is missing)."""
    if not hasattr(os, "wait4"):
        return proc.wait(), None
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage


def script_name(command: list[str]) -> str:
    """The repository script a command runs ("train.py"), also under torchrun; for another
    command, its first argument ("-c")."""
    return next((Path(arg).name for arg in command[1:] if arg.endswith(".py")),
                command[1] if len(command) > 1 else command[0])


def record_cpu_time(path: Path | None, command: list[str], usage, started: float, share: int = 1) -> None:
    """Append the command's line to `path` (a run's cpu_times.jsonl): its CPU seconds from
    `usage` (ru_utime, ru_stime), its wall seconds since `started`; a group of `share` runs
    records each run's equal part, and `group` says how many shared it."""
    if path is None or usage is None or not path.parent.is_dir():
        return
    script = script_name(command)
    record = {"script": script,
              "cpu_s": round((usage.ru_utime + usage.ru_stime) / share, 2),
              "user_s": round(usage.ru_utime / share, 2), "sys_s": round(usage.ru_stime / share, 2),
              "wall_s": round((time.time() - started) / share, 2),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
              "processor": processor_name(), **({"group": share} if share > 1 else {})}
    if script == "train.py":      # its epochs' CPU time is in metrics.jsonl: analysis/cost.py counts it there
        record["cpu_in_metrics"] = True
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def execute(run: PlannedRun, commands: list[list[str]], env: dict | None = None,
            log: IO | None = None) -> str:
    """Run a run's commands in order; "done", "incomplete" or "failed: ..." (why)."""
    for command in commands:
        code = run_command(command, env, log, account=run.dir / CPU_TIMES)
        script = script_name(command)
        if code != 0:
            return f"failed: {script} exited with {code}"
        if script == "train.py" and not is_finished(run):
            return "incomplete"   # stopped early (run.max_steps): no best.pt to evaluate yet
    return "done"


def recorded_differences(run: PlannedRun, analysis: Analysis) -> list[str]:
    """The options of `analysis` that its result file in the run records with another value (a
    plan's rank: [--contexts, "40"] after the runs were ranked over 20 contexts): a result is
    taken as done by its time alone, so such a file is kept, and said to differ. Compared: rank.py's
    --contexts (when given) and --dtype, evaluate.py's method settings given as options."""
    try:
        recorded = json.loads((run.dir / analysis.result).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    args = importlib.import_module(analysis.script).parse_args(["RUN", *analysis.args])
    if analysis.script == "rank":
        asked = {"contexts": args.contexts, "dtype": args.dtype}    # no --contexts: all, not compared
    elif args.method and not args.cache_search:                    # a search records what it chose
        from evaluate import METHOD_FLAGS
        asked = {field: getattr(args, flag) for flag, field in METHOD_FLAGS[args.method].items()}
        recorded = recorded.get("settings") or {}
    else:
        return []
    return [f"{key} {recorded.get(key)!r} there, {value!r} in this sweep"
            for key, value in asked.items() if value is not None and recorded.get(key) != value]


def differences_note(run: PlannedRun, commands: Sequence[list[str]] = ()) -> str:
    """For the result files kept (not made again by `commands`): those made with other options,
    and what to do to make them with this sweep's."""
    notes = [f"{analysis.result}: {difference}" for analysis in run.analyses
             if not any(command[1] == str(SCRIPTS[analysis.script]) and command[3:] == list(analysis.args)
                        for command in commands)
             for difference in recorded_differences(run, analysis)]
    return (f" (note: kept {'; '.join(notes)}: delete the file for the sweep to make it again with "
            f"this sweep's options)") if notes else ""


def describe(run: PlannedRun, commands: list[list[str]]) -> str:
    if not commands:
        kept = " (its result files; no checkpoint)" if results_only(run) else ""
        return f"finished and evaluated{kept}: skip{differences_note(run)}"
    first = commands[0]
    if script_name(first) != "train.py":
        done_now = ", ".join(Path(script_name(c)).stem for c in commands)
        return f"finished: {done_now}{differences_note(run, commands)}"
    state = "resume" if "--resume" in first else "new"
    max_steps = run.config.run.max_steps
    if max_steps and len(commands) > 1:       # execute() stops after train.py if the run is unfinished
        state += (f" (run.max_steps={max_steps}: if that ends it before its last epoch, the commands "
                  f"after train.py do not run)")
    return state


@contextlib.contextmanager
def claimed(run_dir: Path):
    """Yields whether this process holds `run_dir`'s sweep claim (False: another process does)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / CLAIM_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def locked_by_another_process(run_dir: Path) -> bool:
    """Whether a live process (a train.py started by hand) holds the run directory's lock (not
    a folder that cannot hold one at all), asked without taking it (nothing written)."""
    return run_dir.is_dir() and held_elsewhere(run_dir / LOCK_NAME)


def process(run: PlannedRun, tag: str, env: dict | None = None, log_to_run_dir: bool = False) -> str:
    """Work out and run what is left of one run; its outcome (see `execute`, "skipped", or
    ELSEWHERE when another process works on it). A run that failed before its training wrote
    anything leaves no directory behind that the sweep made for it."""
    return process_group([run], tag, env, log_to_run_dir)[str(run.dir)]


def process_group(runs: Sequence[PlannedRun], tag: str, env: dict | None = None,
                  log_to_run_dir: bool = False) -> dict[str, str]:
    """`process` for runs that train together (sweep.py --group: one train.py --group command
    for those of them whose training is pending, then each one's evaluation and analyses as
    alone); their outcomes by run directory."""
    made = {run.dir: list(itertools.takewhile(lambda p: not p.exists(), (run.dir, *run.dir.parents)))
            for run in runs}
    outcomes, pending = {}, []
    with contextlib.ExitStack() as claims:
        for run in runs:
            try:
                ours = claims.enter_context(claimed(run.dir))
            except OSError as e:
                say(f"{tag} {run.dir}: cannot claim the run ({e.strerror or e})")
                outcomes[str(run.dir)] = f"failed: cannot claim {run.dir} ({e.strerror or e})"
                continue
            if not ours:
                say(f"{tag} {run.dir}: {ELSEWHERE}: skip")
                outcomes[str(run.dir)] = ELSEWHERE
                continue
            try:
                commands = pending_commands(run)
            except LaunchError as e:     # one bad run directory must not stop the others
                say(f"{tag} {run.dir}: {e}")
                outcomes[str(run.dir)] = f"failed: {e}"
                continue
            # a train.py started by hand holds it (its lock, not a sweep's claim): in a group, its
            # train.py --group would refuse the whole group, so it is left out before (a run with
            # nothing left to do is not locked to ask, which would touch it)
            if commands and locked_by_another_process(run.dir):
                say(f"{tag} {run.dir}: {ELSEWHERE}: skip")
                outcomes[str(run.dir)] = ELSEWHERE
                continue
            say(f"{tag} {run.dir}: {describe(run, commands)}")
            if commands:
                pending.append((run, commands))
            else:
                outcomes[str(run.dir)] = "skipped"
        training = trainings_together(pending)
        trained = train_together(training, tag, env, log_to_run_dir) if training else {}
        for run, commands in pending:
            if run.dir in trained:
                outcome, commands = trained[run.dir], commands[1:]
                if outcome != "done" or not commands:
                    outcomes[str(run.dir)] = outcome
                    continue
            outcomes[str(run.dir)] = run_logged(run, commands, env, log_to_run_dir)
        for run in runs:
            outcome = outcomes[str(run.dir)]
            if outcome.startswith("failed") and locked_by_another_process(run.dir):
                outcomes[str(run.dir)] = ELSEWHERE
            elif outcome.startswith("failed") and made[run.dir]:
                remove_if_unused(run.dir, made[run.dir])
    return outcomes


def trains_alone(commands: list[list[str]]) -> bool:
    """The run's first command is a plain train.py (not under torchrun): it can join a group."""
    return bool(commands) and commands[0][1:2] == [str(SCRIPTS["train"])]


def trainings_together(pending: list[tuple[PlannedRun, list[list[str]]]]) -> list:
    """Of the runs with their pending commands, those whose training goes into one train.py
    --group: each whose first command is a plain train.py, when there are two or more (a single
    one trains as alone)."""
    training = [(run, commands) for run, commands in pending if trains_alone(commands)]
    return training if len(training) >= 2 else []


def run_logged(run: PlannedRun, commands: list[list[str]], env: dict | None, log_to_run_dir: bool) -> str:
    """`execute`, its output in the terminal or in RUN/sweep.log (and then a failure's reason
    from the log's last line, as the log may not stay)."""
    if not log_to_run_dir:
        return execute(run, commands, env)
    run.dir.mkdir(parents=True, exist_ok=True)
    with open(run.dir / "sweep.log", "a", encoding="utf-8") as log:
        outcome = execute(run, commands, env, log)
    if outcome.startswith("failed"):
        lines = (run.dir / "sweep.log").read_text(encoding="utf-8", errors="replace").split("\n")
        outcome += next((f" ({line.strip()})" for line in reversed(lines) if line.strip()), "")
    return outcome


def group_command(training: list[tuple[PlannedRun, list[list[str]]]]) -> list[str]:
    """The train.py --group command for runs whose first pending command is a plain train.py:
    each member its train.py arguments, quoted."""
    return [sys.executable, str(SCRIPTS["train"]), "--group",
            *[shlex.join(commands[0][2:]) for _, commands in training]]


def train_together(training: list[tuple[PlannedRun, list[list[str]]]], tag: str, env: dict | None,
                   log_to_run_dir: bool) -> dict[Path, str]:
    """One `train.py --group` command for the runs' pending trainings (each its train.py
    arguments, quoted); each run's training outcome, read from its group_exit.json: "done",
    "incomplete" or "failed: ..."."""
    runs = [run for run, _ in training]
    command = group_command(training)
    say(f"{tag} training {len(runs)} runs as one group: {', '.join(run.name for run in runs)}")
    accounts = [run.dir / CPU_TIMES for run in runs]
    started = time.time()
    if log_to_run_dir:
        for run in runs:
            run.dir.mkdir(parents=True, exist_ok=True)
        for run in runs[1:]:
            with open(run.dir / "sweep.log", "a", encoding="utf-8") as log:
                log.write(f"trained in a group; the group's output is in {runs[0].dir / 'sweep.log'}\n")
        with open(runs[0].dir / "sweep.log", "a", encoding="utf-8") as log:
            code = run_command(command, env, log, account=accounts)
    else:
        code = run_command(command, env, account=accounts)
    trained = {}
    for run in runs:
        path = run.dir / GROUP_EXIT
        try:                                   # this group's record (not an earlier sitting's)
            ended = json.loads(path.read_text(encoding="utf-8"))["exit_code"] \
                if path.stat().st_mtime >= started else None
        except (OSError, ValueError, KeyError, TypeError):
            ended = None                       # the group did not start, or did not end its runs
        if ended is None or not (run.dir / "last.pt").is_file():
            trained[run.dir] = f"failed: train.py --group exited with {code}"
        elif ended != 0:
            trained[run.dir] = f"failed: train.py exited with {ended} (in a group)"
        else:
            trained[run.dir] = "done" if is_finished(run) else "incomplete"
    return trained


# What a sweep and a refused train.py leave in a run directory: with nothing else there, the run
# left nothing of its own.
BOOKKEEPING = {CLAIM_NAME, LOCK_NAME, CPU_TIMES, "sweep.log"}


def remove_if_unused(run_dir: Path, made: list[Path]) -> None:
    """Remove `run_dir` and the folders above it in `made` (those the sweep made, the deepest
    first, each while empty) if the run wrote nothing there: a failed command leaves no folder
    behind that it made. Called holding the run's claim."""
    if any(path.name not in BOOKKEEPING for path in run_dir.iterdir()):
        return
    for path in run_dir.iterdir():
        path.unlink()
    for folder in made:
        try:
            folder.rmdir()
        except OSError:                          # not empty: another run's, or not ours
            break
