"""What to look at first when a run did not learn (report.py diagnose), for each run directory:

- spread: how much the last LSTM layer's output varies over positions of the validation text,
  with best.pt's weights in eval mode: the standard deviation over the first 700 positions of
  each of 10 batch columns of every unit of the raw (not dropped) output, averaged over units.
  A body that never trained gives every context nearly the same output, and the head the same
  distribution: a test perplexity at the unigram level.
- gradient-share: the LSTM layers' share of the gradient norm (the global norm that clipping
  scales, so the share is that of the clipped gradient too) over the first SGD steps of the run's
  model from its start: rebuilt from config.yaml and seeded as train.py does, plain SGD with the
  run's lr, parameter groups, weight decay and clipping, consecutive BPTT windows of train.bptt
  (no variable length, one forward over the whole batch), cross-entropy only. Without AR and TAR
  because they act on the last layer's output directly: the question is how much of what the
  head sends back reaches the body. From the start, not from best.pt, because a run that never
  learnt is explained by its first steps; the trained run's late gradients are not measured.
- slopes (LMS-PLIF heads, whose state has the slope parameters v): best.pt's v against the v the
  run started from (rebuilt as above; a finetuning's, from its train.init_from), as the largest
  change of v and the mean and largest change of the slopes softplus(v). LMS-PLIF† keeps its
  slopes, so it gives exactly 0: the check that the start is rebuilt right.
- perplexity: the test perplexity of eval_best.json (evaluate.py), beside the unigram level: the
  test perplexity of the training split's word frequencies (add-one smoothed only when a test
  word never occurs in training).

These began as one-off scripts for the 6-epoch CPU runs; their outputs are kept in
results/cpu_ptb/diagnostics/.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from data import load_corpus
from data.batching import batchify, get_batch
from experiment import checkpoint
from experiment.averaged_sgd import make_optimizer
from experiment.config import Config, load_config
from experiment.loading import (TrainedModel, check_named_data_dir, code_version, device_name, initial_model,
                                load_trained)
from experiment.run_directory import FINETUNE_DIR
from . import AnalysisError
from .figures import prefixed
from .runs import head_label, read_json, require_best_pt
from .tables import run_file_note

MEASUREMENTS = ("perplexity", "spread", "slopes", "gradient-share")     # the columns' order
READ_BEST_PT = ("spread", "slopes")
SPREAD_COLUMNS, SPREAD_POSITIONS = 10, 700     # as the body_spread.txt of the CPU runs


@dataclass
class GradientSample:
    step: int              # SGD updates taken before this batch
    loss: float            # its cross-entropy
    grad_norm: float       # the global gradient norm, before clipping
    lstm_share: float      # the LSTM layers' part of that norm
    output_std: float      # the last layer's raw output on the batch: std over positions, mean over units


@dataclass
class SlopeMovement:
    slopes: int            # K
    v_max: float           # max |v - v_start|
    slope_mean: float      # mean |softplus(v) - softplus(v_start)|
    slope_max: float       # max of the same


@dataclass
class Diagnosis:
    run_dir: Path
    dataset: str
    head: str
    d: int
    seed: int
    test_ppl: float | None = None
    test_ppl_note: str | None = None      # why eval_best.json's test ppl is not shown
    unigram_ppl: float | None = None
    unigram_smoothed: bool = False
    spread: float | None = None
    slopes: SlopeMovement | None = None
    gradient: list[GradientSample] | None = None


def own_random_stream(device: torch.device):
    """The global random streams of this process as they were, once the block ends: rebuilding a
    run reseeds them, and the caller's (another run's, a test's) is not disturbed."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


# ---------------------------------------------------------------------- the measurements

@torch.no_grad()
def body_spread(model, valid: torch.Tensor) -> float:
    """Mean over units of the std over positions of the last LSTM layer's raw output (eval mode)
    on the first SPREAD_POSITIONS positions of SPREAD_COLUMNS columns of `valid`."""
    device = next(model.parameters()).device
    text = batchify(valid, SPREAD_COLUMNS, device)[:SPREAD_POSITIONS]
    model.eval()
    raw = model.body(text, model.init_hidden(SPREAD_COLUMNS)).last_raw_output
    return raw.reshape(-1, raw.size(-1)).std(dim=0).mean().item()


def gradient_shares(config: Config, corpus, steps: int, every: int,
                    device: torch.device) -> list[GradientSample]:
    """The LSTM's share of the gradient norm at steps 0, every, 2 every, ... <= steps of the
    run's model trained from its start (the module's docstring says how and why)."""
    t = config.train
    corpus.check_batchable("train", t.batch_size, "train.batch_size", min_rows=3)
    train = batchify(corpus.train, t.batch_size, device)
    most = (train.size(0) - 1) // t.bptt - 1
    if steps > most:
        raise AnalysisError(f"--steps {steps}: the training split gives {most + 1} windows of "
                            f"train.bptt={t.bptt} at train.batch_size={t.batch_size}: at most --steps {most}")
    samples = []
    with own_random_stream(device):
        model = initial_model(config, corpus).to(device).train()
        optimizer = make_optimizer(model, t, torch.optim.SGD)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        lstm = [p for name, p in model.named_parameters() if name.startswith("body.rnns.")]
        hidden = model.init_hidden(t.batch_size)
        for step in tqdm(range(steps + 1), desc="gradient share", unit="step", leave=False, disable=None):
            inputs, targets = get_batch(train, step * t.bptt, t.bptt)
            out = model(inputs, [(h.detach(), c.detach()) for h, c in hidden], targets)
            hidden = out.hidden
            loss = -out.target_log_probs.mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            lstm_norm = torch.nn.utils.get_total_norm([p.grad for p in lstm])
            total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            if t.clip > 0:
                torch.nn.utils.clip_grads_with_norm_(params, t.clip, total)
            if step % every == 0:
                raw = out.last_raw_output.detach()
                samples.append(GradientSample(step, loss.item(), total.item(), (lstm_norm / total).item(),
                                              raw.std(dim=(0, 1)).mean().item()))
            if step < steps:
                optimizer.step()
    return samples


def slope_movement(trained: TrainedModel) -> SlopeMovement | None:
    """How far best.pt's slopes are from where the run started; None for a head without them."""
    v = trained.checkpoint["model"].get("head.v")
    if v is None:
        return None
    start = start_slopes(trained)
    moved = (F.softplus(v) - F.softplus(start)).abs()
    return SlopeMovement(v.numel(), (v - start).abs().max().item(), moved.mean().item(), moved.max().item())


def start_slopes(trained: TrainedModel) -> torch.Tensor:
    init_from = trained.config.train.init_from
    if init_from:           # a finetuning started from that checkpoint's weights
        try:
            return checkpoint.load(init_from)["model"]["head.v"]
        except checkpoint.CheckpointError as e:
            raise AnalysisError(f"{trained.path}: its slopes started from its train.init_from, "
                                f"and {e}") from None
    with own_random_stream(torch.device("cpu")):
        return initial_model(trained.config, trained.corpus).head.v.detach()


def unigram_perplexity(train: torch.Tensor, test: torch.Tensor, vocab_size: int) -> tuple[float, bool]:
    """The perplexity on `test` of the word frequencies of `train`, and whether they had to be
    add-one smoothed (a word of `test` that `train` never has)."""
    counts = torch.bincount(train, minlength=vocab_size).double()
    smoothed = bool((counts[test] == 0).any())
    if smoothed:
        counts += 1
    return math.exp(-(counts[test] / counts.sum()).log().mean().item()), smoothed


# ---------------------------------------------------------------------- one run, many runs

def run_config(run_dir: Path) -> Config:
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise AnalysisError(f"{run_dir}: no config.yaml, which the gradient share builds the model from")
    return load_config(path)


def require_measured_best_pt(run_dir: Path, measurements: Iterable[str]) -> None:
    reading = [m for m in READ_BEST_PT if m in measurements]
    try:
        require_best_pt(run_dir, " and ".join(reading))
    except AnalysisError as e:
        raise AnalysisError(f"{e}, --measure gradient-share perplexity need none") from None


def diagnose_run(run_dir: Path, measurements: Sequence[str], steps: int, every: int,
                 device: torch.device, data_dir: str | None = None) -> Diagnosis:
    trained = None
    if any(m in READ_BEST_PT for m in measurements):
        require_measured_best_pt(run_dir, measurements)
        trained = load_trained(run_dir, device, data_dir)
        config, corpus = trained.config, trained.corpus
    else:
        config = run_config(run_dir)
        check_named_data_dir(data_dir, config.data.dataset)
        corpus = load_corpus(config.data.dataset, data_dir or config.data.data_dir,
                             allow_modified=config.data.allow_modified_corpus)
    found = Diagnosis(run_dir, config.data.dataset, config.head_name, config.model.emsize, config.train.seed)
    if "perplexity" in measurements:
        evaluation = read_json(run_dir / "eval_best.json") or {}
        # as a table does: a test ppl of other weights than best.pt's (or of another head, corpus
        # or test batch size) is not shown, and the note says why and what to run
        found.test_ppl_note = run_file_note(run_dir, "eval_best.json", evaluation) if evaluation else None
        found.test_ppl = None if found.test_ppl_note else evaluation.get("test_ppl")
        found.unigram_ppl, found.unigram_smoothed = unigram_perplexity(corpus.train, corpus.test,
                                                                       corpus.vocab_size)
    if "spread" in measurements:
        corpus.check_batchable("valid", SPREAD_COLUMNS, "the spread's columns")
        found.spread = body_spread(trained.model, corpus.valid)
    if "slopes" in measurements:
        found.slopes = slope_movement(trained)
    if "gradient-share" in measurements:
        found.gradient = gradient_shares(config, corpus, steps, every, device)
    return found


def measured_where(device: torch.device) -> dict:
    """The device (with the GPU's or processor's model), torch and the code's commit: the gradient
    share's later steps are plain SGD at the run's lr (20 on PTB), which amplifies another
    processor's rounding into another trajectory within some 20-40 steps."""
    return {"device": device_name(device), "torch": torch.__version__, "code": code_version()}


def diagnose_runs(run_dirs: Sequence[Path], measurements: Sequence[str], steps: int, every: int,
                  device: torch.device, data_dir: str | None, out_prefix: Path | None) -> str:
    """The text table of every run (and with out_prefix PREFIX.md, the same, and PREFIX.json)."""
    diagnoses = [diagnose_run(d, measurements, steps, every, device, data_dir) for d in run_dirs]
    text = diagnosis_markdown(diagnoses, measurements, steps, measured_where(device))
    if out_prefix is not None:
        prefixed(out_prefix, ".md").parent.mkdir(parents=True, exist_ok=True)
        prefixed(out_prefix, ".md").write_text(text, encoding="utf-8")
        settings = {"measurements": list(measurements), "spread_columns": SPREAD_COLUMNS,
                    "spread_positions": SPREAD_POSITIONS, "steps": steps, "every": every,
                    **measured_where(device)}
        runs = [{**dataclasses.asdict(d), "run_dir": str(d.run_dir)} for d in diagnoses]
        prefixed(out_prefix, ".json").write_text(json.dumps({"settings": settings, "runs": runs}, indent=1)
                                                 + "\n", encoding="utf-8")
    return text


# ---------------------------------------------------------------------- the text

def run_label(run_dir: Path) -> str:
    return f"{run_dir.parent.name}/{run_dir.name}" if run_dir.name == FINETUNE_DIR else run_dir.name


def aligned_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table padded to its columns' widths, as readable in a terminal as rendered."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *map(line, rows)]) + "\n"


def number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def summary_columns(d: Diagnosis, measurements: Sequence[str]) -> dict[str, str]:
    columns = {}
    if "perplexity" in measurements:
        columns["test ppl"] = number(d.test_ppl)
        columns["unigram ppl"] = number(d.unigram_ppl) + (" (add-one)" if d.unigram_smoothed else "")
    if "spread" in measurements:
        columns["body spread"] = number(d.spread, 4)
    if "slopes" in measurements:
        columns["slope change (max)"] = "—" if d.slopes is None else f"{d.slopes.slope_max:.2e}"
    if "gradient-share" in measurements:
        shares = [s.lstm_share for s in d.gradient]
        columns["LSTM share"] = f"{min(shares):.3f}–{max(shares):.3f}"
    return columns


NOTES = {
    "perplexity": "test ppl: eval_best.json's (— not evaluated, or not of best.pt's weights: a note below says); unigram ppl: the test perplexity of "
                  "the training split's word frequencies. A test ppl near it: the run did not learn.",
    "spread": f"body spread: std over positions (the first {SPREAD_POSITIONS} positions of {SPREAD_COLUMNS} "
              f"validation columns) of the last LSTM layer's raw output, mean over units, best.pt in "
              f"eval mode. Near 0: every context gets the same output, the body did not learn.",
    "slopes": "slope change: LMS-PLIF's largest change of a slope from the run's start to best.pt (— no "
              "slopes; LMS-PLIF† keeps them: 0).",
    "gradient-share": "LSTM share: the LSTM layers' part of the gradient norm over the first SGD steps "
                      "of the run's model from its start (lowest–highest of the steps below).",
}


def diagnosis_markdown(diagnoses: Sequence[Diagnosis], measurements: Sequence[str], steps: int,
                       where: dict) -> str:
    header, rows = [], []
    for d in diagnoses:
        columns = {"run": run_label(d.run_dir), "head": head_label(d.head), "d": str(d.d),
                   "seed": str(d.seed), **summary_columns(d, measurements)}
        header = list(columns)
        rows.append(list(columns.values()))
    parts = ["# Diagnostics\n", aligned_table(header, rows),
             "".join(f"- {NOTES[m]}\n" for m in MEASUREMENTS if m in measurements)
             + "".join(f"- {run_label(d.run_dir)}: test ppl not shown: {d.test_ppl_note}\n"
                       for d in diagnoses if d.test_ppl_note)]
    if "gradient-share" in measurements:
        step_rows = [[run_label(d.run_dir), str(s.step), f"{s.loss:.3f}", f"{s.grad_norm:.3f}",
                      f"{s.lstm_share:.3f}", f"{s.output_std:.4f}"] for d in diagnoses for s in d.gradient]
        parts += [f"## The LSTM's share of the gradient norm, steps 0–{steps} from the start\n",
                  aligned_table(["run", "step", "loss", "gradient norm", "LSTM share", "output std"],
                                step_rows),
                  "- Plain SGD on consecutive training windows, cross-entropy only; gradient norm "
                  "before clipping; output std: the last layer's raw output on the step's batch "
                  "(training mode), std over positions, mean over units.\n"
                  + f"- Measured on {where['device']}, torch {where['torch']}. SGD at the run's lr "
                  "amplifies rounding: on another processor or torch the steps agree at first and "
                  "then follow another trajectory (the level, not the digits, is what carries over).\n"]
    return "\n".join(parts)
