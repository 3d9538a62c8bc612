"""What the runs cost (report.py cost): CPU hours per run and in all, from the cpu_times.jsonl that
sweep.py writes into each run directory (one line per command it ran there: train.py, each
sitting of a run trained over several; evaluate.py; rank.py), the run's finetuning (RUN/finetune)
counted on a row of its own."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from experiment.run_directory import CPU_TIMES, FINETUNE_DIR
from . import AnalysisError
from .figures import prefixed
from .runs import config_value, head_label, head_order, markdown_table, read_metrics, read_run_config, write_csv


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

    @property
    def cpu_s(self) -> float:
        return self.train_cpu_s + self.other_cpu_s

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


def read_cost(run_dir: Path, name: str, finetune: bool) -> Cost | None:
    path = run_dir / CPU_TIMES
    if not path.is_file():
        return None
    records = read_cpu_times(path)
    config = read_run_config(run_dir)
    train = [r for r in records if r["script"] == "train.py"]
    return Cost(name, config_value(config, "head.name") or "?", config_value(config, "model.emsize"),
                config_value(config, "train.seed"), finetune, sum(r["cpu_s"] for r in train),
                sum(r["cpu_s"] for r in records if r["script"] != "train.py"),
                sum(r["wall_s"] for r in records), len(train), len(read_metrics(run_dir)))


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
    hours = lambda seconds: f"{seconds / 3600:.2f}"       # noqa: E731
    per_epoch = lambda c: "-" if c.cpu_s_per_epoch is None else f"{c.cpu_s_per_epoch:.1f}"   # noqa: E731
    header = ["Run", "Head", "d", "Seed", "Stage", "train.py sittings", "Epochs", "Train CPU s/epoch",
              "Train CPU h", "Evaluate / rank CPU h", "CPU h", "Wall h"]
    lines = [[f"`{c.run}`", head_label(c.head), str(c.emsize), str(c.seed),
              "finetuning" if c.finetune else "training", str(c.sittings), str(c.epochs), per_epoch(c),
              hours(c.train_cpu_s), hours(c.other_cpu_s), hours(c.cpu_s), hours(c.wall_s)]
             for c in costs]
    total = sum(c.cpu_s for c in costs)
    lines.append(["**all**", "", "", "", "", str(sum(c.sittings for c in costs)),
                  str(sum(c.epochs for c in costs)), "",
                  hours(sum(c.train_cpu_s for c in costs)), hours(sum(c.other_cpu_s for c in costs)),
                  f"**{hours(total)}**", hours(sum(c.wall_s for c in costs))])
    markdown = (f"CPU time (user + system) of every command sweep.py ran in {len(costs)} run directories, "
                f"from their {CPU_TIMES}: {total / 3600:.2f} CPU-hours in all. Train CPU s/epoch: the "
                f"training CPU time over the epochs in metrics.jsonl (validation included; a sitting "
                f"stopped mid-epoch adds its part-epoch until the run ends), much less changed than "
                f"wall time when runs share the cores.\n\n"
                + markdown_table(header, lines))
    if uncounted:   # trained by hand, or before sweep.py measured: their cost is not in the total
        markdown += (f"\nNot counted (no {CPU_TIMES}): " + ", ".join(f"`{name}`" for name in uncounted)
                     + ".\n")
    write_csv(prefixed(out_prefix, ".csv"),
              ["run", "head", "emsize", "seed", "stage", "train_sittings", "train_cpu_s", "other_cpu_s",
               "cpu_s", "wall_s"],
              [[c.run, c.head, c.emsize, c.seed, "finetuning" if c.finetune else "training", c.sittings,
                round(c.train_cpu_s, 2), round(c.other_cpu_s, 2), round(c.cpu_s, 2), round(c.wall_s, 2)]
               for c in costs])
    path = prefixed(out_prefix, ".md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown, encoding="utf-8")
    return markdown
