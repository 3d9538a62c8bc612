"""The repository's own results (docs/results_cpu.md, and their headline on README.md's front page)
are what the plans' reports make of the committed runs: `sweep.py PLAN --report` over a copy of
results/cpu_ptb/ rewrites every committed report table unchanged, every table and figure the
results page shows is one of those reports, and so are the README's headline table and figure;
the summary against [SB] quotes numbers that the reports and docs/published.md hold, the Mixtape
summary the converged runs' own files, and "The claims, tested" the changes, intervals and seeds
needed that the committed runs give. A report regenerated without the pages, or a number on them
edited by hand, fails."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

import sweep
from analysis.stats import combination, seeds_needed, welch
from launch.plans import load_plan
from tests.conftest import doc_section

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "cpu_ptb"
PLANS = ["sweeps/cpu_seven_heads.yaml", "sweeps/cpu_d_sweep.yaml"]
RESULTS_PAGE = REPO / "docs" / "results_cpu.md"
# Every results folder of the CPU studies and the plans that report into it. A folder is checked
# once it has committed reports (a study in progress commits its finished runs and their reports
# as they come, so its reports too must be what its runs give).
STUDIES = {
    "cpu_ptb": PLANS,
    "cpu_ptb_moc": ["sweeps/cpu_converged_moc.yaml"],
    "cpu_ptb_converged": ["sweeps/cpu_converged_heads.yaml", "sweeps/cpu_converged_d_sweep.yaml"],
}
REPORTED = [study for study in STUDIES if (REPO / "results" / study / "report").is_dir()]
REPORT_FOLDERS = {REPO / "results" / study / "report" for study in STUDIES}


def results_page() -> str:
    return RESULTS_PAGE.read_text(encoding="utf-8")


def readme_section() -> str:
    """The README's headline results: its section "Results on a CPU"."""
    return doc_section("README.md", "Results on a CPU")


def tables(markdown: str) -> list[str]:
    """Every Markdown table of a page, its lines joined."""
    blocks, current = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append("\n".join(current))
            current = []
    return blocks


def figures(markdown: str, page: Path) -> list[Path]:
    """The images a page shows, resolved from the page's folder."""
    return [(page.parent / f).resolve() for f in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)]


def table_lines(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("|")]


@pytest.fixture(scope="module")
def regenerate(tmp_path_factory):
    """study -> the report folder that its plans' --report writes from a copy of its committed
    runs (made once per study)."""
    made: dict[str, Path] = {}

    def report_folder(study: str) -> Path:
        if study not in made:
            out = tmp_path_factory.mktemp("cpu") / study
            shutil.copytree(REPO / "results" / study, out, ignore=shutil.ignore_patterns("report"))
            for plan in STUDIES[study]:
                code = sweep.main([str(REPO / plan), "--report", "--out", str(out)])
                # a study in progress may lack what some report needs (a finetuned run, a d = 64
                # run); the reports it committed must come out all the same (compared below)
                assert code == 0 or (code == 2 and study != "cpu_ptb"), plan
            made[study] = out / "report"
        return made[study]
    return report_folder


def committed_reports(study: str = "cpu_ptb") -> list[Path]:
    return sorted((REPO / "results" / study / "report").glob("*.md"))


def test_every_cpu_plan_reports_into_a_study_folder():
    """A plan of the CPU studies that no entry of STUDIES names would have its reports unchecked."""
    cpu_plans = {p.relative_to(REPO).as_posix() for p in (REPO / "sweeps").glob("cpu_*.yaml")}
    assert cpu_plans == {plan for plans in STUDIES.values() for plan in plans}
    for study, plans in STUDIES.items():
        for plan in plans:
            assert Path(load_plan(REPO / plan).out).name == study, plan


@pytest.mark.parametrize("study", REPORTED)
def test_the_plans_report_into_the_committed_folder(study):
    written = {Path(a[a.index("--out") + 1]).name.split(".")[0]
               for plan in STUDIES[study] for a in load_plan(REPO / plan).report_commands(Path("x"))}
    committed = {p.stem for p in committed_reports(study)}
    assert committed <= written, f"results/{study}/report has reports that no plan writes"
    if study == "cpu_ptb":     # a complete study: every report its plans write is committed
        assert written == committed | {"spectra"}


@pytest.mark.parametrize("study, report", [(study, report) for study in REPORTED
                                           for report in committed_reports(study)],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_a_committed_report_is_what_the_runs_give(study, report, regenerate):
    assert (regenerate(study) / report.name).read_text(encoding="utf-8") == report.read_text(encoding="utf-8")


def test_the_results_page_shows_the_reports_tables_and_figures():
    page = results_page()
    for name in ("seven_heads.md", "methods.md", "d_sweep.md"):
        for table in tables((RESULTS / "report" / name).read_text(encoding="utf-8")):
            assert f"\n{table}\n" in page, \
                f"docs/results_cpu.md does not show {name}'s tables as the report wrote them"
    moc = REPO / "results" / "cpu_ptb_moc" / "report" / "moc.md"
    if moc.is_file():     # the MoC single changes, once some have run
        for table in tables(moc.read_text(encoding="utf-8")):
            assert f"\n{table}\n" in page, "docs/results_cpu.md does not show cpu_ptb_moc's moc.md as the report wrote it"
    converged = REPO / "results" / "cpu_ptb_converged" / "report"
    for name in ("heads.md", "convergence_heads.md", "cost.md",    # the converged study, as it grows:
                 "d_sweep.md", "heads_d64.md", "methods_d_sweep.md", "convergence_d_sweep.md"):   # every table of each
        if (converged / name).is_file():
            for table in tables((converged / name).read_text(encoding="utf-8")):
                assert f"\n{table}\n" in page, f"docs/results_cpu.md does not show cpu_ptb_converged's {name}"
    # the seed spread at convergence beside the 6-epoch one, each as its report gives it
    spreads = [seed_spread(converged / "heads.md"), seed_spread(RESULTS / "report" / "seven_heads.md")]
    at = [page.find(spread) for spread in spreads]
    assert min(at) >= 0 and 0 <= at[1] - (at[0] + len(spreads[0])) < 200, \
        "docs/results_cpu.md does not show the seed spread at convergence beside the 6-epoch one"
    shown = figures(page, RESULTS_PAGE)
    assert {f.relative_to(RESULTS).as_posix() for f in shown if f.parent == RESULTS / "report"} \
        >= {"report/curves.png", "report/spectra.png", "report/d_sweep.png"}
    for figure in shown:
        assert figure.is_file() and figure.parent in REPORT_FOLDERS, figure


def test_every_table_the_results_page_shows_as_a_reports_is_one_a_report_prints():
    """The converse: a table of the page with a report table's header row is one a committed
    report prints today (the page held a stale second copy of convergence_heads.md's table,
    two seeds of LMS-PLIF behind, under convergence_d_sweep.md's name)."""
    printed = {table for folder in REPORT_FOLDERS for report in folder.glob("*.md")
               for table in tables(report.read_text(encoding="utf-8"))}
    headers = {table.split("\n", 1)[0] for table in printed}
    stale = [table.split("\n", 3)[:3] for table in tables(results_page())
             if table.split("\n", 1)[0] in headers and table not in printed]
    assert not stale, f"docs/results_cpu.md shows tables no report prints now: {stale}"


def seed_spread(report: Path) -> str:
    """The paragraph of a table report on the seed-to-seed spread of test ppl."""
    return report.read_text(encoding="utf-8").split(": seed spread\n\n")[1].split("\n")[0]


def test_the_readme_headline_is_the_reports_table_and_figure():
    """The README's headline is the converged study's table of every head at d = 32 with its note,
    and its d-sweep's table and figure, each as a report wrote it."""
    section = readme_section()
    converged = REPO / "results" / "cpu_ptb_converged" / "report"
    heads = converged / "heads.md"
    table = tables(heads.read_text(encoding="utf-8"))[0]      # the table itself (the others: the results page)
    assert table and f"\n{table}\n" in section, \
        "README's Results on a CPU does not show cpu_ptb_converged's heads.md table as the report wrote it"
    measured = [t for t in tables(section) if t.startswith("| Model |")]
    assert measured == [table], "a table of measured results on the README that no report wrote"
    note = next(line for line in heads.read_text(encoding="utf-8").splitlines() if line.startswith("Mean ± "))
    assert f"\n{note}\n" in section, "README's note under the table is not the report's"
    d_sweep = tables((converged / "d_sweep.md").read_text(encoding="utf-8"))
    assert [t for t in tables(section) if t.startswith("| head |")] == d_sweep[:1], \
        "README's d-sweep table is not the converged d_sweep.md's first table as the report wrote it"
    shown = figures(section, REPO / "README.md")
    assert converged / "d_sweep.png" in shown, "README does not show the converged d-sweep's figure"
    for figure in shown:
        assert figure.is_file() and figure.parent in REPORT_FOLDERS, figure


def numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?", text)}


def test_the_summary_against_sb_quotes_the_reports_and_the_published_page():
    """Each row of the results page's table against [SB]: the left cell's numbers are on
    docs/published.md, the right cell's in the converged study's committed reports."""
    rows = [line for t in tables(results_page()) if t.startswith("| [SB] |")
            for line in t.splitlines()[2:]]
    assert len(rows) >= 4
    published = numbers((REPO / "docs" / "published.md").read_text(encoding="utf-8"))
    converged = REPO / "results" / "cpu_ptb_converged"
    measured = set().union(*(numbers(f.read_text(encoding="utf-8"))
                             for folder in ("report", "diagnostics") for f in (converged / folder).glob("*.md")))
    for row in rows:
        sb, here = row.strip("|").split("|")
        assert numbers(sb) <= published, (row, numbers(sb) - published)
        assert numbers(here) <= measured, (row, numbers(here) - measured)


def test_the_mixtape_summary_quotes_the_converged_d_sweep():
    """The results page's bullet on Mixtape against d quotes, for Mixtape, Softmax and MoS at
    d = 16 and 64 (and Mixtape at d = 32), each run's test ppl (eval_best.json), Press rank
    (rank_test.json) and, at d = 16 and 64, its training CPU seconds an epoch (cost.md); a number
    retyped wrong fails."""
    page = results_page()
    start = page.index("- **Mixtape against d**")
    end = min(i for i in (page.find("\n\n", start), page.find("\n- ", start + 1)) if i > 0)
    quoted = numbers(page[start:end])
    converged = REPO / "results" / "cpu_ptb_converged"
    cost_rows = {row.split("|")[1].strip(" `"): row.split("|")[8].strip()
                 for row in table_lines((converged / "report" / "cost.md").read_text(encoding="utf-8"))[2:]}
    runs = [(head, d) for head in ("mixtape", "softmax", "mos") for d in (16, 64)] + [("mixtape", 32)]
    for head, d in runs:
        name = f"ptb-{head}-model.emsize={d}-seed1"
        test_ppl = json.loads((converged / name / "eval_best.json").read_text(encoding="utf-8"))["test_ppl"]
        rank = json.loads((converged / name / "rank_test.json").read_text(encoding="utf-8"))["press_rank"]
        assert f"{test_ppl:.2f}" in quoted and str(rank) in quoted, (name, test_ppl, rank)
        if d != 32:
            assert cost_rows[name].rstrip("*") in quoted, (name, cost_rows[name])


# "The claims, tested" (docs/results_cpu.md): each row whose last cell gives seeds, with the
# comparisons it answers in order. A comparison is its cells, (weight, study, head, d, seeds):
# every committed run of the cell, or those seeds (the 6-epoch d-sweep's d = 32 point is seed 1).
CONVERGED, SIX = "cpu_ptb_converged", "cpu_ptb"


def against(head: str, other: str, d: int, study: str = CONVERGED, other_d: int | None = None) -> list:
    """head at d against other at other_d (d unless given)."""
    return [(1, study, head, d, None), (-1, study, other, other_d or d, None)]


def gains(head: str, d1: int, d2: int, study: str = CONVERGED) -> list:
    """head's change against Softmax at d1 against its change at d2 (four cells)."""
    seeds = (1,) if study == SIX else None
    at = lambda d: None if d != 32 else seeds
    return [(1, study, head, d1, at(d1)), (-1, study, "softmax", d1, at(d1)),
            (-1, study, head, d2, at(d2)), (1, study, "softmax", d2, at(d2))]


SEEDS_NEEDED = {
    "MoS below Softmax at d = 32": [against("mos", "softmax", 32)],
    "MoS below Softmax at d = 16 and at d = 64": [against("mos", "softmax", 16), against("mos", "softmax", 64)],
    "SS below Softmax": [against("ss", "softmax", 32)],
    "GSS below Softmax": [against("gss", "softmax", 32)],
    "LMS-PLIF and LMS-PLIF† above Softmax": [against("plif", "softmax", 32), against("plif_frozen", "softmax", 32)],
    "MoS below SS": [against("mos", "ss", 32)],
    "LMS-PLIF above SS and GSS, and MoS below LMS-PLIF": [against("plif", "ss", 32), against("plif", "gss", 32),
                                                         against("mos", "plif", 32)],
    "GSS behind SS, at the higher rank": [against("gss", "ss", 32)],
    "MoS below GSS": [against("mos", "gss", 32)],
    "Mixtape at d = 64 between Softmax and MoS": [against("mixtape", "softmax", 64), against("mixtape", "mos", 64)],
    "Mixtape behind Softmax at d = 16 and 32 (not converged: the 70-epoch cap)": [against("mixtape", "softmax", 16), against("mixtape", "softmax", 32)],
    "Softmax's perplexity falls as d grows": [against("softmax", "softmax", 32, other_d=16),
                                              against("softmax", "softmax", 64, other_d=32)],
    "Whether the gain grows as d shrinks": [gains("mos", 16, 32, SIX), gains("mos", 16, 64, SIX),
                                            gains("mos", 16, 32), gains("mos", 32, 64)],
    "SS below Softmax after 6 epochs": [against("ss", "softmax", 32, SIX)],
    "GSS below Softmax after 6 epochs": [against("gss", "softmax", 32, SIX)],
    "LMS-PLIF and LMS-PLIF† no better than Softmax after 6 epochs": [against("plif", "softmax", 32, SIX),
                                                                    against("plif_frozen", "softmax", 32, SIX)],
    "The gain grows as d shrinks, after 6 epochs": [gains("mos", 16, 32, SIX), gains("mos", 16, 64, SIX),
                                                    gains("gss", 16, 32, SIX), gains("gss", 16, 64, SIX)],
}


def log_test_ppl(study: str, head: str, d: int, seeds) -> list[float]:
    runs = sorted((REPO / "results" / study).glob(f"ptb-{head}-model.emsize={d}-seed*"))
    values = [math.log(json.loads((run / "eval_best.json").read_text(encoding="utf-8"))["test_ppl"])
              for run in runs if seeds is None or int(run.name.rsplit("seed", 1)[1]) in seeds]
    assert values, (study, head, d, seeds)
    return values


def claims_table() -> dict[str, list[str]]:
    """The rows of "The claims, tested", by their first cell."""
    section = doc_section("docs/results_cpu.md", "The claims, tested")
    table = next(t for t in tables(section) if t.startswith("| claim | the reports"))
    return {row.split(" | ")[0].strip("| "): row for row in table.splitlines()[2:]}


def pooled_spread(study: str) -> tuple[float, float]:
    """A study's pooled seed spread of test ppl and its interval's upper end (fractions), as its
    table report prints them (the converged study's heads.md, the 6-epoch seven_heads.md)."""
    report = REPO / "results" / study / "report" / ("heads.md" if study == CONVERGED else "seven_heads.md")
    spread, _, upper = (float(x) / 100 for x in re.search(
        r"\*\*([\d.]+)% \[([\d.]+), ([\d.]+)\]\*\*", seed_spread(report)).groups())
    return spread, upper


def test_the_claims_tested_give_the_runs_changes_and_the_seeds_they_need():
    """Every change the table quotes is the committed runs' (the ratio of geometric means of test
    ppl), and the seeds per cell are seeds_needed's at the pooled seed spread of the study the
    change is measured in (the converged runs' for a converged change, the 6-epoch runs' for a
    6-epoch one) and at that spread's interval's upper end, as the reports print them. A row
    without seeds has none."""
    section = doc_section("docs/results_cpu.md", "The claims, tested")
    spreads = {study: pooled_spread(study) for study in (CONVERGED, SIX)}
    for spread, upper in spreads.values():
        assert f"**{100 * spread:.2f}% [" in section and f"{100 * upper:.2f}%" in section
    rows = claims_table()
    checked = set()
    for label, comparisons in SEEDS_NEEDED.items():
        assert label in rows, f'"The claims, tested" has no row "{label}"'
        row = rows[label]
        checked.add(row)
        cells = row.strip("|").split(" | ")
        expected = []
        for comparison in comparisons:
            value = sum(w * sum(v) / len(v) for w, *cell in comparison for v in [log_test_ppl(*cell)])
            assert f"{100 * math.expm1(value):+.1f}%" in cells[1], (label, 100 * math.expm1(value))
            spread, upper = spreads[comparison[0][1]]
            expected.append(f"{seeds_needed(value, spread, len(comparison))} "
                            f"({seeds_needed(value, upper, len(comparison))})")
        assert re.findall(r"\d+ \(\d+\)", cells[-1]) == expected, (label, expected)
    for row in set(rows.values()) - checked:
        assert row.rstrip(" |").endswith("| —"), f"a row of seeds that the test does not recompute: {row}"


def reports_text() -> str:
    """Every committed report of both studies, one text."""
    return "".join(f.read_text(encoding="utf-8") for study in (SIX, CONVERGED)
                   for f in (REPO / "results" / study / "report").glob("*.md"))


def holm_by_interval(reports: str) -> dict[str, set[str]]:
    """interval -> the Holm's p printed beside it, from the reports' tables with a Holm's p column."""
    holm_of: dict[str, set[str]] = {}
    for table in tables(reports):
        header, _, *rows = table.splitlines()
        if header.rstrip(" |").split("| ")[-1].startswith("Holm's p"):
            for row in rows:
                *_, interval, holm = row.strip("| ").split(" | ")
                holm_of.setdefault(interval, set()).add(holm)
    return holm_of


INTERVAL = r"[+-][\d.]+% \[[^\]]+\], p = [\d.e+-]*\d"


def quoted_holm(text: str) -> list[str]:
    """The Holm's p values a text quotes as current: the one after "Holm's p" and those listed
    after it ("Holm's p 1.7e-04 and 0.0069", "Holm's p 0.012, 0.044 and 0.0014"). A past value
    is quoted after a semicolon ("Holm's p 0.066; 0.029 over the 10 before"), so it is not
    among them."""
    number = r"\d[\d.]*(?:e-\d+)?"
    return [value for run in re.findall(rf"Holm's p (?:is )?({number}(?:(?:, | and ){number})*)", text)
            for value in re.split(r", | and ", run)]


def test_quoted_holm_reads_the_current_values_and_leaves_past_ones():
    assert quoted_holm("(Holm's p 0.012, 0.044 and 0.0014; 0.066 before)") == ["0.012", "0.044", "0.0014"]
    assert quoted_holm("Holm's p 1.7e-04 and 0.0069, over the 6 pairs") == ["1.7e-04", "0.0069"]
    assert quoted_holm("(over the 15 pairs Holm's p 0.13 then, 0.086 since)") == ["0.13"]


def test_the_claims_tested_quote_the_reports_intervals():
    """Every interval "c% [low, high], p = x" in the table is one a committed report prints (a head
    against Softmax, every two rows, a head against itself at another d, MoS's gain averaged over
    d), and every Holm's p the table quotes is the one the report prints beside an interval of
    that row. The pairs the table names are recomputed here from eval_best.json (Welch on log test
    ppl) and MoS over d as three measurements of one gain (a one-sample t), which the front page
    quotes too."""
    reports = reports_text()
    holm_of = holm_by_interval(reports)

    def mean(values):
        return sum(values) / len(values)
    mos_over_d = [mean(log_test_ppl(CONVERGED, "mos", d, None)) - mean(log_test_ppl(CONVERGED, "softmax", d, None))
                  for d in (16, 32, 64)]
    pooled = combination([mos_over_d], [1.0]).describe()
    rows = claims_table()
    assert pooled in rows["MoS below Softmax, over d"] and pooled in reports
    for label in ("MoS below SS", "GSS behind SS, at the higher rank", "Softmax's perplexity falls as d grows"):
        for (_, *cell), (_, *other) in SEEDS_NEEDED[label]:
            described = welch(log_test_ppl(*cell), log_test_ppl(*other)).describe()
            assert described in rows[label] and described in holm_of, (label, described)
    intervals = re.findall(INTERVAL, "\n".join(rows.values()))
    assert len(intervals) >= 8
    for interval in intervals:
        assert interval in reports, interval
    holm_quoted = 0
    for row in rows.values():
        for holm in quoted_holm(row):
            assert any(holm in holm_of.get(i, ()) for i in re.findall(INTERVAL, row)), (row, holm)
            holm_quoted += 1
    assert holm_quoted >= 10
    assert pooled in " ".join(readme_section().split()), "README's claims that stand do not quote MoS over d"


def test_the_readme_quotes_the_reports_intervals_and_holms_p():
    """Every interval the front page's results quote is one a committed report prints, and every
    Holm's p it quotes is a report's Holm's p column value: new seeds that move a report leave no
    stale figure on the front page."""
    assert_quotes_the_reports(" ".join(readme_section().split()), least_intervals=8, least_holm=5)


def excludes_zero(interval: str) -> bool:
    low, high = (float(x.rstrip("%")) for x in re.search(r"\[([^,]+), ([^\]]+)\]", interval).groups())
    return low > 0 or high < 0


def test_the_readmes_lists_of_what_stands_what_is_found_and_what_is_not_resolved_follow_the_reports():
    """Each interval under the front page's "What stands:" excludes zero and, where a report gives
    it a Holm's p, has one below 0.05; under "Found, but not standing:" each excludes zero with no
    Holm's p below 0.05; under "Not resolved:" each reaches zero. New seeds that move a claim
    across a line (SS below Softmax went from standing to found alone and back) fail here until
    the front page moves it."""
    text = " ".join(readme_section().split())
    stands = text.split("What stands:")[1].split("Found, but not standing:")[0]
    found = text.split("Found, but not standing:")[1].split("Not resolved:")[0]
    unresolved = text.split("Not resolved:")[1].split("The converged seeds")[0]
    holm_of = holm_by_interval(reports_text())
    holm = lambda interval: [float(h) for h in holm_of.get(interval, ())]
    checked = 0
    for interval in re.findall(INTERVAL, stands):
        assert excludes_zero(interval) and all(h < 0.05 for h in holm(interval)), ("stands", interval, holm(interval))
        checked += 1
    assert all(re.search(r"Holm's p", bullet) for bullet in stands.split(" - ")[1:]), "a standing claim without its Holm's p"
    for interval in re.findall(INTERVAL, found):
        assert excludes_zero(interval) and not any(h < 0.05 for h in holm(interval)), ("found alone", interval,
                                                                                         holm(interval))
        checked += 1
    for interval in re.findall(INTERVAL, unresolved):
        assert not excludes_zero(interval), ("not resolved", interval)
        checked += 1
    assert checked >= 15


def assert_quotes_the_reports(text: str, least_intervals: int, least_holm: int) -> None:
    """Every interval `text` quotes is one a committed report prints, and every Holm's p it
    quotes as current is a value of a report's Holm's p column (at least as many of each as
    given, so that a change of format cannot leave nothing checked)."""
    reports = reports_text()
    holm_values = set().union(*holm_by_interval(reports).values())
    intervals = re.findall(INTERVAL, text)
    assert len(intervals) >= least_intervals
    for interval in intervals:
        assert interval in reports, interval
    quoted = quoted_holm(text)
    assert len(quoted) >= least_holm
    for value in quoted:
        assert value in holm_values, value


def test_the_six_epoch_conclusions_against_convergence_quote_the_reports():
    """The results page's table "Which 6-epoch conclusions survive convergence": every interval
    it quotes is one a committed report prints, every Holm's p it quotes as current is in a
    report's Holm's p column, and every converged cell mean "ppl ± sd (n = k)" is a row of
    heads.md (a stale figure there had read 0.029 for a Holm's p of 0.11)."""
    [table] = [t for t in tables(results_page()) if t.startswith("| claim | [SB], d = 400 | 6 epochs")]
    assert_quotes_the_reports(table, least_intervals=5, least_holm=5)
    heads = (REPO / "results" / CONVERGED / "report" / "heads.md").read_text(encoding="utf-8")
    means = re.findall(r"(\d+\.\d\d ± \d+\.\d\d) \(n = (\d+)\)", table.split(" | converged, d = 32")[1])
    assert len(means) >= 5
    for mean, n in means:
        assert re.search(rf"\| {n} \|.*\| {re.escape(mean)} \|", heads), (mean, n)


# The claims table's Welch counts (each cell its own spread, from heads.md's seed-spread line):
# file in results/cpu_ptb_converged/planning/ -> the report.py seeds arguments that wrote it.
WELCH_SEEDS = {"welch_seeds_softmax_ss.md": ["--change", "-3.2", "--spread", "0.13", "1.02"],
               "welch_seeds_softmax_lms_plif_frozen.md": ["--change", "+1.1", "--spread", "0.13", "0.53"],
               "welch_seeds_softmax_lms_plif.md": ["--change", "+1.5", "--spread", "0.13", "0.63"],
               "welch_seeds_gss_ss.md": ["--change", "+1.1", "--spread", "0.48", "1.02"]}


@pytest.mark.parametrize("name", sorted(WELCH_SEEDS))
def test_the_welch_seed_counts_are_what_report_seeds_gives(name, tmp_path, capsys):
    """Each committed count is what the command gives today, the spreads it names are heads.md's
    cells' (its seed-spread line), and the results page quotes the file."""
    import report
    folder = REPO / "results" / CONVERGED / "planning"
    assert sorted(p.name for p in folder.glob("*.md")) == sorted(WELCH_SEEDS)
    assert report.main(["seeds", *WELCH_SEEDS[name], "--out", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_text(encoding="utf-8") == (folder / name).read_text(encoding="utf-8")
    spreads = WELCH_SEEDS[name][WELCH_SEEDS[name].index("--spread") + 1:]
    line = seed_spread(REPO / "results" / CONVERGED / "report" / "heads.md")
    assert all(re.search(rf"\b{re.escape(s)}% \(n = ", line) for s in spreads), (spreads, line)
    assert f"planning/{name}" in results_page()
