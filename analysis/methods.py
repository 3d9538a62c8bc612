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
from .runs import config_value, head_label, markdown_table, read_json, read_run_config, write_csv
from .stats import combination, welch
from .pooling import compared, refuse_unlike
from .tables import read_run, run_file_note

METHODS = (("plain", "eval_best.json"), ("cache", "eval_best_cache.json"),
           ("dynamic", "eval_best_dynamic.json"))
SPLITS = (("val_ppl", "valid"), ("test_ppl", "test"))


def method_results(run_dir: Path, left_out: list[str] | None = None) -> dict[str, dict]:
    """method -> the JSON evaluate.py wrote for it in run_dir (methods not run are left out, and
    so is a file not of the weights best.pt holds now, as report.py table leaves it out: its note
    goes to `left_out`)."""
    found = {}
    for method, name in METHODS:
        results = read_json(run_dir / name)
        if results is None:
            continue
        if note := run_file_note(run_dir, name, results):
            if left_out is not None:
                left_out.append(f"`{run_dir}`: {note}")
            continue
        found[method] = results
    return found


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
    left_out, plain_only = [], []
    for run_dir in run_dirs:
        stages = [("trained", run_dir), ("finetuned", run_dir / FINETUNE_DIR)]
        evaluated = [(stage, found) for stage, folder in stages if folder.is_dir()
                     for found in [method_results(folder, left_out)] if found]
        if not any(set(found) - {"plain"} for _, found in evaluated) and len(evaluated) < 2:
            plain_only.append(run_dir)   # neither finetuned nor evaluated with a method
            continue
        run = read_run(run_dir, group_by=["model.emsize"])
        listed.append((run, run.group[0], evaluated))
    if not listed:
        raise AnalysisError("no run was finetuned or evaluated with --cache or --dynamic"
                            + (": " + "; ".join(left_out) if left_out else ""))
    refuse_unlike_cells(listed)
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
    text += omitted_seeds_markdown(listed, plain_only, several_d)
    if left_out:
        text += ("\nLeft out (not of the weights best.pt holds now, or of another head, corpus or test "
                 "batch size):\n\n" + "".join(f"- {note}\n" for note in left_out))
    prefixed(out_prefix, ".md").parent.mkdir(parents=True, exist_ok=True)
    prefixed(out_prefix, ".md").write_text(text, encoding="utf-8")
    write_csv(prefixed(out_prefix, ".csv"),
              ["dataset", "head", "emsize", "seed", "weights", *(f"{name}_{m}" for _, name in SPLITS for m, _ in METHODS)],
              csv_rows)
    return text


def omitted_seeds_markdown(listed, plain_only: Sequence[Path], several_d: bool) -> str:
    """A cell holds only the runs listed (finetuned or evaluated with a method): the line that
    says which of its seeds, evaluated plainly only, it leaves out, where a reader would read its
    n against report.py table's, which pools them all; "" when none."""
    cells = {(run.head, d) for run, d, _ in listed}
    omitted: dict[tuple, int] = {}
    for run_dir in plain_only:
        config = read_run_config(run_dir)
        key = (config_value(config, "head.name"), config_value(config, "model.emsize"))
        if key in cells:
            omitted[key] = omitted.get(key, 0) + 1
    if not omitted:
        return ""
    named = ", ".join(f"{head_label(head)}{f' at d = {d}' if several_d else ''} {count}"
                      for (head, d), count in omitted.items())
    return (f"\nA cell holds only its runs above. Seeds of these cells evaluated plainly only, neither "
            f"finetuned nor with a method, are not in them ({named}); report.py table pools every seed.\n")


def refuse_unlike_cells(listed) -> None:
    """A cell (a head at one d) pools its runs as seeds, and sets them against Softmax's at the
    same d: its runs must be seeds of one configuration, and Softmax's of the same one but for
    the head (pooling.py); a run of another corpus or learning rate is refused in one line."""
    by_cell: dict[tuple, list] = {}
    for run, d, _ in listed:
        by_cell.setdefault((run.head, d), []).append(compared(run.config))
    for (head, d), settings in by_cell.items():
        refuse_unlike(f"{head_label(head)} at d = {d}", settings)
        softmax = by_cell.get(("softmax", d))
        if head != "softmax" and softmax:
            def body(setting):
                return {k: v for k, v in setting.items() if not k.startswith("head.")}
            refuse_unlike(f"{head_label(head)} and Softmax at d = {d}", [body(settings[0]), body(softmax[0])])


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
