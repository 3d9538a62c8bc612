"""README's "Adding a head" recipe, followed to the letter in a copy of the repository: the new
head's file, its registry line and its two configs are taken from the README's code blocks, and
nothing else is edited. The generic head tests, the config tests and the training test then pick
the head up, `train.py --dry-run` resolves it, sweep.py (what the row scripts run) plans it and
a 3-step training run trains it."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NAME = "temperature"                      # the README's example head


def recipe() -> list[tuple[str, str]]:
    """(first line, code) of each fenced block in README's "Adding a head" section."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Adding a head\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:python|yaml)\n(.*?)```", section, re.S)
    return [(block.splitlines()[0], block) for block in blocks]


def follow_recipe(root: Path) -> None:
    registry_line = None
    for first, code in recipe():
        target = first.lstrip("# ").split(":")[0]
        if target == "model/heads/__init__.py":
            registry_line = code.splitlines()[1]
        else:
            assert not (root / target).exists(), target
            (root / target).write_text(code, encoding="utf-8")
    registry = root / "model/heads/__init__.py"
    text = registry.read_text(encoding="utf-8")
    start = text.index("HEADS: dict[str, type[OutputHead]] = {\n")
    end = text.index("\n}\n", start)                 # the new line goes last: tables keep their order
    assert registry_line is not None
    registry.write_text(text[:end + 1] + registry_line + text[end:], encoding="utf-8")


@pytest.fixture(scope="module")
def repo_with_new_head(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("extended") / "repo"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "runs", "corpora", "__pycache__", ".pytest_cache", "*.pyc"))
    follow_recipe(root)
    return root


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True)


def test_the_recipe_names_a_file_a_registry_line_and_two_configs():
    targets = [first for first, _ in recipe()]
    assert targets == [f"# model/heads/{NAME}.py", "# model/heads/__init__.py: one line at the end of HEADS",
                       f"# configs/ptb/{NAME}.yaml", f"# configs/wt2/{NAME}.yaml"]


def test_generic_tests_pick_up_the_new_head(repo_with_new_head, shared_data_dir):
    proc = run(repo_with_new_head, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
               "tests/test_heads.py", "tests/test_configs.py", "tests/test_heads_training.py",
               "-k", f"{NAME} or registry or label")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    passed = set(re.findall(r"^PASSED (\S+)", proc.stdout, re.M))
    for test in (f"test_heads.py::test_rows_are_distributions[{NAME}]",
                 f"test_heads.py::test_gradients_gradcheck_float64[{NAME}]",
                 f"test_heads.py::test_forward_computes_the_heads_plain_reference_with_its_gradients[train-{NAME}]",
                 f"test_heads.py::test_target_log_probs_equal_the_gathered_log_probs_with_gradients[{NAME}-False]",
                 f"test_heads.py::test_extreme_inputs_give_finite_log_probs[1.0-1e+30-{NAME}]",
                 "test_heads.py::test_every_head_has_its_own_label_and_a_config_per_dataset",
                 f"test_configs.py::test_every_config_resolves_and_builds[ptb/{NAME}]",
                 f"test_configs.py::test_every_config_resolves_and_builds[wt2/{NAME}]",
                 f"test_heads_training.py::test_a_resumed_run_equals_an_uninterrupted_one[{NAME}]"):
        assert f"tests/{test}" in passed, test


def test_dry_run_sweep_plan_and_three_training_steps_of_the_new_head(repo_with_new_head, small_data, tmp_path):
    from tests.conftest import TINY
    config = f"configs/ptb/{NAME}.yaml"
    dry = run(repo_with_new_head, "train.py", config, f"data.data_dir={small_data}", *TINY, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    summary = json.loads(dry.stdout.strip().splitlines()[-1])
    assert summary["head"] == NAME and summary["params"] > 0
    assert "tau: 2.0" in dry.stdout
    planned = run(repo_with_new_head, "sweep.py", config, f"data.data_dir={small_data}", *TINY,
                  "--seeds", "3", "--out", str(tmp_path / "runs"), "--rank", "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert f"ptb-{NAME}-seed3: new" in planned.stdout and "rank.py" in planned.stdout
    run_dir = tmp_path / "new-head"
    trained = run(repo_with_new_head, "train.py", config, f"data.data_dir={small_data}", *TINY,
                  "run.max_steps=3", f"run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr
    assert json.loads((run_dir / "run.json").read_text())["head"] == NAME
    import torch
    assert torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"] == 3
