"""Test perplexity and Press rank against one config key (report.py versus), one line per head:
the d-sweep of the CPU results (--key model.emsize), the language-model counterpart of
synthetic.py's mode match and KL against D.

Beside the figure, tables: each point's test ppl (n, mean ± std) and Press rank; each head's
gain over Softmax at every value of the key (the change of test ppl in percent with its 95%
Welch interval and p-value, stats.py); how that gain differs between two values of the key
(four cells, Welch-Satterthwaite); and each head against Softmax at a common epoch
(comparisons.py). A point pools only seeds of one configuration: runs of a head at one value
that differ in another compared key are refused in one line (pooling.py).
"""
from __future__ import annotations

import math
import sys
from itertools import combinations
from pathlib import Path
from typing import Sequence

from . import AnalysisError
from .comparisons import at_common_epoch, common_epoch_table, log_values, pairs_table, test_difference
from .figures import plain_log_ticks, prefixed, pyplot, save
from .runs import head_label, markdown_table, write_csv
from .stats import combination, difference_of_differences, format_p, holm
from .tables import align_rank_settings, devices_markdown, estimate_csv, group_rows, mean_std, read_run

BASELINE = "softmax"


def write_versus(run_dirs: Sequence[Path], key: str, out_prefix: Path) -> str:
    """PREFIX.png (two panels), PREFIX.md and PREFIX.csv; returns the Markdown."""
    results = [read_run(d, [key]) for d in run_dirs]
    align_rank_settings(results)
    # every run whose rank is not in the table, and why (not ranked, ranked on other weights, over
    # other contexts or in another precision than the rest), as report.py table lists them
    prefix = "press_rank ("
    ranks_left_out = [f"`{r.dir}`: {note[len(prefix):-1]}" for r in results
                      for note in r.missing if note.startswith(prefix)]
    if all(r.group[0] is None for r in results):
        raise AnalysisError(f"--key {key}: no run's config.yaml has this key (a config key, e.g. model.emsize)")
    if any(r.group[0] is None for r in results):
        bad = next(r.dir for r in results if r.group[0] is None)
        raise AnalysisError(f"--key {key}: {bad}'s config.yaml has no {key}")
    corpora = list(dict.fromkeys(r.dataset for r in results))
    if len(corpora) > 1:
        # One line per head and value: runs of two corpora would overwrite each other's cells.
        other = next(r.dir for r in results if r.dataset == corpora[1])
        raise AnalysisError(f"versus sets runs of one corpus against {key}; these are of "
                            f"{' and '.join(corpora)} (e.g. {other} is {corpora[1]}): give one "
                            f"corpus's runs, or choose with --only data.dataset={corpora[0]}")
    rows = [row for row in group_rows(results, [key], unlike="refuse") if row.values("test_ppl")]
    if not rows:
        raise AnalysisError("no run has a test perplexity yet (eval_best.json)")
    heads = list(dict.fromkeys(row.head for row in rows))
    values = sorted({row.group[0] for row in rows})
    cells = {(row.head, row.group[0]): row for row in rows}

    def stat(row, name):
        found = row.values(name)
        return mean_std(found) if found else (math.nan, math.nan)

    points = {cell: (stat(row, "test_ppl"), stat(row, "press_rank"), len(row.runs))
              for cell, row in cells.items()}
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
        if which == 1:       # a rank is each run's own: a point of several runs says how many
            n = len(cells[head, value].values("press_rank"))
            return f"{mean:,.0f}" if n == 1 else f"{mean:,.0f} ± {std:,.0f} (n = {n})"
        n = len(cells[head, value].values("test_ppl"))
        return (f"{mean:.2f}" if n == 1 else f"{mean:.2f} ± {std:.2f}") + f" (n = {n})"

    header = ["head", *(f"test ppl, {key} = {v}" for v in values), *(f"Press rank, {key} = {v}" for v in values)]
    table = [[head_label(h), *(cell(h, v, 0) for v in values), *(cell(h, v, 1) for v in values)] for h in heads]
    # One value leaves nothing to set against: the sections across values would be empty, so say why.
    lone = (f"Every run here has {key} = {values[0]}: no gain across values of {key}, and no head "
            f"against itself at another value (`report.py table` compares the heads at one setting).\n\n"
            if len(values) == 1 else "")
    if lone:
        print(f"note: versus --key {key}: every run has {key} = {values[0]}", file=sys.stderr)
    text = (f"# Test perplexity and Press rank against {key}\n\n" + lone + markdown_table(header, table)
            + f"\nTest ppl: eval_best.json, at each run's stop, mean ± sample std over the point's n "
              f"runs (n = 1: the one run's value); Press rank: rank_test.json, the same over the "
              f"point's ranked runs (n shown where more than one). Figure: "
              f"{prefixed(out_prefix, '.png').name}\n")
    if ranks_left_out:
        text += ("\nPress ranks not in the table (not ranked, ranked on other weights than best.pt holds, "
                 "or over other contexts or in another precision than the rest, so not pooled with them):\n\n"
                 + "".join(f"- {note}\n" for note in ranks_left_out))
    others = [h for h in heads if h != BASELINE]
    gains = {(h, v): test_difference(cells[h, v], cells[BASELINE, v])
             for h in others for v in values if (h, v) in cells and (BASELINE, v) in cells}
    if gains:
        text += (f"\nTest ppl against Softmax's at the same {key}: the change of the ratio of their "
                 f"geometric means in percent, its 95% interval and p-value (Welch's t-test on log "
                 f"ppl); no interval where a point has one run:\n\n"
                 + markdown_table(["head", *(f"{key} = {v}" for v in values)],
                                  [[head_label(h), *(gains[h, v].describe() if (h, v) in gains else ""
                                                     for v in values)] for h in others]))
        averaged = {h: averaged_gain(cells, h, [v for v in values if (h, v) in gains])
                    for h in others if sum((h, v) in gains for v in values) >= 2}
        if averaged:
            holm_p = holm([1.0 if e.p is None else e.p for e in averaged.values()])
            text += (f"\nEach head's gain averaged over the values of {key}: the mean over the "
                     f"values of its difference to Softmax in mean log test ppl, with a one-sample t "
                     f"interval over those values (k values: k - 1 degrees of freedom), so that how "
                     f"the gain varies between values, and each value's seed noise, are its noise; "
                     + (f"Holm's p over the {len(averaged)} heads' averages:\n\n" if len(averaged) > 1
                        else "one head, so Holm's p is its own p:\n\n")
                     + markdown_table(["head", "values", f"gain averaged over {key}", "Holm's p"],
                                      [[head_label(h), ", ".join(str(v) for v in values if (h, v) in gains),
                                        estimate.describe(), "—" if estimate.p is None else format_p(p)]
                                       for (h, estimate), p in zip(averaged.items(), holm_p)]))
            alone = {h: gain_at_these_values(cells, h, [v for v in values if (h, v) in gains]) for h in averaged}
            text += (f"\nThe same average read as one over these values of {key} alone (the values "
                     f"asked about, not a sample of them): only each point's seed noise is its noise, "
                     f"a Welch interval over the points' runs (Welch-Satterthwaite degrees of "
                     f"freedom); no interval where a point has one run. It answers a narrower "
                     f"question than the table above and is not held together with it:\n\n"
                     + markdown_table(["head", "values", f"gain over these values of {key} alone"],
                                      [[head_label(h), ", ".join(str(v) for v in values if (h, v) in gains),
                                        estimate.describe()] for h, estimate in alone.items()]))
        pairs = list(combinations(values, 2))
        between = {(h, a, b): gain_difference(cells, h, a, b)
                   for h in others for a, b in pairs if (h, a) in gains and (h, b) in gains}
        if between:
            text += (f"\nHow the gain differs between two values of {key}: the head's ratio to "
                     f"Softmax at the first value divided by its ratio at the second, minus 1, in "
                     f"percent (negative: further below Softmax at the first value), its 95% "
                     f"interval and p-value (the four points' variances, Welch-Satterthwaite degrees "
                     f"of freedom); no interval where a point has one run:\n\n"
                     + markdown_table(["head", *(f"{key} = {a} against {b}" for a, b in pairs)],
                                      [[head_label(h), *(between[h, a, b].describe() if (h, a, b) in between
                                                         else "" for a, b in pairs)]
                                       for h in others if any((h, a, b) in between for a, b in pairs)]))
        common = {(h, v): at_common_epoch(cells[h, v], cells[BASELINE, v]) for h, v in gains}
        listed = [(f"{head_label(h)}, {key} = {v}", common[h, v]) for h in others for v in values
                  if common.get((h, v)) is not None]
        if listed:
            text += f"\n## Each head against Softmax at a common epoch\n\n" + common_epoch_table(listed, "Softmax")
    own = pairs_table([(f"{head_label(h)}, {key} = {b}", cells[h, b], f"{key} = {a}", cells[h, a])
                       for h in heads for a, b in combinations(values, 2) if (h, a) in cells and (h, b) in cells],
                      f"Each head against itself at a lower {key}")
    if own:
        text += f"\n## Each head against itself at another {key}\n\n" + own
    text += "\n" + devices_markdown([(f"{head_label(h)}, {key} = {v}", cells[h, v].runs)
                                      for h in heads for v in values if (h, v) in cells])
    prefixed(out_prefix, ".md").write_text(text, encoding="utf-8")
    write_csv(prefixed(out_prefix, ".csv"),
              ["head", key, "runs", "test_ppl", "test_ppl_std", "press_rank", "gain_pct", "gain_low_pct",
               "gain_high_pct", "gain_p"],
              [[h, v, points[h, v][2], points[h, v][0][0], points[h, v][0][1], points[h, v][1][0],
                *estimate_csv(gains.get((h, v)))]
               for h in heads for v in values if (h, v) in points])
    return text


def gain_difference(cells: dict, head: str, first, second):
    """(head - Softmax at `first`) - (head - Softmax at `second`) of mean log test ppl."""
    return difference_of_differences(*(log_values(cells[h, v].runs, "test_ppl")
                                       for h, v in ((head, first), (BASELINE, first),
                                                    (head, second), (BASELINE, second))))


def gain_at_these_values(cells: dict, head: str, values: Sequence):
    """The same mean over `values` of (head - Softmax) in mean log test ppl as averaged_gain, its
    noise each point's seed noise alone: weights +-1/k over the 2k points' runs (Welch)."""
    points = [(h, v) for v in values for h in (head, BASELINE)]
    return combination([log_values(cells[point].runs, "test_ppl") for point in points],
                       [(1.0 if h == head else -1.0) / len(values) for h, _ in points])


def averaged_gain(cells: dict, head: str, values: Sequence):
    """The mean over `values` of (head - Softmax) in mean log test ppl: a one-sample t over the
    values, each value's gain one measurement of the gain averaged over them."""
    def mean(cell):
        found = log_values(cell.runs, "test_ppl")
        return sum(found) / len(found)
    return combination([[mean(cells[head, v]) - mean(cells[BASELINE, v]) for v in values]], [1.0])
