"""The "Adding an experiment" recipe (docs/sweeps.md), followed to the letter in a copy of the
repository: the plan file and its row in a table of plans (docs/results_cpu.md) are taken from the
recipe's code blocks, and nothing else is edited. The test of the tables of plans then finds the
plan with its run count, and the plan runs end to end on tiny models with its reports
(tests/test_plans.py, as for every plan)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import doc_blocks

REPO = Path(__file__).resolve().parent.parent
PLAN = "sweeps/cpu_d8.yaml"               # the recipe's example plan
RECIPE_PAGE = "docs/sweeps.md"            # where the recipe is
TABLE_PAGE = "docs/results_cpu.md"        # where its row goes: the CPU plans' table
TABLE_SECTION = "## The miniature and its plans"


def recipe() -> list[tuple[str, str]]:
    """(first line, code) of each fenced block in the "Adding an experiment" section of
    docs/sweeps.md."""
    return doc_blocks(RECIPE_PAGE, "Adding an experiment", "yaml|markdown")


def follow_recipe(root: Path) -> None:
    (plan_first, plan), (row_first, row_block) = recipe()
    target = root / plan_first.lstrip("# ")
    assert not target.exists(), target
    target.write_text(plan, encoding="utf-8")
    row = row_block.splitlines()[1]
    page = root / TABLE_PAGE
    text = page.read_text(encoding="utf-8")
    start = text.index(f"\n{TABLE_SECTION}\n")
    table_start = text.index("\n| ", start)
    table_end = text.index("\n\n", table_start)      # the row goes after the table's last row
    page.write_text(text[:table_end] + "\n" + row + text[table_end:], encoding="utf-8")


def test_the_recipe_names_a_plan_file_and_a_row_of_a_table_of_plans():
    firsts = [first for first, _ in recipe()]
    assert firsts == [f"# {PLAN}",
                      f'<!-- {TABLE_PAGE}: a row at the end of the table of plans in "{TABLE_SECTION[3:]}" -->']


def test_the_plan_of_the_recipe_is_counted_planned_and_runs_with_its_reports(tmp_path, shared_data_dir):
    root = tmp_path / "repo"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "runs", "results", "corpora", "__pycache__", ".pytest_cache", "*.pyc"))
    follow_recipe(root)
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    dry = subprocess.run([sys.executable, "sweep.py", PLAN, "--dry-run"], cwd=root, env=env,
                         capture_output=True, text=True)
    assert dry.returncode == 0 and dry.stdout.strip().splitlines()[-1] == "# 4 runs planned", dry.stderr
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                           "tests/test_plans.py", "-k", "tables_of_plans or cpu_d8"],
                          cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    passed = set(re.findall(r"^PASSED (\S+)", proc.stdout, re.M))
    assert {"tests/test_plans.py::test_every_plan_is_in_the_tables_of_plans_with_its_number_of_runs",
            "tests/test_plans.py::test_every_plan_runs_end_to_end_with_its_reports[cpu_d8]"} <= passed, passed
