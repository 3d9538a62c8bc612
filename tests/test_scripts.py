"""The per-row launch scripts: thin wrappers that train, evaluate and rank one run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROW_SCRIPTS = sorted(Path("scripts").glob("*_*.sh"))


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
