"""Test perplexity and Press rank against one config key (report.py versus), one line per head:
the d-sweep of the CPU results (--key model.emsize), the language-model counterpart of
synthetic.py's mode match and KL against D."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from . import AnalysisError
from .figures import plain_log_ticks, prefixed, pyplot, save
from .runs import head_label, markdown_table, write_csv
from .tables import group_rows, mean_std, read_run


def write_versus(run_dirs: Sequence[Path], key: str, out_prefix: Path) -> str:
    """PREFIX.png (two panels), PREFIX.md and PREFIX.csv; returns the Markdown."""
    results = [read_run(d, [key]) for d in run_dirs]
    if any(r.group[0] is None for r in results):
        bad = next(r.dir for r in results if r.group[0] is None)
        raise AnalysisError(f"{bad}: its config.yaml has no {key}")
    rows = [row for row in group_rows(results, [key]) if row.values("test_ppl")]
    if not rows:
        raise AnalysisError("no run has a test perplexity yet (eval_best.json)")
    heads = list(dict.fromkeys(row.head for row in rows))
    values = sorted({row.group[0] for row in rows})

    def stat(row, name):
        found = row.values(name)
        return mean_std(found) if found else (math.nan, math.nan)

    points = {(row.head, row.group[0]): (stat(row, "test_ppl"), stat(row, "press_rank"), len(row.runs))
              for row in rows}
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for head in heads:
        xs = [v for v in values if (head, v) in points]
        left.plot(xs, [points[head, v][0][0] for v in xs], marker="o", label=head_label(head))
        right.plot(xs, [points[head, v][1][0] for v in xs], marker="o", label=head_label(head))
    if key == "model.emsize":      # wide and pale, so that it shows under a line that follows it
        right.plot(values, [v + 2 for v in values], color="grey", alpha=0.35, linewidth=7,
                    zorder=0, label="d + 2")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values])
        ax.set_xlabel(key)
    # Log scales: log perplexity is the cross-entropy, and a run that failed (a unigram-level
    # perplexity) does not flatten the others.
    for ax in (left, right):
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
    left.set(ylabel="test perplexity (log scale)", title="Test perplexity")
    right.set(ylabel="Press rank of the test log-P matrix (log scale)", title="Press rank")
    right.legend(fontsize="small")
    save(fig, prefixed(out_prefix, ".png"))

    def cell(head, value, which: int) -> str:
        if (head, value) not in points:
            return ""
        mean, std = points[head, value][which]
        if math.isnan(mean):
            return "—"
        text = f"{mean:.2f}" if which == 0 else f"{mean:,.0f}"
        return text + (f" ± {std:.2f}" if which == 0 and not math.isnan(std) else "")

    header = ["head", *(f"test ppl, {key} = {v}" for v in values), *(f"Press rank, {key} = {v}" for v in values)]
    table = [[head_label(h), *(cell(h, v, 0) for v in values), *(cell(h, v, 1) for v in values)] for h in heads]
    text = (f"# Test perplexity and Press rank against {key}\n\n" + markdown_table(header, table)
            + f"\nTest ppl: eval_best.json (mean ± std where a point has several runs); Press rank: "
              f"rank_test.json. Figure: {prefixed(out_prefix, '.png').name}\n")
    if "softmax" in heads:      # the gain of each head over Softmax's at the same value, as read
        def change(head, value) -> str:
            if (head, value) not in points or ("softmax", value) not in points:
                return ""
            return f"{100 * (points[head, value][0][0] / points['softmax', value][0][0] - 1):+.1f}%"
        others = [h for h in heads if h != "softmax"]
        text += (f"\nTest ppl against Softmax's at the same {key} (mean against mean):\n\n"
                 + markdown_table(["head", *(f"{key} = {v}" for v in values)],
                                  [[head_label(h), *(change(h, v) for v in values)] for h in others]))
    prefixed(out_prefix, ".md").write_text(text, encoding="utf-8")
    write_csv(prefixed(out_prefix, ".csv"), ["head", key, "runs", "test_ppl", "test_ppl_std", "press_rank"],
              [[h, v, points[h, v][2], points[h, v][0][0], points[h, v][0][1], points[h, v][1][0]]
               for h in heads for v in values if (h, v) in points])
    return text
