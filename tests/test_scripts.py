"""The per-row launch scripts: thin wrappers that train, evaluate and rank one run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROW_SCRIPTS = sorted(p for p in Path("scripts").glob("*_*.sh") if p.stem.split("_")[0] in ("ptb", "wt2", "run"))


def test_every_table_row_of_sb_has_a_script():
    """The 14 rows of [SB] Table 2 (with Table 3's frozen PLIF and MoC) and Mixtape have a thin
    script each; any other config runs with scripts/run_row.sh CONFIG, so a new head needs no script."""
    rows = {p.stem for p in ROW_SCRIPTS if p.stem != "run_row"}
    assert rows >= {f"{d}_{h}" for d in ("ptb", "wt2")
                    for h in ("softmax", "ss", "gss", "plif", "plif_frozen", "mos", "moc", "mixtape")}


@pytest.mark.parametrize("script", [p for p in ROW_SCRIPTS if p.stem != "run_row"], ids=lambda p: p.stem)
def test_every_row_script_is_a_thin_wrapper_of_run_row(script):
    text = script.read_text()
    dataset, config_name = script.stem.split("_", 1)
    assert f"configs/{dataset}/{config_name}.yaml" in text and "run_row.sh" in text
    assert Path(f"configs/{dataset}/{config_name}.yaml").is_file()
    assert os.access(script, os.X_OK)
    assert ("--contexts 33320" in text) == (dataset == "wt2")
    assert len([line for line in text.splitlines() if line and not line.startswith("#")]) <= 2


def test_a_row_script_trains_evaluates_ranks_and_resumes(ptb_slice, tmp_path):
    """The row script is sweep.py for one seed: the run directory is named by the one naming
    rule, and re-issuing the command skips what is done."""
    from experiment.run_directory import run_name
    from tests.conftest import TINY
    run_dir = tmp_path / run_name("ptb", Path("configs/ptb/softmax.yaml"), (), 7)
    env = dict(os.environ, PYTHON=sys.executable, RANK_ARGS="--contexts 50 --device cpu",
               OUT=str(tmp_path))
    args = ["bash", "scripts/ptb_softmax.sh", "7", f"data.data_dir={ptb_slice}", *TINY,
            "train.epochs=1"]
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run_dir / "eval_best.json").read_text())["test_ppl"] > 1
    assert json.loads((run_dir / "rank_test.json").read_text())["contexts"] == 50
    config = (run_dir / "config.yaml").read_text()
    assert "seed: 7" in config
    # Issued again, the run is finished, evaluated and ranked: nothing is run again.
    again = subprocess.run(args, capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr
    assert "finished and evaluated: skip" in again.stdout and "1 skipped" in again.stdout


def test_a_row_script_without_torch_says_how_to_get_it_in_one_line(tmp_path):
    """A fresh clone without scripts/setup.sh's .venv falls back to python3; one that cannot
    import torch is one line and exit 2, not a traceback from sweep.py."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    proc = subprocess.run(["bash", "scripts/ptb_softmax.sh", "7"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHON=str(python), OUT=str(tmp_path / "runs")))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: {python} cannot import torch: run scripts/setup.sh first (it makes .venv, "
                           f"which this script uses), or set PYTHON=/path/to/python\n")
    assert not (tmp_path / "runs").exists()


def test_setup_refuses_a_python_older_than_the_default_torch_needs_in_one_line(tmp_path):
    """A venv whose python is older than 3.10 (a stand-in that fails the version check): one line,
    exit 2, nothing installed."""
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    stub = venv / "bin" / "python"
    stub.write_text(f'#!/usr/bin/env bash\ncase "$2" in *version_info*) exit 1;; esac\necho "$@" >> {log}\n')
    stub.chmod(0o755)
    env = dict(os.environ, VENV=str(venv))
    env.pop("TORCH_SPEC", None)
    proc = subprocess.run(["bash", "scripts/setup.sh"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and not log.exists()
    assert proc.stderr.count("\n") == 1 and "older than Python 3.10" in proc.stderr


@pytest.mark.parametrize("spec", [None, "torch==2.12.1"])
def test_setup_installs_the_torch_ci_tests_unless_told_and_says_what_it_installed(spec, tmp_path):
    """scripts/setup.sh with a stand-in venv whose python records pip's arguments (and runs the
    real interpreter for the final report)."""
    import torch
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    stub = venv / "bin" / "python"
    stub.write_text(f'#!/usr/bin/env bash\nif [ "$1" = -c ]; then exec {sys.executable} "$@"; fi\n'
                    f'echo "$@" >> {log}\n')
    stub.chmod(0o755)
    env = dict(os.environ, VENV=str(venv))
    env.pop("TORCH_SPEC", None)
    if spec:
        env["TORCH_SPEC"] = spec
    proc = subprocess.run(["bash", "scripts/setup.sh"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    installs = [line.split()[4:] for line in log.read_text().splitlines()
                if line.startswith("-m pip install -q")]
    assert installs[1] == [spec or "torch==2.13.0"] and installs[2] == ["-r", "requirements.txt"]
    cuda = torch.version.cuda or "none (a CPU build)"
    assert proc.stdout.strip().splitlines()[-1] == (
        f"installed torch {torch.__version__}, built for CUDA {cuda}; "
        f"a CUDA GPU usable here: {torch.cuda.is_available()}")


def test_the_gpu_group_script_runs_end_to_end_on_the_cpu(small_data, tmp_path):
    """scripts/gpu_group_check.sh, prepared for a short GPU window, checked here with FAST=1 (tiny
    shapes on the CPU): its files, each part's result, no checkpoint in the archive."""
    import tarfile
    out = tmp_path / "out"
    env = dict(os.environ, FAST="1", OUT=str(out), PYTHON=sys.executable, OMP_NUM_THREADS="1",
               EXTRA=f"data.data_dir={small_data} data.allow_modified_corpus=true")
    proc = subprocess.run(["bash", "scripts/gpu_group_check.sh"], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench_group.txt", "env.txt", "gpu_check.txt", "plan_steps.txt", "profile.txt",
                     "runs.tar.gz", "train_group8.txt", "train_solo.txt"]      # 8: all the device tool brings back
    assert (out / "gpu_check.txt").read_text().strip().endswith("\n10 of 10 checks passed")  # group 3 x 3, lstm 1
    table = (out / "bench_group.txt").read_text()
    assert "| 2 | " in table and table.count("| 2 | ") == 4       # the default, streams, batched, per_member
    assert [line.rsplit(": ", 1)[1] for line in table.splitlines() if "the grouped LSTM's products:" in line] == \
        ["by_shape", "streams", "batched", "per_member"]
    assert "as one group:" in (out / "plan_steps.txt").read_text()
    profiled = (out / "profile.txt").read_text()
    assert "step of a group of 2" in profiled and "self_cpu_time_total" in profiled
    products = profiled[profiled.index("| G | as computed"):]
    assert [row.split(" | ")[0] for row in products.splitlines()[2:4]] == ["| 1", "| 2"]
    backward = profiled[profiled.index("the backward loop's product"):].splitlines()
    # batched, weights first, per member, the three splits, then streams ('-': CUDA only)
    assert all(len(row.split(" | ")) == 8 and row.endswith(" | - |") and " - " not in row[:-4]
               for row in [*products.splitlines()[2:4], *backward[3:5]])
    layers = profiled[profiled.index("| G | the group's recurrence"):].splitlines()
    assert [row.split(" | ")[0] for row in layers[2:4]] == ["| 1", "| 2"]
    assert all(row.endswith("| - (no CUDA) |") for row in layers[2:4])
    group_log = (out / "train_group8.txt").read_text()
    assert "group of 8 runs" in group_log and group_log.count(": done: ") == 8
    assert (out / "train_solo.txt").read_text().count("done: ") == 2
    with tarfile.open(out / "runs.tar.gz") as archive:
        names = archive.getnames()
    assert sum(n.endswith("metrics.jsonl") for n in names) == 10
    assert not any(n.endswith(".pt") for n in names)


def test_the_gpu_seeds_script_packs_the_finished_runs(small_data, tmp_path):
    """scripts/gpu_seeds.sh with FAST=1 on a plan of two runs: a job whose budget ends at once
    packs nothing and exits 0 (the next job carries on; sweep.py's stop and resume are
    tests/test_sweep_stop.py's), the next one trains the two as one group, evaluates and ranks
    them, and packs their result files without checkpoints."""
    import tarfile
    plan = tmp_path / "plan.yaml"
    plan.write_text("title: two seeds\nout: unused\nrank: [--contexts, '10000']\nexperiments:\n"
                    + "".join(f"  - config: configs/ptb_mini/{h}.yaml\n    seeds: [4]\n" for h in ("softmax", "mos")))
    env = dict(os.environ, FAST="1", PYTHON=sys.executable, OMP_NUM_THREADS="1", PLAN=str(plan),
               RUNS=str(tmp_path / "runs"), EXTRA=f"data.data_dir={small_data} data.allow_modified_corpus=true")

    def job(out: Path, budget: int) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "scripts/gpu_seeds.sh"], capture_output=True, text=True, timeout=900,
                              env=dict(env, OUT=str(out), BUDGET=str(budget)))
    first = job(tmp_path / "out1", 1)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "0 runs finished in this job (none), no seeds.tar.gz written" in first.stdout
    assert not (tmp_path / "out1" / "seeds.tar.gz").exists()
    second = job(tmp_path / "out2", 600)
    assert second.returncode == 0, second.stdout + second.stderr
    names = ["ptb-mos-seed4", "ptb-softmax-seed4"]
    assert f"2 runs finished in this job ({' '.join(names)}), packed in" in second.stdout
    assert sorted(p.name for p in (tmp_path / "out2").iterdir()) == ["env.txt", "seeds.tar.gz", "sweep.txt"]
    with tarfile.open(tmp_path / "out2" / "seeds.tar.gz") as archive:
        files = set(archive.getnames())
        info = json.loads(archive.extractfile(f"{names[0]}/run.json").read())
    for name in names:
        for result in ("config.yaml", "metrics.jsonl", "eval_best.json", "rank_test.json", "run.json",
                       "cpu_times.jsonl", "singular_values_test_logp.npy"):
            assert f"{name}/{result}" in files, (name, result)
    assert not any(f.endswith((".pt", "lock", "sweep.log")) for f in files)
    assert [Path(r).name for r in info["groups"][0]["runs"]] == sorted(names, reverse=True)   # plan order
    # a later job skips what is finished and packs nothing it did not train
    third = job(tmp_path / "out3", 600)
    assert third.returncode == 0 and "0 runs finished in this job (none), no seeds.tar.gz written" in third.stdout
    assert "skip" in (tmp_path / "out3" / "sweep.txt").read_text()
    # EXTRA comes after FAST's overrides, so a key it sets wins; DRY_RUN prints the plan and stops
    dry = subprocess.run(["bash", "scripts/gpu_seeds.sh"], capture_output=True, text=True, timeout=120,
                         env=dict(env, DRY_RUN="1", RUNS=str(tmp_path / "fresh"), EXTRA="train.epochs=3"))
    line = next(l for l in dry.stdout.splitlines() if "train.py" in l)
    assert dry.returncode == 0 and line.index("train.epochs=1") < line.index("train.epochs=3"), dry.stdout
    assert not (tmp_path / "fresh").exists()
    # bad settings: one line, exit 2, before anything runs
    for setting in ({"GROUP": "0"}, {"BUDGET": "abc"}):
        bad = subprocess.run(["bash", "scripts/gpu_seeds.sh"], capture_output=True, text=True, timeout=60,
                             env=dict(env, OUT=str(tmp_path / "bad"), **setting))
        name, value = next(iter(setting.items()))
        assert bad.returncode == 2 and bad.stderr.strip() == (
            f"gpu_seeds: error: {name} must be a whole number above 0, got '{value}'"), bad.stderr
    assert not (tmp_path / "bad").exists()


def test_row_scripts_take_a_users_out_an_empty_rank_args_and_say_their_usage(tmp_path):
    """A newcomer's --out was dropped (run_row.sh's own --out came last and won); RANK_ARGS= could
    not clear the WikiText-2 rows' --contexts; run_row.sh without arguments was bash's 'unbound
    variable'."""
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "env-out"))
    out = subprocess.run(["bash", "scripts/ptb_softmax.sh", "1", "--out", str(tmp_path / "mine"), "--dry-run"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0 and f"{tmp_path / 'mine'}/ptb-softmax-seed1" in out.stdout, out.stderr
    assert "env-out" not in out.stdout
    default = subprocess.run(["bash", "scripts/ptb_softmax.sh", "1", "--dry-run"], capture_output=True, text=True, env=env)
    assert f"{tmp_path / 'env-out'}/ptb-softmax-seed1" in default.stdout
    unset = {key: value for key, value in env.items() if key != "RANK_ARGS"}
    for row_env, contexts in ((unset, True), (dict(env, RANK_ARGS=""), False)):
        dry = subprocess.run(["bash", "scripts/wt2_softmax.sh", "1", "--dry-run"], capture_output=True, text=True,
                             env=row_env)
        line = next(l for l in dry.stdout.splitlines() if "rank.py" in l)
        assert ("--contexts 33320" in line) == contexts, line
    usage = subprocess.run(["bash", "scripts/run_row.sh"], capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: scripts/run_row.sh CONFIG [SEED]")


def test_the_gpu_scripts_check_budget_and_keep_fast_runs_out_of_the_results(tmp_path):
    """gpu_group_check.sh's BUDGET=abc was bash's 'unbound variable'; gpu_seeds.sh FAST=1 without
    RUNS trained tiny runs under the committed plan's real run names."""
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"))
    bad = subprocess.run(["bash", "scripts/gpu_group_check.sh"], capture_output=True, text=True, timeout=60,
                         env=dict(env, BUDGET="abc"))
    assert bad.returncode == 2 and bad.stderr == "gpu_group_check: error: BUDGET must be a whole number above 0, got 'abc'\n"
    assert not (tmp_path / "out").exists()
    dry = subprocess.run(["bash", "scripts/gpu_seeds.sh"], capture_output=True, text=True, timeout=120,
                         env=dict(env, FAST="1", DRY_RUN="1"))
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("gpu_seeds: FAST=1: the runs go to /")
    line = next(l for l in dry.stdout.splitlines() if "train.py" in l)
    assert "run.dir=results/" not in line and "run.dir=/" in line
