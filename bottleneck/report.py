"""The synthetic experiment's outputs: a Markdown table, a CSV and the paper's two figures.

A row is one fitted cell (alpha, M, D, head, seed). The table and figures show the mean over
seeds; the CSV keeps every row.
"""
from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from statistics import mean

from analysis.figures import pyplot, save


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


def to_markdown(rows: list[Row]) -> str:
    """One table per (alpha, M): a line per D, a column pair (mode match, KL) per head.
    The best value of each metric on a line is in bold; `*` marks a mean over fits of which
    at least one stopped at the step limit rather than by the convergence rule. A table of fits
    with a trained decoder bias says so in its heading."""
    groups = _grouped(rows)
    heads = list(dict.fromkeys(row.head for row in rows))
    labels = {row.head: row.label for row in rows}
    lines: list[str] = []
    for alpha, words in dict.fromkeys((r.alpha, r.words) for r in rows):
        seeds = sorted({r.seed for r in rows if r.alpha == alpha and r.words == words})
        contexts = sorted({r.contexts for r in rows if r.alpha == alpha and r.words == words})
        biased = any(r.decoder_bias for r in rows if r.alpha == alpha and r.words == words)
        lines += [f"### alpha = {alpha:g}, M = {words:,}, N = "
                  f"{', '.join(f'{n:,}' for n in contexts)}, seeds {', '.join(map(str, seeds))}"
                  + (f", {BIAS_NOTE}" if biased else ""),
                  "",
                  "| D | " + " | ".join(f"{labels[h]} mode % | {labels[h]} KL" for h in heads) + " |",
                  "|---:|" + "---:|---:|" * len(heads)]
        for dim in sorted({r.dim for r in rows if r.alpha == alpha and r.words == words}):
            cells = {h: groups.get((alpha, words, dim, h)) for h in heads}
            means = {h: (mean(r.mode_match for r in g), mean(r.kl for r in g),
                         all(r.converged for r in g)) for h, g in cells.items() if g}
            best_mode = max(m for m, _, _ in means.values())
            best_kl = min(k for _, k, _ in means.values())
            line = [str(dim)]
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
