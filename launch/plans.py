"""Experiment plans: one YAML file per table or figure, run by `python sweep.py PLAN`.

A plan lists the experiments (configs, their seeds, override grids) behind one result, what runs
on each trained run (rank.py, the Press-rank robustness), and the report.py commands that turn
the runs into the table or figure:

    title: "[SB] Table 2, PTB"
    out: runs/sb_table2_ptb              # the run directories go here (sweep.py --out replaces it)
    seeds: [config, 1, 2, 3]             # `config`: the config's own seed (the authors')
    overrides: [train.epochs=60]         # key=value overrides of every experiment's configs
                                         # (before the experiment's own)
    rank: []                             # rank.py options; leave out to skip rank.py
    robustness: []                       # rank.py --robustness options; leave out to skip
                                         # (an experiment may give its own rank / robustness)
    experiments:
      - config: configs/ptb/softmax.yaml
      - config: configs/ptb/gss.yaml
        overrides: [train.asgd_trigger=nt]
        grid: {head.c: [-1, 0], head.k: [2, 3]}
        seeds: [config]                  # replaces the plan's seeds for this experiment
        evaluate: [--cache, --dynamic]   # evaluate.py on each of its runs with each option list too
      - config: configs/ptb/mos.yaml
        finetune_best:                   # once all its runs are evaluated: train.py --finetune
          overrides: [train.epochs=3]    # the one with the best validation ppl (into RUN/finetune),
          evaluate: [--cache, --dynamic] # then evaluate.py on it, plain and with each option list
    report:                              # report.py arguments; {out}: the plan's folder,
      - table --paper table2 {out} --out {out}/table2     # {runs}: the folder that holds it

Every key is checked: an unknown key, a value of the wrong type or a config that does not exist
is one line naming the plan file and the key; each report command is parsed as report.py would
parse it, and a command it would refuse is one line naming the plan file and the command.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from analysis.commands import check as check_report_arguments, config_keys_named
from analysis.pooling import flatten
from experiment.config import SECTIONS, ConfigError, load_config, parse_override, read_yaml
from . import LaunchError
from .runs import (SWEEP_KEYS, Analysis, Experiment, FinetuneBest, evaluate_analysis, options_refused,
                   rank_analysis, yaml_scalar)

CONFIG_KEYS = {*SECTIONS, "head", "base"}          # the top-level keys a config file may have
PLAN_KEYS = {"title", "out", "seeds", "overrides", "rank", "robustness", "experiments", "report"}
EXPERIMENT_KEYS = {"config", "seeds", "overrides", "grid", "rank", "robustness", "evaluate", "finetune_best"}
FINETUNE_KEYS = {"overrides", "evaluate"}


@dataclass(frozen=True)
class Plan:
    path: Path
    title: str
    out: Path
    experiments: tuple[Experiment, ...]
    reports: tuple[str, ...]                # report.py argument strings, {out} and {runs} unfilled

    def report_commands(self, out: Path | None = None) -> list[list[str]]:
        """report.py's argument lists, with the plan's folder (or `out`) filled in."""
        return [self.report_commands_of(text, out) for text in self.reports]

    def report_commands_of(self, text: str, out: Path | None = None) -> list[str]:
        out = out or self.out
        return shlex.split(text.format(out=out, runs=out.parent))


def is_plan(path: Path) -> bool:
    """A plan file is a YAML file with top-level keys, none of them a config's (data, model,
    train, run, head, base): a plan with a misspelled key (`experimnts:`) is still a plan, whose
    error names that key. Read as text, so that a broken plan is still told apart from a config
    and its error is a plan's."""
    try:
        text = path.read_text(encoding="utf-8") if path.suffix in (".yaml", ".yml") else ""
    except (OSError, UnicodeDecodeError):
        return False
    keys = set(re.findall(r"""^["']?([A-Za-z_][\w.-]*)["']?[ \t]*:(?:\s|$)""", text, re.M))
    return bool(keys) and keys.isdisjoint(CONFIG_KEYS)


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        data = read_yaml(path, "plan file")
    except ConfigError as e:
        raise LaunchError(str(e)) from None

    def fail(key: str, expected: str, value) -> LaunchError:
        return LaunchError(f"{path}: {key}: expected {expected}, got {value!r}")

    unknown = sorted(set(data) - PLAN_KEYS)
    if unknown:
        raise LaunchError(f"{path}: unknown key {unknown[0]!r} (valid: {', '.join(sorted(PLAN_KEYS))})")
    for key in ("title", "out"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise fail(key, "a string", data.get(key))
    experiments = data.get("experiments")
    if not isinstance(experiments, list) or not experiments:
        raise fail("experiments", "a non-empty list of experiments", experiments)
    reports = tuple(_strings(data.get("report", []), "report", fail))
    keys: set[str] = set()         # every config key of the plan's runs, for the reports' keys
    plan = Plan(path, data["title"], Path(data["out"]).expanduser(),
                tuple(_experiment(entry, i, data, path, fail, keys) for i, entry in enumerate(experiments)),
                reports)
    for text in reports:
        try:
            arguments = plan.report_commands_of(text)
        except (KeyError, IndexError, ValueError) as e:
            raise LaunchError(f"{path}: report command {text!r}: {_placeholder_problem(e)}") from None
        problem = check_report_arguments(arguments)
        if problem:
            raise LaunchError(f"{path}: report command {text!r}: {problem}")
        for option, key in config_keys_named(arguments):
            if key not in keys:
                raise LaunchError(f"{path}: report command {text!r}: {option} {key}: not a config key "
                                  "of any of the plan's runs (e.g. model.emsize, head.name, train.seed)")
    return plan


def _placeholder_problem(error: Exception) -> str:
    """What str.format or shlex found wrong in a report command, said for a plan's author."""
    if isinstance(error, (KeyError, IndexError)):
        return f"unknown placeholder {{{error.args[0]}}} (the placeholders are {{out}} and {{runs}})"
    if "quotation" in str(error):
        return f"{error} (a quote opened and not closed)"
    return f"{error} (a brace is written {{{{ or }}}} outside the placeholders {{out}} and {{runs}})"


def _strings(value, key: str, fail) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(key, "a list of strings", value)
    return value


def _analyses(data: dict, where: str, fail) -> tuple[Analysis, ...]:
    """rank.py (`rank`) and rank.py --robustness (`robustness`), each with its options."""
    analyses = []
    for key in ("rank", "robustness"):
        if key in data:
            try:
                analysis = rank_analysis(_strings(data[key], f"{where}{key}", fail), robustness=key == "robustness")
            except LaunchError as e:     # --robustness among rank's options: it is its own key
                raise fail(f"{where}{key}", f"rank.py's rank options ({e})", data[key]) from None
            analyses.append(_taken(analysis, f"{where}{key}", fail, data[key]))
    return tuple(analyses)


def _taken(analysis: Analysis, where: str, fail, value) -> Analysis:
    """The analysis, if its script takes its options (else the plan error, before any training)."""
    refused = options_refused(analysis)
    if refused:
        raise fail(where, f"options {analysis.script}.py takes ({analysis.script}.py: {refused})", value)
    return analysis


def _experiment(entry, index: int, plan: dict, plan_path: Path, fail, keys: set) -> Experiment:
    """One experiment, checked; adds its runs' config keys to `keys`."""
    where = f"experiments[{index}]"
    if not isinstance(entry, dict):
        raise fail(where, "a mapping with a config", entry)
    unknown = sorted(set(entry) - EXPERIMENT_KEYS)
    if unknown:
        raise fail(f"{where}.{unknown[0]}", f"one of {', '.join(sorted(EXPERIMENT_KEYS))}", unknown[0])
    config = Path(str(entry.get("config", "")))
    if not config.is_file():
        raise fail(f"{where}.config", "an existing config file", entry.get("config"))
    overrides = (tuple(_strings(plan.get("overrides", []), "overrides", fail))
                 + tuple(_strings(entry.get("overrides", []), f"{where}.overrides", fail)))
    grid = entry.get("grid", {})
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise fail(f"{where}.grid", "a mapping of keys to non-empty lists of values", grid)
    for key in grid:        # what the sweep sets itself for each run is no grid key either
        if key in SWEEP_KEYS:
            raise fail(f"{where}.grid", f"no {key} (the sweep sets it: the seeds from `seeds`, the folder "
                                        f"from `out`)", key)
    seeds = entry.get("seeds", plan.get("seeds"))
    if seeds is not None and (not isinstance(seeds, list) or not seeds or not all(
            s == "config" or (isinstance(s, int) and not isinstance(s, bool)) for s in seeds)):
        raise fail(f"{where}.seeds" if "seeds" in entry else "seeds", "a list of integers (and `config`)", seeds)
    # The overrides, and each value of the grid alone, read as the runs will read them: a wrong
    # key or value is named here, with the plan file, before anything runs.
    base = _checked_config(config, overrides, where, plan_path)
    keys.update(flatten(base.to_dict()))
    for key, values in grid.items():
        for value in values:
            point = _checked_config(config, (*overrides, f"{key}={yaml_scalar(value)}"), f"{where}.grid", plan_path)
            keys.update(flatten(point.to_dict()))
    # What the sweep sets itself (a run's seed and folder), or the grid sets, is no override.
    for owner, texts in (("overrides", plan.get("overrides", [])), (f"{where}.overrides", entry.get("overrides", []))):
        for text in texts:
            key = ".".join(parse_override(text)[0])
            if key in SWEEP_KEYS:
                raise fail(owner, f"no {key} (the sweep sets it: the seeds from `seeds`, the folder from `out`)", text)
            if key in grid:
                raise fail(owner, f"no key the grid of {where} also sets ({key}: keep one)", text)
    if seeds is not None:
        resolved = tuple(base.train.seed if s == "config" else s for s in seeds)
        if len(set(resolved)) != len(resolved):
            raise fail(f"{where}.seeds" if "seeds" in entry else "seeds",
                       "distinct seeds (`config` is the config's own seed, "
                       f"{base.train.seed} here)", seeds)
        seeds = resolved
    # An experiment's own rank / robustness options replace the plan's (both keys together).
    own = {"rank", "robustness"} & set(entry)
    analyses = _analyses(entry, f"{where}.", fail) if own else _analyses(plan, "", fail)
    if "evaluate" in entry:
        analyses = _evaluations(entry["evaluate"], f"{where}.evaluate", fail) + analyses
    finetune = _finetune_best(entry["finetune_best"], f"{where}.finetune_best", fail) \
        if "finetune_best" in entry else None
    return Experiment(config, overrides,
                      tuple((key, tuple(yaml_scalar(v) for v in values)) for key, values in grid.items()),
                      seeds, analyses, finetune)


def _checked_config(config: Path, overrides: tuple, where: str, plan_path: Path):
    try:
        return load_config(config, list(overrides))
    except ConfigError as e:
        raise LaunchError(f"{plan_path}: {where}: {e}") from None


def _finetune_best(entry, where: str, fail) -> FinetuneBest:
    if not isinstance(entry, dict):
        raise fail(where, "a mapping with overrides and evaluate", entry)
    unknown = sorted(set(entry) - FINETUNE_KEYS)
    if unknown:
        raise fail(f"{where}.{unknown[0]}", f"one of {', '.join(sorted(FINETUNE_KEYS))}", unknown[0])
    overrides = tuple(_strings(entry.get("overrides", []), f"{where}.overrides", fail))
    for text in overrides:
        if text.split("=", 1)[0].strip() in ("run.dir", "train.init_from"):
            raise fail(f"{where}.overrides", "no run.dir or train.init_from (the finetuning sets them)", text)
    return FinetuneBest(overrides, _evaluations(entry.get("evaluate", []), f"{where}.evaluate", fail))


def _evaluations(value, where: str, fail) -> tuple[Analysis, ...]:
    """evaluate.py runs beyond the plain one, one per option list; each names its method
    (--cache, --cache-search or --dynamic), whose own result file it writes (eval_best_cache.json,
    eval_best_dynamic.json): options alone would rewrite the plain evaluation's eval_best.json."""
    analyses = []
    for text in _strings(value, where, fail):
        analysis = evaluate_analysis(shlex.split(text))
        if analysis.result == "eval_best.json":
            raise fail(where, "option lists naming --cache, --cache-search or --dynamic", text)
        analyses.append(_taken(analysis, where, fail, text))
    return tuple(analyses)
