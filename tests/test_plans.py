"""The experiment plans of sweeps/ (one per table or figure of [SB]): every plan loads, plans the
runs its table of plans says (docs/sweeps.md, docs/results_cpu.md), and runs end to end on tiny
models with its reports; the plan file format refuses what it does not know in one line.

The end-to-end runs make each plan small with the sweep's own options (--seeds, --limit and
key=value overrides for a tiny model on slices of PTB and WikiText-2) and run train.py,
evaluate.py, rank.py and report.py in this process (`run_command` is replaced by a dispatcher to
their main(), which parse exactly the argv the sweep would give the scripts).
"""
from __future__ import annotations

import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import evaluate
import rank
import sweep
import train
from launch import LaunchError, runs as launch_runs
from launch.modes import in_groups
from launch.plans import is_plan, load_plan
from launch.runs import plan_runs
from tests.conftest import TINY, copy_first_lines, doc_section

PLANS = sorted(Path("sweeps").glob("*.yaml"))


TABLES_OF_PLANS = [("docs/sweeps.md", "Reproducing the paper"),          # [SB]'s plans
                   ("docs/results_cpu.md", "The miniature and its plans")]  # the CPU plans


def plan_rows() -> dict[str, int]:
    """plan file -> number of runs, from the tables of plans (TABLES_OF_PLANS: page, section)."""
    sections = [doc_section(page, title) for page, title in TABLES_OF_PLANS]
    rows = {}
    for line in "\n".join(sections).splitlines():
        match = re.match(r"\|[^|]*\| `python sweep.py (sweeps/\S+\.yaml)` \| ([\d,]+) \|", line)
        if match:
            rows[match.group(1)] = int(match.group(2).replace(",", ""))
    return rows


def test_every_plan_is_in_the_tables_of_plans_with_its_number_of_runs(capsys):
    rows = plan_rows()
    missing = sorted({str(p) for p in PLANS} - set(rows))
    assert not missing, (f"{missing}: every plan in sweeps/ has a row in a table of plans "
                         f"({TABLES_OF_PLANS}); a scratch plan can live outside sweeps/")
    assert sorted(rows) == [str(p) for p in PLANS]
    for plan in PLANS:
        assert sweep.main([str(plan), "--dry-run"]) == 0
        count = capsys.readouterr().out.strip().splitlines()[-1]
        assert count == f"# {rows[str(plan)]} run{'s' * (rows[str(plan)] != 1)} planned", plan


# Plans that are their seeds (one experiment a seed, in the order a GPU's groups take them), so
# that `--seeds` makes their experiments the same runs and is refused.
SEEDS_ARE_THE_PLAN = {"sweeps/gpu_converged_seeds.yaml"}


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_every_plan_takes_seeds_from_the_command_line(plan):
    """`sweep.py PLAN --seeds 1 2` replaces every experiment's seeds: a plan whose experiments
    differed only in their seeds (the d-sweep's Mixtape at d = 64, seed 2, appended beside its
    seed 1) was refused, two of its runs the same. Each plan gives each run once, but those that
    are their seeds, which are refused in one line."""
    from launch.runs import plan_runs
    loaded = load_plan(plan)
    if str(plan) in SEEDS_ARE_THE_PLAN:
        with pytest.raises(LaunchError, match="--seeds replaces each experiment's own seeds"):
            plan_runs(loaded.experiments, Path(loaded.out), [], [1, 2], None)
        return
    runs = plan_runs(loaded.experiments, Path(loaded.out), [], [1, 2], None)
    assert len({run.dir for run in runs}) == len(runs) > 0


def test_the_plans_use_the_papers_seeds_and_grids():
    table2 = load_plan("sweeps/sb_table2_ptb.yaml")
    seeds = {e.config.stem: e.seeds for e in table2.experiments}
    assert seeds["softmax"] == (141, *range(1, 11)) and seeds["mos"] == (28, *range(1, 11))
    assert seeds["moc"] == (28,)                                  # one run in [SB]
    wt2 = load_plan("sweeps/sb_table2_wt2.yaml")
    assert all(e.seeds[0] == 1881 and len(e.seeds) in (1, 11) for e in wt2.experiments)
    assert all(a.args == ("--contexts", "33320") for e in wt2.experiments for a in e.analyses)
    grid = dict(load_plan("sweeps/sb_figure2_gss_ptb.yaml").experiments[0].grid)
    assert len(grid["head.c"]) == 9 and len(grid["head.k"]) == 8
    nt = load_plan("sweeps/sb_sm_tables4_5.yaml")
    assert all("train.asgd_trigger=nt" in e.overrides for e in nt.experiments)
    robust = load_plan("sweeps/sb_sm_tables14_16.yaml")
    # SM section 5.1's matrix is the NT-ASGD MoS run's (rank 9,979, SM Table 10), SM Tables
    # 10/11's run with the authors' seed, trained once for both plans (not Table 2's ET-ASGD run).
    tables10_11 = load_plan("sweeps/sb_sm_tables10_11.yaml")
    assert robust.out == tables10_11.out
    [mos] = robust.experiments
    [same_run] = [e for e in tables10_11.experiments if e.config == mos.config]
    assert mos.overrides == same_run.overrides == ("train.asgd_trigger=nt",) and mos.seeds == same_run.seeds == (28,)
    assert [a.args for a in mos.analyses] == [("--robustness",)]
    # SM Tables 10/11's ET-ASGD column is one run per row, the authors' seed: the report reads
    # only those of Table 2's 11 seeds (it pooled all 11 into a mean before).
    [report] = [r for r in tables10_11.reports if r.startswith("table ")]
    only = report.split("--only train.seed=")[1].split()[0].split(",")
    table2_seeds = [e.seeds for p in ("ptb", "wt2") for e in load_plan(f"sweeps/sb_table2_{p}.yaml").experiments]
    assert {int(s) for s in only} == {seeds[0] for seeds in table2_seeds}
    assert not {int(s) for s in only} & {s for seeds in table2_seeds for s in seeds[1:]}


@pytest.fixture(scope="module")
def plan_data(small_data, shared_data_dir, tmp_path_factory) -> Path:
    """Tiny PTB (small_data, whose test split also holds the plans' top-5 contexts, [SB] SM Table
    2's 18, so that their words are in the vocabulary) and the first lines of WikiText-2. PTB's
    valid and test text is read twice over, so that each split outruns the cache's window of 500
    positions and the plans' --cache evaluations use it (evaluate.py refuses a cache that a split
    too short would never use)."""
    from analysis.commands import build_parser
    top5_contexts = dict.fromkeys(context for plan in PLANS for arguments in load_plan(plan).report_commands()
                                  if arguments[0] == "top5" for context in build_parser().parse_args(arguments).contexts)
    root = tmp_path_factory.mktemp("plan-data")
    (root / "ptb").mkdir()
    for split in ("train", "valid", "test"):
        text = (small_data / "ptb" / f"{split}.txt").read_text(encoding="utf-8")
        text = text if split == "train" else text * 2
        if split == "test":
            text += "".join(f" {context.replace(' <eos> ', chr(10) + ' ')}\n" for context in top5_contexts)
        (root / "ptb" / f"{split}.txt").write_text(text, encoding="utf-8")
    copy_first_lines(shared_data_dir / "wikitext-2", root / "wikitext-2",
                     {"train": 12, "valid": 5, "test": 5})
    return root


def in_process(command, env=None, log=None, account=None) -> int:
    """run_command in this process, with its CPU-time line in `account` (what report.py cost reads)."""
    script = {"train.py": train, "evaluate.py": evaluate, "rank.py": rank}[Path(command[1]).name]
    started, wall = resource.getrusage(resource.RUSAGE_SELF), time.time()
    code = script.main(command[2:])
    ended = resource.getrusage(resource.RUSAGE_SELF)
    used = SimpleNamespace(ru_utime=ended.ru_utime - started.ru_utime, ru_stime=ended.ru_stime - started.ru_stime)
    accounts = [account] if account is None or isinstance(account, Path) else list(account)
    for path in accounts:
        launch_runs.record_cpu_time(path, command, used, wall, share=len(accounts))
    return code


# How small each plan is made: enough runs for its reports (a correlation needs 3 points).
LIMITS = {"sb_figure2_gss_ptb": 3, "sb_figure2_gss_wt2": 3, "sb_sm_tables4_5": 2}


def small_plan_options(plan: Path, plan_data: Path) -> list[str]:
    """The sweep's options that make `plan` tiny: a tiny model on the plan data, one epoch, the
    first run(s) of each experiment. A key the plan varies (the CPU plans' model.emsize, which
    nhidlast follows) keeps the plan's values."""
    loaded = load_plan(plan)
    varied = {key for e in loaded.experiments for key, _ in e.grid}
    tiny = [o for o in TINY if o.split("=", 1)[0] not in varied]
    tiny += ["model.nhidlast=null"] if "model.emsize" in varied else []
    return [f"data.data_dir={plan_data}", *tiny, "train.epochs=1", "train.small_batch_size=null",
            "--limit", str(LIMITS.get(plan.stem, 1))]


@pytest.fixture(scope="module")
def trained_alone() -> dict[str, Path]:
    """plan stem -> the --out folder where the end-to-end test trained it (small_plan_options, no
    --group), for the grouped test to compare against instead of training it again."""
    return {}


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.stem)
def test_every_plan_runs_end_to_end_with_its_reports(plan, plan_data, trained_alone, tmp_path, monkeypatch,
                                                     capsys):
    monkeypatch.setattr(launch_runs, "run_command", in_process)
    # Eager kernels (the compiled ones compute the same and are tested on their own): compiling
    # them would cost most of this test's time.
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)
    loaded = load_plan(plan)
    runs = tmp_path / "runs"
    small = small_plan_options(plan, plan_data)
    # The plans whose reports read other plans' runs get those (small) runs too.
    needs = {"sb_sm_tables10_11": ["sb_table2_ptb", "sb_table2_wt2"],
             "sb_sm_tables4_5": ["sb_sm_tables10_11"],
             "sb_sm_table12": ["sb_sm_tables10_11", "sb_sm_tables4_5"]}.get(plan.stem, [])
    for other in needs:
        assert sweep.main([f"sweeps/{other}.yaml", *small, "--out", str(runs / other)]) == 0
    out = runs / loaded.out.name
    assert sweep.main([str(plan), *small, "--out", str(out)]) == 0
    trained_alone[plan.stem] = out
    planned = launch_runs.plan_runs(loaded.experiments, out, small[:-2], None, LIMITS.get(plan.stem, 1))
    assert planned
    finetuned, waiting = launch_runs.finetune_runs(planned)
    assert not waiting and len(finetuned) == sum(bool(e.finetune_best) for e in loaded.experiments)
    for run in planned + finetuned:        # trained, evaluated, and each analysis wrote its result
        for result in ("best.pt", "eval_best.json", *(a.result for a in run.analyses)):
            assert (run.dir / result).is_file(), (run.dir, result)
    capsys.readouterr()
    if not loaded.reports:      # its runs are another plan's to report (it says which), and --report says so
        assert sweep.main([str(plan), "--report", "--out", str(out)]) == 2
        assert "the plan has no report: section" in capsys.readouterr().err
        return
    assert sweep.main([str(plan), "--report", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for arguments in loaded.report_commands(out):
        assert f"+ python report.py {shlex.join(arguments)}" in printed
        written = Path(arguments[arguments.index("--out") + 1])
        assert list(written.parent.glob(written.name + "*")), arguments   # PREFIX.md, .png, ...


CPU_PLANS = sorted(Path("sweeps").glob("cpu_*.yaml"))
TIMES = ("seconds", "cpu_seconds", "cpu_s", "wall_s", "user_s", "sys_s", "started")


def results_without_times(run_dir: Path, root: Path) -> dict:
    """A run directory's result files (metrics, evaluations, ranks) as data, their timings left
    out and the sweep's folder `root` taken out of the paths they name."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMES}
        if isinstance(value, str):
            return value.replace(str(root), "ROOT")
        return [strip(v) for v in value] if isinstance(value, list) else value
    found = {}
    for path in sorted(run_dir.rglob("*.json*")):
        if path.name in ("run.json", "group_exit.json", "cpu_times.jsonl"):
            continue
        lines = path.read_text(encoding="utf-8").splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        found[str(path.relative_to(run_dir))] = [strip(json.loads(line)) for line in lines]
    return found


@pytest.mark.parametrize("plan", CPU_PLANS, ids=lambda p: p.stem)
def test_the_cpu_plans_trained_in_groups_give_the_result_files_of_their_runs_alone(
        plan, plan_data, trained_alone, tmp_path, monkeypatch, capsys):
    """sweep.py --group 3 on a CPU plan at the end-to-end test's size (the finetuning stage where
    it has one): the runs of one shape train in groups, and every result file is the one the
    end-to-end test's runs alone wrote (trained here when that test did not run first)."""
    monkeypatch.setattr(launch_runs, "run_command", in_process)
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)      # eager kernels, as above
    small = small_plan_options(plan, plan_data)
    alone = trained_alone.get(plan.stem)
    if alone is None:
        alone = tmp_path / "alone"
        assert sweep.main([str(plan), *small, "--out", str(alone)]) == 0
    capsys.readouterr()
    grouped = tmp_path / "grouped"
    planned = launch_runs.plan_runs(load_plan(plan).experiments, grouped, small[:-2], None, int(small[-1]))
    together = {run.dir.relative_to(grouped) for item in in_groups(planned, 3) if len(item) > 1 for run in item}
    assert together                         # the runs of one shape the sweep groups (3 at a time)
    assert sweep.main([str(plan), *small, "--out", str(grouped), "--group", "3"]) == 0
    assert "runs as one group" in capsys.readouterr().out
    runs = sorted(p.parent.relative_to(grouped) for p in grouped.rglob("eval_best.json"))
    assert runs == sorted(p.parent.relative_to(alone) for p in alone.rglob("eval_best.json")) and runs
    assert {run for run in runs if (grouped / run / "group_exit.json").is_file()} >= together
    for run in runs:
        assert results_without_times(grouped / run, grouped) == results_without_times(alone / run, alone), run


def test_a_rerun_plan_skips_what_is_done(plan_data, tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(launch_runs, "run_command", lambda c, env=None, log=None, account=None: calls.append(c) or in_process(c))
    argv = ["sweeps/sb_table5_ptb.yaml", f"data.data_dir={plan_data}", *TINY, "train.epochs=1",
            "--seeds", "4", "--limit", "1", "--out", str(tmp_path / "t5")]
    assert sweep.main(argv) == 0
    assert [Path(c[1]).name for c in calls] == ["train.py", "evaluate.py"] * 3
    calls.clear()
    assert sweep.main(argv) == 0
    assert calls == [] and "3 skipped" in capsys.readouterr().out


def test_a_plan_whose_runs_are_in_its_folder_says_what_it_skipped_and_how_to_train_them_again(
        monkeypatch, capsys):
    """A fresh clone's CPU plan, as the README ran it, trains nothing (its results are committed in
    its folder): the sweep says so and names --out, for real and in a dry run."""
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", lambda command, *rest, **options: commands.append(command))
    note = ("16 planned runs and 2 finetunings skipped: finished and evaluated in results/cpu_ptb "
            "already; another folder (--out DIR) trains them again there")
    assert sweep.main(["sweeps/cpu_seven_heads.yaml", "--jobs", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["sweep: 18 skipped", note]
    assert sweep.main(["sweeps/cpu_seven_heads.yaml", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [f"# {note}", "# 16 runs planned"]
    assert sweep.main(["sweeps/cpu_seven_heads.yaml", "--train-only", "--limit", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == ("7 planned runs skipped: finished and evaluated "
                                                        "in results/cpu_ptb already; another folder "
                                                        "(--out DIR) trains them again there")
    assert commands == []


def documented_plan_commands() -> list[tuple[str, str]]:
    """(page, command) for each `python sweep.py sweeps/...` line of the README's and
    docs/sweeps.md's code blocks that trains (no --dry-run, --report or --mode slurm). The plan
    of the recipe "Adding an experiment" (sweeps/cpu_d8.yaml) exists once the recipe is followed:
    tests/test_adding_an_experiment.py runs its lines in a copy that follows it."""
    found = []
    for page in ("README.md", "docs/sweeps.md"):
        blocks = re.findall(r"```bash\n(.*?)```", Path(page).read_text(encoding="utf-8"), re.S)
        for line in "".join(blocks).splitlines():
            command = line.split("  #")[0].strip()
            if command.startswith("python sweep.py sweeps/") and not re.search(
                    r"--dry-run|--report|--mode slurm", command):
                if command.startswith("python sweep.py sweeps/cpu_d8.yaml") and not Path("sweeps/cpu_d8.yaml").exists():
                    continue
                found.append((page, command))
    return found


def committed(folder: Path) -> bool:
    """Whether git tracks files in `folder` (without git: whether it exists)."""
    try:
        return bool(subprocess.run(["git", "ls-files", "--", str(folder)], capture_output=True, text=True,
                                   check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return folder.exists()


@pytest.mark.parametrize("page, command", documented_plan_commands())
def test_a_documented_plan_command_trains_in_a_folder_of_its_own(page, command, tmp_path, capsys):
    """A plan whose folder holds its committed results (results/cpu_*) trains nothing there, and a
    smoke test of a plan must not leave its runs in the plan's folder: each documented command
    that trains a plan either runs in a folder where nothing is committed, or gives --out."""
    arguments = shlex.split(command)[2:]
    plan = load_plan(arguments[0])
    if "--out" not in arguments:
        assert not committed(plan.out), f"{page}: {command}: {plan.out} is committed; give --out"
        assert "--limit" not in arguments, f"{page}: {command}: a smoke test; give it an --out of its own"
        return
    out = arguments[arguments.index("--out") + 1]
    assert Path(out) != plan.out and out.startswith("runs/"), f"{page}: {command}"
    arguments[arguments.index("--out") + 1] = str(tmp_path / out)        # what it would do there
    assert sweep.main([*arguments, "--dry-run"]) == 0
    titles = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# [")]
    assert titles and all(title.endswith(": new") or ": new (run.max_steps=" in title for title in titles), titles


def test_a_plan_goes_to_slurm_as_one_array(tmp_path, capsys):
    assert sweep.main(["sweeps/sb_figure2_gss_wt2.yaml", "--mode", "slurm", "--dry-run",
                       "--out", str(tmp_path / "grid")]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --array=0-35\n" in script
    exec_line = script.strip().splitlines()[-1]
    assert "sweeps/sb_figure2_gss_wt2.yaml" in exec_line and "--task" in exec_line


@pytest.mark.parametrize("text, message", [
    ("title: t\nout: o\nexperiments: []\n", "experiments: expected a non-empty list"),
    ("title: t\nout: o\nexperiment: []\nexperiments: [{config: configs/ptb/softmax.yaml}]\n",
     "unknown key 'experiment'"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/nope.yaml}]\n",
     "experiments[0].config: expected an existing config file"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, seeds: [1, two]}]\n",
     "experiments[0].seeds: expected a list of integers"),
    ("title: t\nout: o\nseeds: [1, two]\nexperiments: [{config: configs/ptb/softmax.yaml}]\n",
     ": seeds: expected a list of integers"),             # the plan's own seeds: named as such
    ("title: t\nout: o\nrank: --contexts 5\nexperiments: [{config: configs/ptb/softmax.yaml}]\n",
     "rank: expected a list of strings"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, grid: {head.k: 2}}]\n",
     "experiments[0].grid: expected a mapping of keys to non-empty lists"),
    ("title: t\ntitle: u\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\n",
     "key 'title' is written twice"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, overrides: [train.nope=1]}]\n",
     "unknown key train.nope"),
    ("title: t\nout: o\noverrides: train.epochs=3\nexperiments: [{config: configs/ptb/softmax.yaml}]\n",
     "overrides: expected a list of strings"),
    ("title: t\nout: o\noverrides: [train.nope=1]\nexperiments: [{config: configs/ptb/softmax.yaml}]\n",
     "experiments[0]: override 'train.nope=1': unknown key train.nope"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, grid: {head.init_tua: [1]}}]\n",
     "experiments[0].grid: override 'head.init_tua=1': unknown key head.init_tua (the softmax head takes no keys)"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, grid: {train.lr: [20, abc]}}]\n",
     "experiments[0].grid: override 'train.lr=abc': train.lr: expected a finite float32 number"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\nreport: ['tabel {out} --out x']\n",
     "report command 'tabel {out} --out x': report.py: error: argument command: invalid choice: 'tabel'"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\nreport: ['table {out}']\n",
     "report command 'table {out}': report.py table: error: the following arguments are required: --out"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\n"
     "report: ['curves {out} --out x --group-by']\n",
     "report.py curves: error: argument --group-by: expected one argument"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, finetune_best: [a]}]\n",
     "experiments[0].finetune_best: expected a mapping with overrides and evaluate"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, finetune_best: {epochs: 3}}]\n",
     "experiments[0].finetune_best.epochs: expected one of evaluate, overrides"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, "
     "finetune_best: {overrides: [run.dir=x]}}]\n",
     "finetune_best.overrides: expected no run.dir or train.init_from (the finetuning sets them)"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, evaluate: --cache}]\n",
     "experiments[0].evaluate: expected a list of strings"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, evaluate: ['--batch-size 5']}]\n",
     "experiments[0].evaluate: expected option lists naming --cache, --cache-search or --dynamic, "
     "got '--batch-size 5'"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, "
     "finetune_best: {evaluate: ['--json']}}]\n",
     "experiments[0].finetune_best.evaluate: expected option lists naming --cache"),
    # what sweep.py's command line would refuse as a flag is named in the plan's terms
    ("title: t\nout: o\nseeds: [1, 2, 2]\nexperiments: [{config: configs/ptb/softmax.yaml}]\n",
     ": seeds: expected distinct seeds (`config` is the config's own seed, 141 here), got [1, 2, 2]"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, seeds: [config, 141]}]\n",
     "experiments[0].seeds: expected distinct seeds (`config` is the config's own seed, 141 here)"),
    ("title: t\nout: o\noverrides: [train.seed=5]\nexperiments: [{config: configs/ptb/softmax.yaml}]\n",
     ": overrides: expected no train.seed (the sweep sets it"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, overrides: [run.dir=x]}]\n",
     "experiments[0].overrides: expected no run.dir (the sweep sets it"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, overrides: [train.lr=10], "
     "grid: {train.lr: [5, 10]}}]\n",
     "experiments[0].overrides: expected no key the grid of experiments[0] also sets (train.lr: keep one)"),
    # an experiment given twice: named with its plan and the run directory the two would share
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}, {config: configs/ptb/softmax.yaml}]\n",
     "two planned runs get the same run directory, o/ptb-softmax-seed141 (an experiment or a grid value given twice?)"),
    # rank.py's and evaluate.py's options, checked at load: a typo found after the training was paid
    ("title: t\nout: o\nrank: [--contxts, '500']\nexperiments: [{config: configs/ptb/softmax.yaml}]\n",
     "rank: expected options rank.py takes (rank.py: unrecognized arguments: --contxts 500)"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, robustness: [--keep, many]}]\n",
     "experiments[0].robustness: expected options rank.py takes (rank.py: argument --keep: invalid int value"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, evaluate: ['--cache --cache-windw 5']}]\n",
     "experiments[0].evaluate: expected options evaluate.py takes (evaluate.py: unrecognized arguments: "
     "--cache-windw 5)"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml, "
     "finetune_best: {evaluate: ['--dynamic --cache-theta 1']}}]\n",
     "finetune_best.evaluate: expected options evaluate.py takes (evaluate.py: --cache-theta belongs to --cache)"),
    # a report command's placeholders, quotes and config keys, checked before anything runs
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\nreport: ['table {outt} --out x']\n",
     "report command 'table {outt} --out x': unknown placeholder {outt} (the placeholders are {out} and {runs})"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\nreport: ['table {out --out x']\n",
     "expected '}' before end of string (a brace is written {{ or }} outside the placeholders"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\n"
     "report: ['table {out} --out x --only \"head.name=softmax']\n",
     "No closing quotation (a quote opened and not closed)"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\n"
     "report: ['table {out} --out x --only modle.emsize=8']\n",
     "--only modle.emsize: not a config key of any of the plan's runs"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\n"
     "report: ['versus {out} --key model.emsze --out x']\n",
     "--key model.emsze: not a config key of any of the plan's runs"),
    ("title: t\nout: o\nexperiments: [{config: configs/ptb/softmax.yaml}]\n"
     "report: ['curves {out} --out x --group-by head.components']\n",    # MoS's key, no run of this plan's
     "--group-by head.components: not a config key of any of the plan's runs"),
])
def test_a_bad_plan_is_one_line(text, message, tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(text, encoding="utf-8")
    assert is_plan(plan)
    assert sweep.main([str(plan), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {plan}: ") and "\n" not in err and message in err, err


@pytest.mark.parametrize("extra", [[], ["--out", "elsewhere"], ["--dry-run"]])
def test_a_misspelled_top_level_key_is_named_with_the_valid_ones_before_anything_else(extra, tmp_path,
                                                                                      capsys):
    """Not "--out: give the folder" (taken for a config), nor "unknown section 'title'": every
    top-level key of a plan is checked, and the misspelled one named first."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"title: t\nout: {tmp_path / 'o'}\nexperimnts:\n  - config: configs/ptb/softmax.yaml\n",
                    encoding="utf-8")
    assert sweep.main([str(plan), *[str(tmp_path / e) if e == "elsewhere" else e for e in extra]]) == 2
    assert capsys.readouterr().err == (f"error: {plan}: unknown key 'experimnts' (valid: experiments, "
                                       f"out, overrides, rank, report, robustness, seeds, title)\n")
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "o").exists()


def test_plan_options_and_config_options_do_not_mix(capsys):
    with pytest.raises(SystemExit):
        sweep.main(["sweeps/sb_table5_ptb.yaml", "--grid", "train.lr=1,2"])
    assert "is a plan, which names its own grids" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["configs/ptb/softmax.yaml", "--report", "--out", "x"])
    assert "--report runs a plan's report commands" in capsys.readouterr().err
    assert sweep.main(["sweeps/gpu_converged_seeds.yaml", "--report", "--out", "x"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: sweeps/gpu_converged_seeds.yaml: the plan has no report: section, so --report has nothing to run")
    with pytest.raises(LaunchError, match="plan file not found"):
        load_plan("sweeps/nope.yaml")
    # a plan without the second stage: said (it printed "sweep: no runs")
    assert sweep.main(["sweeps/sb_sm_table12.yaml", "--finetune-only", "--out", "x"]) == 2
    assert capsys.readouterr().err.strip() == ("error: sweeps/sb_sm_table12.yaml: --finetune-only runs a plan's "
                                               "finetune_best stage, and no experiment of this plan has one")


def test_dry_run_names_every_run_of_a_plan(capsys):
    assert sweep.main(["sweeps/sb_sm_table12.yaml", "--dry-run"]) == 0
    titles = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# [")]
    names = [line.split(": ")[0].rsplit("/", 1)[1] for line in titles]
    assert names == ["ptb-mos-head.dropoutl=0.145-seed28", "ptb-mos-head.dropoutl=0.0-seed28",
                     "wikitext-2-mos-head.dropoutl=0.145-seed1881",
                     "wikitext-2-mos-head.dropoutl=0.0-seed1881"]


def test_a_plans_overrides_reach_every_run_before_the_experiments_own(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("title: t\nout: o\noverrides: [train.epochs=7, train.lr=3]\nexperiments:\n"
                    "  - config: configs/ptb/softmax.yaml\n"
                    "  - config: configs/ptb/mos.yaml\n    overrides: [train.lr=5]\n", encoding="utf-8")
    runs = plan_runs(load_plan(plan).experiments, tmp_path / "out")
    assert [(r.config.train.epochs, r.config.train.lr) for r in runs] == [(7, 3.0), (7, 5.0)]


def test_an_experiments_evaluate_options_run_on_each_of_its_runs_before_rank(tmp_path):
    """`evaluate:` adds evaluate.py with each option list to every run of that experiment (its
    own result file each), not to the other experiments' runs."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("title: t\nout: o\nseeds: [1, 2]\nrank: []\nexperiments:\n"
                    "  - config: configs/ptb/softmax.yaml\n    evaluate: [--cache, '--dynamic --dynamic-lr 1e-4']\n"
                    "  - config: configs/ptb/mos.yaml\n", encoding="utf-8")
    runs = plan_runs(load_plan(plan).experiments, tmp_path / "out")
    assert [[(a.script, a.args, a.result) for a in r.analyses] for r in runs] == [
        [("evaluate", ("--cache",), "eval_best_cache.json"),
         ("evaluate", ("--dynamic", "--dynamic-lr", "1e-4"), "eval_best_dynamic.json"),
         ("rank", (), "rank_test.json")]] * 2 + [[("rank", (), "rank_test.json")]] * 2


def test_finetune_best_finetunes_the_run_with_the_best_validation_ppl_and_evaluates_it(
        plan_data, tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(launch_runs, "run_command", lambda c, env=None, log=None, account=None: calls.append(c) or in_process(c))
    plan = tmp_path / "plan.yaml"
    plan.write_text("title: t\nout: o\nseeds: [1, 2, 3]\nexperiments:\n"
                    "  - config: configs/ptb/softmax.yaml\n"
                    "    finetune_best: {overrides: [train.epochs=2], evaluate: ['--cache --cache-window 20']}\n",
                    encoding="utf-8")
    out = tmp_path / "runs"
    argv = [str(plan), f"data.data_dir={plan_data}", *TINY, "train.epochs=1", "--out", str(out)]
    assert sweep.main([*argv, "--dry-run"]) == 0
    assert "# then finetuning the best of 3 configs/ptb/softmax.yaml runs: waits for 3 of them" \
        in capsys.readouterr().out
    # --train-only with --seeds: the first seed now, no finetuning of the best of one run
    assert sweep.main([*argv, "--seeds", "1", "--train-only"]) == 0
    assert (out / "ptb-softmax-seed1" / "eval_best.json").is_file()
    assert not any(out.glob("*/finetune")) and "not run:" not in capsys.readouterr().out
    assert sweep.main(argv) == 0                   # the other seeds, then the best of all three
    val = {s: json.loads((out / f"ptb-softmax-seed{s}" / "eval_best.json").read_text())["val_ppl"]
           for s in (1, 2, 3)}
    best = min(val, key=val.get)
    finetuned = out / f"ptb-softmax-seed{best}" / "finetune"
    assert [s for s in (1, 2, 3) if (out / f"ptb-softmax-seed{s}" / "finetune").exists()] == [best]
    saved = yaml.safe_load((finetuned / "config.yaml").read_text())
    assert saved["train"]["init_from"] == str(out / f"ptb-softmax-seed{best}" / "best.pt")
    assert (saved["train"]["asgd_trigger"], saved["train"]["early_stop_nonmono"], saved["train"]["epochs"]) \
        == ("start", True, 2)
    cache = json.loads((finetuned / "eval_best_cache.json").read_text())
    assert cache["method"] == "cache" and cache["settings"]["window"] == 20
    assert (finetuned / "eval_best.json").is_file()
    assert [Path(c[1]).name for c in calls[-3:]] == ["train.py", "evaluate.py", "evaluate.py"]
    calls.clear()
    assert sweep.main(argv) == 0                   # done: nothing runs again
    assert calls == []
    # --finetune-only: the second stage alone, once the first stage's runs are all evaluated
    (out / f"ptb-softmax-seed{best}" / "finetune" / "eval_best_cache.json").unlink()
    (out / "ptb-softmax-seed1" / "eval_best.json").touch()      # stays fresh: nothing to redo
    capsys.readouterr()
    assert sweep.main([*argv, "--finetune-only", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "# [finetune 1/1]" in printed and "# [1/3" not in printed
    assert printed.strip().splitlines()[-1] == "# 1 finetuning run planned"
    assert sweep.main([*argv, "--finetune-only"]) == 0
    assert [Path(c[1]).name for c in calls] == ["evaluate.py"] and "--cache" in calls[0]
    # an evaluation older than its best.pt (files copied without their times, say) is named
    evaluated = out / "ptb-softmax-seed2" / "eval_best.json"
    os.utime(evaluated, (evaluated.stat().st_mtime - 60,) * 2)
    capsys.readouterr()
    # nothing to finetune: exit 2 (a job chained after the first stage's array can tell), one line
    assert sweep.main([*argv, "--finetune-only", "--dry-run"]) == 2
    assert capsys.readouterr().err == (
        "error: --finetune-only: nothing to finetune: finetuning the best of 3 configs/ptb/softmax.yaml runs: "
        "waits for 1 of them to be trained and evaluated (ptb-softmax-seed2: eval_best.json is older than "
        "best.pt; run evaluate.py again)\n")
    # The runs' result files without their checkpoints (a fresh clone of committed results): the
    # best run is still the best, and the finetuning says it has nothing to start from.
    evaluated.touch()
    shutil.rmtree(finetuned)
    for checkpoint in out.glob("*/*.pt"):
        checkpoint.unlink()
    calls.clear()
    capsys.readouterr()
    assert sweep.main([*argv, "--finetune-only"]) == 2
    assert calls == [] and not finetuned.exists()
    assert (f"finetuning the best of 3 configs/ptb/softmax.yaml runs: the best, "
            f"ptb-softmax-seed{best}, has its result files but no best.pt to finetune; copy its "
            f"checkpoints back in, or move its directory away and train it again") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["configs/ptb/softmax.yaml", "--finetune-only", "--out", "x"])
    assert "--finetune-only is about a plan's finetune_best stage" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main([str(plan), "--train-only", "--finetune-only"])
    assert "--train-only and --finetune-only: give one" in capsys.readouterr().err


def test_a_failing_report_does_not_stop_the_others(tmp_path, capsys):
    """A plan in progress reports what its finished runs allow: `methods` fails before any run
    is finetuned, the table and curves after it are still written, and the exit code says so."""
    out = tmp_path / "runs"
    run = Path("results/cpu_ptb_moc/ptb-moc-head.components=1-seed1")
    shutil.copytree(run, out / run.name)
    plan = tmp_path / "plan.yaml"
    plan.write_text("title: t\nout: o\nexperiments: [{config: configs/ptb_mini/moc.yaml}]\nreport:\n"
                    "  - table {out} --out {out}/report/first\n"
                    "  - methods {out} --out {out}/report/methods\n"
                    "  - curves {out} --out {out}/report/last\n", encoding="utf-8")
    assert sweep.main([str(plan), "--report", "--out", str(out)]) == 2
    assert (out / "report" / "first.md").is_file() and (out / "report" / "last.md").is_file()
    assert not (out / "report" / "methods.md").exists()
    err = capsys.readouterr().err
    assert "error: 1 of the plan's 3 reports failed (methods); the others were written" in err
    # a plan with no finished run: every report fails, and the last line does not claim others
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sweep.main([str(plan), "--report", "--out", str(empty)]) == 2
    printed = capsys.readouterr()
    assert "error: 3 of the plan's 3 reports failed (table, methods, curves); none was written" in printed.err
    # and it says which of the plan's runs are not there yet (a newcomer read the reports as the plan)
    assert (f"note: 1 of the plan's 1 runs are not in these reports yet (not trained, evaluated and ranked "
            f"in {empty}): ptb-moc-seed1") in printed.out


def test_a_dry_run_piped_into_head_ends_without_a_traceback():
    """A newcomer's `sweep.py PLAN --dry-run | head -3` printed a BrokenPipeError traceback. Here
    the reader is gone before the first line (a pipe whose reading end is closed), so every write
    fails as head's going away makes it: one quiet exit, 141 as a Unix tool ends there."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "sweep.py", "sweeps/cpu_converged_heads.yaml", "--dry-run"],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                                cwd=Path(__file__).resolve().parents[1])
    finally:
        os.close(write_end)
    assert result.returncode == 141 and result.stderr == "", result.stderr


def test_a_documented_plan_group_names_the_plans_run_count():
    """docs/sweeps.md's "a plan (N runs) as one group" line: N, and its --group N, are the plan's
    run count today (the plan grew from 18 to 21 runs and the line stayed at 18)."""
    from launch.runs import plan_runs
    repo = Path(__file__).resolve().parent.parent
    text = (repo / "docs" / "sweeps.md").read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if "# a plan (" in line)
    plan_path, group, count = re.search(r"sweep\.py (\S+) --group (\d+) .*# a plan \((\d+) runs\)", line).groups()
    plan = load_plan(repo / plan_path)
    runs = plan_runs(plan.experiments, Path(plan.out), [], None, None)
    assert int(group) == int(count) == len(runs), line
