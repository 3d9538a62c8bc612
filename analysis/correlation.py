"""[SB] Figure 2: Press rank against test perplexity over the GSS(c, k) grid, with Pearson's r.

One point per GSS run (every seed of every grid point): its Press rank (rank_test.json) and test
perplexity (eval_best.json). Per dataset, Pearson's correlation coefficient of the two
(scipy.stats.pearsonr) over all runs, and over the runs inside the perplexity range [SB] keeps when
it leaves out the outliers (p. 3: [56.6, 57.6] on PTB, [64.0, 65.0] on WikiText-2), each beside
the paper's value (analysis/published.py, GSS_GRID).

Writes PREFIX.png (one panel per dataset, points coloured by k), PREFIX.md and PREFIX.csv.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy import stats

from . import AnalysisError
from .figures import prefixed, pyplot, save
from .published import GSS_GRID, dataset_label
from .runs import dataset_order, head_label, heads_named, markdown_table, write_csv
from .pooling import compared, refuse_unlike
from .tables import align_rank_settings, read_run

GRID_KEYS = ("head.c", "head.k")


@dataclass(frozen=True)
class GridPoint:
    run_dir: Path
    c: float
    k: float
    seed: int | None
    press_rank: int
    test_ppl: float


def pearson_r(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r of two samples (scipy.stats.pearsonr); nan when undefined (fewer than two
    points, or a sample that does not vary)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    with warnings.catch_warnings():        # two points: r is +-1 and scipy warns that p is 1
        warnings.simplefilter("ignore")
        return float(stats.pearsonr(x, y).statistic)


def collect_points(run_dirs: Sequence[Path]) -> tuple[dict[str, list[GridPoint]], list[str]]:
    """GSS runs' points by dataset, and a note per run left out (another head, a missing number)."""
    points: dict[str, list[GridPoint]] = {}
    notes = []
    runs = [read_run(run_dir, GRID_KEYS) for run_dir in run_dirs]
    gss = [run for run in runs if run.head == "gss"]
    # Ranks over one number of contexts and one precision (a table's rule), and one r per
    # dataset over runs that differ only in c, k and the seed: r over runs of two d's would
    # measure d.
    align_rank_settings(gss)                # a rank left out is in its run's missing notes
    for dataset in dict.fromkeys(run.dataset for run in gss):
        refuse_unlike(f"{dataset_label(dataset)}, the GSS(c, k) grid",
                      [{k: v for k, v in compared(run.config).items() if k not in GRID_KEYS}
                       for run in gss if run.dataset == dataset])
    for run in runs:
        run_dir = run.dir
        if run.head != "gss":
            notes.append(f"{run_dir}: a {head_label(run.head)} run, not GSS: left out")
        elif run.press_rank is None or run.test_ppl is None:
            notes.append(f"{run_dir}: " + "; ".join(m for m in run.missing
                                                    if m.startswith(("test_ppl", "press_rank"))))
        else:
            c, k = run.group
            points.setdefault(run.dataset, []).append(
                GridPoint(run_dir, c, k, run.seed, run.press_rank, run.test_ppl))
    if not points:
        unmeasured = [note for note in notes if "not GSS: left out" not in note]
        raise AnalysisError("no GSS run with both a test perplexity and a Press rank: "
                            + ("; ".join(unmeasured) if unmeasured else
                               f"the runs given are of other heads ({heads_named([r.head for r in runs])})"))
    return dict(sorted(points.items(), key=lambda item: dataset_order(item[0]))), notes


def correlations(points: Sequence[GridPoint], dataset: str) -> dict:
    """r over all points, and over the points in [SB]'s perplexity range of the dataset."""
    ranks = [p.press_rank for p in points]
    ppls = [p.test_ppl for p in points]
    result = {"runs": len(points), "r": pearson_r(ranks, ppls), "r_interval": r_with_interval(ranks, ppls)}
    published = GSS_GRID.get(dataset)
    if published is not None:
        low, high = published.ppl_range
        inside = [p for p in points if low <= p.test_ppl <= high]
        result.update(paper_r=published.pearson_r, range=published.ppl_range, runs_in_range=len(inside),
                      r_in_range=pearson_r([p.press_rank for p in inside], [p.test_ppl for p in inside]),
                      r_in_range_interval=r_with_interval([p.press_rank for p in inside],
                                                          [p.test_ppl for p in inside]),
                      paper_r_in_range=published.pearson_r_in_range)
    return result


def format_r(r: float | None) -> str:
    return "—" if r is None or math.isnan(r) else f"{r:.2f}"


def r_with_interval(x: Sequence[float], y: Sequence[float]) -> str:
    """Pearson's r with its 95% interval (Fisher's z, scipy's; four points or more), e.g.
    "0.48 [0.10, 0.74]"; "—" where r is undefined."""
    r = pearson_r(x, y)
    if math.isnan(r):
        return "—"
    if len(x) < 4 or abs(r) == 1.0:
        return f"{r:.2f} (n = {len(x)}: no interval)"
    low, high = stats.pearsonr(x, y).confidence_interval(0.95)
    return f"{r:.2f} [{low:.2f}, {high:.2f}]"


def plot(points: dict[str, list[GridPoint]], summaries: dict[str, dict], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(len(points), 1, figsize=(10, 5.2 * len(points)), squeeze=False)
    for ax, (dataset, dataset_points) in zip(axes[:, 0], points.items()):
        summary = summaries[dataset]
        ks = sorted({p.k for p in dataset_points})
        colours = plt.cm.viridis(np.linspace(0, 0.9, len(ks)))
        for k, colour in zip(ks, colours):
            chosen = [p for p in dataset_points if p.k == k]
            ax.scatter([p.press_rank for p in chosen], [p.test_ppl for p in chosen], color=colour,
                       label=f"k = {k:g}", s=28, edgecolors="black", linewidths=0.4)
        if "range" in summary:
            low, high = summary["range"]
            ax.axhspan(low, high, color="0.9", zorder=0,
                       label=f"[SB]'s range without outliers,\ntest ppl in [{low:g}, {high:g}]: "
                             f"r = {format_r(summary['r_in_range'])}\n([SB]: {format_r(summary['paper_r_in_range'])})")
        title = (f"{head_label('gss')}(c, k) on {dataset_label(dataset)}: Pearson r = "
                 f"{format_r(summary['r'])} over {summary['runs']} runs")
        if "paper_r" in summary:
            title += f"\n[SB] Figure 2: r = {format_r(summary['paper_r'])}"
        ax.set(title=title, xlabel="Press rank of the test log-P matrix", ylabel="test perplexity")
        ax.legend(fontsize="small", title="GSS slope k (c varies)", title_fontsize="small",
                  loc="upper left", bbox_to_anchor=(1.01, 1))     # beside the points, not over them
        ax.grid(alpha=0.3)
    save(fig, path)


def write_correlation(run_dirs: Sequence[Path], out_prefix: Path) -> str:
    """Write PREFIX.png, PREFIX.md and PREFIX.csv; return the Markdown."""
    points, notes = collect_points(run_dirs)
    summaries = {dataset: correlations(dataset_points, dataset) for dataset, dataset_points in points.items()}
    plot(points, summaries, prefixed(out_prefix, ".png"))

    header = ["Dataset", "Runs", "Pearson r [95% CI]", "[SB] r", "Test ppl range", "Runs in range",
              "r in range [95% CI]", "[SB] r in range"]
    rows = []
    for dataset, s in summaries.items():
        in_range = "range" in s
        rows.append([dataset_label(dataset), str(s["runs"]), s["r_interval"], format_r(s.get("paper_r")),
                     f"[{s['range'][0]:g}, {s['range'][1]:g}]" if in_range else "—",
                     str(s["runs_in_range"]) if in_range else "—", s.get("r_in_range_interval", "—"),
                     format_r(s.get("paper_r_in_range"))])
    text = ("# [SB] Figure 2: Press rank against test perplexity, GSS(c, k) grid\n\n"
            + markdown_table(header, rows)
            + "\nPearson's r (scipy.stats.pearsonr) of Press rank and test perplexity over the runs, "
              "with its 95% interval (Fisher's z; none under four runs): [SB]'s r outside it is a "
              "difference at 95%; "
              "'in range': only the runs whose test perplexity lies in the range [SB] uses to leave "
              "out outliers (p. 3).\n")
    if notes:
        text += "\n## Left out\n\n" + "\n".join(f"- {note}" for note in notes) + "\n"
    write_csv(prefixed(out_prefix, ".csv"), ["dataset", "c", "k", "seed", "press_rank", "test_ppl", "run_dir"],
              [[d, p.c, p.k, p.seed, p.press_rank, p.test_ppl, str(p.run_dir)]
               for d, dataset_points in points.items() for p in dataset_points])
    prefixed(out_prefix, ".md").write_text(text, encoding="utf-8")
    return text
