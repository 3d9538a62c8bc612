"""Learning curves (report.py curves): validation perplexity against epoch, one line per head
(and per value of the --group-by keys), the mean over its runs with their range shaded, and
where ASGD took over marked."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from . import AnalysisError
from .figures import plain_log_ticks, prefixed, pyplot, save
from .runs import markdown_table, read_metrics
from .tables import Row, group_rows, read_run


@dataclass
class Curve:
    label: str
    epochs: np.ndarray          # 1, 2, ... as far as every run of the row has gone
    mean: np.ndarray            # validation ppl, mean over the runs
    low: np.ndarray             # and the smallest and largest of them
    high: np.ndarray
    runs: int
    switch_epochs: list[int]    # per run: the last SGD epoch before ASGD (none: never switched)


def switch_epoch(records: Sequence[dict]) -> int | None:
    """The epoch after which the run averaged (ASGD): the one that says it switched, or, for a run
    that averaged from the start, 0."""
    for record in records:
        if record.get("switched_to_asgd"):
            return record["epoch"]
        if record.get("optimizer") == "ASGD":
            return record["epoch"] - 1
    return None


def row_curve(row: Row, with_dataset: bool = False) -> Curve:
    histories = [read_metrics(run.dir) for run in row.runs]
    common = min(len(h) for h in histories)
    if common == 0:
        raise AnalysisError(f"{row.runs[0].dir}: no metrics.jsonl records (no epoch finished)")
    ppl = np.array([[record["val_ppl"] for record in h[:common]] for h in histories])
    switches = [s for s in (switch_epoch(h) for h in histories) if s is not None]
    label = f"{row.label}, {row.dataset}" if with_dataset else row.label
    return Curve(label, np.arange(1, common + 1), ppl.mean(axis=0), ppl.min(axis=0), ppl.max(axis=0),
                 len(histories), switches)


def plot_curves(curves: Sequence[Curve], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    switches = sorted({s for curve in curves for s in curve.switch_epochs})
    for curve in curves:
        (line,) = ax.plot(curve.epochs, curve.mean, marker="o", markersize=3, linewidth=1.2,
                          label=f"{curve.label} ({curve.runs} run{'s' * (curve.runs != 1)})")
        if curve.runs > 1:
            ax.fill_between(curve.epochs, curve.low, curve.high, color=line.get_color(), alpha=0.15)
    for i, epoch in enumerate(switches):
        # ASGD averages from the epoch after the switch: the line stands between the two.
        ax.axvline(epoch + 0.5, color="grey", linestyle=":", linewidth=1,
                   label="ASGD from here" if i == 0 else None)
    from matplotlib.ticker import MaxNLocator
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="epoch", ylabel="validation perplexity (log scale)", title=title)
    ax.legend(fontsize="small")
    save(fig, path)


def write_curves(run_dirs: Sequence[Path], out_prefix: Path, group_by: Sequence[str] = ()) -> str:
    """PREFIX.png (the figure) and PREFIX.md (the numbers); returns the Markdown."""
    rows = group_rows([read_run(d, group_by) for d in run_dirs], group_by)
    datasets = sorted({row.dataset for row in rows})
    # Runs of two corpora: each label says its corpus (two columns read "Softmax" otherwise).
    curves = [row_curve(row, with_dataset=len(datasets) > 1) for row in rows]
    title = f"Validation perplexity by epoch ({', '.join(datasets)})"
    plot_curves(curves, prefixed(out_prefix, ".png"), title)
    longest = max(len(c.epochs) for c in curves)
    table_rows = []
    for epoch in range(1, longest + 1):
        cells = []
        for c in curves:
            if epoch > len(c.epochs):
                cells.append("")
                continue
            i = epoch - 1
            spread = f" ({c.low[i]:.1f}–{c.high[i]:.1f})" if c.runs > 1 else ""
            asgd = " †" if any(epoch > s for s in c.switch_epochs) else ""
            cells.append(f"{c.mean[i]:.1f}{spread}{asgd}")
        table_rows.append([str(epoch), *cells])
    text = (f"# {title}\n\n" + markdown_table(["epoch", *(f"{c.label} (n = {c.runs})" for c in curves)], table_rows)
            + "\nMean over the n runs of each column (their range in brackets), as far as all n have "
              "trained (to the earliest stop among them); † the weights are ASGD averages (validated "
              "after the switch). Figure: "
            + prefixed(out_prefix, ".png").name + "\n")
    prefixed(out_prefix, ".md").write_text(text, encoding="utf-8")
    return text
