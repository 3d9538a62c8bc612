"""The repository's own results (README "Results on a CPU") are what the plans' reports make of
the committed runs: `sweep.py PLAN --report` over a copy of results/cpu_ptb/ rewrites every
committed report table unchanged, and every table and figure the README section shows is one of
those reports. A report regenerated without the README, or a README number edited by hand, fails."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import sweep
from launch.plans import load_plan

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "cpu_ptb"
PLANS = ["sweeps/cpu_seven_heads.yaml", "sweeps/cpu_d_sweep.yaml"]


def readme_section() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return readme.split("\n## Results on a CPU\n", 1)[1].split("\n## ", 1)[0]


def table_lines(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("|")]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cpu") / "cpu_ptb"
    shutil.copytree(RESULTS, out, ignore=shutil.ignore_patterns("report"))
    for plan in PLANS:
        assert sweep.main([str(REPO / plan), "--report", "--out", str(out)]) == 0
    return out / "report"


def committed_reports() -> list[Path]:
    return sorted((RESULTS / "report").glob("*.md"))


def test_the_plans_report_into_the_committed_folder():
    written = {Path(a[a.index("--out") + 1]).name.split(".")[0]
               for plan in PLANS for a in load_plan(REPO / plan).report_commands(Path("x"))}
    assert written == {p.stem for p in committed_reports()} | {"spectra"}


@pytest.mark.parametrize("report", committed_reports(), ids=lambda p: p.name)
def test_a_committed_report_is_what_the_runs_give(report, regenerated):
    assert (regenerated / report.name).read_text(encoding="utf-8") == report.read_text(encoding="utf-8")


def test_the_readme_shows_the_reports_tables_and_figures():
    section = readme_section()
    for name in ("seven_heads.md", "methods.md", "d_sweep.md"):
        table = "\n".join(table_lines((RESULTS / "report" / name).read_text(encoding="utf-8")))
        assert table and f"\n{table}\n" in section, \
            f"README's Results on a CPU does not show {name}'s table as the report wrote it"
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", section)
    assert {Path(f).name for f in figures} >= {"curves.png", "spectra.png", "d_sweep.png"}
    for figure in figures:
        assert (REPO / figure).is_file() and figure.startswith("results/cpu_ptb/report/"), figure
