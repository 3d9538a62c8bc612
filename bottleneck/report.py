"""The synthetic experiment's outputs: a Markdown table, a CSV and the paper's two figures.

A row is one fitted cell (alpha, M, D, head, seed). The table and figures show the mean over
seeds; the CSV keeps every row. Where a cell has two seeds or more, the table is followed by the
heads' differences paired by seed (a seed draws P* and every head's starting point, so two heads'
fits of one seed face the same problem): each head against the Linear-Softmax, and the leader of
each metric against the head next to it, with a 95% t interval over the seeds' differences.
"""
from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from statistics import mean

from analysis.figures import pyplot, save
from analysis.stats import combination, format_bound


@dataclass(frozen=True)
class Row:
    alpha: float
    words: int          # M
    dim: int            # D
    contexts: int       # N
    head: str           # key of bottleneck.problem.SYNTHETIC_HEADS
    label: str          # the head's name in tables and figures
    seed: int
    mode_match: float   # %
    kl: float           # mean KL(P*||Q), nats
    steps: int
    converged: bool
    seconds: float
    decoder_bias: bool  # fitted with a trained decoder bias b (synthetic.py --decoder-bias)


# results.csv files written before the decoder_bias column existed: every fit then had a trained
# decoder bias (the heads' TiedDecoder b, which the fit did not hold at zero), so they read as it.
COLUMN_DEFAULTS = {"decoder_bias": "True"}


# How a table of fits with a trained decoder bias (l = E g + b, not [LMS]'s l = E g) is headed.
BIAS_NOTE = "with a trained decoder bias b (--decoder-bias)"


def to_csv(rows: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, [f.name for f in fields(Row)], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(asdict(row))
    return out.getvalue()


def from_csv(text: str, source: str = "results.csv") -> list[Row]:
    """Rows written by to_csv (any number of files may be concatenated by the caller). A missing
    column or a value of the wrong type is a ValueError naming `source`, the line and the column."""
    rows = []
    reader = csv.DictReader(io.StringIO(text))
    missing = [f.name for f in fields(Row)
               if f.name not in (reader.fieldnames or []) and f.name not in COLUMN_DEFAULTS]
    if missing:
        raise ValueError(f"{source}: missing column(s) {', '.join(missing)} "
                         f"(expected the header that synthetic.py writes)")
    for line, record in enumerate(reader, start=2):
        values = {}
        for f in fields(Row):
            text_value = record.get(f.name, COLUMN_DEFAULTS.get(f.name))
            try:
                if f.type == "bool":
                    if text_value not in ("True", "False"):
                        raise ValueError
                    values[f.name] = text_value == "True"
                else:
                    values[f.name] = {"int": int, "float": float, "str": str}[f.type](text_value)
            except (ValueError, TypeError):
                raise ValueError(f"{source}, line {line}: {f.name}: expected {f.type}, "
                                 f"got {text_value!r}") from None
        rows.append(Row(**values))
    return rows


def _grouped(rows: list[Row]):
    """{(alpha, M, D, head): [rows over seeds]} in first-seen order."""
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        groups[(row.alpha, row.words, row.dim, row.head)].append(row)
    return groups


def _seeds(cell: list[Row]) -> str:
    return ", ".join(str(s) for s in sorted(r.seed for r in cell))


def _paired(a: list[Row], b: list[Row], metric: str, digits: int) -> tuple[int, str]:
    """mean over the seeds both cells have of a's metric minus b's, with its 95% t interval
    (analysis.stats.combination of one sample: the seeds' differences); (n, text)."""
    of_b = {r.seed: getattr(r, metric) for r in b}
    differences = [getattr(r, metric) - of_b[r.seed] for r in a if r.seed in of_b]
    if not differences:
        return 0, "no seed in common"
    estimate = combination([differences], [1.0])
    text = f"{estimate.value:+.{digits}f}"
    if estimate.why_not:
        return len(differences), f"{text} ({estimate.why_not}: no interval)"
    return len(differences), f"{text} [{format_bound(estimate.low, digits)}, {format_bound(estimate.high, digits)}]"


# The paired tables' metrics: the Row field, its decimals, and which of two values is better.
PAIRED_METRICS = (("mode_match", 1, max), ("kl", 4, min))


def paired_tables(groups: dict, heads: list[str], labels: dict, alpha: float, words: int,
                  dims: list[int]) -> list[str]:
    """The lines of the two paired tables of one (alpha, M) (module doc), or none where no cell
    has two seeds."""
    seeded = [d for d in dims if sum(len(groups.get((alpha, words, d, h), [])) > 1 for h in heads) > 1]
    if not seeded:
        return []
    single = [d for d in dims if d not in seeded]
    lines = ["Differences paired by seed (one seed draws P* and every head's start), mean over the "
             "seeds two cells share with its 95% t interval, each interval alone (not adjusted for "
             "the others); KL in nats, mode % in points"
             + (f"; D = {', '.join(map(str, single))}: one seed, no interval" if single else "") + ":", ""]
    dims = seeded
    if "softmax" in heads:
        others = [h for h in heads if h != "softmax"]
        lines += ["| D | n | " + " | ".join(f"{labels[h]} mode % - Softmax's | {labels[h]} KL - Softmax's"
                                          for h in others) + " |",
                  "|---:|---:|" + "---:|---:|" * len(others)]
        for dim in dims:
            base = groups.get((alpha, words, dim, "softmax"))
            if not base:
                continue
            cells, sizes = [], set()
            for h in others:
                for metric, digits, _ in PAIRED_METRICS:
                    n, text = _paired(groups.get((alpha, words, dim, h), []), base, metric, digits)
                    cells.append(text if n else "")
                    if n:
                        sizes.add(n)
            lines.append(f"| {dim} | {', '.join(map(str, sorted(sizes)))} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["| D | n | most modes matched | next | ahead by (points) | lowest KL | next | below by (nats) |",
              "|---:|---:|---|---|---:|---|---|---:|"]
    for dim in dims:
        cells = {h: groups[(alpha, words, dim, h)] for h in heads if groups.get((alpha, words, dim, h))}
        if len(cells) < 2:
            continue
        line, sizes = [], set()
        for metric, digits, best in PAIRED_METRICS:
            order = sorted(cells, key=lambda h: mean(getattr(r, metric) for r in cells[h]),
                           reverse=best is max)
            n, text = _paired(cells[order[0]], cells[order[1]], metric, digits)
            sizes.add(n)
            line += [labels[order[0]], labels[order[1]], text]
        lines.append(f"| {dim} | {', '.join(map(str, sorted(sizes)))} | " + " | ".join(line) + " |")
    return lines + [""]


def to_markdown(rows: list[Row]) -> str:
    """One table per (alpha, M): a line per D, a column pair (mode match, KL) per head, and a
    seeds column where the cells' seeds differ. The best value of each metric on a line is in
    bold; `*` marks a mean over fits of which at least one stopped at the step limit rather than
    by the convergence rule. A table of fits with a trained decoder bias says so in its heading.
    Where a cell has two seeds or more, the paired differences follow (paired_tables); a table
    of one seed says that its differences have no interval."""
    groups = _grouped(rows)
    heads = list(dict.fromkeys(row.head for row in rows))
    labels = {row.head: row.label for row in rows}
    lines: list[str] = []
    for alpha, words in dict.fromkeys((r.alpha, r.words) for r in rows):
        seeds = sorted({r.seed for r in rows if r.alpha == alpha and r.words == words})
        contexts = sorted({r.contexts for r in rows if r.alpha == alpha and r.words == words})
        biased = any(r.decoder_bias for r in rows if r.alpha == alpha and r.words == words)
        dims = sorted({r.dim for r in rows if r.alpha == alpha and r.words == words})
        cell_seeds = {_seeds(g) for (a, m, _, _), g in groups.items() if (a, m) == (alpha, words)}
        mixed = len(cell_seeds) > 1         # some cells have other seeds than others: say each line's
        lines += [f"### alpha = {alpha:g}, M = {words:,}, N = "
                  f"{', '.join(f'{n:,}' for n in contexts)}, seeds {', '.join(map(str, seeds))}"
                  + (f", {BIAS_NOTE}" if biased else ""),
                  "",
                  "| D | " + ("seeds | " if mixed else "")
                  + " | ".join(f"{labels[h]} mode % | {labels[h]} KL" for h in heads) + " |",
                  "|---:|" + ("---|" if mixed else "") + "---:|---:|" * len(heads)]
        for dim in dims:
            cells = {h: groups.get((alpha, words, dim, h)) for h in heads}
            means = {h: (mean(r.mode_match for r in g), mean(r.kl for r in g),
                         all(r.converged for r in g)) for h, g in cells.items() if g}
            best_mode = max(m for m, _, _ in means.values())
            best_kl = min(k for _, k, _ in means.values())
            line = [str(dim)]
            if mixed:
                line.append(" / ".join(dict.fromkeys(_seeds(g) for g in cells.values() if g)))
            for h in heads:
                if h not in means:
                    line += ["", ""]
                    continue
                mode, kl, converged = means[h]
                star = "" if converged else "*"
                line.append(f"**{mode:.1f}**" if mode == best_mode else f"{mode:.1f}")
                line.append((f"**{kl:.3f}**" if kl == best_kl else f"{kl:.3f}") + star)
            lines.append("| " + " | ".join(line) + " |")
        lines.append("")
        paired = paired_tables(groups, heads, labels, alpha, words, dims)
        lines += paired or ["One seed per cell: no difference between two heads here has an interval, "
                            "and none is resolved by this table alone.", ""]
    if any(not r.converged for r in rows):
        lines.append("`*`: at least one fit in this mean stopped at the step limit (not converged).")
    return "\n".join(lines).rstrip() + "\n"


def write_figures(rows: list[Row], out: Path) -> list[Path]:
    """The paper's Figures 2 and 3 (mode match vs D, mean KL vs D): one line per head, one panel
    per M; one pair of files per alpha. Returns the paths written."""
    plt = pyplot()
    groups = _grouped(rows)
    heads = list(dict.fromkeys(row.head for row in rows))
    labels = {row.head: row.label for row in rows}
    written = []
    for alpha in dict.fromkeys(r.alpha for r in rows):
        vocab_sizes = sorted({r.words for r in rows if r.alpha == alpha})
        for metric, title, name in (("mode_match", "contexts whose mode matches (%)", "mode_match"),
                                    ("kl", "mean KL(P*||Q) (nats)", "kl")):
            # sharex: a panel whose grid was only partly run still spans every D of the others
            fig, axes = plt.subplots(1, len(vocab_sizes), figsize=(4.2 * len(vocab_sizes), 3.4),
                                     squeeze=False, sharex=True)
            for ax, words in zip(axes[0], vocab_sizes):
                for head in heads:
                    dims = sorted({d for (a, m, d, h) in groups if (a, m, h) == (alpha, words, head)})
                    if not dims:
                        continue
                    values = [mean(getattr(r, metric) for r in groups[(alpha, words, d, head)])
                              for d in dims]
                    ax.plot(dims, values, marker="o", label=labels[head])
                ax.set_xscale("log", base=2)
                ax.set_xlabel("D (embedding size)")
                biased = any(r.decoder_bias for r in rows if (r.alpha, r.words) == (alpha, words))
                ax.set_title(f"M = {words:,}, alpha = {alpha:g}" + (", with bias b" if biased else ""))
                ax.grid(alpha=0.3)
            axes[0][0].set_ylabel(title)
            axes[0][-1].legend(fontsize=8)
            path = out / f"{name}_alpha{alpha:g}.png"
            save(fig, path)
            written.append(path)
    return written
