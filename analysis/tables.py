"""The [SB] Table 2 layout from run directories: one row per head (and dataset), over seeds.

A row pools runs only when they are seeds of one configuration (pooling.py): runs of a head that
differ in any other compared config key are separate rows, labelled by the keys they differ in.

Columns and where each number comes from:
  n               the row's runs
  #Params         run.json "params" (truncated to two decimals of millions, as [SB] prints them)
  Time (s/epoch)  metrics.jsonl "seconds", the mean over all epochs of all the row's runs: the
                  training steps' wall time, validation left out (the reference code's printed
                  epoch time includes it)
  Train ppl       metrics.jsonl "train_ppl" of the epoch with the lowest validation loss (the
                  epoch best.pt comes from); it is the running perplexity of that epoch's
                  training pass, with dropout, as train.py logs it
  Validation ppl  metrics.jsonl "val_ppl" of the same epoch
  Test ppl        eval_best.json "test_ppl" (evaluate.py on best.pt, test batch size 1)
  Test ppl vs Softmax
                  the row's test ppl against the baseline row at the same setting (the baseline
                  head's row whose values of the keys that split the rows, head.* aside, are the
                  row's, e.g. the same model.emsize): the change in percent with its 95% Welch
                  interval and p-value, on log ppl (stats.py); no interval where a row has one run
  p-value         ([SB]'s layouts only, beside [SB]'s) two-sided unpaired Student t-test (equal
                  variances) of test ppl against the baseline row, [SB]'s test
  Press rank      rank_test.json "press_rank" (rank.py)
Perplexities and ranks are mean ± sample standard deviation (ddof=1) over the row's runs. A run
that lacks a number is listed under "Missing or incomplete", and a cell averaged over fewer runs
than its row has says so with (n=k). So is a run whose metrics.jsonl has fewer than
train.epochs epochs (unless its last epoch ended training early, as finetuning does), and a
test ppl or rank computed on other weights than best.pt's by metrics.jsonl (a run evaluated,
then trained on): the step in eval_best.json / rank_test.json tells; or on a corpus that is not
the published one for a run that trained on the published one (their "corpus" record).

Below the table: each row against its baseline at their common epoch (comparisons.py), and the
seed-to-seed spread of test ppl.

With a published table of [SB] (`paper`, analysis/published.py: Table 2, Table 5, SM Tables 4/5,
10/11, 12) the table takes the paper's layout: its columns, rows split by the config keys its
rows differ in (e.g. head.components), each row named as the paper names it, and the paper's
number in a "[SB] ..." column beside each measured one; and it says which rows' models are not
[SB]'s (their parameter count against the paper's).
"""
from __future__ import annotations

import math
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from scipy import stats

from data.corpus import describe_text_change, differing_splits
from experiment.run_directory import trained_corpus
from . import AnalysisError
from .comparisons import (AtCommonEpoch, at_common_epoch, common_epoch_table, pairs_table, seed_spread_line,
                          test_difference)
from .cost import training_device
from .pooling import compared, differing_keys, refuse_unlike, run_setting
from .published import (GSS_GRID, PUBLISHED_TABLES, ROBUSTNESS, PublishedRow, PublishedTable, Stat, dataset_label,
                        same_value)
from .stats import SMALLEST_P, Estimate, percent
from .stats import format_p as format_stats_p
from .runs import (config_value, dataset_order, head_label, head_order, markdown_table, read_json, read_metrics,
                   read_run_config, write_csv)

PPL_COLUMNS = (("train_ppl", "Train ppl"), ("val_ppl", "Validation ppl"), ("test_ppl", "Test ppl"))
# [SB] Table 6's columns: the epsilon-effective ranks rank.py writes beside the Press rank
EFFECTIVE_RANK_COLUMNS = {"effective_rank_e3": 1e-3, "effective_rank_e4": 1e-4, "effective_rank_e5": 1e-5}


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
    rank_contexts: int | None = None # rank_test.json "contexts": the rows of the ranked log-P matrix
    rank_dtype: str | None = None    # and "dtype", the precision of its singular values
    effective_rank_e3: int | None = None   # rank_test.json "effective_rank" at epsilon 1e-3, 1e-4, 1e-5
    effective_rank_e4: int | None = None
    effective_rank_e5: int | None = None
    missing: list[str] = field(default_factory=list)   # one note per missing number
    config: dict = field(default_factory=dict)         # config.yaml resolved, dotted keys (pooling.py)
    val_ppl_by_epoch: dict[int, float] = field(default_factory=dict)   # metrics.jsonl
    device: str = "unrecorded"       # where it trained: training_device()
    corpus_published: bool | None = None   # eval_best.json's corpus record: the published splits?

    @property
    def setting(self) -> dict:
        """What seeds of one configuration share (pooling.compared)."""
        return compared(self.config)


def read_run(run_dir: Path, group_by: Sequence[str] = ()) -> RunResult:
    """Everything a table needs from one run directory; what is absent goes to `missing`."""
    info = read_json(run_dir / "run.json") or {}
    config = read_run_config(run_dir)
    dataset = info.get("dataset") or config_value(config, "data.dataset")
    head = info.get("head") or config_value(config, "head.name")
    if dataset is None or head is None:
        raise AnalysisError(f"{run_dir}: neither run.json nor config.yaml names the dataset and head")
    result = RunResult(run_dir, dataset, head, tuple(config_value(config, key) for key in group_by),
                       info.get("seed", config_value(config, "train.seed")), info.get("params"),
                       config=run_setting(run_dir, config), device=training_device(run_dir, info))
    if result.params is None:
        result.missing.append("params (no run.json)")

    metrics = read_metrics(run_dir)
    best_pt_step = best_checkpoint_step(metrics)
    if metrics:
        best = min(metrics, key=lambda r: r["val_loss"])
        result.train_ppl, result.val_ppl = best["train_ppl"], best["val_ppl"]
        result.epoch_seconds = [r["seconds"] for r in metrics]
        result.val_ppl_by_epoch = {r["epoch"]: r["val_ppl"] for r in metrics}
        epochs = config_value(config, "train.epochs")
        if epochs is not None and metrics[-1]["epoch"] < epochs and not metrics[-1].get("early_stop"):
            result.missing.append(f"training unfinished ({metrics[-1]['epoch']} of {epochs} epochs)")
    else:
        result.missing.append("seconds, train_ppl, val_ppl (no metrics.jsonl: no epoch finished)")

    evaluation = read_json(run_dir / "eval_best.json")
    if evaluation is not None and "test_ppl" in evaluation:
        if stale := outdated_note(evaluation, "eval_best.json", run_dir, head, config, best_pt_step):
            result.missing.append(f"test_ppl ({stale})")
        else:
            result.test_ppl = checked_perplexity(evaluation["test_ppl"], run_dir / "eval_best.json")
            result.corpus_published = (evaluation.get("corpus") or {}).get("published")
    else:
        result.missing.append(f"test_ppl (no eval_best.json: run python evaluate.py {run_dir})")

    rank = read_json(run_dir / "rank_test.json")
    ranked = Path(rank.get("checkpoint", "best.pt")).name if rank is not None else None
    if rank is not None and "press_rank" in rank and ranked == "best.pt":
        if stale := outdated_note(rank, "rank_test.json", run_dir, head, config, best_pt_step):
            result.missing.append(f"press_rank ({stale})")
        else:
            result.press_rank, result.rank_contexts, result.rank_dtype = \
                rank["press_rank"], rank.get("contexts"), rank.get("dtype")
            effective = {float(eps): value for eps, value in (rank.get("effective_rank") or {}).items()}
            for name, eps in EFFECTIVE_RANK_COLUMNS.items():
                setattr(result, name, effective.get(eps))
    elif ranked is not None and ranked != "best.pt":    # rank.py RUN/last.pt writes the same file
        result.missing.append(f"press_rank (rank_test.json ranks {ranked}, not best.pt: run python rank.py {run_dir})")
    else:
        result.missing.append(f"press_rank (no rank_test.json: run python rank.py {run_dir})")
    return result


def checked_perplexity(value, path: Path) -> float:
    """`value`, the test_ppl read from `path`, if it is a perplexity: a finite number of 1 or more.
    Anything else is refused in one line: the reports take logs of it, and one inf or nan (what
    evaluate.py writes for a loss past float64's range or a NaN loss) made every mean, interval
    and spread of its row print as +inf% or nan%; 0, a negative or a string was a traceback."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if is_number and math.isfinite(value) and value >= 1:
        return value
    why = (" (evaluate.py writes it for a model whose loss overflowed or was NaN: the run diverged)"
           if is_number and not math.isfinite(value) else "")
    raise AnalysisError(f"{path}: test_ppl is {value!r}, not a perplexity (a finite number of 1 or more)"
                        f"{why}; give the report the other runs (move this one out of the folder)")


def best_checkpoint_step(metrics: list[dict]) -> int | None:
    """The step of the weights in best.pt by metrics.jsonl: the best epoch's, or 0 where a run
    from train.init_from never beat its starting weights (its best_val_ppl, which counts them,
    then stays below every epoch's); None without metrics or steps (older files)."""
    if not metrics or any("step" not in r for r in metrics):
        return None
    best = min(metrics, key=lambda r: r["val_loss"])
    return best["step"] if best["val_ppl"] <= metrics[-1].get("best_val_ppl", best["val_ppl"]) else 0


# The command that writes each result file again (outdated_note's notes name it).
RERUN = {"eval_best.json": "python evaluate.py {run}",
         "eval_best_cache.json": "python evaluate.py {run} --cache (with its settings)",
         "eval_best_dynamic.json": "python evaluate.py {run} --dynamic (with its settings)",
         "rank_test.json": "python rank.py {run}",
         "robustness_test.json": "python rank.py {run} --robustness"}


def outdated_note(result: dict, name: str, run_dir: Path, head: str, config: dict,
                  best_step: int | None) -> str | None:
    """Why the run's eval_best*.json, rank_test.json or robustness_test.json (`name`, read into
    `result`) is not of the model best.pt holds now on the run's corpus (and, for eval_best.json,
    at the run's test batch size), or None: each of the notes below, the first that applies."""
    command = RERUN[name].format(run=run_dir)
    return (head_note(result, head, name, command)
            or stale_note(result, best_step, name, command)
            or corpus_note(result, run_dir, config, name, command)
            or (batch_size_note(result, config, command) if name == "eval_best.json" else None))


def run_file_note(run_dir: Path, name: str, result: dict, of_best_pt: bool = True) -> str | None:
    """outdated_note for a result file of run_dir, reading the run's head, config.yaml and
    metrics.jsonl itself (report.py diagnose and spectra show one file of a run, as a table does).
    of_best_pt=False: the file is of another checkpoint (rank.py RUN/last.pt), by choice; its step
    is not checked against best.pt's."""
    config = read_run_config(run_dir)
    head = (read_json(run_dir / "run.json") or {}).get("head") or config_value(config, "head.name")
    best_step = best_checkpoint_step(read_metrics(run_dir)) if of_best_pt else None
    return outdated_note(result, name, run_dir, head, config, best_step)


def head_note(result: dict, head: str, name: str, command: str) -> str | None:
    """Why a result file is not of the run's model, or None: it names another head (a file
    copied in from another run). Files without the record pass."""
    if head is None or result.get("head", head) == head:
        return None
    return f"{name} is of a {result['head']} model, the run's head is {head}: run {command}"


def stale_note(result: dict, best_step: int | None, name: str, command: str) -> str | None:
    """Why a result file is not of the weights best.pt holds now (a run evaluated, then trained
    on and improved), or None; each such file carries the step of the weights it was computed on."""
    step = result.get("step")
    if best_step is None or step is None or step == best_step:
        return None
    return (f"{name} is of the weights at step {step:,}, but metrics.jsonl puts best.pt at step "
            f"{best_step:,}: run {command} again")


def corpus_note(result: dict, run_dir: Path, config: dict, name: str, command: str) -> str | None:
    """Why a result file is not of the run's corpus, or None: computed on other validation or
    test text than the run trained beside (by the hashes run.json and the file record), or, for
    files and runs from before the hashes were kept, on a corpus that is not the published one
    (evaluate.py --data-dir with --allow-modified-corpus) for a run that trained on the published
    one. Files written before any record pass."""
    corpus = result.get("corpus") or {}
    trained = trained_corpus(run_dir)
    if changed := differing_splits(trained, corpus, ("valid", "test")):
        return (f"{name} was computed on other text than the run trained beside: "
                f"{describe_text_change(trained, corpus, changed)}: run {command} on the run's folder")
    if trained and trained.get("sha256") and corpus.get("sha256"):
        return None                          # the same text, published or not
    if corpus.get("published", True) or config_value(config, "data.allow_modified_corpus"):
        return None
    return (f"{name} was computed on a corpus that is not the published one ({corpus.get('folder')}, "
            f"{corpus.get('tokens', {}).get('test', 0):,} test tokens), the run trained on the published "
            f"one: run {command}")


def rank_options(contexts: int | None, dtype: str | None) -> str:
    """The rank.py options that rank over `contexts` in `dtype` (" --contexts 200 --dtype float64";
    float32 is rank.py's default)."""
    return (f" --contexts {contexts}" if contexts else "") + (
        f" --dtype {dtype}" if dtype and dtype != "float32" else "")


def align_rank_settings(results: Sequence[RunResult]) -> list[str]:
    """Press ranks of one table over the same contexts and precision: a rank counts the rows of
    its log-P matrix and the rounding of its singular values, so the table takes, for each corpus,
    the setting most of that corpus's ranked runs share (rank.py --contexts, --dtype; [SB] ranks
    PTB over all its test contexts and WikiText-2 over the first 33,320) and lists a run ranked
    otherwise under "Missing or incomplete" rather than pooling it; every rank.py command a note
    gives carries that setting. Returns the notes of the ranks left out."""
    left_out = []
    for dataset in dict.fromkeys(r.dataset for r in results):
        left_out += _align_rank_settings([r for r in results if r.dataset == dataset])
    return left_out


def _align_rank_settings(results: Sequence[RunResult]) -> list[str]:
    settings = Counter((r.rank_contexts, r.rank_dtype) for r in results if r.press_rank is not None)
    if not settings:
        return []
    # the most runs; between as many, more contexts, then float32 (rank.py's default)
    (contexts, dtype), _ = max(settings.items(),
                               key=lambda item: (item[1], item[0][0] or 0, item[0][1] == "float32"))
    options = rank_options(contexts, dtype)
    left_out = []
    for r in results:
        command = f"python rank.py {r.dir}"
        r.missing = [note.replace(command, command + options) if note.startswith("press_rank") else note
                     for note in r.missing]
        if r.press_rank is not None and (r.rank_contexts, r.rank_dtype) != (contexts, dtype):
            reason = (f"rank_test.json is over {r.rank_contexts or 'all'} contexts in {r.rank_dtype}, "
                      f"the other ranks here over {contexts or 'all'} in {dtype}: run {command}{options}")
            left_out.append(f"`{r.dir}`: {reason}")
            r.missing.append(f"press_rank ({reason})")
            r.press_rank = r.rank_contexts = r.rank_dtype = None
            for name in EFFECTIVE_RANK_COLUMNS:          # of the same matrix: left out with it
                setattr(r, name, None)
    return left_out


def batch_size_note(evaluation: dict, config: dict, command: str) -> str | None:
    """Why eval_best.json's test ppl is not at the run's test batch size, or None: evaluate.py
    --test-batch-size N gives another number (fewer, longer-carried hidden states: not the
    batch-size-1 test of the papers), which a table would pool with the other runs' as one."""
    used = evaluation.get("test_batch_size")
    own = config_value(config, "train.test_batch_size") or 1
    if used is None or used == own:
        return None
    return (f"eval_best.json is at test batch size {used}, the run's train.test_batch_size is {own}: "
            f"run {command}")


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
    p_value: float | None = math.nan   # Student t-test vs the baseline row; None: this is the baseline
    published: PublishedRow | None = None   # the paper's row for these runs, when there is one
    split_by: tuple[str, ...] = ()     # keys this head's runs differ in, beyond group_by (pooling.py)
    split: tuple = ()                  # and this row's values of them
    reference: Row | None = None       # the baseline row it is compared with (None: none, or itself)
    is_baseline: bool = False
    test_change: Estimate | None = None      # test ppl against the reference's (comparisons.py)
    common_epoch: AtCommonEpoch | None = None

    @property
    def label(self) -> str:
        split = ", ".join(f"{k}={v}" for k, v in zip(self.split_by, self.split))
        if self.published is not None:
            return self.published.label + (f" ({split})" if split else "")
        details = ", ".join([f"{k}={v}" for k, v in zip(self.group_by, self.group) if v is not None]
                            + ([split] if split else []))
        return head_label(self.head) + (f" ({details})" if details else "")

    @property
    def setting(self) -> dict:
        return dict(zip(self.group_by + self.split_by, self.group + self.split))

    def values(self, name: str, exclude_seeds: Sequence[int] = ()) -> list[float]:
        return [getattr(r, name) for r in self.runs
                if getattr(r, name) is not None and r.seed not in exclude_seeds]

    def seconds_by_device(self) -> dict[str, float]:
        """The mean wall seconds of an epoch's training steps, per kind of device the row's runs
        trained on (cpu, cuda, ...: the first word of training_device): a row pooling CPU seeds
        with GPU seeds would otherwise average minutes with seconds."""
        seconds: dict[str, list[float]] = {}
        for run in self.runs:
            if run.epoch_seconds:
                seconds.setdefault(run.device.split()[0], []).extend(run.epoch_seconds)
        return {kind: float(np.mean(values)) for kind, values in seconds.items()}

    def seconds_per_epoch(self) -> float | None:
        """seconds_by_device's one value; None where the runs trained on several kinds (or none)."""
        by_device = self.seconds_by_device()
        return next(iter(by_device.values())) if len(by_device) == 1 else None


def group_rows(results: Sequence[RunResult], group_by: Sequence[str],
               published: PublishedTable | None = None, unlike: str = "split") -> list[Row]:
    """One row per (dataset, head, values of the group_by keys) whose runs are seeds of one
    configuration: runs that differ in other compared keys (pooling.py) are split into rows by
    those keys (`unlike="split"`), or refused in one line naming them (`unlike="refuse"`, for a
    report whose rows cannot be split). With `published`, rows the paper has come first, in its
    order, each holding its published row."""
    cells: dict[tuple, list[RunResult]] = {}
    for r in results:
        cells.setdefault((r.dataset, r.head, r.group), []).append(r)
    rows: list[Row] = []
    for (dataset, head, group), runs in cells.items():
        keys = [key for key in differing_keys([r.setting for r in runs]) if key not in group_by]
        if keys and unlike == "refuse":
            details = ", ".join(f"{k}={v}" for k, v in zip(group_by, group) if v is not None)
            refuse_unlike(f"{head_label(head)}{f' ({details})' if details else ''} ({dataset})",
                          [r.setting for r in runs])
        parts: dict[tuple, list[RunResult]] = {}
        for r in runs:
            parts.setdefault(tuple(repr(r.setting.get(k)) for k in keys), []).append(r)
        for part in parts.values():
            rows.append(Row(dataset, head, group, tuple(group_by), part, split_by=tuple(keys),
                            split=tuple(part[0].config.get(k) for k in keys)))
    if published is not None:
        for row in rows:
            row.published = published.row_for(row.dataset, row.head, row.setting)

    in_paper = {id(published_row): i for i, published_row in enumerate(published.rows)} if published else {}

    def sortable(values: tuple) -> tuple:
        return tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in values)

    def order(row: Row) -> tuple:
        return (dataset_order(row.dataset), in_paper.get(id(row.published), len(in_paper)),
                head_order(row.head), sortable(row.group), sortable(row.split))

    return sorted(rows, key=order)


def same_setting(row: Row, other: Row) -> bool:
    """Whether two rows agree on every key that splits either of them, the head's own keys
    aside: a head is compared with the baseline at the same d, learning rate, ..."""
    keys = [k for k in dict.fromkeys(row.group_by + row.split_by + other.group_by + other.split_by)
            if not k.startswith("head.")]
    return all(same_value(row.runs[0].config.get(k), other.runs[0].config.get(k)) for k in keys)


def baseline_row(rows: Sequence[Row], row: Row, baseline: str, by_label: bool = False) -> Row | None:
    """The one row of `row`'s dataset with the baseline head at the same setting (or, `by_label`,
    the paper's row of that name, whatever its setting: [SB] Table 5 sets MoS at d = 280 against
    Softmax at 340; where runs split that row by other keys, the part at `row`'s setting); None
    if there is not exactly one."""
    if by_label:
        candidates = [r for r in rows if r.dataset == row.dataset and r.published is not None
                      and r.published.label == baseline]
        if len(candidates) > 1:                  # e.g. Softmax's runs at several d
            candidates = [r for r in candidates if same_setting(row, r)]
    else:
        candidates = [r for r in rows if r.dataset == row.dataset and r.head == baseline
                      and same_setting(row, r)]
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
    mean, std = mean_std(values)     # as [SB] prints ranks: mean ± sample std
    if len(values) == 1:
        text = f"{values[0]:,}"
    elif len(distinct) == 1:         # every run the same rank: a spread of zero, not one run's value
        text = f"{distinct[0]:,} ± 0"
    else:
        text = f"{mean:,.1f} ± {std:,.1f}"
    return text + (f" (n={len(values)})" if len(values) < runs else "")


def format_p(p: float | None) -> str:
    if p is None:
        return "N/A"
    if math.isnan(p):
        return "—"
    return format_stats_p(p) if p < SMALLEST_P else f"{p:.2e}"       # underflowed: a bound, not 0.00e+00


def format_stat(stat: Stat, rank: bool = False) -> str:
    """A published mean (± std) as the paper prints it: ranks with thousands separators."""
    text = (lambda v: f"{v:,.0f}") if rank else (lambda v: f"{v:.2f}")
    return text(stat.mean) + ("" if stat.std is None else f" ± {text(stat.std)}")


def format_seconds(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.1f}"


def format_seconds_by_device(by_device: dict[str, float]) -> str:
    """"189.9", or per device where the row's runs trained on several: "189.9 on cpu, 4.1 on cuda"."""
    if len(by_device) <= 1:
        return format_seconds(next(iter(by_device.values()), None))
    return ", ".join(f"{seconds:.1f} on {kind}" for kind, seconds in sorted(by_device.items()))


@dataclass(frozen=True)
class Column:
    """A table column: its title, the cell of a row of runs and, for a column [SB] prints, how to
    print the paper's value (the PublishedRow attribute of the column's name)."""
    title: str
    measured: Callable[[Row], str]
    paper: Callable[[object], str] | None = None


def format_change(row: Row) -> str:
    """The row's test ppl against its baseline's: "baseline", the change with its interval, or
    "—" where there is no baseline at the row's setting (or no test ppl)."""
    if row.is_baseline:
        return "baseline"
    return row.test_change.describe() if row.test_change is not None else "—"


COLUMNS = {
    "params": Column("#Params", lambda row: format_params(row.values("params")), str),
    "seconds": Column("Time (s/epoch)", lambda row: format_seconds_by_device(row.seconds_by_device()),
                      lambda seconds: f"~{seconds:g}"),
    **{name: Column(title, lambda row, name=name: format_ppl(row.values(name), len(row.runs)), format_stat)
       for name, title in PPL_COLUMNS},
    "test_change": Column("Test ppl vs {baseline}: % [95% CI], p", format_change),
    "p_value": Column("p-value", lambda row: format_p(row.p_value), format_p),
    "press_rank": Column("Press rank", lambda row: format_rank(row.values("press_rank"), len(row.runs)),
                         lambda stat: format_stat(stat, rank=True)),
    "runs": Column("n", lambda row: str(len(row.runs))),
    **{name: Column(f"Effective rank, ε = 1e-{name[-1]}", lambda row, name=name: format_rank(row.values(name), len(row.runs)),
                    lambda stat: format_stat(stat, rank=True))
       for name, eps in EFFECTIVE_RANK_COLUMNS.items()},
}
TABLE2_COLUMNS = ("runs", "params", "seconds", "train_ppl", "val_ppl", "test_ppl", "test_change", "press_rank")


@dataclass
class Table:
    rows: list[Row]
    baseline: str                       # head name, or with a published table the paper's row label
    published: PublishedTable | None = None
    exclude_from_t_test: Sequence[int] = ()

    @property
    def baseline_label(self) -> str:
        return self.baseline if self.published and self.published.baseline else head_label(self.baseline)

    @property
    def compares(self) -> bool:
        return any(row.reference is not None for row in self.rows)

    @property
    def columns(self) -> tuple[str, ...]:
        """[SB]'s columns, with the Welch change after test ppl wherever a row has a baseline."""
        if not self.published:
            return TABLE2_COLUMNS
        columns = list(self.published.columns)
        if self.compares and "test_ppl" in columns:
            columns.insert(columns.index("test_ppl") + 1, "test_change")
        return tuple(columns)

    def header_and_cells(self, rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
        """Measured columns, each followed by the paper's when a published row has a value there."""
        header, cells = ["Model"], [[row.label] for row in rows]
        for name in self.columns:
            column = COLUMNS[name]
            title = (f"{column.title} (vs {self.baseline_label})" if name == "p_value"
                     else column.title.format(baseline=self.baseline_label))
            header.append(title)
            for line, row in zip(cells, rows):
                line.append(column.measured(row))
            paper = [getattr(row.published, name, None) if column.paper and row.published else None
                     for row in rows]
            if any(value is not None for value in paper):
                header.append(f"[SB] {title}")
                for line, row, value in zip(cells, rows, paper):
                    is_baseline = name == "p_value" and row.published and row.published.label == self.baseline
                    line.append("N/A" if is_baseline else "—" if value is None else column.paper(value))
        return header, cells

    def datasets(self) -> list[str]:
        return list(dict.fromkeys(row.dataset for row in self.rows))

    def markdown(self) -> str:
        parts = []
        for dataset in self.datasets():
            header, cells = self.header_and_cells([r for r in self.rows if r.dataset == dataset])
            parts.append(f"## {dataset}\n\n" + markdown_table(header, cells))
        return "\n".join(parts)

    def common_epoch_markdown(self) -> str:
        """Each row against its baseline at their common epoch (comparisons.py), per dataset."""
        parts = []
        for dataset in self.datasets():
            compared = [(r.label, r.common_epoch) for r in self.rows
                        if r.dataset == dataset and r.common_epoch is not None]
            if compared:
                parts.append(f"## {dataset}: each row against {self.baseline_label} at a common epoch\n\n"
                             + common_epoch_table(compared, self.baseline_label))
        return "\n".join(parts)

    def pairs_markdown(self) -> str:
        """Every two rows at the same setting (the head's own keys aside), per dataset: each row
        against each row above it (Softmax heads the rows, so its pairs read as the baseline
        column does)."""
        parts = []
        for dataset in self.datasets():
            rows = [r for r in self.rows if r.dataset == dataset]
            table = pairs_table([(b.label, b, a.label, a) for i, a in enumerate(rows) for b in rows[i + 1:]
                                 if same_setting(a, b)], "Every two rows at the same setting, each row against "
                                "each row above it", self.exclude_from_t_test)
            if table:
                parts.append(f"## {dataset}: every two rows\n\n{table}")
        return "\n".join(parts)

    def spread_markdown(self) -> str:
        parts = [f"## {dataset}: seed spread\n\n"
                 + seed_spread_line([r for r in self.rows if r.dataset == dataset], lambda r: r.label) + "\n"
                 for dataset in self.datasets()]
        return "\n".join(parts)

    def csv_rows(self) -> tuple[list[str], list[list]]:
        header = ["dataset", "model", "head", "runs", "params", "seconds_per_epoch", "seconds_per_epoch_by_device"]
        for name, _ in PPL_COLUMNS:
            header += [f"{name}_mean", f"{name}_std", f"{name}_n"]
        header += ["test_change_pct", "test_change_low_pct", "test_change_high_pct", "test_change_p",
                   "common_epoch", "val_change_pct", "val_change_low_pct", "val_change_high_pct",
                   "val_change_p"]
        if "p_value" in self.columns:
            header += ["p_value"]
        header += ["press_rank_mean", "press_rank_values"]
        effective = [name for name in EFFECTIVE_RANK_COLUMNS if name in self.columns]
        header += [f"{name}_{part}" for name in effective for part in ("mean", "values")]
        if self.published:
            header += [f"paper_{name}" for name in PAPER_CSV_FIELDS]
        rows = []
        for row in self.rows:
            seconds, params = row.seconds_per_epoch(), sorted(set(row.values("params")))
            line = [row.dataset, row.label, row.head, len(row.runs),
                    "/".join(map(str, params)), "" if seconds is None else seconds,
                    ";".join(f"{kind}:{value}" for kind, value in sorted(row.seconds_by_device().items()))]
            for name, _ in PPL_COLUMNS:
                values = row.values(name)
                line += [*(mean_std(values) if values else ("", "")), len(values)]
            common = row.common_epoch
            line += [*estimate_csv(row.test_change), "" if common is None else common.epoch,
                     *estimate_csv(common and common.difference)]
            if "p_value" in self.columns:
                line += ["" if row.p_value is None else row.p_value]
            ranks = row.values("press_rank")
            line += [np.mean(ranks) if ranks else "", ";".join(map(str, ranks))]
            for name in effective:
                ranks = row.values(name)
                line += [np.mean(ranks) if ranks else "", ";".join(map(str, ranks))]
            if self.published:
                line += paper_csv_values(row.published)
            rows.append(line)
        return header, rows


def estimate_csv(estimate: Estimate | None) -> list:
    """change, low, high (percent) and p of an estimate; blanks for what it lacks."""
    if estimate is None:
        return ["", "", "", ""]
    if estimate.why_not:
        return [estimate.percent, "", "", ""]
    return [estimate.percent, percent(estimate.low), percent(estimate.high), estimate.p]


# The published numbers in the CSV: statistics as mean and std, the rest as printed.
PAPER_CSV_FIELDS = ("params", "seconds",
                    *[f"{name}_{part}" for name in ("train_ppl", "val_ppl", "test_ppl", "press_rank",
                                                    *EFFECTIVE_RANK_COLUMNS)
                      for part in ("mean", "std")],
                    "p_value")


def paper_csv_values(published: PublishedRow | None) -> list:
    if published is None:
        return [""] * len(PAPER_CSV_FIELDS)
    values = []
    for field_name in PAPER_CSV_FIELDS:
        name, _, part = field_name.rpartition("_")
        if part in ("mean", "std"):
            stat = getattr(published, name)
            value = None if stat is None else getattr(stat, part)
        else:
            value = getattr(published, field_name)
        values.append("" if value is None else value)
    return values


def build_table(results: Sequence[RunResult], group_by: Sequence[str] = (), baseline: str = "softmax",
                exclude_from_t_test: Sequence[int] = (), published: PublishedTable | None = None) -> Table:
    """`results` grouped into rows, each compared with its baseline row; with `published`,
    `group_by` must hold its keys and the baseline is the paper's row named `published.baseline`
    when it has one."""
    rows = group_rows(results, group_by, published)
    by_label = published is not None and published.baseline is not None
    if by_label:
        baseline = published.baseline
    for row in rows:
        reference = baseline_row(rows, row, baseline, by_label)
        if reference is row:
            row.p_value, row.is_baseline = None, True
        elif reference is not None:
            row.reference = reference
            row.p_value = t_test_p_value(row.values("test_ppl", exclude_from_t_test),
                                         reference.values("test_ppl", exclude_from_t_test))
            row.test_change = test_difference(row, reference, exclude_from_t_test)
            row.common_epoch = at_common_epoch(row, reference)
    return Table(rows, baseline, published, tuple(exclude_from_t_test))


def missing_section(results: Sequence[RunResult]) -> str:
    lines = [f"- `{r.dir}`: " + "; ".join(r.missing) for r in results if r.missing]
    # About the runs found: a plan's runs not trained yet are not in the folder, so not here.
    complete = "Every run found has all its numbers (runs not yet trained are not in the table)."
    return "## Missing or incomplete\n\n" + ("\n".join(lines) if lines else complete) + "\n"


def published_table(name: str) -> PublishedTable:
    if name not in PUBLISHED_TABLES:
        raise AnalysisError(f"--paper {name}: expected one of {', '.join(PUBLISHED_TABLES)}")
    return PUBLISHED_TABLES[name]


def model_note(table: Table) -> str:
    """Whether the rows set beside [SB]'s are [SB]'s models: each row's parameter count against
    the one the paper prints for its row."""
    differ, unknown, same = [], [], 0
    for row in table.rows:
        if row.published is None:
            continue
        measured = format_params(row.values("params"))
        same += measured == row.published.params
        if row.published.params is None or measured == "—":
            unknown.append(row.label)
        elif measured != row.published.params:
            differ.append(f"{row.label} {measured} here, {row.published.params} in [SB]")
    text = ""
    if differ:
        text += ("**Not [SB]'s model:** these rows' parameter counts are not the paper's, so their "
                 "numbers are of other models than those beside them: " + "; ".join(differ) + ".")
    elif same and not unknown:
        text += "Every row with a published counterpart has the parameter count [SB] prints for it."
    if unknown:
        text += (" " if text else "") + ("No parameter count to check against [SB]'s (the paper "
                                         "prints none, or the run has no run.json): "
                                         + "; ".join(unknown) + ".")
    return text + "\n" if text else ""


def table_note(table: Table) -> str:
    base = table.baseline_label
    excluded = (f" (seeds {', '.join(map(str, table.exclude_from_t_test))} left out of both tests)"
                if table.exclude_from_t_test else "")
    note = ("Mean ± sample std over the row's n runs (n = 1: the one run's value, no spread). Train "
            "/ validation ppl: the epoch with the lowest validation loss (metrics.jsonl); test ppl: "
            "eval_best.json, at each run's stop. ")
    if "test_change" in table.columns:
        note += (f"Test ppl vs {base}: the row's test ppl against the {base} row "
                 + ("named so" if table.published and table.published.baseline else
                    "at the same setting (the same values of the keys that split the rows, the head's own aside)")
                 + f", the change of the ratio of their geometric means in percent with its 95% "
                 f"interval and two-sided p-value, Welch's t-test on log ppl{excluded}; no interval "
                 f"where a row has one run. ")
    if "p_value" in table.columns:
        note += (f"p-value: two-sided unpaired Student t-test (equal variances) of test ppl "
                 f"against the {base} row, the test [SB] reports{excluded}. ")
    if "press_rank" in table.columns:
        ranked = [run for row in table.rows for run in row.runs if run.press_rank is not None]
        contexts = sorted({run.rank_contexts for run in ranked if run.rank_contexts is not None})
        dtypes = sorted({run.rank_dtype for run in ranked if run.rank_dtype is not None})
        if contexts:
            note += ("Press rank: rank_test.json, the rank of best.pt's log-probability matrix over the first "
                     + " or ".join(f"{c:,}" for c in contexts) + " test contexts"
                     + (f" in {' or '.join(dtypes)}" if dtypes else "") + " (rank.py --contexts, --dtype; "
                     + "the same for every run: a rank taken otherwise is listed under Missing or incomplete"
                     + "), mean ± sample std as above (± 0: every run the same rank). ")
    return note + ("Time: the wall seconds of an epoch's training steps, validation left out (the "
                   "epoch time that the AWD-LSTM and MoS code print includes it), per kind of device "
                   "where a row's runs trained on several.\n")


def devices_markdown(cells: Sequence[tuple[str, Sequence[RunResult]]]) -> str:
    """Where each cell's runs trained (run.json): one line when every run shares a device,
    else each cell's count per device (a device without its model recorded said so)."""
    devices = {run.device for _, runs in cells for run in runs}
    if len(devices) == 1:
        return f"Where the runs trained (run.json, else cpu_times.jsonl): every run on {devices.pop()}.\n"
    # Older runs' run.json has the device ("cpu") without its model: beside runs of that device
    # with one ("cpu (AMD EPYC ...)"), say that it is unrecorded rather than a different device.
    named = {device.split(" (")[0] for device in devices if " (" in device}

    def shown(device: str) -> str:
        return f"{device} (model not recorded)" if device in named else device
    lines = [f"- {label}: " + ", ".join(f"{n} on {shown(device)}" for device, n in
                                        sorted(Counter(run.device for run in runs).items()))
             for label, runs in cells]
    return "Where the runs trained (run.json, else cpu_times.jsonl), per row:\n\n" + "\n".join(lines) + "\n"


def write_table(run_dirs: Sequence[Path], out_prefix: Path, group_by: Sequence[str] = (),
                baseline: str = "softmax", exclude_from_t_test: Sequence[int] = (),
                paper: str | None = None) -> str:
    """Write <prefix>.md and <prefix>.csv; return the Markdown. `paper` names a published table
    (analysis/published.py) whose layout, row names and numbers the table takes."""
    published = published_table(paper) if paper else None
    if published:
        group_by = list(dict.fromkeys([*published.group_by, *group_by]))
    results = [read_run(d, group_by) for d in run_dirs]
    align_rank_settings(results)
    table = build_table(results, group_by, baseline, exclude_from_t_test, published)
    note = table_note(table)
    title = f"# {published.title}" if published else "# Results"
    if published:
        unmatched = sorted({row.label for row in table.rows if row.published is None})
        note += (f"\nColumns marked [SB]: {published.title}. {published.note}\n"
                 + (f"\nRows without a published counterpart: {'; '.join(unmatched)}.\n" if unmatched else ""))
        modified = [r for r in results if r.corpus_published is False]
        if modified:
            warning = (f"{len(modified)} of the {len(results)} runs were evaluated on a corpus that is not the "
                       f"published one (data.allow_modified_corpus; e.g. {modified[0].dir}): the [SB] "
                       f"columns set their numbers against the paper's on another text")
            print(f"warning: {warning}", file=sys.stderr)
        note_on_models = model_note(table)
        title += "\n\n" + note_on_models.rstrip("\n") if note_on_models else ""
        title += f"\n\n**Not the published corpus**: {warning}." if modified else ""
    common, pairs = table.common_epoch_markdown(), table.pairs_markdown()
    text = (title + "\n\n" + table.markdown() + "\n" + note + "\n" + (common + "\n" if common else "")
            + (pairs + "\n" if pairs else "") + table.spread_markdown() + "\n" + devices_markdown([(row.label, row.runs) for row in table.rows])
            + "\n" + missing_section(results))
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    out_prefix.with_name(out_prefix.name + ".md").write_text(text, encoding="utf-8")
    write_csv(out_prefix.with_name(out_prefix.name + ".csv"), *table.csv_rows())
    return text


def published_markdown() -> str:
    """Every number of analysis/published.py as Markdown: the page docs/published.md, which a
    test keeps equal to this function's output."""
    parts = ["# The numbers [SB] publishes\n",
             "Generated by `python report.py published --out docs/published.md` from "
             "`analysis/published.py`, the one place that holds them; `report.py` prints and draws "
             "them beside the measured ones. [SB]: Parthiban, Mao, Inkpen, *On the Softmax "
             "Bottleneck of Recurrent Language Models*, AAAI 2021, and its supplementary material "
             "(SM).\n"]
    for table in PUBLISHED_TABLES.values():
        columns = [name for name in table.columns if COLUMNS[name].paper is not None]
        header = ["Row", "Dataset", *(COLUMNS[name].title for name in columns), "Source"]
        rows = [[row.label, dataset_label(row.dataset),
                 *("" if getattr(row, name) is None else COLUMNS[name].paper(getattr(row, name))
                   for name in columns), row.source] for row in table.rows]
        parts.append(f"## {table.title}\n\n{table.note}\n\n" + markdown_table(header, rows))
    parts.append("## [SB] Figure 2: Press rank against test perplexity over the GSS(c, k) grid\n\n"
                 + markdown_table(["Dataset", "c", "k", "Pearson r", "r without outliers (test ppl in)"],
                                  [[dataset_label(d), ", ".join(f"{c:g}" for c in g.c),
                                    ", ".join(f"{k:g}" for k in g.k), f"{g.pearson_r:.2f}",
                                    f"{g.pearson_r_in_range:.2f} ({g.ppl_range[0]:g}-{g.ppl_range[1]:g})"]
                                   for d, g in GSS_GRID.items()]))
    r = ROBUSTNESS
    parts.append(f"## [SB] SM Tables 14-16: robustness of the Press rank\n\nMoS on the first "
                 f"{r.contexts:,} PTB test contexts (Press rank {r.press_rank:,}), top {r.keep} "
                 f"singular values kept.\n\n"
                 + markdown_table(["Algorithm 1: iteration", "Press rank", "error (x 1e-28)"],
                                  [[str(i), str(rank), f"{e:.2f}"] for i, rank, e in r.reconstruction])
                 + "\n" + markdown_table(["Algorithm 2: c", "Press rank", "effective ranks (1e-3, 1e-4, 1e-5)"],
                                         [[f"{c:g}", f"{rank:,}", ", ".join(map(str, r.noise_effective_rank[c]))
                                           if c in r.noise_effective_rank else ""]
                                          for c, rank in r.noise_press_rank.items()]))
    return "\n".join(parts)
