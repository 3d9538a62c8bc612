"""The evaluation methods side by side (report.py methods): for each run that was finetuned
or evaluated with a method, validation and test perplexity plain, with the neural cache and with
dynamic evaluation, before and after finetuning (RUN/finetune).

Beside the runs, the seeds of a cell (a head at one d and stage) taken together: each head
against Softmax under each method (Welch on log test ppl, as the tables do), and each method
against plain evaluation within a cell (the same runs evaluated both ways, so a one-sample t on
each run's log ratio: the seeds' spread common to both evaluations cancels)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from experiment.run_directory import FINETUNE_DIR
from . import AnalysisError
from .figures import prefixed
from .runs import head_label, markdown_table, read_json, write_csv
from .stats import combination, welch
from .tables import read_run

METHODS = (("plain", "eval_best.json"), ("cache", "eval_best_cache.json"),
           ("dynamic", "eval_best_dynamic.json"))
SPLITS = (("val_ppl", "valid"), ("test_ppl", "test"))


def method_results(run_dir: Path) -> dict[str, dict]:
    """method -> the JSON evaluate.py wrote for it in run_dir (methods not run are left out)."""
    found = {method: read_json(run_dir / name) for method, name in METHODS}
    return {method: results for method, results in found.items() if results is not None}


def method_setting(results: dict) -> str:
    """What a method's result was computed at, as text: its settings (evaluate.py's "settings"),
    with theta and lambda said to be searched where --cache-search chose them per run on the
    validation split (runs searched alike are one method, whatever pair each found)."""
    if "settings" not in results and "test_batch_size" in results:        # plain evaluation
        return f"valid batch size {results.get('val_batch_size')}, test batch size {results['test_batch_size']}"
    settings = dict(results.get("settings", {}))
    if "search" in results:
        settings = {k: v for k, v in settings.items() if k not in ("theta", "lam")}
        settings["theta, lam"] = "searched on valid"
    return ", ".join(f"{key} {value}" for key, value in settings.items()) or "not recorded"


def write_methods(run_dirs: Sequence[Path], out_prefix: Path) -> str:
    """PREFIX.md and PREFIX.csv; returns the Markdown."""
    listed = []                          # (run, its d, [(stage, results by method)])
    for run_dir in run_dirs:
        stages = [("trained", run_dir), ("finetuned", run_dir / FINETUNE_DIR)]
        evaluated = [(stage, method_results(folder)) for stage, folder in stages if folder.is_dir()]
        if not any(set(found) - {"plain"} for _, found in evaluated) and len(evaluated) < 2:
            continue                    # neither finetuned nor evaluated with a method
        run = read_run(run_dir, group_by=["model.emsize"])
        listed.append((run, run.group[0], evaluated))
    if not listed:
        raise AnalysisError("no run was finetuned or evaluated with --cache or --dynamic")
    # Runs of several d (a d-sweep's) are told apart by it.
    several_d = len({d for _, d, _ in listed}) > 1
    rows, csv_rows = [], []
    for run, d, evaluated in listed:
        label = f"{head_label(run.head)}{f', d = {d}' if several_d else ''} (seed {run.seed})"
        for stage, found in evaluated:
            cells = [f"{found[m][split]:.2f}" if m in found else "—"
                     for split, _ in SPLITS for m, _ in METHODS]
            rows.append([label, stage, *cells])
            csv_rows.append([run.dataset, run.head, d, run.seed, stage,
                             *(found[m][split] if m in found else None for split, _ in SPLITS for m, _ in METHODS)])
    header = ["run", "weights", *(f"{name} {m}" for _, name in SPLITS for m, _ in METHODS)]
    text = ("# Plain, neural cache and dynamic evaluation\n\n" + markdown_table(header, rows)
            + "\nPerplexity of each run's best.pt (trained) and of its finetuning's (RUN/finetune): "
              "plain (eval_best.json), with the neural cache (eval_best_cache.json) and with dynamic "
              "evaluation (eval_best_dynamic.json), at the settings each file records; — not run.\n")
    text += settings_markdown(listed, several_d)
    text += cells_markdown(listed, several_d)
    prefixed(out_prefix, ".md").parent.mkdir(parents=True, exist_ok=True)
    prefixed(out_prefix, ".md").write_text(text, encoding="utf-8")
    write_csv(prefixed(out_prefix, ".csv"),
              ["dataset", "head", "emsize", "seed", "weights", *(f"{name}_{m}" for _, name in SPLITS for m, _ in METHODS)],
              csv_rows)
    return text


def settings_markdown(listed, several_d: bool) -> str:
    """The settings each method ran at: one line per method and setting, with its runs."""
    used: dict[str, dict[str, list[str]]] = {}
    for run, d, evaluated in listed:
        for stage, found in evaluated:
            for method, results in found.items():
                used.setdefault(method, {}).setdefault(method_setting(results), []).append(
                    f"{head_label(run.head)}{f', d = {d}' if several_d else ''} (seed {run.seed}), {stage}")
    lines = []
    for method, settings in used.items():
        for setting, runs in settings.items():
            which = "every run" if len(settings) == 1 else "; ".join(runs)
            lines.append(f"- {method}: {setting} ({which})")
    return "\nThe methods' settings (evaluate.py's files):\n\n" + "\n".join(lines) + "\n" if lines else ""


def cells_markdown(listed, several_d: bool) -> str:
    """The two tables of a cell's seeds together (module doc); "" where no cell has a method."""
    cells: dict[tuple, list[dict]] = {}          # (head, d, stage) -> each run's test ppl by method
    settings: dict[tuple, dict[str, set]] = {}   # the same cells -> each method's settings in it
    for run, d, evaluated in listed:
        for stage, found in evaluated:
            cells.setdefault((run.head, d, stage), []).append(
                {m: results["test_ppl"] for m, results in found.items() if "test_ppl" in results})
            for method, results in found.items():
                settings.setdefault((run.head, d, stage), {}).setdefault(method, set()).add(method_setting(results))

    def label(head, d, stage):
        return f"{head_label(head)}{f', d = {d}' if several_d else ''}, {stage}"

    # A cell's seeds are one measurement of a method only if each was evaluated at its settings,
    # and a head is compared with Softmax under a method only at the same settings.
    for cell, by_method in settings.items():
        for method, found in by_method.items():
            if len(found) > 1:
                raise AnalysisError(f"{label(*cell)}: its runs' {method} results were computed at different "
                                    f"settings ({' / '.join(sorted(found))}): evaluate them alike, or choose "
                                    f"runs with --only")
            softmax = settings.get(("softmax", *cell[1:]), {}).get(method)
            if softmax and softmax != found:
                raise AnalysisError(f"{label(*cell)} and {label('softmax', *cell[1:])}: their {method} results "
                                    f"were computed at different settings ({next(iter(found))} / "
                                    f"{next(iter(softmax))}): evaluate them alike, or choose runs with --only")

    def logs(runs, method):
        return [math.log(r[method]) for r in runs if method in r]

    def against_softmax(runs, softmax, method) -> str:
        mine, theirs = logs(runs, method), logs(softmax, method)
        return welch(mine, theirs).describe() if mine and theirs else ""

    methods = [m for m, _ in METHODS]
    against = [[label(*cell), *(against_softmax(runs, cells[("softmax", *cell[1:])], m) for m in methods)]
               for cell, runs in cells.items() if cell[0] != "softmax" and ("softmax", *cell[1:]) in cells]
    gains = []
    for cell, runs in cells.items():
        ratios = {m: [math.log(r[m] / r["plain"]) for r in runs if m in r and "plain" in r] for m in methods[1:]}
        if any(ratios.values()):
            gains.append([label(*cell), *(combination([ratios[m]], [1.0]).describe() if ratios[m] else ""
                                          for m in methods[1:])])
    text = ""
    if any(any(line[1:]) for line in against):
        text += ("\nEach head against Softmax at the same d and weights, under each evaluation: its "
                 "test ppl's change in percent with the 95% interval and p of Welch's t-test on log "
                 "ppl over the cells' seeds; no interval where a cell has one run:\n\n"
                 + markdown_table(["cell", *methods], against))
    if gains:
        text += ("\nEach method against plain evaluation, per cell: the change of test ppl in percent, "
                 "the mean over the cell's runs of each run's log ratio with its one-sample t interval "
                 "and p (the same runs both ways); no interval where a cell has one run:\n\n"
                 + markdown_table(["cell", *methods[1:]], gains))
    return text
