"""A cell of runs against its reference cell (a head against Softmax at the same d): the
difference of their test perplexities at each run's stop, and of their validation perplexities
at a common epoch, each with its Welch interval (stats.py). A cell is anything with `runs`, the
RunResults of tables.py.

Runs stop at different epochs (the plateau rule), and a run stopped later has had more epochs to
improve; so beside the test perplexities at each run's stop, the reports compare every run's
validation perplexity (metrics.jsonl) at the cell's common epoch: the earliest stop among the
runs of the two cells compared.

The reports compare each cell with its reference; `pairs_table` compares every two cells of a
report that have two runs or more each (SS against MoS, GSS against SS, Softmax at one d against
itself at another), with Holm's adjustment over the pairs it lists, since among many pairs at 95%
each one in twenty differences of zero comes out "found".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .runs import markdown_table
from .stats import SEEDS_SPREAD_BELOW, Estimate, format_p, holm, pooled_spread, welch


def log_values(runs: Sequence, name: str, exclude_seeds: Sequence[int] = ()) -> list[float]:
    """log of each run's `name` (a perplexity) that it has, seeds in `exclude_seeds` left out."""
    return [math.log(getattr(r, name)) for r in runs
            if getattr(r, name) is not None and r.seed not in exclude_seeds]


def test_difference(cell, reference, exclude_seeds: Sequence[int] = ()) -> Estimate | None:
    """The cell's test ppl against the reference's (Welch on log ppl); None if either has none."""
    mine, theirs = (log_values(c.runs, "test_ppl", exclude_seeds) for c in (cell, reference))
    return welch(mine, theirs) if mine and theirs else None


@dataclass(frozen=True)
class AtCommonEpoch:
    epoch: int                          # the earliest stop among the runs of both cells
    stops: list[int]                    # each run's last epoch, the cell's then the reference's
    reference_stops: list[int]
    val_ppl: list[float]                # each run's validation ppl at `epoch`
    reference_val_ppl: list[float]
    difference: Estimate                # log val ppl, the cell's against the reference's


def at_common_epoch(cell, reference) -> AtCommonEpoch | None:
    """Both cells' validation ppl at their common epoch; None if a cell has no epoch logged (or
    a run lacks that epoch's record)."""
    mine = [r for r in cell.runs if r.val_ppl_by_epoch]
    theirs = [r for r in reference.runs if r.val_ppl_by_epoch]
    if not mine or not theirs:
        return None
    epoch = min(max(r.val_ppl_by_epoch) for r in mine + theirs)
    if any(epoch not in r.val_ppl_by_epoch for r in mine + theirs):
        return None
    values = [r.val_ppl_by_epoch[epoch] for r in mine]
    reference_values = [r.val_ppl_by_epoch[epoch] for r in theirs]
    return AtCommonEpoch(epoch, [max(r.val_ppl_by_epoch) for r in mine],
                         [max(r.val_ppl_by_epoch) for r in theirs], values, reference_values,
                         welch([math.log(v) for v in values], [math.log(v) for v in reference_values]))


def seed_spread_line(cells: Sequence, label) -> str:
    """A paragraph: each cell's spread of log test ppl over its seeds (cells of two runs or more)
    and the spread pooled over them, in percent of perplexity with 95% intervals."""
    samples = [(label(c), log_values(c.runs, "test_ppl")) for c in cells]
    samples = [(name, values) for name, values in samples if len(values) >= 2]
    pooled = pooled_spread([values for _, values in samples])
    if pooled is None:
        return ("No row has two runs with a test perplexity: the seed-to-seed spread is unknown "
                "here (n = 1 in every row).")
    identical = "identical test ppl: no interval"
    each = "; ".join(f"{name} {100 * spread.std:.2f}% (n = {len(values)}, "
                     + (identical if spread.low is None else f"{100 * spread.low:.2f}-{100 * spread.high:.2f}%")
                     + ")" for name, values in samples for spread in [pooled_spread([values])])
    text = (f"Seed-to-seed spread of test ppl (the sample std of log test ppl, in percent of "
            f"perplexity, with its 95% chi-square interval), pooled over the {pooled.groups} "
            f"row{'s' * (pooled.groups != 1)} with two runs or more ({pooled.df} degrees of freedom): ")
    if pooled.low is None:       # report.py seeds refuses a spread of 0, so no command is offered
        return (text + f"**0.00% ({'every row has ' if pooled.groups > 1 else ''}{identical})**. "
                f"Each: {each}. The seed spread is unknown here: runs that show none give no "
                f"interval for it (different seeds agreeing to every digit: check for a copied "
                f"eval_best.json).")
    text += f"**{100 * pooled.std:.2f}% [{100 * pooled.low:.2f}, {100 * pooled.high:.2f}]**. Each: {each}. "
    if 100 * pooled.std >= SEEDS_SPREAD_BELOW:      # report.py seeds would refuse the command
        return text + ("Runs of one setting whose test ppl differ by factors: no count of seeds is "
                       "planned at a spread this large (report.py seeds takes spreads under 100%).")
    return (text + f"The seeds per cell a true difference of c% needs at this spread: "
                   f"`python report.py seeds --change c --spread {100 * pooled.std:.2f}`.")


def common_epoch_table(compared: Sequence[tuple[str, AtCommonEpoch]], reference: str) -> str:
    """The Markdown table of (label, AtCommonEpoch) pairs against `reference` (e.g. "Softmax")
    and the paragraph that explains it."""
    header = ["Model", "stopped at epoch", f"{reference} stopped at epoch", "common epoch",
              "valid ppl at it", f"{reference}'s valid ppl at it", f"valid ppl vs {reference}: % [95% CI], p"]
    lines = [[label, ", ".join(map(str, c.stops)), ", ".join(map(str, c.reference_stops)), str(c.epoch),
              ", ".join(f"{v:.2f}" for v in c.val_ppl), ", ".join(f"{v:.2f}" for v in c.reference_val_ppl),
              c.difference.describe()] for label, c in compared]
    return (markdown_table(header, lines)
            + f"\nRuns stop at different epochs, and a comparison at their stops favours the cell "
              f"that trained longer. Here every run's validation ppl (metrics.jsonl) at the common "
              f"epoch of a cell and its {reference} cell, the earliest stop among their runs (one "
              f"value per run, in the order of the stops), and the change against {reference} "
              f"(Welch on log ppl, as for test ppl).\n")


def pairs_table(pairs: Sequence[tuple[str, object, str, object]], what: str,
                exclude_seeds: Sequence[int] = ()) -> str | None:
    """Each (label, cell, other label, other cell) pair whose cells have two test ppls or more
    each: the cell's test ppl against the other's (Welch on log ppl), with Holm's p over the pairs
    listed (`what` says what they are), seeds in `exclude_seeds` left out as the baseline column
    leaves them out; None if no pair has two runs a side. The caller orders
    each pair (a row against a row above it), never the data: a pair keeps its direction when
    more seeds move the means."""
    compared = []
    for label, cell, other_label, other in pairs:
        mine, theirs = (log_values(c.runs, "test_ppl", exclude_seeds) for c in (cell, other))
        if len(mine) < 2 or len(theirs) < 2:
            continue
        compared.append((f"{label} against {other_label}", len(mine), len(theirs), welch(mine, theirs)))
    if not compared:
        return None
    adjusted = holm([1.0 if e.p is None else e.p for *_, e in compared])
    lines = [[name, f"{n} and {m}" + ("" if estimate.df is None else f" ({estimate.df:.1f})"),
              estimate.describe(), "—" if estimate.p is None else format_p(p)]
             for (name, n, m, estimate), p in zip(compared, adjusted)]
    family = f"over the {len(lines)} pairs" if len(lines) > 1 else "one pair: its own p"
    header = ["pair", "n (Welch's df)", "test ppl: % [95% CI], p", f"Holm's p ({family})"]
    return (markdown_table(header, lines)
            + f"\n{what}, each pair with two runs or more a side: the first's test ppl against "
              f"the second's (the change of the ratio of their geometric means, Welch's t-test on "
              f"log ppl; n: the runs a side, and in brackets the Welch-Satterthwaite degrees of "
              f"freedom, few with 2 or 3 runs a side, where the p rests on log ppl being near normal "
              f"over seeds). Each p is the pair's alone, and a difference of zero gives p below 0.05 "
              f"in one pair of twenty; a pair whose Holm's p is below 0.05 stands with "
              f"the chance of any false finding among these {len(lines)} pairs held to 5%.\n")
