"""Run one config over several seeds and an override grid, or an experiment plan, each run in its
own directory.

    python sweep.py sweeps/sb_table2_ptb.yaml                  # a plan: [SB] Table 2, PTB (67 runs)
    python sweep.py sweeps/sb_table2_ptb.yaml --dry-run        # what it would run, and how many
    python sweep.py sweeps/sb_table2_ptb.yaml --report         # its tables and figures from the runs
    python sweep.py configs/ptb/softmax.yaml --seeds 141 142 143 --out runs/ptb
    python sweep.py configs/ptb/gss.yaml --grid head.c=-1.5,-1,0 --grid head.k=2,2.5,3 --out runs/gss
    python sweep.py configs/ptb/softmax.yaml --seeds 141 142 --out runs/ptb --dry-run
    python sweep.py configs/ptb/softmax.yaml --seeds 141 142 --out runs/ptb --mode gpus --gpus 0,1
    python sweep.py configs/ptb_mini/softmax.yaml --seeds 1 2 3 4 --group 4 --out runs/mini   # 4 seeds in one process
    python sweep.py sweeps/sb_table2_ptb.yaml --mode gpus --runs-per-gpu 3    # 3 at a time a GPU (PTB on an H200: no gain, docs/gpus.md)
    python sweep.py sweeps/cpu_seven_heads.yaml --jobs 2 --out runs/cpu_ptb   # 2 runs at a time on the CPU cores
    python sweep.py sweeps/cpu_converged_d_sweep.yaml --task 3 --nproc 2 --out runs/x   # one run, DDP on 2 cores
    python sweep.py configs/ptb/softmax.yaml --seeds 141 142 --out runs/ptb --mode slurm \
        --sbatch=--gres=gpu:1 --submit

Each run directory is <out>/<dataset>-<config name>[-key=value...]-seed<seed>. Re-issuing the
same command continues interrupted runs and skips finished ones (see launch/runs.py), and says
how many it skipped: a CPU plan's folder holds its committed results, and --out trains the plan
again elsewhere (as in the examples above). SIGTERM, SIGINT or SIGHUP to sweep.py reaches every
command it started (launch/stopping.py): each train.py saves last.pt, and sweep.py exits with
128 + the signal once they have ended. A plan (launch/plans.py, the files in sweeps/) names its
configs, seeds, grids, what runs after training and its report commands; every option below
applies to it too, except those a plan gives itself.
An experiment of a plan with `finetune_best` has a second stage: once all its runs are trained
and evaluated, the sweep finetunes the one with the best validation perplexity and evaluates
it (local, --jobs and gpus modes; a Slurm array trains the first stage, and `python sweep.py
PLAN --finetune-only` afterwards runs the second).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import shlex
import subprocess
import sys
from pathlib import Path

from experiment.cli import (ArgumentParser, main_begins, quiet_interrupt_while_starting,
                          refuse_several_torchrun_processes, stdout_closed)

if __name__ == "__main__":        # (not when a test imports the script)
    quiet_interrupt_while_starting()   # before torch's import, which takes seconds: a Ctrl-C there is one line

from experiment.config import ConfigError, seed_problem
from experiment.run_directory import FINETUNE_DIR, RunDirectoryError, check_run_dir_usable
from launch import LaunchError
from launch.modes import (alone, in_groups, in_progress_elsewhere, slurm_script, summary, sweep_gpus,
                          sweep_jobs, sweep_local, tag_of, visible_gpus)
from launch.plans import Plan, is_plan, load_plan
from launch.runs import (ELSEWHERE, Experiment, check_corpora, check_process_count, check_same_experiment, describe, finetune_runs, group_command, parse_grid, pending_commands,
                         options_refused, plan_runs, rank_analysis, trainings_together)
from launch.stopping import PassingOnStopSignals, SweepStopped


def parse_args(argv=None):
    parser = ArgumentParser(
        prog="sweep.py",
        description="Train (, evaluate, rank) one config over seeds and an override grid, or a plan.",
        epilog="key=value overrides after the config or plan are passed to every run. Options for "
               "sbatch that start with '-' are given with '=', e.g. --sbatch=--gres=gpu:1.")
    parser.add_argument("config", help="config file (configs/ptb/softmax.yaml) or plan file (sweeps/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides shared by all runs")
    parser.add_argument("--out", metavar="DIR",
                        help="folder that receives one run directory per run (required with a "
                             "config; a plan names its own, which --out replaces: the way to train "
                             "a plan again whose runs are finished in its folder, as a fresh "
                             "clone's CPU plans are)")
    parser.add_argument("--seeds", nargs="+", action="extend",
                        help="train.seed values, `config` for the config's own (default: the config's, "
                             "or the plan's); repeated, they add up: --seeds 1 --seeds 2 is --seeds 1 2")
    parser.add_argument("--limit", type=int, metavar="N",
                        help="only the first N runs of each experiment (a smoke test of a plan)")
    parser.add_argument("--report", action="store_true",
                        help="a plan: run its report.py commands on the runs there are, train nothing")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="values of one key; several --grid give their cartesian product")
    parser.add_argument("--rank", action="store_true", help="also run rank.py on every run")
    parser.add_argument("--rank-args", default="", metavar="ARGS",
                        help='options for rank.py, e.g. --rank-args="--contexts 33320"')
    parser.add_argument("--mode", choices=("local", "gpus", "slurm"), default="local",
                        help="local: one run after another; gpus: runs on the local GPUs in parallel "
                             "(--runs-per-gpu at a time on each; where torch sees no GPU it refuses, "
                             "unless the override run.device=cpu says to train on the CPU); "
                             "slurm: write (and with --submit submit) an sbatch job array")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="local mode: N runs at a time, each with an equal share of the CPU cores "
                             "as its threads, output to DIR/sweep.log (default 1: one after another "
                             "in this terminal)")
    parser.add_argument("--group", type=int, default=1, metavar="G",
                        help="train the runs G at a time in one process each (train.py --group: "
                             "runs of the same body shapes and batch layout, one step of all at "
                             "a time; on a GPU the way to train many seeds; docs/training.md, "
                             "'Group runs'); with --jobs N, N groups at a time; with --mode gpus, "
                             "one group per GPU at a time. --group 1, the default: each run alone")
    parser.add_argument("--nproc", type=int, default=1, metavar="N",
                        help="local mode: train each run in N processes with DDP (torchrun "
                             "--standalone; a run resumes only with the N it was started with). On a "
                             "CPU, one run on all its cores finishes sooner than one on a core")
    parser.add_argument("--gpus", help="gpus mode: comma-separated GPUs as torch numbers them here (0..N-1; "
                        "under CUDA_VISIBLE_DEVICES, positions in that list: with CUDA_VISIBLE_DEVICES=2,3, "
                        "--gpus 0,1 runs on GPUs 2 and 3), or GPU-/MIG- UUIDs from that list (default: all visible)")
    parser.add_argument("--runs-per-gpu", type=int, default=1, metavar="K",
                        help="gpus mode: keep K runs at a time on each GPU (default 1; for the PTB "
                             "models K > 1 gave no more tokens/s on an H200, docs/gpus.md)")
    parser.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                        help="slurm mode: an #SBATCH line, e.g. --sbatch=--time=48:00:00 (repeatable)")
    parser.add_argument("--array-limit", type=int, help="slurm mode: at most this many tasks at once")
    parser.add_argument("--submit", action="store_true", help="slurm mode: submit the script with sbatch")
    parser.add_argument("--task", type=int, metavar="I",
                        help="run only the I-th planned run (0-based): what each slurm array task does")
    parser.add_argument("--task-run", metavar="NAME",
                        help="with --task: the run directory's name the I-th run must have (a slurm "
                             "script gives each task its run's, so that a plan changed since the "
                             "script was written refuses instead of training another run)")
    parser.add_argument("--train-only", action="store_true",
                        help="a plan: train, evaluate and rank its runs but leave its finetune_best "
                             "stage to a later sweep (with --seeds or --limit, so that the best run is "
                             "chosen among all of an experiment's runs, not the first few)")
    parser.add_argument("--finetune-only", action="store_true",
                        help="a plan: only its finetune_best stage, for the experiments whose runs "
                             "are all trained and evaluated (after a Slurm array, say)")
    parser.add_argument("--dry-run", action="store_true", help="print the planned commands, run nothing")
    words = sys.argv[1:] if argv is None else list(argv)
    if "--seeds" in words:
        # `--seeds 1 2 configs/x.yaml`: the seeds take every word up to the next option, the
        # config file too, and argparse would ask for the config that was given.
        after = list(itertools.takewhile(lambda w: not w.startswith("-"), words[words.index("--seeds") + 1:]))
        files = [w for w in after if w.endswith((".yaml", ".yml"))]
        if files:
            parser.error(f"--seeds took {files[0]} as a seed: give the config or plan first "
                         f"(sweep.py {files[0]} --seeds ...)")
    args = parser.parse_intermixed_args(argv)
    if args.seeds:
        # `--seeds 1 2 key=value` would swallow the override: give it back to the overrides.
        args.overrides += [s for s in args.seeds if "=" in s]
        given = [s for s in args.seeds if "=" not in s]
        bad = [s for s in given if s != "config" and not s.lstrip("-").isdigit()]
        if bad:
            parser.error(f"--seeds: expected integers or config, the config's own seed, got {bad[0]!r}")
        args.seeds = [s if s == "config" else int(s) for s in given]
        for seed in args.seeds:
            if seed != "config" and (problem := seed_problem(seed)):
                parser.error(f"--seeds: {problem}")
    if args.array_limit is not None and args.array_limit < 1:
        parser.error(f"--array-limit: expected an integer >= 1, got {args.array_limit}")
    for option in args.sbatch:
        name = option.split("=", 1)[0]
        if not option.startswith("-"):
            parser.error(f"--sbatch={option}: expected an sbatch option, e.g. --sbatch=--{option}")
        if name in ("--array", "-a", "--output", "-o", "--job-name", "-J"):
            parser.error(f"--sbatch={option}: the script sets {name} itself (the array from the runs, "
                         f"with --array-limit; the output beside the runs)")
    if args.mode != "slurm" and (args.submit or args.sbatch or args.array_limit is not None):
        parser.error("--submit, --sbatch and --array-limit belong to --mode slurm")
    if args.mode != "gpus" and (args.gpus or args.runs_per_gpu != 1):
        parser.error("--gpus and --runs-per-gpu belong to --mode gpus")
    if args.runs_per_gpu < 1:
        parser.error(f"--runs-per-gpu: expected an integer >= 1, got {args.runs_per_gpu}")
    if args.gpus is not None:
        ids = args.gpus.split(",")
        # An index, or a UUID as nvidia-smi -L prints it (GPU-..., MIG-...): what CUDA_VISIBLE_DEVICES takes
        if not all(i.isdigit() or i.startswith(("GPU-", "MIG-")) for i in ids) or len(set(ids)) != len(ids):
            parser.error(f"--gpus: expected GPU indices or GPU-/MIG- UUIDs, comma-separated, each once "
                         f"(e.g. 0,1,2,3), got {args.gpus!r}")
    if args.jobs != 1 and args.mode != "local":
        parser.error("--jobs belongs to --mode local (on GPUs: --runs-per-gpu)")
    if args.jobs < 1:
        parser.error(f"--jobs: expected an integer >= 1, got {args.jobs}")
    if args.nproc < 1:
        parser.error(f"--nproc: expected an integer >= 1, got {args.nproc}")
    if args.group < 1:
        parser.error(f"--group: expected an integer >= 1, got {args.group}")
    if args.group > 1:
        clash = ("--nproc" if args.nproc > 1 else "--task" if args.task is not None
                 else "--mode slurm" if args.mode == "slurm" else None)
        if clash:
            parser.error(f"--group trains several runs in one process: not with {clash}")
    if args.nproc != 1 and (args.mode != "local" or args.jobs != 1):
        parser.error("--nproc belongs to --mode local with one run at a time (--jobs 1)")
    if args.task_run is not None and args.task is None:
        parser.error("--task-run belongs to --task")
    if args.task is not None and args.mode != "local":
        parser.error("--task runs one run here: use it with --mode local")
    if args.train_only and args.finetune_only:
        parser.error("--train-only and --finetune-only: give one (neither runs both stages)")
    if args.finetune_only and (args.task is not None or args.mode == "slurm"):
        parser.error("--finetune-only runs the second stage here: not with --task or --mode slurm")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit: expected an integer >= 1, got {args.limit}")
    args.plan = None                     # loaded in main(), where its errors become one line
    if not Path(args.config).is_file():
        return args                      # main() names the missing file, not a flag it lacks
    if args.report:
        # --report trains nothing: a setting of what to train would be silently ignored.
        training = [name for name, value in (
            ("--seeds", args.seeds), ("--limit", args.limit is not None), ("--group", args.group != 1),
            ("--jobs", args.jobs != 1), ("--nproc", args.nproc != 1), ("--task", args.task is not None),
            ("--mode", args.mode != "local"), ("--train-only", args.train_only),
            ("--finetune-only", args.finetune_only),
            (f"override {args.overrides[0]}" if args.overrides else "", args.overrides)) if value]
        if training:
            parser.error(f"{training[0]}: --report runs the plan's report commands over the runs in its "
                         f"folder and trains nothing (report.py's --only chooses runs)")
    if is_plan(Path(args.config)):
        given = [flag for flag, value in (("--grid", args.grid), ("--rank", args.rank),
                                          ("--rank-args", args.rank_args)) if value]
        if given:
            parser.error(f"{given[0]}: {args.config} is a plan, which names its own grids and rank options")
    elif args.report:
        parser.error("--report runs a plan's report commands: give a plan file")
    elif args.rank_args and not args.rank:
        parser.error("--rank-args belongs to --rank (rank.py runs only with --rank)")
    elif args.rank:
        try:
            args.rank_analysis = rank_analysis(shlex.split(args.rank_args))
        except ValueError as e:          # shlex: a quote opened and not closed
            parser.error(f"--rank-args={args.rank_args}: {e} (a quote opened and not closed)")
        except LaunchError as e:
            parser.error(f"--rank-args: {e}")
        if refused := options_refused(args.rank_analysis):
            parser.error(f"--rank-args: rank.py would refuse them: {refused}")
    elif args.finetune_only or args.train_only:
        parser.error(f"{'--finetune-only' if args.finetune_only else '--train-only'} is about a plan's "
                     f"finetune_best stage: give a plan file")
    elif not args.out:
        parser.error("--out: give the folder for the run directories (a plan names its own)")
    return args


def inner_sweep_command(args) -> list[str]:
    """This sweep as the command every slurm array task runs (it adds --task $SLURM_ARRAY_TASK_ID)."""
    command = [sys.executable, str(Path(__file__).resolve()), args.config, *args.overrides,
               "--out", str(out_folder(args))]
    for grid in args.grid:
        command += ["--grid", grid]
    if args.seeds:
        command += ["--seeds", *map(str, args.seeds)]
    if args.limit:
        command += ["--limit", str(args.limit)]
    return command + (["--rank", f"--rank-args={args.rank_args}"] if args.rank else [])


def out_folder(args) -> Path:
    return Path(args.out).expanduser() if args.out else args.plan.out


def print_plan(out: Path, runs, finetunes=(), waiting=(), group: int = 1) -> None:
    """--dry-run: every planned run's pending commands; with --group G, the trainings that would
    run together as one `train.py --group` command, printed before their runs' other commands."""
    skipped = []
    for stage, planned in (("", runs), ("finetune ", finetunes)):
        for item in in_groups(planned, group) if group > 1 else alone(planned):
            pending = [(run, pending_commands(run)) for run in item]
            # what the sweep would skip as another process's (found without writing into the runs)
            elsewhere = {run.dir for run, commands in pending if in_progress_elsewhere(run, work_left=bool(commands))}
            training = trainings_together([(run, commands) for run, commands in pending if run.dir not in elsewhere])
            if training:
                print(f"# group {tag_of(item)}: {len(training)} runs trained as one: "
                      f"{', '.join(run.name for run, _ in training)}")
                print(shlex.join(group_command(training)))
            grouped = {run.dir for run, _ in training}
            for run, commands in pending:
                task = "" if stage else f", --task {run.index}"     # --task counts from 0
                if run.dir in elsewhere:
                    print(f"# [{stage}{run.index + 1}/{run.count}{task}] {run.dir}: {ELSEWHERE}: skip")
                    continue
                skipped += [] if commands else [run.dir]
                print(f"# [{stage}{run.index + 1}/{run.count}{task}] {run.dir}: {describe(run, commands)}")
                for command in commands[1:] if run.dir in grouped else commands:
                    print(shlex.join(command))
    for line in waiting:
        print(f"# then {line}")
    if skipped:
        print(f"# {skipped_note(skipped, out)}")
    if not runs and finetunes:                  # --finetune-only
        print(f"# {len(finetunes)} finetuning run{'s' * (len(finetunes) != 1)} planned")
        return
    total = runs[0].count if runs else 0
    print(f"# {total} run{'s' * (total != 1)} planned" if len(runs) == total
          else f"# {len(runs)} of {total} planned runs")


def skipped_note(skipped: list, out: Path) -> str:
    """What a sweep that skipped finished runs (their directories) says last: a fresh clone's
    plans have their results committed, so the same command in their folder trains nothing."""
    finetunings = sum(Path(run_dir).name == FINETUNE_DIR for run_dir in skipped)
    runs = len(skipped) - finetunings
    what = " and ".join([f"{runs} planned run{'s' * (runs != 1)}"] * bool(runs) +
                        [f"{finetunings} finetuning{'s' * (finetunings != 1)}"] * bool(finetunings))
    return (f"{what} skipped: finished and evaluated in {out} already; another folder (--out DIR) "
            f"trains {'them' if len(skipped) > 1 else 'it'} again there")


def run_reports(plan: Plan, out: Path, dry_run: bool) -> int:
    """The plan's report.py commands, one after another. One that fails (its error line printed)
    does not stop the others: a plan in progress reports what its finished runs allow (a table
    before any run is finetuned, say); the exit code is 2 if any failed, with a last line that
    names them."""
    import report
    failed = []
    commands = plan.report_commands(out)
    if not commands:
        print(f"error: {plan.path}: the plan has no report: section, so --report has nothing to run "
              f"(a plan whose runs another plan reports says which in its comments)", file=sys.stderr)
        return 2
    for arguments in commands:
        print(f"+ python report.py {shlex.join(arguments)}", flush=True)
        if not dry_run and report.main(arguments) != 0:
            failed.append(arguments[0])
    # The reports read the runs that are there: say which of the plan's are not (by their result
    # files, what the reports read, whatever overrides trained the others).
    runs = plan_runs(plan.experiments, out, [], None, None)
    waiting = [run.dir.name for run in runs
               if not all((run.dir / name).is_file() for name in ("eval_best.json", *(a.result for a in run.analyses)))]
    if waiting:
        shown = ", ".join(waiting[:8]) + (f" and {len(waiting) - 8} more" if len(waiting) > 8 else "")
        print(f"note: {len(waiting)} of the plan's {len(runs)} runs are not in these reports yet "
              f"(not trained, evaluated and ranked in {out}): {shown}", flush=True)
    if failed:
        rest = "the others were written" if len(failed) < len(commands) else "none was written"
        print(f"error: {len(failed)} of the plan's {len(commands)} reports failed ({', '.join(failed)}); {rest}",
              file=sys.stderr)
        return 2
    return 0


def write_slurm(args, runs) -> int:
    out = out_folder(args)
    script = slurm_script(runs, inner_sweep_command(args), out, f"sweep-{Path(args.config).stem}",
                          args.sbatch, args.array_limit)
    if not any("gpu" in option.lower() for option in args.sbatch) and \
            any(run.config.run.device != "cpu" for run in runs):
        print("warning: no --sbatch option asks for a GPU (e.g. --sbatch=--gres=gpu:1): each array task "
              "gets what the partition gives by default", file=sys.stderr)
    if "AWD_DATA_DIR" not in os.environ and not any(o.startswith("data.data_dir=") for o in args.overrides):
        print("warning: AWD_DATA_DIR is not set here: each array task reads the corpora from "
              "$AWD_DATA_DIR as its job's environment has it (sbatch passes on the environment it is "
              "submitted from), else from the repository's corpora/", file=sys.stderr)
    if args.dry_run:
        print(script, end="")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"sweep-{Path(args.config).stem}.sbatch"
    path.write_text(script, encoding="utf-8")
    print(f"wrote {path} ({len(runs)} array task{'' if len(runs) == 1 else 's'})")
    if args.submit:
        try:
            proc = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
        except FileNotFoundError:
            raise LaunchError(f"--submit: sbatch is not installed here; the script is written ({path}): "
                              f"submit it on the cluster (sbatch {path})") from None
        if proc.returncode != 0:
            last_line = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            raise LaunchError(f"sbatch {path} failed: {last_line}")
        print(proc.stdout.strip())
    return 0


def run_all(args, runs) -> dict[str, str]:
    """Run `runs` in the chosen mode (one by one, or in groups); their outcomes by run directory."""
    if not runs:
        return {}
    items = in_groups(runs, args.group) if args.group > 1 else alone(runs)
    if args.mode == "gpus":
        return sweep_gpus(items, args.gpus.split(",") if args.gpus else visible_gpus(), args.runs_per_gpu)
    return sweep_jobs(items, args.jobs) if args.jobs > 1 else sweep_local(items)


def main(argv=None) -> int:
    args = parse_args(argv)
    config_path = Path(args.config)
    try:
        if not config_path.is_file():
            what = "a folder, not a file" if config_path.is_dir() else "config file not found"
            raise LaunchError(f"{config_path}: {what} (expected a plan, e.g. "
                              f"sweeps/cpu_seven_heads.yaml, or a config with --out)")
        if is_plan(config_path):
            args.plan = load_plan(config_path)
            if args.report:
                return run_reports(args.plan, out_folder(args), args.dry_run)
            experiments = args.plan.experiments
            if args.finetune_only and not any(e.finetune_best for e in experiments):
                raise LaunchError(f"{config_path}: --finetune-only runs a plan's finetune_best stage, and no "
                                  f"experiment of this plan has one")
        else:
            grid = tuple((key, tuple(values)) for key, values in parse_grid(args.grid))
            analyses = (args.rank_analysis,) if args.rank else ()
            experiments = [Experiment(config_path, grid=grid, analyses=analyses)]
        try:
            runs = plan_runs(experiments, out_folder(args), args.overrides, args.seeds, args.limit)
        except LaunchError as e:
            raise LaunchError(f"{config_path}: {e}" if args.plan else str(e)) from None
        if args.task is not None:
            if not 0 <= args.task < len(runs):
                raise LaunchError(f"--task {args.task}: the sweep has {len(runs)} runs "
                                    f"(0..{len(runs) - 1})")
            if args.task_run is not None and runs[args.task].name != args.task_run:
                raise LaunchError(f"--task {args.task}: the sweep's run {args.task} is {runs[args.task].name}, "
                                  f"not {args.task_run} as when the slurm script was written: its plan or "
                                  f"flags changed since; write the script again (--mode slurm)")
            runs = [runs[args.task]]
        runs = [dataclasses.replace(run, train_processes=args.nproc) for run in runs]
        try:
            check_run_dir_usable(out_folder(args), "--out" if args.out else "out:")
        except RunDirectoryError as e:
            # a plan's folder: the plan file named first, and the option that replaces its out:
            raise LaunchError(str(e) if args.out else f"{config_path}: {e} (or --out DIR)") from None
        for run in [] if args.finetune_only else runs:
            if (run.dir / "last.pt").is_file():
                check_same_experiment(run)    # --out holds other runs: refused before any run (or Slurm script), exit 2
            check_process_count(run)          # what train.py would refuse under --nproc (or without it)
        if args.mode == "slurm":
            return write_slurm(args, runs)
        second_stage = args.task is None and not args.train_only
        if args.finetune_only:
            finetunes, waiting = finetune_runs(runs)
            if not finetunes:    # a job chained after a Slurm array must see that nothing was finetuned
                raise LaunchError(f"--finetune-only: nothing to finetune: {'; '.join(waiting)}")
        if args.plan:
            print(f"{'# ' if args.dry_run else 'sweep: '}plan: {args.plan.title} ({config_path})", flush=True)
        if args.dry_run:
            print_plan(out_folder(args), [] if args.finetune_only else runs,
                       *(finetune_runs(runs) if second_stage else ((), ())), group=args.group)
            return 0
        check_corpora([] if args.finetune_only else runs)
        with PassingOnStopSignals():
            outcomes = {} if args.finetune_only else run_all(args, runs)
            if second_stage:
                finetunes, waiting = finetune_runs(runs)
                outcomes.update(run_all(args, finetunes))
                for line in waiting:
                    print(f"not run: {line}")
    except (LaunchError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SweepStopped as e:
        print(f"stopped by {e}: the commands under way have ended (a training saves its last.pt); "
              f"run the same command again to continue", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("interrupted; re-issue the same command to continue", file=sys.stderr)
        return 130
    text, ok = summary(outcomes)
    print(f"sweep: {text}")
    skipped = [run_dir for run_dir, outcome in outcomes.items() if outcome == "skipped"]
    if skipped:
        print(skipped_note(skipped, out_folder(args)))
    return 0 if ok else 1


if __name__ == "__main__":
    main_begins()
    refuse_several_torchrun_processes()     # two sweeps of one plan would race for its runs
    try:
        sys.exit(main())
    except BrokenPipeError:
        stdout_closed()
