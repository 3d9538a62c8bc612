"""The MoS sweeps of [SB]: capacity against K (Figure 6) and rank against perplexity (Figure 5).

MoS runs are grouped by head.components (K), head.dropoutl and train.asgd_trigger; each group is
one point, its numbers the means over its runs (seeds of one configuration: runs of a group that
differ in another compared key are refused, pooling.py): parameters (run.json), train perplexity
(metrics.jsonl, best epoch), test perplexity (eval_best.json; ± its runs' sample std), Press rank
(rank_test.json). The table sets each point's test perplexity against the point before it in the
sweep (Welch on log ppl, stats.py), so that a step in K is read against the seeds' spread.

- capacity (Figure 6): per dataset, train and test perplexity against K (left axis) and the
  parameter count against K (right axis), for the runs at dropoutl 0.29.
- rank (Figure 5): per dataset, test perplexity against Press rank as K grows (dropoutl 0.29,
  left) and as dropoutl falls (K = 15, right), each point labelled with its K or dropoutl.

The paper's points (SM Tables 4, 5 and 12; analysis/published.py) are drawn hollow and dashed
beside the measured ones. [SB] trained those runs with NT-ASGD; the legend names the trigger of
the measured runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from . import AnalysisError
from .figures import prefixed, pyplot, save
from .published import SM_TABLE12, SM_TABLES_4_5, PublishedRow, dataset_label, same_value
from .runs import dataset_order, head_label, heads_named, markdown_table
from .stats import welch
from .pooling import compared, refuse_unlike
from .tables import Row, align_rank_settings, group_rows, read_run

KEYS = ("head.components", "head.dropoutl", "train.asgd_trigger")
BASE_COMPONENTS, BASE_DROPOUTL = 15, 0.29        # [SB]'s MoS: the fixed value of each sweep


@dataclass(frozen=True)
class Point:
    components: int
    dropoutl: float
    trigger: str | None
    runs: int
    params: float | None          # millions
    train_ppl: float | None
    test_ppl: float | None
    press_rank: float | None
    test_logs: tuple[float, ...] = ()     # each run's log test ppl (the step's Welch interval)

    def label(self, sweep: str) -> str:
        return f"K={self.components}" if sweep == "components" else f"dropoutl={self.dropoutl:g}"


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def measured_point(row: Row) -> Point:
    components, dropoutl, trigger = row.group
    params = _mean(row.values("params"))
    return Point(components, dropoutl, trigger, len(row.runs), None if params is None else params / 1e6,
                 _mean(row.values("train_ppl")), _mean(row.values("test_ppl")), _mean(row.values("press_rank")),
                 tuple(math.log(v) for v in row.values("test_ppl")))


def paper_point(row: PublishedRow) -> Point:
    setting = row.setting
    return Point(setting["head.components"], setting["head.dropoutl"], setting["train.asgd_trigger"], 1,
                 None if row.params is None else float(row.params.rstrip("M")),
                 row.train_ppl.mean, row.test_ppl.mean, row.press_rank.mean)


def collect(run_dirs: Sequence[Path]) -> tuple[dict[str, list[Point]], list[str]]:
    """Measured points of the MoS runs by dataset, and a note per run that is not MoS."""
    results, notes, others = [], [], []
    for run_dir in run_dirs:
        run = read_run(run_dir, KEYS)
        if run.head == "mos":
            results.append(run)
        else:
            others.append(run.head)
            notes.append(f"{run_dir}: a {head_label(run.head)} run, not MoS: left out")
    if not results:
        raise AnalysisError(f"no MoS run among the runs given (their heads: {heads_named(others)})")
    notes += align_rank_settings(results)   # one number of contexts and precision for every rank
    rows = group_rows(results, KEYS, unlike="refuse")
    for dataset in dict.fromkeys(row.dataset for row in rows):
        for name in SWEEPS:
            # a sweep's steps are read as K's (or dropoutl's): its points may differ in nothing else
            refuse_unlike(f"{dataset_label(dataset)}, the {SWEEPS[name]} sweep",
                          [{k: v for k, v in compared(run.config).items() if k not in KEYS}
                           for row in rows if row.dataset == dataset and in_sweep(row.group[0], row.group[1], name)
                           for run in row.runs])
    notes += [f"{dataset_label(row.dataset)}: MoS with K = {row.group[0]}, dropoutl {row.group[1]:g} "
              f"({len(row.runs)} run{'s' if len(row.runs) > 1 else ''}): in neither sweep (K at dropoutl "
              f"{BASE_DROPOUTL}, dropoutl at K = {BASE_COMPONENTS}): left out"
              for row in rows if not any(in_sweep(row.group[0], row.group[1], name) for name in SWEEPS)]
    points: dict[str, list[Point]] = {}
    for row in rows:
        points.setdefault(row.dataset, []).append(measured_point(row))
    return dict(sorted(points.items(), key=lambda item: dataset_order(item[0]))), notes


SWEEPS = {"components": "K", "dropoutl": "dropoutl"}


def in_sweep(components, dropoutl, name: str) -> bool:
    """K varies at dropoutl 0.29; dropoutl varies at K = 15."""
    if name == "components":
        return same_value(dropoutl, BASE_DROPOUTL)
    return components == BASE_COMPONENTS


def sweep(points: Sequence[Point], name: str) -> list[Point]:
    """The points of one sweep (in_sweep), sorted in the direction [SB] reads it (K growing,
    dropoutl falling)."""
    chosen = [p for p in points if in_sweep(p.components, p.dropoutl, name)]
    return sorted(chosen, key=(lambda p: p.components) if name == "components" else (lambda p: -p.dropoutl))


def paper_points(dataset: str, name: str) -> tuple[list[Point], str]:
    """[SB]'s points of a sweep on a dataset and where they are printed."""
    table = SM_TABLES_4_5 if name == "components" else SM_TABLE12
    rows = [row for row in table.rows if row.dataset == dataset]
    return sweep([paper_point(row) for row in rows], name), rows[0].source if rows else ""


def measured_label(trigger: str | None, points: Sequence[Point]) -> str:
    runs = sorted({p.runs for p in points})
    runs_text = f"{runs[0]}" if len(runs) == 1 else f"{runs[0]}-{runs[-1]}"
    trigger_text = f"{trigger.upper()}-ASGD" if trigger else "trigger unknown"
    return f"measured ({trigger_text}, mean of {runs_text} run{'s' if runs != [1] else ''})"


@dataclass(frozen=True)
class Series:
    label: str
    points: list[Point]
    linestyle: str
    hollow: bool                  # the paper's points are drawn hollow


def all_series(points: Sequence[Point], dataset: str, name: str) -> list[Series]:
    """The measured points of a sweep, one series per ASGD trigger, then [SB]'s."""
    chosen = sweep(points, name)
    series = []
    for trigger, linestyle in zip(dict.fromkeys(p.trigger for p in chosen), ("-", "-.", ":")):
        group = [p for p in chosen if p.trigger == trigger]
        series.append(Series(measured_label(trigger, group), group, linestyle, False))
    reference, source = paper_points(dataset, name)
    if reference:
        series.append(Series(f"[SB] {source} (NT-ASGD)", reference, "--", True))
    return series


def plotted(points: Sequence[Point], x: str, y: str) -> list[Point]:
    return [p for p in points if getattr(p, x) is not None and getattr(p, y) is not None]


# ---------------------------------------------------------------------- Figure 6

def plot_capacity(points: dict[str, list[Point]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(len(points), 1, figsize=(10, 6.4 * len(points)), squeeze=False)
    for ax, (dataset, dataset_points) in zip(axes[:, 0], points.items()):
        twin = ax.twinx()
        series = all_series(dataset_points, dataset, "components")
        for one in series:
            for name, what, marker, colour, axis in (("train_ppl", "train ppl", "o", "tab:blue", ax),
                                                     ("test_ppl", "test ppl", "s", "tab:red", ax),
                                                     ("params", "parameters", "^", "0.35", twin)):
                shown = plotted(one.points, "components", name)
                axis.plot([p.components for p in shown], [getattr(p, name) for p in shown], one.linestyle,
                          marker=marker, color=colour, markerfacecolor="none" if one.hollow else colour,
                          label=f"{what}, {one.label}")
        ax.set(title=f"{head_label('mos')} on {dataset_label(dataset)}: capacity and perplexity against K "
                     f"(dropoutl {BASE_DROPOUTL})",
               xlabel="mixture components K", ylabel="perplexity")
        twin.set_ylabel("parameters (millions)")
        ax.set_xticks(sorted({p.components for one in series for p in one.points}))
        handles = [h for a in (ax, twin) for h in a.get_legend_handles_labels()[0]]
        ax.legend(handles, [h.get_label() for h in handles], fontsize="small", ncol=2,
                  loc="upper center", bbox_to_anchor=(0.5, -0.12))       # below the axes, off the lines
        ax.grid(alpha=0.3)
    save(fig, path)


# ---------------------------------------------------------------------- Figure 5

PANELS = (("components", f"as K grows (dropoutl {BASE_DROPOUTL})"),
          ("dropoutl", f"as dropoutl falls (K = {BASE_COMPONENTS})"))


def plot_rank(points: dict[str, list[Point]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(len(points), 2, figsize=(13, 5.2 * len(points)), squeeze=False)
    for axes_row, (dataset, dataset_points) in zip(axes, points.items()):
        for ax, (name, title) in zip(axes_row, PANELS):
            series = all_series(dataset_points, dataset, name)
            for one, colour in zip(series, ("tab:blue", "tab:green", "tab:purple", "tab:orange")):
                colour = "tab:red" if one.hollow else colour
                shown = plotted(one.points, "press_rank", "test_ppl")
                ax.plot([p.press_rank for p in shown], [p.test_ppl for p in shown], one.linestyle, marker="o",
                        color=colour, markerfacecolor="none" if one.hollow else colour, label=one.label)
                for p in shown:
                    ax.annotate(p.label(name), (p.press_rank, p.test_ppl), textcoords="offset points",
                                xytext=(5, 4), fontsize="x-small", color=colour)
            if all(one.hollow for one in series):
                ax.text(0.5, 0.5, "no measured runs in this sweep", transform=ax.transAxes,
                        ha="center", color="0.4")
            ax.margins(x=0.12, y=0.08)            # room for the labels of the outer points
            ax.set(title=f"{head_label('mos')} on {dataset_label(dataset)}: rank and test perplexity {title}",
                   xlabel="Press rank of the test log-P matrix", ylabel="test perplexity")
            ax.legend(fontsize="small")
            ax.grid(alpha=0.3)
    save(fig, path)


# ---------------------------------------------------------------------- the command

def points_table(points: dict[str, list[Point]], names: Sequence[str]) -> str:
    """The plotted numbers, measured beside [SB]'s, one section per dataset and sweep."""
    def show(value, digits=2):
        return "—" if value is None else f"{value:,.{digits}f}"

    parts = []
    for dataset, dataset_points in points.items():
        for name in names:
            reference, source = paper_points(dataset, name)
            by_value = {p.label(name): p for p in reference}
            rows, before = [], {}          # the previous point of each trigger's series
            for p in sweep(dataset_points, name):
                ref = by_value.get(p.label(name)) if p.trigger == "nt" else None
                previous = before.get(p.trigger)
                step = ("" if previous is None or not p.test_logs or not previous.test_logs
                        else f"{welch(p.test_logs, previous.test_logs).describe()} against {previous.label(name)}")
                spread = f" ± {np.std(np.exp(p.test_logs), ddof=1):.2f}" if len(p.test_logs) > 1 else ""
                rows.append([p.label(name), p.trigger or "—", str(p.runs), show(p.params),
                             show(ref and ref.params), show(p.train_ppl), show(ref and ref.train_ppl),
                             show(p.test_ppl) + spread, show(ref and ref.test_ppl), step,
                             show(p.press_rank, 0), show(ref and ref.press_rank, 0)])
                before[p.trigger] = p
            header = ["Setting", "ASGD", "Runs", "Params (M)", "[SB]", "Train ppl", "[SB]", "Test ppl",
                      "[SB]", "Test ppl vs the point before: % [95% CI], p", "Press rank", "[SB]"]
            parts.append(f"## {dataset_label(dataset)}, {dict(PANELS)[name]}\n\n"
                         + (markdown_table(header, rows) if rows else "No runs.\n")
                         + (f"\n[SB] columns: {source}, NT-ASGD runs (shown beside NT-ASGD runs only).\n"
                            if reference else ""))
    return "\n".join(parts)


def write_mos_figure(run_dirs: Sequence[Path], out_prefix: Path, figure: str) -> str:
    """figure "capacity" (Figure 6) or "rank" (Figure 5): PREFIX.png and PREFIX.md; the Markdown."""
    points, notes = collect(run_dirs)
    if figure == "capacity":
        plot_capacity(points, prefixed(out_prefix, ".png"))
        title, names = "[SB] Figure 6: MoS capacity and perplexity against K", ("components",)
    else:
        plot_rank(points, prefixed(out_prefix, ".png"))
        title, names = "[SB] Figure 5: MoS Press rank and test perplexity", ("components", "dropoutl")
    text = f"# {title}\n\n" + points_table(points, names)
    if notes:
        text += "\n## Left out\n\n" + "\n".join(f"- {note}" for note in notes) + "\n"
    prefixed(out_prefix, ".md").write_text(text, encoding="utf-8")
    return text
