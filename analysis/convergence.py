"""Did each run converge? (report.py convergence): one row per run, from its metrics.jsonl.

A run counts as converged when its best validation perplexity improved by less than `gain`
(a fraction: 0.01 is 1%) over its last `window` epochs, or when its early-stop rule ended it
(metrics.jsonl's last record says so: train.plateau_gain or train.early_stop_nonmono). The
improvement is 1 - best ppl after the last epoch / best ppl `window` epochs before it; the best
so far rather than each epoch's own, so that a noisy last epoch does not count as progress lost.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from . import AnalysisError
from .figures import prefixed
from .runs import config_value, head_label, head_order, markdown_table, read_metrics, read_run_config, write_csv


@dataclass(frozen=True)
class Convergence:
    run: str
    head: str
    emsize: int | None
    seed: int | None
    epochs: int                   # epochs trained
    planned: int | None           # train.epochs
    asgd_from: int | None         # the first averaged epoch
    best_val_ppl: float
    best_epoch: int
    gain: float                   # the best ppl's relative improvement over the last `window` epochs
    stopped_early: bool           # the run's early-stop rule ended it
    converged: bool


def last_window_gain(val_ppls: Sequence[float], window: int) -> float:
    """1 - (best after the last epoch) / (best `window` epochs earlier); nan with too few epochs."""
    if len(val_ppls) <= window:
        return math.nan
    return 1 - min(val_ppls) / min(val_ppls[:-window])


def read_convergence(run_dir: Path, window: int, gain: float) -> Convergence:
    metrics = read_metrics(run_dir)
    if not metrics:
        raise AnalysisError(f"{run_dir}: no metrics.jsonl (no epoch finished yet)")
    config = read_run_config(run_dir)
    val_ppls = [r["val_ppl"] for r in metrics]
    best = min(metrics, key=lambda r: r["val_ppl"])
    averaged = [r["epoch"] for r in metrics if r["optimizer"] == "ASGD"]
    improvement = last_window_gain(val_ppls, window)
    stopped_early = bool(metrics[-1].get("early_stop"))
    return Convergence(run_dir.name, config_value(config, "head.name") or "?", config_value(config, "model.emsize"),
                       config_value(config, "train.seed"), metrics[-1]["epoch"],
                       config_value(config, "train.epochs"), averaged[0] if averaged else None,
                       best["val_ppl"], best["epoch"], improvement, stopped_early,
                       stopped_early or improvement < gain)


def verdict(c: Convergence, window: int, gain: float) -> str:
    if math.isnan(c.gain) and not c.stopped_early:
        trained = f"{c.epochs} epoch{'s' * (c.epochs != 1)}"
        if c.planned is not None and c.epochs >= c.planned:      # finished: its schedule was short
            return f"cannot tell: {trained}, all it planned, fewer than the {window + 1} the rule reads"
        return f"not yet: {trained}, fewer than {window + 1}"
    if not math.isnan(c.gain) and c.gain < gain:
        stopped = f" (its early stop ended it after epoch {c.epochs})" if c.stopped_early else ""
        return f"yes: under {gain:.0%} over the last {window} epochs{stopped}"
    if c.stopped_early:
        return f"yes: the early-stop rule ended it after epoch {c.epochs}"
    unfinished = c.planned is not None and c.epochs < c.planned
    return "not yet (training)" if unfinished else f"no: {c.epochs} epochs trained, still improving"


def write_convergence(run_dirs: Sequence[Path], out_prefix: Path, window: int, gain: float) -> str:
    """PREFIX.md and PREFIX.csv; returns the Markdown."""
    rows = sorted((read_convergence(d, window, gain) for d in run_dirs),
                  key=lambda c: (head_order(c.head), c.emsize or 0, c.seed or 0, c.run))
    header = ["Head", "d", "Seed", "Epochs", "ASGD from", "Best valid ppl (epoch)",
              f"Last {window} epochs: gain", "Converged"]
    lines = [[head_label(c.head), str(c.emsize), str(c.seed), str(c.epochs) + (f" of {c.planned}" if c.planned else ""),
              str(c.asgd_from or "-"), f"{c.best_val_ppl:.2f} ({c.best_epoch})",
              "-" if math.isnan(c.gain) else f"{c.gain:.3%}", verdict(c, window, gain)] for c in rows]
    markdown = (f"Converged: the best validation perplexity improved by less than {gain:.0%} over the "
                f"last {window} epochs, or the run's early-stop rule ended it.\n\n"
                + markdown_table(header, lines))
    write_csv(prefixed(out_prefix, ".csv"),
              ["run", "head", "emsize", "seed", "epochs", "planned_epochs", "asgd_from", "best_val_ppl",
               "best_epoch", f"gain_last_{window}", "stopped_early", "converged"],
              [[c.run, c.head, c.emsize, c.seed, c.epochs, c.planned, c.asgd_from, round(c.best_val_ppl, 4),
                c.best_epoch, None if math.isnan(c.gain) else round(c.gain, 6), c.stopped_early, c.converged]
               for c in rows])
    path = prefixed(out_prefix, ".md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown, encoding="utf-8")
    return markdown
