"""Finding run directories and reading the files train.py, evaluate.py and rank.py leave in them."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterable, Sequence

from model.heads import HEADS
from . import AnalysisError

DATASET_ORDER = ("ptb", "wikitext-2")


def head_label(head: str) -> str:
    """The head's name in tables and figures (its class's label, e.g. "LMS-PLIF†")."""
    return HEADS[head].label if head in HEADS else head


def head_order(head: str) -> tuple:
    """Registry order (that of [SB]'s tables); heads no longer registered follow alphabetically."""
    names = list(HEADS)
    return (names.index(head), "") if head in names else (len(names), head)


def dataset_order(dataset: str) -> tuple:
    return (DATASET_ORDER.index(dataset), "") if dataset in DATASET_ORDER else (len(DATASET_ORDER), dataset)


def is_run_dir(path: Path) -> bool:
    # run.json and config.yaml are the first files train.py writes into a run directory.
    return (path / "run.json").is_file() or (path / "config.yaml").is_file()


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Each path is a run directory or a folder searched recursively for run directories.

    The search does not enter a run directory: a run finetuned into RUN/finetune is another
    experiment, read only when given itself.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise AnalysisError(f"{path}: no such run directory")
        below = search(path)
        if not below:
            raise AnalysisError(f"{path}: not a run directory and holds none (no run.json or config.yaml)")
        found.extend(below)
    return list(dict.fromkeys(found))   # de-duplicated, order kept


def search(folder: Path) -> list[Path]:
    if is_run_dir(folder):
        return [folder]
    return [run for sub in sorted(p for p in folder.iterdir() if p.is_dir()) for run in search(sub)]


def read_json(path: Path) -> dict | None:
    """The JSON object in `path`, or None when the file does not exist."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise AnalysisError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def read_metrics(run_dir: Path) -> list[dict]:
    """The per-epoch records of metrics.jsonl (empty when the file does not exist)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise AnalysisError(f"{path}:{number}: not a JSON line") from None
    return records


def config_value(config: dict, key: str):
    """The value of a dotted key (model.emsize) in a config dict; None when it has none."""
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def read_run_config(run_dir: Path) -> dict:
    """The run's config.yaml as train.py saved it ({} when it has none)."""
    import yaml
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise AnalysisError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise AnalysisError(f"{path}: expected a mapping of config sections, got {type(config).__name__}")
    return config


def value_matches(value, texts: set[str]) -> bool:
    """Whether a config value (None: the key is absent) is one of `texts`: as text, or as numbers
    where both are numbers (train.lr=20 matches 20.0, model.emsize=32.0 matches 32)."""
    return value is not None and (str(value) in texts or any(same_number(value, text) for text in texts))


def same_number(value, text: str) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return float(text) == float(value)
    except ValueError:
        return False


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def require_best_pt(run_dir: Path, readers: str) -> None:
    """One line when run_dir has no best.pt for `readers` (e.g. "report.py top5"), which read a
    run directory's best.pt only: a run before its first validation is told apart from a run
    whose checkpoints are elsewhere (committed results hold none)."""
    if (run_dir / "best.pt").is_file():
        return
    why = ("the run has no validated model yet (a last.pt, no best.pt: train.py writes it when the "
           "run first validates)" if (run_dir / "last.pt").is_file()
           else "no best.pt here (the run has none, or its checkpoints are elsewhere)")
    raise AnalysisError(f"{run_dir}: {why}; {readers} read{'s' if ' and ' not in readers else ''} it")


def heads_named(heads: Sequence[str]) -> str:
    """ "Softmax 3, SS 4": how many runs of each head, in registry order (an error's few words
    where a list of every run would be a line too long to read)."""
    counts: dict[str, int] = {}
    for head in sorted(heads, key=head_order):
        counts[head] = counts.get(head, 0) + 1
    return ", ".join(f"{head_label(head)} {count}" for head, count in counts.items())
