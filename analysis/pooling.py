"""Which runs a report may pool as seeds of one configuration.

A report averages runs only when they are seeds of one configuration: every key of their resolved
configs equal but those listed in NOT_COMPARED. A run's config.yaml is resolved as train.py
resolves one, each key it lacks (a run trained before the key existed) taking the key's default,
so that a key added since does not set an older run apart. Runs that differ in a compared key are
not seeds of one configuration: a table gives them separate rows, labelled by the keys they differ
in (group_rows in tables.py), and a report that cannot split them refuses in one line naming
those keys (`refuse_unlike`).
"""
from __future__ import annotations

import dataclasses
import math

from experiment.config import SECTIONS
from experiment.run_directory import trained_corpus
from model.heads import HEADS
from . import AnalysisError
from .runs import read_run_config

# The keys that may differ between runs pooled together, and why none of them changes what a run
# computes beyond floating-point rounding. Every other key is compared: those that change the
# result in distribution (train.small_batch_size redraws the embedding and DropConnect masks per
# chunk), those that change what is reported (train.eval_batch_size, train.test_batch_size),
# run.max_steps (ends training early) and run.tf32 (lower-precision arithmetic on GPUs: kept
# apart until shown not to matter).
NOT_COMPARED = {
    "train.seed": "the seed: what the runs of one configuration differ in",
    "run.dir": "where the run's files are written",
    "data.data_dir": "where the corpus is read from: each split is checked against its published "
                     "SHA-256; a modified corpus's text is compared by its hashes (data.trained_text), "
                     "and by its folder for runs trained before run.json kept them",
    "run.device": "the device asked for: the same arithmetic up to rounding (run.tf32 is "
                  "compared), so a cell may hold CPU and GPU seeds",
    "run.deterministic": "which GPU kernels compute the same operations: repeats bit for bit, "
                         "not other results",
    "run.ddp_reduce": "the order in which processes sum their gradients: the same sum up to rounding",
    "run.checkpoint_every_steps": "how often last.pt is also written: a resumed run is the same run",
    "run.log_interval": "how often progress is printed",
    "run.tensorboard": "whether TensorBoard logs are written",
    "head.compile": "torch.compile's fused kernels or eager ones for the same operations",
}


def flatten(config: dict, prefix: str = "") -> dict:
    """{"model": {"emsize": 32}} -> {"model.emsize": 32}."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def defaults(cls, prefix: str) -> dict:
    return {f"{prefix}.{f.name}": f.default for f in dataclasses.fields(cls)
            if f.init and f.default is not dataclasses.MISSING}


def resolved(config: dict) -> dict:
    """A run's config.yaml as dotted keys, each key it lacks at its default (train.py's)."""
    flat = flatten(config)
    for section, cls in SECTIONS.items():
        for key, value in defaults(cls, section).items():
            flat.setdefault(key, value)
    head = HEADS.get(flat.get("head.name"))
    if head is not None:
        for key, value in defaults(head.Options, "head").items():
            flat.setdefault(key, value)
    return flat


TRAINED_TEXT = "data.trained_text"


def run_setting(run_dir, config: dict | None = None) -> dict:
    """A run's config.yaml (`config`, read when not given) resolved, with the text it trained on
    where that is a modified corpus (TRAINED_TEXT, from run.json): two runs on different text of
    the same words are not seeds of one configuration, whatever their folders' names."""
    setting = resolved(read_run_config(run_dir) if config is None else config)
    corpus = trained_corpus(run_dir) or {}
    hashes = corpus.get("sha256") or {}
    if corpus.get("published") is False and hashes:
        setting[TRAINED_TEXT] = ", ".join(f"{split}.txt {hashes.get(split, '?')[:12]}" for split in ("train", "valid"))
    return setting


def compared(config: dict) -> dict:
    """The keys of a resolved config that runs pooled together must agree on, values made
    comparable (numbers as floats: lr 20 and 20.0 are one value)."""
    ignored = set(NOT_COMPARED)
    if config.get("data.allow_modified_corpus") and TRAINED_TEXT not in config:
        ignored.discard("data.data_dir")      # a run trained before run.json kept the hashes
    return {key: comparable(value) for key, value in config.items() if key not in ignored}


def comparable(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else repr(float(value))
    if isinstance(value, list):
        return tuple(comparable(v) for v in value)
    return value


def differing_keys(settings: list[dict]) -> list[str]:
    """The keys (in config order) on which these compared settings do not all agree; a key one
    of them lacks counts as differing."""
    keys = list(dict.fromkeys(key for setting in settings for key in setting))
    missing = object()
    return [key for key in keys if len({repr(s.get(key, missing)) for s in settings}) > 1]


def describe_values(settings: list[dict], keys: list[str]) -> str:
    """ "train.epochs (6, 70), train.plateau_gain (None, 0.01)": each key's values, once each."""
    def shown(value) -> str:          # compared() made numbers floats: 16, not 16.0
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return ", ".join(f"{key} ({', '.join(dict.fromkeys(shown(s.get(key)) for s in settings))})" for key in keys)


def refuse_unlike(what: str, settings: list[dict]) -> None:
    """One line naming the keys in which runs meant to be pooled differ; nothing if none."""
    keys = differing_keys(settings)
    if keys:
        raise AnalysisError(f"{what}: the runs are not seeds of one configuration, they differ in "
                            f"{describe_values(settings, keys)}; choose one with --only KEY=VALUE")


def refuse_repeated_runs(run_dirs) -> None:
    """One line if two of the run directories are one configuration trained with one seed (a copy
    of a run, or the same seed trained again): a report would count that seed twice, and an
    interval over its cell would be narrower than the runs give. Runs without config.yaml pass."""
    seen: dict[tuple, object] = {}
    for run_dir in run_dirs:
        config = read_run_config(run_dir)
        if not config:
            continue
        setting = run_setting(run_dir, config)
        key = (repr(sorted(compared(setting).items())), repr(setting.get("train.seed")))
        if key in seen:
            raise AnalysisError(f"{seen[key]} and {run_dir} are one configuration with one seed "
                                f"({setting.get('train.seed')}): a copy, or the seed trained twice; a "
                                f"report counts each seed once: give one of them")
        seen[key] = run_dir
