"""report.py's [SB] reports on run directories written by hand (no training): tables in the
paper's layout (--paper), the Figure 2 correlation, the MoS capacity and rank figures and the
Press-rank robustness tables."""
from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import stats

import report
from analysis.stats import format_p
from analysis.correlation import collect_points, pearson_r, r_with_interval
from analysis.mos_sweeps import collect, paper_points, sweep
from analysis.published import GSS_GRID, PUBLISHED_TABLES, ROBUSTNESS
from analysis.tables import EFFECTIVE_RANK_COLUMNS
from spectrum.robustness import press_rank_robustness
from tests.test_tables import make_run

PNG = b"\x89PNG\r\n\x1a\n"


def fake_run(root: Path, name: str, dataset: str, head: str, seed: int, *, config: dict | None = None,
             test_ppl: float | None = None, press_rank: int | None = None, params: int = 1_000_000,
             train_ppl: float = 40.0, val_ppl: float = 60.0) -> Path:
    """A finished one-epoch run directory with the given numbers and extra config keys."""
    run_dir = make_run(root, name, head, seed, test_ppl=test_ppl, press_rank=press_rank, params=params,
                       dataset=dataset, epochs=1)
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    for section, values in (config or {}).items():
        resolved.setdefault(section, {}).update(values)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved))
    (run_dir / "metrics.jsonl").write_text(json.dumps(
        {"epoch": 1, "seconds": 10.0, "train_ppl": train_ppl, "val_loss": math.log(val_ppl),
         "val_ppl": val_ppl}) + "\n")
    return run_dir


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table_line(markdown: str, label: str) -> list[str]:
    line = next(l for l in markdown.splitlines() if l.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


# ---------------------------------------------------------------------- tables in the paper's layout

@pytest.fixture
def table5_runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    rows = {"mos_d280": ("mos", 280, 17_535_200, [56.2, 56.5, 56.4]),
            "softmax_d280": ("softmax", 280, 16_350_800, [57.9, 58.1]),
            "softmax_d340": ("softmax", 340, 17_560_880, [56.5, 56.4, 56.6])}
    for name, (head, d, params, ppls) in rows.items():
        for seed, ppl in enumerate(ppls, 1):
            fake_run(root, f"{name}-seed{seed}", "ptb", head, seed, test_ppl=ppl, params=params,
                     config={"model": {"emsize": d, "nhidlast": d}, "train": {"asgd_trigger": "et"}})
    fake_run(root, "mos-table2", "ptb", "mos", 28, test_ppl=55.0, params=21_500_620,
             config={"model": {"emsize": 280, "nhidlast": 620}})
    return root


def test_table5_layout_row_names_and_published_numbers(table5_runs, tmp_path):
    assert report.main(["table", str(table5_runs), "--paper", "table5", "--out", str(tmp_path / "t5")]) == 0
    markdown = (tmp_path / "t5.md").read_text()
    assert markdown.startswith("# [SB] Table 5")
    header = table_line(markdown, "Model")
    assert header == ["Model", "#Params", "[SB] #Params", "Train ppl", "[SB] Train ppl", "Validation ppl",
                      "[SB] Validation ppl", "Test ppl", "[SB] Test ppl", "Test ppl vs Softmax‡: % [95% CI], p",
                      "p-value (vs Softmax‡)", "[SB] p-value (vs Softmax‡)", "n"]
    mos = dict(zip(header, table_line(markdown, "MoS†")))
    assert mos["#Params"] == "17.53M" == mos["[SB] #Params"]
    assert mos["Test ppl"] == f"{statistics.mean([56.2, 56.5, 56.4]):.2f} ± {statistics.stdev([56.2, 56.5, 56.4]):.2f}"
    assert mos["[SB] Test ppl"] == "56.39 ± 0.19" and mos["[SB] Train ppl"] == "42.45 ± 1.03"
    p = stats.ttest_ind([56.2, 56.5, 56.4], [56.5, 56.4, 56.6]).pvalue        # against Softmax‡
    assert mos["p-value (vs Softmax‡)"] == f"{p:.2e}" and mos["[SB] p-value (vs Softmax‡)"] == "6.20e-01"
    welch = stats.ttest_ind(np.log([56.2, 56.5, 56.4]), np.log([56.5, 56.4, 56.6]), equal_var=False)
    assert mos["Test ppl vs Softmax‡: % [95% CI], p"].endswith(f"p = {welch.pvalue:.2g}")
    reference = dict(zip(header, table_line(markdown, "Softmax‡")))
    assert reference["p-value (vs Softmax‡)"] == "N/A" == reference["[SB] p-value (vs Softmax‡)"]
    assert reference["[SB] #Params"] == "17.56M" and reference["[SB] Test ppl"] == "56.45 ± 0.10"
    dagger = dict(zip(header, table_line(markdown, "Softmax†")))
    assert dagger["[SB] #Params"] == "16.35M" and dagger["[SB] Test ppl"] == "—"
    # rows in the paper's order; a run the paper's table does not have keeps a descriptive name
    order = [l.split("|")[1].strip() for l in markdown.split("## ptb")[1].splitlines() if l.startswith("| ")]
    assert order[1:] == ["MoS†", "Softmax†", "Softmax‡", "MoS (model.emsize=280, model.nhidlast=620)"]
    assert "Rows without a published counterpart: MoS (model.emsize=280, model.nhidlast=620)" in markdown
    csv_rows = {row["model"]: row for row in read_csv(tmp_path / "t5.csv")}
    assert float(csv_rows["MoS†"]["paper_test_ppl_mean"]) == 56.39
    assert float(csv_rows["MoS†"]["paper_test_ppl_std"]) == 0.19 and csv_rows["MoS†"]["paper_params"] == "17.53M"
    assert csv_rows["MoS (model.emsize=280, model.nhidlast=620)"]["paper_test_ppl_mean"] == ""


def test_mos_components_table_matches_trigger_and_k(tmp_path):
    root = tmp_path / "runs"
    for k, rank in ((5, 8000), (10, 9900)):
        fake_run(root, f"k{k}", "ptb", "mos", 28, test_ppl=58.0, press_rank=rank, params=19_755_620,
                 config={"head": {"components": k, "dropoutl": 0.29}, "train": {"asgd_trigger": "nt"}})
    fake_run(root, "k10-et", "ptb", "mos", 28, test_ppl=57.0, press_rank=9950,
             config={"head": {"components": 10, "dropoutl": 0.29}, "train": {"asgd_trigger": "et"}})
    assert report.main(["table", str(root), "--paper", "sm-tables4-5", "--out", str(tmp_path / "k")]) == 0
    markdown = (tmp_path / "k.md").read_text()
    header = table_line(markdown, "Model")
    assert header == ["Model", "#Params", "[SB] #Params", "Train ppl", "[SB] Train ppl", "Test ppl",
                      "[SB] Test ppl", "Press rank", "[SB] Press rank", "n"]     # no Softmax: no change column
    k5 = dict(zip(header, table_line(markdown, "K = 5")))
    assert (k5["[SB] #Params"], k5["[SB] Test ppl"], k5["[SB] Press rank"], k5["Press rank"]) == \
        ("19.75M", "58.38", "8,057", "8,000")
    assert dict(zip(header, table_line(markdown, "K = 10")))["[SB] Press rank"] == "9,976"
    et = "MoS (head.components=10, head.dropoutl=0.29, train.asgd_trigger=et)"
    assert table_line(markdown, et)[2] == "—"                      # no NT-ASGD number for an ET run


def test_table2_layout_keeps_its_columns_and_adds_the_papers(tmp_path):
    root = tmp_path / "runs"
    for head, ppls in (("softmax", [57.0, 57.2]), ("ss", [56.9, 57.0, 57.1])):
        for seed, ppl in enumerate(ppls, 1):
            fake_run(root, f"{head}-{seed}", "ptb", head, seed, test_ppl=ppl, press_rank=402,
                     config={"train": {"asgd_trigger": "et"}})
    assert report.main(["table", str(root), "--paper", "table2", "--out", str(tmp_path / "t2")]) == 0
    markdown = (tmp_path / "t2.md").read_text()
    header = table_line(markdown, "Model")
    assert [h for h in header if not h.startswith("[SB]")] == [
        "Model", "#Params", "Time (s/epoch)", "Train ppl", "Validation ppl", "Test ppl",
        "Test ppl vs Softmax: % [95% CI], p", "p-value (vs Softmax)", "Press rank", "n"]
    ss = dict(zip(header, table_line(markdown, "SS")))
    assert ss["[SB] Time (s/epoch)"] == "~57" and ss["[SB] Press rank"] == "5,113 ± 85"
    assert ss["[SB] p-value (vs Softmax)"] == "3.92e-01"
    assert ss["p-value (vs Softmax)"] == f"{stats.ttest_ind([56.9, 57.0, 57.1], [57.0, 57.2]).pvalue:.2e}"
    assert dict(zip(header, table_line(markdown, "Softmax")))["[SB] p-value (vs Softmax)"] == "N/A"


def test_table6_sets_the_effective_ranks_beside_the_papers(tmp_path):
    """[SB] Table 6 (SM Tables 17/18): Press and epsilon-effective ranks of the authors'-seed runs,
    from rank_test.json's "effective_rank" (its keys as json.dumps writes the floats)."""
    root = tmp_path / "runs"
    for head, seed, ranks in (("softmax", 141, (402, 50, 199, 301)), ("mos", 28, (9980, 80, 1500, 6400)),
                              ("mos", 1, (9979, 82, 1510, 6420))):
        run = fake_run(root, f"{head}-{seed}", "ptb", head, seed, test_ppl=57.0, press_rank=ranks[0],
                       config={"train": {"asgd_trigger": "et"}})
        rank = json.loads((run / "rank_test.json").read_text())
        rank["effective_rank"] = {"0.001": ranks[1], "0.0001": ranks[2], "1e-05": ranks[3]}
        (run / "rank_test.json").write_text(json.dumps(rank))
    assert report.main(["table", str(root), "--paper", "table6", "--only", "train.seed=141,28",
                        "--out", str(tmp_path / "t6")]) == 0
    markdown = (tmp_path / "t6.md").read_text()
    header = table_line(markdown, "Model")
    assert header == ["Model", "Press rank", "[SB] Press rank", "Effective rank, ε = 1e-3", "[SB] Effective rank, ε = 1e-3",
                      "Effective rank, ε = 1e-4", "[SB] Effective rank, ε = 1e-4", "Effective rank, ε = 1e-5",
                      "[SB] Effective rank, ε = 1e-5", "n"]
    assert table_line(markdown, "MoS") == ["MoS", "9,980", "9,983", "80", "81", "1,500", "1,521", "6,400", "6,428", "1"]
    assert table_line(markdown, "Softmax") == ["Softmax", "402", "402", "50", "52", "199", "201", "301", "306", "1"]
    [mos] = [row for row in read_csv(tmp_path / "t6.csv") if row["head"] == "mos"]
    assert mos["effective_rank_e4_values"] == "1500" and mos["paper_effective_rank_e5_mean"] == "6428"


def test_table2_compares_each_row_with_softmax_at_its_own_d(tmp_path):
    """The converged study's runs at three d: Softmax's rows were labelled "Softmax (model.emsize=16,
    ...)", the paper's baseline matched none of them by name, and every comparison went silently."""
    root = tmp_path / "runs"
    runs = {("softmax", 16): [160.0, 161.0], ("softmax", 32): [120.0, 121.0], ("ss", 32): [117.0, 118.0, 117.5],
            ("mos", 16): [157.0, 158.0]}
    for (head, d), ppls in runs.items():
        for seed, ppl in enumerate(ppls, 1):
            fake_run(root, f"{head}-{d}-{seed}", "ptb", head, seed, test_ppl=ppl, press_rank=d + 2,
                     config={"train": {"asgd_trigger": "et"}, "model": {"emsize": d, "nhidlast": d}})
    assert report.main(["table", str(root), "--paper", "table2", "--out", str(tmp_path / "t2")]) == 0
    markdown = (tmp_path / "t2.md").read_text()
    header = table_line(markdown, "Model")
    rows = {label: dict(zip(header, table_line(markdown, label))) for label in (
        "Softmax (model.emsize=16, model.nhidlast=16)", "Softmax (model.emsize=32, model.nhidlast=32)",
        "SS", "MoS")}
    for label, softmax in (("SS", [120.0, 121.0]), ("MoS", [160.0, 161.0])):
        own = runs["ss", 32] if label == "SS" else runs["mos", 16]
        assert rows[label]["p-value (vs Softmax)"] == f"{stats.ttest_ind(own, softmax).pvalue:.2e}", label
        change = 100 * math.expm1(np.mean(np.log(own)) - np.mean(np.log(softmax)))
        assert rows[label]["Test ppl vs Softmax: % [95% CI], p"].startswith(f"{change:+.1f}%"), label
    for label in ("Softmax (model.emsize=16, model.nhidlast=16)", "Softmax (model.emsize=32, model.nhidlast=32)"):
        assert rows[label]["Test ppl vs Softmax: % [95% CI], p"] == "baseline"
        assert rows[label]["[SB] p-value (vs Softmax)"] == "N/A"
    assert "each row against Softmax at a common epoch" in markdown


def test_a_paper_table_says_when_its_runs_read_another_corpus(tmp_path, capsys):
    """[SB]'s columns and p-values beside runs evaluated on a slice of PTB: said before the
    numbers, and on stderr."""
    root = tmp_path / "runs"
    for head in ("softmax", "ss"):
        for seed in (1, 2):
            run = fake_run(root, f"{head}-{seed}", "ptb", head, seed, test_ppl=57.0 + seed / 10,
                           config={"train": {"asgd_trigger": "et"}})
    assert report.main(["table", str(root), "--paper", "table2", "--out", str(tmp_path / "t2")]) == 0
    assert "Not the published corpus" not in (tmp_path / "t2.md").read_text()
    # trained and evaluated on a slice (a run that trained on the published corpus and was
    # evaluated on a slice has its test ppl refused instead: tables.corpus_note)
    evaluation = json.loads((run / "eval_best.json").read_text())
    (run / "eval_best.json").write_text(json.dumps({**evaluation, "corpus": {"folder": "/tmp/slice/ptb",
                                                                             "published": False}}))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["allow_modified_corpus"] = True
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert report.main(["table", str(root), "--paper", "table2", "--out", str(tmp_path / "t2")]) == 0
    markdown = (tmp_path / "t2.md").read_text()
    warning = (f"1 of the 4 runs were evaluated on a corpus that is not the published one "
               f"(data.allow_modified_corpus; e.g. {run}): the [SB] columns set their numbers against the "
               f"paper's on another text")
    assert markdown.index(f"**Not the published corpus**: {warning}.") < markdown.index("| Model |")
    assert f"warning: {warning}\n" in capsys.readouterr().err


def test_a_paper_table_says_when_its_models_are_not_sbs(tmp_path):
    """Issue 46: a miniature's numbers were set beside [SB]'s 24.22M-parameter ones without a word."""
    root = tmp_path / "runs"
    for head, params in (("softmax", 180_416), ("ss", 24_221_600)):
        for seed in (1, 2):
            fake_run(root, f"{head}-{seed}", "ptb", head, seed, test_ppl=57.0 + seed / 10, params=params,
                     config={"train": {"asgd_trigger": "et"}})
    assert report.main(["table", str(root), "--paper", "table2", "--out", str(tmp_path / "t2")]) == 0
    markdown = (tmp_path / "t2.md").read_text()
    note = next(line for line in markdown.splitlines() if "Not [SB]'s model" in line)
    assert markdown.index(note) < markdown.index("| Model |")           # before the numbers
    assert "Softmax 0.18M here, 24.22M in [SB]" in note and "SS " not in note
    for path in root.glob("softmax-*/run.json"):                       # [SB]'s size: said so
        path.write_text(json.dumps({**json.loads(path.read_text()), "params": 24_221_600}))
    assert report.main(["table", str(root), "--paper", "table2", "--out", str(tmp_path / "t2")]) == 0
    markdown = (tmp_path / "t2.md").read_text()
    assert "Not [SB]'s model" not in markdown
    assert "Every row with a published counterpart has the parameter count [SB] prints for it." in markdown
    # SM Table 12 prints no parameter count: nothing to check against, and it says so
    fake_run(root, "mos-k15", "ptb", "mos", 1, test_ppl=56.0, params=180_416,
             config={"head": {"components": 15, "dropoutl": 0.0}, "train": {"asgd_trigger": "nt"}})
    assert report.main(["table", str(root / "mos-k15"), "--paper", "sm-table12", "--out", str(tmp_path / "t12")]) == 0
    assert "No parameter count to check against [SB]'s" in (tmp_path / "t12.md").read_text()


def test_paper_table_refuses_another_baseline(table5_runs, tmp_path, capsys):
    assert report.main(["table", str(table5_runs), "--paper", "table5", "--baseline", "mos",
                        "--out", str(tmp_path / "t")]) == 2
    assert "compare against Softmax‡" in capsys.readouterr().err


# ---------------------------------------------------------------------- Figure 2

def test_pearson_r_is_scipys_on_known_samples():
    x = [402, 5113, 8904, 496, 9981, 7000]
    y = [57.08, 57.05, 57.00, 56.80, 54.91, 57.3]
    r = pearson_r(x, y)
    assert r == stats.pearsonr(x, y).statistic
    dx, dy = np.subtract(x, np.mean(x)), np.subtract(y, np.mean(y))          # by hand
    assert r == pytest.approx(float(dx @ dy / math.sqrt((dx @ dx) * (dy @ dy))), rel=1e-12)
    assert pearson_r([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert math.isnan(pearson_r([1, 1, 1], [1, 2, 3])) and math.isnan(pearson_r([1], [2]))
    assert r_with_interval([1, 2, 3], [2, 4, 5]) == f"{pearson_r([1, 2, 3], [2, 4, 5]):.2f} (n = 3: no interval)"
    assert r_with_interval([1, 1, 1], [1, 2, 3]) == "—"


@pytest.fixture
def gss_grid(tmp_path) -> tuple[Path, list]:
    """A 3 x 3 GSS grid on PTB with known ranks and perplexities, plus runs the report leaves out."""
    root = tmp_path / "grid"
    points = []
    for i, c in enumerate((-1.5, 0.0, 1.5)):
        for j, k in enumerate((1.5, 2.5, 3.0)):
            rank, ppl = 1000 + 900 * i + 250 * j, 56.5 + 0.3 * j - 0.1 * i + 0.05 * (i * j % 2)
            fake_run(root, f"gss-c{c}-k{k}", "ptb", "gss", 141, test_ppl=ppl, press_rank=rank,
                     config={"head": {"c": c, "k": k}})
            points.append((c, k, rank, ppl))
    fake_run(root, "softmax", "ptb", "softmax", 141, test_ppl=57.0, press_rank=402)
    fake_run(root, "gss-unranked", "ptb", "gss", 141, test_ppl=57.0, config={"head": {"c": 2.0, "k": 2.0}})
    return root, points


def test_correlation_report(gss_grid, tmp_path):
    root, points = gss_grid
    out = tmp_path / "figure2"
    assert report.main(["correlation", str(root), "--out", str(out)]) == 0
    markdown = (tmp_path / "figure2.md").read_text()
    ranks, ppls = [p[2] for p in points], [p[3] for p in points]
    low, high = GSS_GRID["ptb"].ppl_range
    inside = [(r, p) for r, p in zip(ranks, ppls) if low <= p <= high]
    assert 2 < len(inside) < len(points)
    row = table_line(markdown, "PTB")
    def with_interval(result):
        low, high = result.confidence_interval(0.95)
        return f"{result.statistic:.2f} [{low:.2f}, {high:.2f}]"
    assert row == ["PTB", "9", with_interval(stats.pearsonr(ranks, ppls)), "0.48", "[56.6, 57.6]",
                   str(len(inside)), with_interval(stats.pearsonr(*zip(*inside))), "0.24"]
    # Fisher's z by hand: atanh(r) +- 1.96 / sqrt(n - 3)
    r = stats.pearsonr(ranks, ppls).statistic
    half = stats.norm.ppf(0.975) / math.sqrt(len(ranks) - 3)
    assert row[2] == f"{r:.2f} [{math.tanh(math.atanh(r) - half):.2f}, {math.tanh(math.atanh(r) + half):.2f}]"
    assert "softmax`" not in markdown and "a Softmax run, not GSS: left out" in markdown
    assert "gss-unranked: press_rank (no rank_test.json" in markdown
    rows = read_csv(tmp_path / "figure2.csv")
    assert len(rows) == 9 and {(float(r["c"]), float(r["k"])) for r in rows} == {p[:2] for p in points}
    assert (tmp_path / "figure2.png").read_bytes()[:8] == PNG
    by_dataset, _ = collect_points([root / "gss-c0.0-k2.5"])
    assert [(p.c, p.k, p.press_rank) for p in by_dataset["ptb"]] == [(0.0, 2.5, 2150)]


# ---------------------------------------------------------------------- Figure 5 and Figure 6

@pytest.fixture
def mos_runs(tmp_path) -> Path:
    root = tmp_path / "mos"
    for dataset, base in (("ptb", 56.0), ("wikitext-2", 63.0)):
        for k in (5, 10, 15, 20):
            for seed in (1, 2):
                fake_run(root, f"{dataset}-k{k}-seed{seed}", dataset, "mos", seed,
                         test_ppl=base + 10 / k + seed / 10, press_rank=8000 + 100 * k + seed,
                         params=19_000_000 + 174_500 * k, train_ppl=30 + 20 / k,
                         config={"head": {"components": k, "dropoutl": 0.29}, "train": {"asgd_trigger": "nt"}})
        for p in (0.145, 0.0):
            fake_run(root, f"{dataset}-dropoutl{p}", dataset, "mos", 1, test_ppl=base + 20 * (0.3 - p),
                     press_rank=9990 - int(10 * p), params=21_500_620, train_ppl=25.0,
                     config={"head": {"components": 15, "dropoutl": p}, "train": {"asgd_trigger": "nt"}})
    fake_run(root, "softmax", "ptb", "softmax", 1, test_ppl=57.0, press_rank=402)
    return root


def test_mos_points_and_sweeps(mos_runs):
    from analysis.runs import find_run_dirs
    points, notes = collect(find_run_dirs([mos_runs]))
    assert list(points) == ["ptb", "wikitext-2"] and len(notes) == 1
    by_k = sweep(points["ptb"], "components")
    assert [p.components for p in by_k] == [5, 10, 15, 20]          # dropoutl 0.145 / 0 are not here
    k10 = by_k[1]
    assert k10.runs == 2 and k10.test_ppl == pytest.approx(56.0 + 1 + 0.15)
    assert k10.press_rank == pytest.approx(9001.5) and k10.params == pytest.approx(20.745)
    assert k10.train_ppl == pytest.approx(32.0)
    assert [p.dropoutl for p in sweep(points["ptb"], "dropoutl")] == [0.29, 0.145, 0.0]
    reference, source = paper_points("wikitext-2", "dropoutl")
    assert source == "SM Table 12" and [(p.dropoutl, p.press_rank) for p in reference] == \
        [(0.29, 13215), (0.145, 17256), (0.0, 19427)]
    reference, source = paper_points("ptb", "components")
    assert source == "SM Table 4" and [p.params for p in reference][:3] == [19.05, 19.40, 19.75]


def test_capacity_and_rank_figures(mos_runs, tmp_path):
    assert report.main(["capacity", str(mos_runs), "--out", str(tmp_path / "capacity")]) == 0
    markdown = (tmp_path / "capacity.md").read_text()
    assert markdown.startswith("# [SB] Figure 6")
    k5 = table_line(markdown, "K=5")               # PTB first: measured beside SM Table 4
    k5_ppl, k10_ppl = [56.0 + 2 + seed / 10 for seed in (1, 2)], [56.0 + 1 + seed / 10 for seed in (1, 2)]
    assert k5[:5] == ["K=5", "nt", "2", "19.87", "19.75"] and k5[7:10] == [
        f"{np.mean(k5_ppl):.2f} ± {np.std(k5_ppl, ddof=1):.2f}", "58.38", ""]          # the first point
    # each point against the one before it in the sweep: Welch on log test ppl (scipy's)
    welch = stats.ttest_ind(np.log(k10_ppl), np.log(k5_ppl), equal_var=False)
    low, high = welch.confidence_interval(0.95)
    change = 100 * math.expm1(np.log(k10_ppl).mean() - np.log(k5_ppl).mean())
    assert table_line(markdown, "K=10")[9] == (f"{change:+.1f}% [{100 * math.expm1(low):+.1f}, "
                                               f"{100 * math.expm1(high):+.1f}], p = {format_p(welch.pvalue)} against K=5")
    assert (tmp_path / "capacity.png").read_bytes()[:8] == PNG
    assert report.main(["mos-rank", str(mos_runs), "--out", str(tmp_path / "figure5")]) == 0
    markdown = (tmp_path / "figure5.md").read_text()
    assert "## WikiText-2, as dropoutl falls (K = 15)" in markdown
    assert "| dropoutl=0.145 | nt | 1 |" in markdown and "17,256" in markdown
    assert (tmp_path / "figure5.png").read_bytes()[:8] == PNG


def test_mos_figures_need_mos_runs(tmp_path, capsys):
    fake_run(tmp_path / "runs", "softmax", "ptb", "softmax", 1, test_ppl=57.0)
    assert report.main(["capacity", str(tmp_path / "runs"), "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == "error: no MoS run among the runs given (their heads: Softmax 1)\n"
    assert report.main(["correlation", str(tmp_path / "runs"), "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == ("error: no GSS run with both a test perplexity and a Press rank: the runs "
                                       "given are of other heads (Softmax 1)\n")


# ---------------------------------------------------------------------- SM Tables 14-16

def test_robustness_tables(tmp_path, capsys):
    run_dir = fake_run(tmp_path / "runs", "ptb-mos", "ptb", "mos", 28, test_ppl=56.0)
    fake_run(tmp_path / "runs", "ptb-softmax", "ptb", "softmax", 141, test_ppl=57.0)
    g = torch.Generator().manual_seed(0)
    matrix = torch.randn(40, 30, generator=g, dtype=torch.float64) * 3 - 9
    result = {"checkpoint": str(run_dir / "best.pt"), "head": "mos", "dataset": "ptb", "split": "test",
              "contexts": 40, **press_rank_robustness(matrix, keep=10, iterations=10,
                                                       scales=(1e-2, 1e-20, 1e-25, 1e-40))}
    (run_dir / "robustness_test.json").write_text(json.dumps(result))
    assert report.main(["robustness", str(tmp_path / "runs"), "--out", str(tmp_path / "rob")]) == 0
    markdown = (tmp_path / "rob.md").read_text()
    assert "## MoS, PTB, seed 28" in markdown and "Press rank 30; top 10" in markdown
    assert "has Press rank 8,933 (the SM does not name its precision; [SB]'s Press ranks count with float32's" in markdown
    # a float64 run's float32 rank beside its own
    result["original_float32"] = {**result["original"], "press_rank": 29, "dtype": "float32"}
    (run_dir / "robustness_test.json").write_text(json.dumps(result))
    assert report.main(["robustness", str(tmp_path / "runs"), "--out", str(tmp_path / "rob")]) == 0
    assert ("log-P matrix in float64: Press rank 30 (from a float32 model pass, in float32: 29); top 10"
            in (tmp_path / "rob.md").read_text())
    assert table_line(markdown, "Iteration")[1:] == [str(i) for i in range(1, 11)]
    assert table_line(markdown, "Press rank")[1:] == ["10"] * 10
    assert table_line(markdown, "[SB] Error ×1e-28")[1:3] == ["0.97", "0.99"]
    errors = [r["error"] for r in result["reconstruction"][1:]]
    assert table_line(markdown, "Error ×1e-28")[1:] == [f"{e / 1e-28:.2f}" for e in errors]
    noisy = result["noise"][1]
    assert noisy["c"] == 1e-20 and table_line(markdown, "1e-20")[:3] == ["1e-20", str(noisy["press_rank"]),
                                                                         "9,899"]   # SM Table 15
    assert table_line(markdown, "1e-25")[2] == "10" and table_line(markdown, "1e-40")[2] == "—"
    line = markdown.split("SM Table 16")[1]
    assert table_line(line, "1e-20") == ["1e-20", str(noisy["press_rank"]), "9,899",
                                         *map(str, noisy["effective_rank"].values()), "7 / 10 / 10"]
    assert "ptb-softmax: no robustness_test.json" in markdown
    assert (tmp_path / "rob.png").read_bytes()[:8] == PNG
    assert ROBUSTNESS.noise_press_rank[1e-20] == 9_899


def test_robustness_needs_results(tmp_path, capsys):
    run_dir = fake_run(tmp_path / "runs", "ptb-mos", "ptb", "mos", 28, test_ppl=56.0)
    assert report.main(["robustness", str(tmp_path / "runs"), "--out", str(tmp_path / "rob")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no robustness results found") and err.count("\n") == 1
    # the validation split's file is not taken for [SB]'s test-split tables, and the note says so
    (run_dir / "robustness_valid.json").write_text("{}")
    assert report.main(["robustness", str(tmp_path / "runs"), "--out", str(tmp_path / "rob")]) == 2
    assert (f"{run_dir}: no robustness_test.json; its robustness_valid.json is of the validation split, "
            f"[SB]'s tables of the test split (run python rank.py {run_dir} --robustness)") in capsys.readouterr().err


def test_robustness_of_another_head_is_left_out(tmp_path, capsys):
    """As report.py table does with rank_test.json: a file of another model (copied in) is not
    reported as the run's."""
    run_dir = fake_run(tmp_path / "runs", "ptb-mos", "ptb", "mos", 28, test_ppl=56.0)
    result = {"head": "softmax", "dataset": "ptb", "contexts": 4, "keep": 1, "original": {},
              "reconstruction": [], "noise": []}
    (run_dir / "robustness_test.json").write_text(json.dumps(result))
    assert report.main(["robustness", str(tmp_path / "runs"), "--out", str(tmp_path / "rob")]) == 2
    assert (f"{run_dir}: left out: robustness_test.json is of a softmax model, the run's head is mos: "
            f"run python rank.py {run_dir} --robustness") in capsys.readouterr().err


def test_every_published_table_is_a_paper_option():
    parser_choices = report.parse_args(["table", "x", "--out", "y", "--paper", "table2"]).paper
    assert parser_choices == "table2"
    for name, table in PUBLISHED_TABLES.items():
        assert set(table.columns) <= {"params", "seconds", "train_ppl", "val_ppl", "test_ppl", "p_value",
                                      "press_rank", "runs", *EFFECTIVE_RANK_COLUMNS}
        for row in table.rows:                       # every row can be selected by its group keys
            assert set(row.setting) <= set(table.group_by), (name, row.label)


def test_docs_published_is_the_generated_page(capsys):
    """docs/published.md is what `report.py published` writes from analysis/published.py."""
    import report
    from analysis.tables import published_markdown
    assert Path("docs/published.md").read_text(encoding="utf-8") == published_markdown()
    assert report.main(["published"]) == 0
    assert "| Softmax | PTB | 24.22M | ~55 | 33.91 ± 0.25 | 59.55 ± 0.12 | 57.08 ± 0.09 |" in capsys.readouterr().out


def test_the_sweeps_and_the_grid_refuse_points_that_differ_in_another_key(gss_grid, mos_runs, tmp_path, capsys):
    """A newcomer's Figure 6 set K = 15 at d = 16 against K = 5 at d = 32 and read the step as K's;
    Figure 2's r ran over GSS runs of three d's; ranks over 2,000 contexts were averaged with ranks
    over 10,000; MoS runs in neither sweep vanished without a note."""
    import yaml

    def at_d_16(run_dir: Path) -> None:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        config.setdefault("model", {})["emsize"] = 16
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    root, _ = gss_grid
    at_d_16(root / "gss-c0.0-k2.5")
    assert report.main(["correlation", str(root), "--out", str(tmp_path / "f2")]) == 2
    assert capsys.readouterr().err.startswith("error: PTB, the GSS(c, k) grid: the runs are not seeds of one "
                                              "configuration, they differ in model.emsize (")
    for seed in (1, 2):                                     # K = 10 at another d than the others
        at_d_16(mos_runs / f"ptb-k10-seed{seed}")
    assert report.main(["capacity", str(mos_runs), "--out", str(tmp_path / "f6")]) == 2
    assert capsys.readouterr().err.startswith("error: PTB, the K sweep: the runs are not seeds of one "
                                              "configuration, they differ in model.emsize (")
    assert report.main(["capacity", str(mos_runs), "--only", "data.dataset=wikitext-2",
                        "--out", str(tmp_path / "f6")]) == 0
    # a MoS point in neither sweep is named; a rank over other contexts is left out, not averaged
    fake_run(mos_runs, "wikitext-2-k4", "wikitext-2", "mos", 1, test_ppl=70.0, press_rank=5000,
             config={"head": {"components": 4, "dropoutl": 0.145}, "train": {"asgd_trigger": "nt"}})
    ranked = mos_runs / "wikitext-2-k20-seed2" / "rank_test.json"
    ranked.write_text(json.dumps({**json.loads(ranked.read_text()), "contexts": 2000}))
    assert report.main(["capacity", str(mos_runs), "--only", "data.dataset=wikitext-2",
                        "--out", str(tmp_path / "f6")]) == 0
    markdown = (tmp_path / "f6.md").read_text()
    assert ("- WikiText-2: MoS with K = 4, dropoutl 0.145 (1 run): in neither sweep (K at dropoutl 0.29, "
            "dropoutl at K = 15): left out") in markdown
    assert f"`{ranked.parent}`: rank_test.json is over 2000 contexts in None" in markdown
