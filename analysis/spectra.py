"""Singular-value curves of the test log-P matrices of several runs in one figure ([SB] SM 4.2).

Left panel: the singular values, descending, on a log scale. Right panel: the same values
normalised to [0, 1] ((s - min) / (max - min) over the whole spectrum), for the first 500
indices, with the y-axis cut at 0.2 as in [SB] SM Figures 3 and 5. The values are read from
the .npy files rank.py writes.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from experiment.run_directory import RunLock
from . import AnalysisError
from .figures import figure_file, pyplot, save
from model.heads import HEADS
from .runs import config_value, head_label, read_json, read_metrics, read_run_config
from .tables import rank_options, run_file_note

SPECTRUM_FILES = {"log P": "singular_values_test_logp.npy",
                  "f(l)": "singular_values_test_transformed.npy"}


def load_spectrum(path: Path) -> np.ndarray | None:
    """The singular values in `path`, descending, or None when the file does not exist."""
    if not path.is_file():
        return None
    try:
        values = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise AnalysisError(f"{path}: not a .npy array ({e})") from None
    if values.ndim != 1 or values.size == 0:
        raise AnalysisError(f"{path}: expected a non-empty 1-D array of singular values, "
                            f"got shape {values.shape}")
    return np.sort(values.astype(np.float64))[::-1]


def normalise(values: np.ndarray) -> np.ndarray:
    span = values.max() - values.min()
    return (values - values.min()) / span if span > 0 else np.zeros_like(values)


Curve = tuple[str, np.ndarray, bool]     # label, singular values, dashed


def legend_names(run_dirs: Sequence[Path]) -> list[str]:
    """Each run's name in the legend: its head, d and seed from config.yaml ("MoS, d = 32, seed
    1"); the run directory's name where that is not enough to tell two runs apart."""
    names = []
    for run_dir in run_dirs:
        config = read_run_config(run_dir)
        head = config_value(config, "head.name")
        if head is None:
            names.append(run_dir.name)
            continue
        parts = [head_label(head)]
        for key, shown in (("model.emsize", "d = {}"), ("train.seed", "seed {}")):
            value = config_value(config, key)
            if value is not None:
                parts.append(shown.format(value))
        names.append(", ".join(parts))
    return [name if names.count(name) == 1 else run_dir.name for name, run_dir in zip(names, run_dirs)]


def how_to_rank(run_dir: Path) -> str:
    """What gives run_dir its spectrum: rank.py for a run directory (it ranks best.pt), its last.pt
    for a run that has not validated an epoch yet (no best.pt, no metrics.jsonl); a folder of runs
    is report.py spectra's to plot (rank.py --plot takes run directories)."""
    if not (run_dir / "config.yaml").is_file() and any(run_dir.glob("*/config.yaml")):
        return (f"a folder of runs, not a run directory: give its runs ({run_dir}/RUN ...), "
                f"or plot them all with python report.py spectra {run_dir} --out FIGURE.png")
    validated = (run_dir / "best.pt").is_file() or read_metrics(run_dir)    # (results without checkpoints)
    if (run_dir / "config.yaml").is_file() and not validated:
        last = run_dir / "last.pt"
        return ("no best.pt yet: the run has not validated an epoch" +
                (f"; its last.pt can be ranked, python rank.py {last}" if last.is_file() else ""))
    return f"run python rank.py {run_dir}"


def rerank_command(run_dir: Path, record: dict) -> str:
    """rank.py's command that ranks run_dir again as its rank_test.json was ranked."""
    return f"python rank.py {run_dir}{rank_options(record.get('contexts'), record.get('dtype'))}"


def has_transformed_logits(run_dir: Path) -> bool:
    """Whether the run's head has f(l) (SS, GSS, LMS-PLIF); True when config.yaml does not say."""
    head = config_value(read_run_config(run_dir), "head.name")
    return HEADS[head].has_transformed_logits if head in HEADS else True


def rank_records(run_dirs: Sequence[Path]) -> tuple[dict[Path, dict], list[str]]:
    """Each run's rank_test.json (rank.py writes it with the spectra, and says of which weights,
    over how many contexts, in which precision), and a note per run whose spectra are not of the
    model best.pt holds now (trained on after rank.py ran, another head's files, another corpus):
    those are left out, as report.py table leaves out their rank. A run without the file passes;
    one ranked on another checkpoint by choice (rank.py RUN/last.pt) is drawn, its legend says so."""
    records, outdated = {}, []
    for run_dir in run_dirs:
        record = read_json(run_dir / "rank_test.json")
        if record is None:
            continue
        of_best_pt = Path(record.get("checkpoint", "best.pt")).name == "best.pt"
        if note := run_file_note(run_dir, "rank_test.json", record, of_best_pt):
            note = note.replace(f"python rank.py {run_dir}", rerank_command(run_dir, record))
            outdated.append(f"{run_dir}: its spectra are left out: {note}")
        else:
            records[run_dir] = record
    return records, outdated


def setting_names(records: dict[Path, dict]) -> tuple[dict[Path, str], list[str]]:
    """What the legend adds to a run's name so that unlike spectra are not read as alike: the
    checkpoint when it is not best.pt, and the corpus (its name and vocabulary, which bounds the
    rank), the precision and the number of contexts when the runs' differ (float32's rounding
    floor is not float64's, and fewer contexts give fewer values); and a note when they differ."""
    def contexts_of(record: dict) -> str:
        return f"{record['contexts']:,}" if record.get("contexts") else "?"

    def corpus_of(record: dict) -> str:
        shape = record.get("shape") or [None, None]
        return f"{record.get('dataset', '?')} (V = {shape[1]:,})" if shape[1] else str(record.get("dataset", "?"))
    corpora = list(dict.fromkeys(corpus_of(r) for r in records.values()))
    dtypes = sorted({str(r.get("dtype")) for r in records.values()})
    contexts = list(dict.fromkeys(contexts_of(r) for r in sorted(records.values(),
                                                                key=lambda r: r.get("contexts") or 0)))
    added = {}
    for run_dir, record in records.items():
        checkpoint = Path(record.get("checkpoint", "best.pt")).name
        parts = ([checkpoint] if checkpoint != "best.pt" else []) + \
                ([corpus_of(record)] if len(corpora) > 1 else []) + \
                ([str(record.get("dtype"))] if len(dtypes) > 1 else []) + \
                ([f"{contexts_of(record)} contexts"] if len(contexts) > 1 else [])
        added[run_dir] = "".join(f", {part}" for part in parts)
    unlike = ([f"corpora {', '.join(corpora)}"] if len(corpora) > 1 else []) + \
             ([f"precisions {', '.join(dtypes)}"] if len(dtypes) > 1 else []) + \
             ([f"contexts {', '.join(contexts)}"] if len(contexts) > 1 else [])
    notes = [f"the spectra are not alike ({'; '.join(unlike)}): the legend names each curve's; "
             + ("a spectrum has as many values as its corpus's vocabulary, which bounds its rank: "
                "compare runs of one corpus; " if len(corpora) > 1 else "")
             + "rank them alike (rank.py --dtype, --contexts) to compare tails"] if unlike else []
    return added, notes


def collect(run_dirs: Sequence[Path], transformed: bool) -> tuple[list[Curve], list[str]]:
    """(label, values, dashed) per curve, and a note per expected file that is missing (an f(l)
    file is expected of a ranked run whose head has transformed logits), per run whose spectra are
    older than its best.pt (left out), and on spectra of unlike settings (named in the legend)."""
    records, missing = rank_records(run_dirs)
    added, unlike = setting_names(records)
    any_with_f_l = False
    curves = []
    for run_dir, name in zip(run_dirs, legend_names(run_dirs)):
        if run_dir not in records and (run_dir / "rank_test.json").is_file():
            continue                                               # outdated: noted above
        name += added.get(run_dir, "")
        values = load_spectrum(run_dir / SPECTRUM_FILES["log P"])
        if values is None:
            missing.append(f"{run_dir}: no {SPECTRUM_FILES['log P']} ({how_to_rank(run_dir)})")
            continue
        curves.append((name, values, False))
        if not transformed:
            continue
        values = load_spectrum(run_dir / SPECTRUM_FILES["f(l)"])
        if values is not None:
            curves.append((f"{name} f(l)", values, True))             # see run_label
        elif has_transformed_logits(run_dir):
            command = rerank_command(run_dir, records.get(run_dir, {}))
            missing.append(f"{run_dir}: no {SPECTRUM_FILES['f(l)']} (run {command})")
        any_with_f_l |= values is not None or has_transformed_logits(run_dir)
    if transformed and curves and not any_with_f_l:
        with_f_l = ", ".join(head.label for head in HEADS.values() if head.has_transformed_logits)
        missing.append(f"no f(l) curve: none of these runs' heads has transformed logits (those of "
                       f"{with_f_l} have)")
    return curves, missing + unlike


def run_label(label: str) -> str:
    """The run a curve's label names (without the " f(l)" of its transformed-logit curve)."""
    suffix = " f(l)"
    return label[:-len(suffix)] if label.endswith(suffix) else label


def plot_spectra(curves: Sequence[Curve], path: Path,
                 first: int = 500, normalised_ymax: float = 0.2) -> None:
    plt = pyplot()
    # One colour per run: its log P (solid) and f(l) (dashed) curves share it.
    runs = list(dict.fromkeys(run_label(label) for label, _, _ in curves))
    palette = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for label, values, dashed in curves:
        style = dict(linestyle="--" if dashed else "-", color=palette(runs.index(run_label(label)) % palette.N),
                     label=label, linewidth=1)
        left.plot(np.arange(values.size), values, **style)
        shown = normalise(values)[:first]
        right.plot(np.arange(shown.size), shown, **style)
    left.set_yscale("log")
    left.set(xlabel="index (linear scale)", ylabel="singular value (log scale)")
    right.set(xlabel="index (linear scale)", ylabel="singular value (normalised, linear scale)",
              xlim=(0, first), ylim=(0, normalised_ymax))
    right.legend(fontsize="small")
    save(fig, path)


def write_spectra(run_dirs: Sequence[Path], path: Path | None = None, transformed: bool = False,
                  first: int = 500, normalised_ymax: float = 0.2) -> tuple[Path, list[str]]:
    """Draw the figure of the runs' saved spectra (report.py spectra, rank.py --plot) into
    `path`, by default spectra.png next to them: in the run directory, or for several runs in
    the deepest folder that holds them all. Returns the path and the notes on missing spectra
    (an error if none is found)."""
    path = None if path is None else figure_file(path, "spectra.png")
    curves, missing = collect(run_dirs, transformed)
    if not curves:
        raise AnalysisError("no singular values found: " + "; ".join(missing))
    if path is None:
        path = Path(os.path.commonpath([d.resolve() for d in run_dirs])) / "spectra.png"
    into_run = path.resolve().parent in {d.resolve() for d in run_dirs}
    with RunLock(path.parent) if into_run else contextlib.nullcontext():
        plot_spectra(curves, path, first, normalised_ymax)
    return path, missing
