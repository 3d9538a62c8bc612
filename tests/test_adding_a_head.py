"""The "Adding a head" recipe (docs/heads.md), followed to the letter in a copy of the repository:
the new head's file, its import and entry in the registry and its three configs (PTB, WikiText-2,
the miniature) are taken from the recipe's code blocks, and nothing else is edited. The generic
head tests, the config tests and the training test then pick the head up, `train.py --dry-run` resolves it, sweep.py (what the row scripts run)
plans it, a 3-step training run trains it and synthetic.py fits it."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import doc_blocks

REPO = Path(__file__).resolve().parent.parent
NAME = "temperature"                      # the recipe's example head
PAGE = "docs/heads.md"                    # where the recipe is


def recipe() -> list[tuple[str, str]]:
    """(first line, code) of each fenced block in the "Adding a head" section of docs/heads.md."""
    return doc_blocks(PAGE, "Adding a head", "python|yaml")


def follow_recipe(root: Path) -> None:
    registry_lines = None
    for first, code in recipe():
        target = first.lstrip("# ").split(":")[0]
        if target == "model/heads/__init__.py":
            registry_lines = code.splitlines()[1:3]
        else:
            assert not (root / target).exists(), (
                f"{target} is already in this checkout: the recipe's example head is named "
                f"temperature; give your own head another name (docs/heads.md, Adding a head)")
            (root / target).write_text(code, encoding="utf-8")
    registry = root / "model/heads/__init__.py"
    lines = registry.read_text(encoding="utf-8").splitlines(keepends=True)
    assert registry_lines is not None
    import_line, entry = (line + "\n" for line in registry_lines)
    last_import = max(i for i, line in enumerate(lines) if line.startswith("from ."))
    end = lines.index("}\n", lines.index("HEADS: dict[str, type[OutputHead]] = {\n"))
    # The entry goes last, so that tables keep their order.
    lines[end:end] = [entry]
    lines[last_import + 1:last_import + 1] = [import_line]
    registry.write_text("".join(lines), encoding="utf-8")


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


def test_the_recipe_names_a_file_a_registry_import_and_entry_and_three_configs():
    targets = [first for first, _ in recipe()]
    assert targets == [f"# model/heads/{NAME}.py",
                       "# model/heads/__init__.py: the import after the others, the entry at the end of HEADS",
                       f"# configs/ptb/{NAME}.yaml", f"# configs/wt2/{NAME}.yaml", f"# configs/ptb_mini/{NAME}.yaml"]


def test_generic_tests_pick_up_the_new_head(repo_with_new_head, shared_data_dir):
    proc = run(repo_with_new_head, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
               "tests/test_heads.py", "tests/test_configs.py", "tests/test_heads_training.py",
               "-k", f"{NAME} or registry")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    passed = set(re.findall(r"^PASSED (\S+)", proc.stdout, re.M))
    for test in (f"test_heads.py::test_rows_are_distributions[{NAME}]",
                 f"test_heads.py::test_gradients_gradcheck_float64[{NAME}]",
                 f"test_heads.py::test_forward_computes_the_heads_plain_reference_with_its_gradients[train-{NAME}]",
                 f"test_heads.py::test_target_log_probs_equal_the_gathered_log_probs_with_gradients[{NAME}-False]",
                 f"test_heads.py::test_extreme_inputs_give_finite_log_probs[1.0-1e+30-{NAME}]",
                 f"test_heads.py::test_a_head_has_its_own_label_and_a_config_per_dataset[{NAME}]",
                 f"test_configs.py::test_every_config_resolves_and_builds[ptb/{NAME}]",
                 f"test_configs.py::test_every_config_resolves_and_builds[wt2/{NAME}]",
                 f"test_configs.py::test_every_config_resolves_and_builds[ptb_mini/{NAME}]",
                 f"test_configs.py::test_the_miniature_configs_share_one_body_and_halve_sbs_dropout[{NAME}]",
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


def test_synthetic_fits_the_new_head(repo_with_new_head, tmp_path):
    done = run(repo_with_new_head, "synthetic.py", "--heads", "softmax", NAME, "--words", "20",
               "--dims", "2", "--contexts", "10", "--max-steps", "2", "--no-compile",
               "--set", f"{NAME}.tau=3", "--out", str(tmp_path / "synthetic"), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(row["head"], row["label"]) for row in rows] == [("softmax", "Softmax"),
                                                             (NAME, "Softmax/tau")]
    settings = json.loads((tmp_path / "synthetic" / "settings.json").read_text())
    assert settings["head_options"][NAME] == {"tau": 3.0}
