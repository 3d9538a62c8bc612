"""What the runs cost (report.py cost): CPU hours per run and in all, the run's finetuning
(RUN/finetune) counted on a row of its own.

Two records, because a sitting can end without a word (a machine stopped, kill -9):
- cpu_times.jsonl, which sweep.py writes into each run directory when a command it ran there
  ends: one line per command (train.py, each sitting of a run trained over several; evaluate.py;
  rank.py) with its CPU and wall seconds. A killed sitting has no line.
- metrics.jsonl's `cpu_seconds`, which train.py writes with each epoch (the epoch's CPU time,
  training and validation, summed over the processes under torchrun), so a killed sitting keeps the cost of every epoch it finished.
  sweep.py marks the train.py lines of such sittings `"cpu_in_metrics": true`: their CPU time is
  in both records, and must be counted once.
A run's training CPU time is the larger of two counts of it: the train.py lines alone (each
sitting's whole process: start-up, loading, the last save, the part-epoch it stopped in), which
is the full count when every sitting has its line; and the epochs' `cpu_seconds` plus the lines
without the mark (the sittings of train.py versions before `cpu_seconds`), which keeps the epochs
of a killed sitting but not the sittings' time outside their epochs. Whether every sitting has its line:
every epoch's training wall time (`seconds`) was spent inside a sitting, so the lines' wall time
adds up to at least the epochs' unless a sitting is missing; then the wall hours are a lower
bound, and so is the CPU time of epochs without `cpu_seconds`, unless a line marked
`"estimated"` (saying how) stands for the missing sitting."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from experiment.run_directory import CPU_TIMES, FINETUNE_DIR
from . import AnalysisError
from .figures import prefixed
from .runs import (config_value, head_label, head_order, markdown_table, read_json, read_metrics, read_run_config,
                   write_csv)


@dataclass(frozen=True)
class Cost:
    run: str
    head: str
    emsize: int | None
    seed: int | None
    finetune: bool
    train_cpu_s: float
    other_cpu_s: float            # evaluate.py, rank.py
    wall_s: float
    sittings: int                 # train.py commands
    epochs: int                   # records in metrics.jsonl: the epochs trained over all sittings
    every_sitting: bool           # every sitting that trained an epoch has its cpu_times line
    cpu_lower_bound: bool         # epochs whose CPU time is in no record: train_cpu_s is at least
    estimated: tuple[str, ...]    # how, for each line that stands for a missing sitting
    processors: tuple[str, ...]   # the CPU models its lines ran on ("unrecorded": lines before sweep.py said)
    device: str = "unrecorded"    # where it trained (training_device): a GPU run's CPU time is its host's

    @property
    def on_gpu(self) -> bool:
        return self.device.split()[0] == "cuda"

    @property
    def cpu_s(self) -> float:
        return self.train_cpu_s + self.other_cpu_s

    @property
    def record(self) -> str:
        """How complete the figures are: "complete", "cpu lower bound", "wall lower bound" (a
        killed sitting whose epochs kept their cpu_seconds) or "sitting estimated"."""
        if self.estimated:
            return "sitting estimated"
        if self.cpu_lower_bound:
            return "cpu lower bound"
        return "complete" if self.every_sitting else "wall lower bound"

    @property
    def cpu_s_per_epoch(self) -> float | None:
        """Training CPU seconds per epoch trained (validation included): unlike the wall time of
        metrics.jsonl, hardly changed when runs share the cores (the converged Softmax: 119.6 CPU
        seconds an epoch with three runs on two cores, 1.6 times that in wall time)."""
        return self.train_cpu_s / self.epochs if self.epochs else None


def read_cpu_times(path: Path) -> list[dict]:
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise AnalysisError(f"{path}:{number}: not a JSON line") from None
    return records


def training_device(run_dir: Path, info: dict) -> str:
    """Where a run trained: run.json's device_name; for an older CPU run without one, the
    processors its cpu_times.jsonl's train.py lines name (written since before run.json named
    them), else run.json's bare device."""
    if info.get("device_name"):
        return info["device_name"]
    device = info.get("device") or "unrecorded"
    if device == "cpu" and (run_dir / CPU_TIMES).is_file():
        processors = sorted({line["processor"] for line in read_cpu_times(run_dir / CPU_TIMES)
                             if line.get("script") == "train.py" and line.get("processor")})
        if processors:
            return f"cpu ({' and '.join(processors)})"
    return device


def read_cost(run_dir: Path, name: str, finetune: bool) -> Cost | None:
    path = run_dir / CPU_TIMES
    if not path.is_file():
        return None
    records = read_cpu_times(path)
    config = read_run_config(run_dir)
    metrics = read_metrics(run_dir)
    train = [r for r in records if r["script"] == "train.py"]
    epochs_cpu = sum(m["cpu_seconds"] for m in metrics if "cpu_seconds" in m)
    unmarked_cpu = sum(r["cpu_s"] for r in train if not r.get("cpu_in_metrics"))
    train_cpu = max(sum(r["cpu_s"] for r in train), epochs_cpu + unmarked_cpu)
    every_sitting = sum(r["wall_s"] for r in train) >= sum(m.get("seconds", 0.0) for m in metrics)
    return Cost(name, config_value(config, "head.name") or "?", config_value(config, "model.emsize"),
                config_value(config, "train.seed"), finetune, train_cpu,
                sum(r["cpu_s"] for r in records if r["script"] != "train.py"),
                sum(r["wall_s"] for r in records), len(train), len(metrics), every_sitting,
                not every_sitting and any("cpu_seconds" not in m for m in metrics),
                tuple(str(r["estimated"]) for r in train if "estimated" in r),
                tuple(sorted({str(r.get("processor", "unrecorded")) for r in records})),
                training_device(run_dir, read_json(run_dir / "run.json") or {}))


def write_cost(run_dirs: Sequence[Path], out_prefix: Path) -> str:
    """PREFIX.md and PREFIX.csv; returns the Markdown."""
    costs, uncounted = [], []
    for run_dir in run_dirs:
        for path, name, finetune in ((run_dir, run_dir.name, False),
                                     (run_dir / FINETUNE_DIR, f"{run_dir.name}/{FINETUNE_DIR}", True)):
            cost = read_cost(path, name, finetune)
            if cost is not None:
                costs.append(cost)
            elif not finetune:
                uncounted.append(name)
    if not costs:
        raise AnalysisError(f"no run has a {CPU_TIMES} (sweep.py writes it for the runs it launches)")
    costs.sort(key=lambda c: (head_order(c.head), c.emsize or 0, c.seed or 0, c.finetune))
    hours = lambda seconds, at_least=False: ("≥ " if at_least else "") + f"{seconds / 3600:.2f}"   # noqa: E731
    per_epoch = lambda c: ("-" if c.cpu_s_per_epoch is None or c.cpu_lower_bound   # noqa: E731
                           else f"{c.cpu_s_per_epoch:.1f}")
    marked = lambda c: "*" if c.estimated else ""       # noqa: E731
    # A killed sitting without its line: at least one sitting more than the lines count.
    missing = lambda c: int(not c.every_sitting and not c.estimated)   # noqa: E731
    sittings = lambda n, more: f"≥ {n + more}" if more else str(n)   # noqa: E731
    # Runs trained on a GPU: their rows give the host's CPU time, which is not what they cost, so
    # the table says where each trained and the totals are the CPU runs'.
    gpu = [c for c in costs if c.on_gpu]
    header = ["Run", "Head", "d", "Seed", "Stage", "train.py sittings", "Epochs", "Train CPU s/epoch",
              "Train CPU h", "Evaluate / rank CPU h", "CPU h", "Wall h", "Processor",
              *(["Trained on"] if gpu else [])]
    lines = [[f"`{c.run}`", head_label(c.head), str(c.emsize), str(c.seed),
              "finetuning" if c.finetune else "training", sittings(c.sittings, missing(c)), str(c.epochs),
              per_epoch(c) + marked(c), hours(c.train_cpu_s, c.cpu_lower_bound) + marked(c),
              hours(c.other_cpu_s), hours(c.cpu_s, c.cpu_lower_bound) + marked(c),
              hours(c.wall_s, not c.every_sitting) + marked(c), ", ".join(c.processors),
              *([c.device] if gpu else [])]
             for c in costs]
    counted = [c for c in costs if not c.on_gpu]
    total = sum(c.cpu_s for c in counted)
    cpu_at_least = any(c.cpu_lower_bound for c in counted)
    any_marked = "*" if any(c.estimated for c in counted) else ""
    lines.append(["**all**" if not gpu else "**all on a CPU**", "", "", "", "",
                  sittings(sum(c.sittings for c in counted), sum(map(missing, counted))),
                  str(sum(c.epochs for c in counted)), "",
                  hours(sum(c.train_cpu_s for c in counted), cpu_at_least) + any_marked,
                  hours(sum(c.other_cpu_s for c in counted)), f"**{hours(total, cpu_at_least)}**{any_marked}",
                  hours(sum(c.wall_s for c in counted), not all(c.every_sitting for c in counted)) + any_marked,
                  "", *([""] if gpu else [])])
    markdown = (f"CPU time (user + system) of every command sweep.py ran in {len(costs)} run "
                f"director{'y' if len(costs) == 1 else 'ies'}, "
                f"from their {CPU_TIMES} and the epochs' cpu_seconds in metrics.jsonl: "
                f"{'at least ' if cpu_at_least else ''}{total / 3600:.2f} CPU-hours in all"
                f"{' (the runs trained on a CPU)' if gpu else ''}. Train CPU: "
                f"every train.py sitting's, its start-up included, or where a killed sitting left no "
                f"line, the epochs' own. Train CPU s/epoch: that time over the epochs in metrics.jsonl "
                f"(validation included; a sitting stopped mid-epoch adds its part-epoch), much less "
                f"changed than wall time when runs share the cores; compare it between runs of one "
                f"processor.\n\n"
                + (f"{len(gpu)} of them trained on a GPU (Trained on): their rows give the CPU time of "
                   f"the GPU's host, not their cost, and the totals leave them out; their wall hours "
                   f"are in their rows.\n\n" if gpu else "")
                + markdown_table(header, lines))
    if not all(c.every_sitting for c in costs):
        markdown += ("\n≥: a sitting of train.py ended without its line in cpu_times.jsonl (killed): "
                     "its wall time is missing, and so is its CPU time where its epochs have no "
                     "cpu_seconds; the sittings count it as one (it may have been more).\n")
    for c in costs:
        for how in c.estimated:
            markdown += f"\n*: `{c.run}`, a sitting estimated: {how}\n"
    if uncounted:   # trained by hand, or before sweep.py measured: their cost is not in the total
        markdown += (f"\nNot counted (no {CPU_TIMES}): " + ", ".join(f"`{name}`" for name in uncounted)
                     + ".\n")
    write_csv(prefixed(out_prefix, ".csv"),
              ["run", "head", "emsize", "seed", "stage", "train_sittings", "train_cpu_s", "other_cpu_s",
               "cpu_s", "wall_s", "record", "processors"],
              [[c.run, c.head, c.emsize, c.seed, "finetuning" if c.finetune else "training", c.sittings,
                round(c.train_cpu_s, 2), round(c.other_cpu_s, 2), round(c.cpu_s, 2), round(c.wall_s, 2),
                c.record, "; ".join(c.processors)] for c in costs])
    path = prefixed(out_prefix, ".md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown, encoding="utf-8")
    return markdown
