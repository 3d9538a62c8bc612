"""The [SB] Table 2 layout from run directories: one row per head (and dataset), over seeds.

Columns and where each number comes from:
  #Params         run.json "params" (truncated to two decimals of millions, as [SB] prints them)
  Time (s/epoch)  metrics.jsonl "seconds", the mean over all epochs of all the row's runs
  Train ppl       metrics.jsonl "train_ppl" of the epoch with the lowest validation loss (the
                  epoch best.pt comes from); it is the running perplexity of that epoch's
                  training pass, with dropout, as train.py logs it
  Validation ppl  metrics.jsonl "val_ppl" of the same epoch
  Test ppl        eval_best.json "test_ppl" (evaluate.py on best.pt, test batch size 1)
  p-value         two-sided unpaired Student t-test (equal variances) of the row's test
                  perplexities against the baseline (Softmax) row of the same dataset
  Press rank      rank_test.json "press_rank" (rank.py)
Perplexities are mean ± sample standard deviation (ddof=1) over the row's runs. A run that lacks
a number is listed under "Missing or incomplete", and a cell averaged over fewer runs than its
row has says so with (n=k). So is a run whose metrics.jsonl has fewer than train.epochs epochs
(unless its last epoch ended training early, as finetuning does).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml
from scipy import stats

from . import AnalysisError
from .runs import (dataset_order, head_label, head_order, markdown_table, read_json, read_metrics,
                   write_csv)

PPL_COLUMNS = (("train_ppl", "Train ppl"), ("val_ppl", "Validation ppl"), ("test_ppl", "Test ppl"))


@dataclass
class RunResult:
    dir: Path
    dataset: str
    head: str
    group: tuple                     # values of the --group-by keys
    seed: int | None
    params: int | None = None
    epoch_seconds: list[float] = field(default_factory=list)
    train_ppl: float | None = None
    val_ppl: float | None = None
    test_ppl: float | None = None
    press_rank: int | None = None
    missing: list[str] = field(default_factory=list)   # one note per missing number


def config_value(config: dict, key: str):
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def read_run(run_dir: Path, group_by: Sequence[str] = ()) -> RunResult:
    """Everything a table needs from one run directory; what is absent goes to `missing`."""
    info = read_json(run_dir / "run.json") or {}
    config_path = run_dir / "config.yaml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    dataset = info.get("dataset") or config_value(config, "data.dataset")
    head = info.get("head") or config_value(config, "head.name")
    if dataset is None or head is None:
        raise AnalysisError(f"{run_dir}: neither run.json nor config.yaml names the dataset and head")
    result = RunResult(run_dir, dataset, head, tuple(config_value(config, key) for key in group_by),
                       info.get("seed", config_value(config, "train.seed")), info.get("params"))
    if result.params is None:
        result.missing.append("params (no run.json)")

    metrics = read_metrics(run_dir)
    if metrics:
        best = min(metrics, key=lambda r: r["val_loss"])
        result.train_ppl, result.val_ppl = best["train_ppl"], best["val_ppl"]
        result.epoch_seconds = [r["seconds"] for r in metrics]
        epochs = config_value(config, "train.epochs")
        if epochs is not None and metrics[-1]["epoch"] < epochs and not metrics[-1].get("early_stop"):
            result.missing.append(f"training unfinished ({metrics[-1]['epoch']} of {epochs} epochs)")
    else:
        result.missing.append("seconds, train_ppl, val_ppl (no metrics.jsonl: no epoch finished)")

    evaluation = read_json(run_dir / "eval_best.json")
    if evaluation is not None and "test_ppl" in evaluation:
        result.test_ppl = evaluation["test_ppl"]
    else:
        result.missing.append(f"test_ppl (no eval_best.json: run python evaluate.py {run_dir})")

    rank = read_json(run_dir / "rank_test.json")
    if rank is not None and "press_rank" in rank:
        result.press_rank = rank["press_rank"]
    else:
        result.missing.append(f"press_rank (no rank_test.json: run python rank.py {run_dir})")
    return result


# ---------------------------------------------------------------------- statistics

def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; nan for fewer than two values)."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else math.nan


def t_test_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided unpaired Student t-test with equal variances; nan when it is undefined."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    with warnings.catch_warnings():     # identical constant samples: scipy warns and returns nan
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(a, b, equal_var=True).pvalue)


@dataclass
class Row:
    dataset: str
    head: str
    group: tuple
    group_by: tuple[str, ...]
    runs: list[RunResult]
    p_value: float | None = math.nan   # test ppl vs the baseline row; None: this is the baseline

    @property
    def label(self) -> str:
        details = ", ".join(f"{k}={v}" for k, v in zip(self.group_by, self.group) if v is not None)
        return head_label(self.head) + (f" ({details})" if details else "")

    def values(self, name: str, exclude_seeds: Sequence[int] = ()) -> list[float]:
        return [getattr(r, name) for r in self.runs
                if getattr(r, name) is not None and r.seed not in exclude_seeds]

    def seconds_per_epoch(self) -> float | None:
        seconds = [s for run in self.runs for s in run.epoch_seconds]
        return float(np.mean(seconds)) if seconds else None


def group_rows(results: Sequence[RunResult], group_by: Sequence[str]) -> list[Row]:
    rows: dict[tuple, Row] = {}
    for r in results:
        key = (r.dataset, r.head, r.group)
        rows.setdefault(key, Row(r.dataset, r.head, r.group, tuple(group_by), [])).runs.append(r)

    def order(row: Row) -> tuple:
        group = tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in row.group)
        return dataset_order(row.dataset), head_order(row.head), group

    return sorted(rows.values(), key=order)


def baseline_row(rows: Sequence[Row], row: Row, baseline: str) -> Row | None:
    """The one row of `row`'s dataset with the baseline head (None if there is not exactly one)."""
    candidates = [r for r in rows if r.dataset == row.dataset and r.head == baseline]
    return candidates[0] if len(candidates) == 1 else None


# ---------------------------------------------------------------------- formatting

def format_params(values: Sequence[int]) -> str:
    millions = sorted({math.floor(v / 1e4) / 100 for v in values})
    return "—" if not millions else "/".join(f"{m:.2f}M" for m in millions)


def format_ppl(values: Sequence[float], runs: int) -> str:
    if not values:
        return "—"
    mean, std = mean_std(values)
    text = f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"
    return text + (f" (n={len(values)})" if len(values) < runs else "")


def format_rank(values: Sequence[int], runs: int) -> str:
    if not values:
        return "—"
    distinct = sorted(set(values))
    text = (f"{distinct[0]:,}" if len(distinct) == 1
            else f"{np.mean(values):,.1f} ({distinct[0]:,}–{distinct[-1]:,})")
    return text + (f" (n={len(values)})" if len(values) < runs else "")


def format_p(p: float | None) -> str:
    if p is None:
        return "N/A"
    return "—" if math.isnan(p) else f"{p:.2e}"


@dataclass
class Table:
    rows: list[Row]
    baseline: str

    def markdown(self) -> str:
        header = ["Model", "#Params", "Time (s/epoch)", *[title for _, title in PPL_COLUMNS],
                  f"p-value (vs {head_label(self.baseline)})", "Press rank", "Runs"]
        parts = []
        for dataset in dict.fromkeys(row.dataset for row in self.rows):
            body = []
            for row in (r for r in self.rows if r.dataset == dataset):
                n, seconds = len(row.runs), row.seconds_per_epoch()
                body.append([row.label, format_params(row.values("params")),
                             "—" if seconds is None else f"{seconds:.1f}",
                             *[format_ppl(row.values(name), n) for name, _ in PPL_COLUMNS],
                             format_p(row.p_value),
                             format_rank(row.values("press_rank"), n), str(n)])
            parts.append(f"## {dataset}\n\n" + markdown_table(header, body))
        return "\n".join(parts)

    def csv_rows(self) -> tuple[list[str], list[list]]:
        header = ["dataset", "model", "head", "runs", "params", "seconds_per_epoch"]
        for name, _ in PPL_COLUMNS:
            header += [f"{name}_mean", f"{name}_std", f"{name}_n"]
        header += ["p_value", "press_rank_mean", "press_rank_values"]
        rows = []
        for row in self.rows:
            seconds, params = row.seconds_per_epoch(), sorted(set(row.values("params")))
            line = [row.dataset, row.label, row.head, len(row.runs),
                    "/".join(map(str, params)), "" if seconds is None else seconds]
            for name, _ in PPL_COLUMNS:
                values = row.values(name)
                line += [*(mean_std(values) if values else ("", "")), len(values)]
            p, ranks = row.p_value, row.values("press_rank")
            line += ["" if p is None else p, np.mean(ranks) if ranks else "", ";".join(map(str, ranks))]
            rows.append(line)
        return header, rows


def build_table(results: Sequence[RunResult], group_by: Sequence[str] = (), baseline: str = "softmax",
                exclude_from_t_test: Sequence[int] = ()) -> Table:
    rows = group_rows(results, group_by)
    for row in rows:
        reference = baseline_row(rows, row, baseline)
        if reference is row:
            row.p_value = None
        elif reference is not None:
            row.p_value = t_test_p_value(row.values("test_ppl", exclude_from_t_test),
                                         reference.values("test_ppl", exclude_from_t_test))
    return Table(rows, baseline)


def missing_section(results: Sequence[RunResult]) -> str:
    lines = [f"- `{r.dir}`: " + "; ".join(r.missing) for r in results if r.missing]
    return "## Missing or incomplete\n\n" + ("\n".join(lines) if lines else "Nothing is missing.") + "\n"


def write_table(run_dirs: Sequence[Path], out_prefix: Path, group_by: Sequence[str] = (),
                baseline: str = "softmax", exclude_from_t_test: Sequence[int] = ()) -> str:
    """Write <prefix>.md and <prefix>.csv; return the Markdown."""
    results = [read_run(d, group_by) for d in run_dirs]
    table = build_table(results, group_by, baseline, exclude_from_t_test)
    note = ("Mean ± sample std over runs. Train / validation ppl: the epoch with the lowest "
            "validation loss (metrics.jsonl); test ppl: eval_best.json; p-value: two-sided "
            "unpaired t-test (equal variances) of test ppl against the baseline row"
            + (f", seeds {', '.join(map(str, exclude_from_t_test))} left out of it" if exclude_from_t_test
               else "") + ".\n")
    text = "# Results\n\n" + table.markdown() + "\n" + note + "\n" + missing_section(results)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    out_prefix.with_name(out_prefix.name + ".md").write_text(text, encoding="utf-8")
    write_csv(out_prefix.with_name(out_prefix.name + ".csv"), *table.csv_rows())
    return text
