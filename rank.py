"""The log-P matrix of a trained model and its Press and epsilon-effective ranks (SPEC section 7).

    python rank.py runs/ptb-softmax-seed141                       # test set, all contexts, float32
    python rank.py runs/wt2-mos-seed1881 --contexts 33320 --json  # the first 33,320 contexts, as [SB]
    python rank.py --plot runs/a runs/b --out spectra.png         # overlay saved test spectra
                                                                  # (default: runs/spectra.png)

The model runs in eval mode over the split at batch size 1 in bptt chunks, exactly as
evaluation does; every context contributes one row of log-probabilities over the whole
vocabulary (and, for SS/GSS/PLIF, one row of transformed logits f(l)). Rows are streamed into
a running QR factorisation (spectrum/), so memory is O(V^2) whatever the number of contexts,
and the singular values are those of the exact R factor (a full SVD, never A^T A).

Writes beside the checkpoint: rank_<split>.json and singular_values_<split>_{logp,transformed}.npy.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from data import DataError
from data.batching import batchify
from experiment.checkpoint import CheckpointError, existing_checkpoint
from experiment.config import ConfigError
from experiment.evaluation import iterate_chunks
from experiment.loading import load_trained, select_device
from experiment.run_directory import RunDirectoryError, RunLock, write_atomic, write_text_atomic
from analysis import AnalysisError
from analysis.spectra import write_spectra
from spectrum import StreamingSingularValues, rank_summary

DTYPES = {"float32": torch.float32, "float64": torch.float64}


COMPUTE_OPTIONS = ("split", "contexts", "dtype", "json", "device", "data_dir")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Ranks of the log-probability matrix of a trained model.")
    parser.add_argument("paths", nargs="+", help="run directory (uses best.pt) or checkpoint; several with --plot")
    parser.add_argument("--split", choices=("test", "valid"), help="default: test")
    parser.add_argument("--contexts", type=int, help="use only the first N contexts (default: all)")
    parser.add_argument("--dtype", choices=tuple(DTYPES),
                        help="precision of the model's forward pass, the matrix and its decomposition "
                             "(default: float32)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--device", help="auto (CUDA when present; the default), cpu, mps, cuda, cuda:N")
    parser.add_argument("--data-dir", help="folder holding ptb/ and wikitext-2/ (default: $AWD_DATA_DIR)")
    parser.add_argument("--plot", action="store_true",
                        help="draw the saved test spectra of the given runs in one figure (no computation)")
    parser.add_argument("--transformed", action="store_true", help="with --plot: add the f(l) spectra")
    parser.add_argument("--out", help="with --plot: the PNG to write (default: spectra.png in the run "
                                      "directory, or in the folder holding all the runs)")
    args = parser.parse_args(argv)
    if args.plot:
        # --plot draws what earlier rank.py runs saved: a computing option would be ignored.
        given = [name for name in COMPUTE_OPTIONS if getattr(args, name) not in (None, False)]
        if given:
            parser.error(f"--{given[0].replace('_', '-')} belongs to computing ranks; --plot only "
                         f"draws the spectra earlier rank.py runs saved")
    else:
        for name in ("transformed", "out"):
            if getattr(args, name):
                parser.error(f"--{name} belongs to --plot")
        if len(args.paths) != 1:
            parser.error("give one run directory or checkpoint (several only with --plot)")
        args.split, args.dtype, args.device = args.split or "test", args.dtype or "float32", args.device or "auto"
    if args.contexts is not None and args.contexts < 1:
        parser.error(f"--contexts: expected an integer >= 1, got {args.contexts}")
    return args


def log_p_rows(model, source: torch.Tensor, bptt: int, limit: int):
    """Yield (log_probs rows, transformed-logit rows or None), (T, V) each, up to `limit` rows."""
    remaining = limit
    for out, _ in iterate_chunks(model, source, bptt):
        take = min(out.log_probs.size(0), remaining)
        transformed = out.transformed_logits
        yield out.log_probs[:take, 0], None if transformed is None else transformed[:take, 0]
        remaining -= take
        if remaining == 0:
            return


def compute_ranks(path: str, split: str, contexts: int | None, dtype: str, device: torch.device,
                  data_dir: str | None) -> dict:
    run = load_trained(path, device, data_dir)
    model = run.model.to(DTYPES[dtype])
    ids = run.corpus.test if split == "test" else run.corpus.valid
    run.corpus.check_batchable(split, 1, "batch size")
    source = batchify(ids, 1, device)
    available = source.size(0) - 1                     # contexts with a next token
    limit = min(contexts or available, available)
    vocab = run.corpus.vocab_size
    streams = {}
    with tqdm(total=limit, unit="ctx", desc=f"log-P rows ({split})", disable=None) as bar:
        for log_probs, transformed in log_p_rows(model, source, run.config.train.bptt, limit):
            for name, rows in (("logp", log_probs), ("transformed", transformed)):
                if rows is None:
                    continue
                if name not in streams:
                    streams[name] = StreamingSingularValues(vocab, dtype=dtype, device=device)
                streams[name].update(rows if device.type != "cpu" else rows.numpy())
            bar.update(log_probs.size(0))

    result = {"checkpoint": str(run.path), "head": run.config.head_name,
              "dataset": run.config.data.dataset, "split": split, "contexts": limit}
    for name, stream in streams.items():
        values = stream.singular_values()
        write_atomic(run.run_dir / f"singular_values_{split}_{name}.npy",
                     lambda f, values=values: np.save(f, values))
        summary = rank_summary(values, stream.shape, dtype)
        if name == "logp":
            result.update(summary)
        else:
            result["transformed"] = summary
    write_text_atomic(run.run_dir / f"rank_{split}.json", json.dumps(result, indent=1) + "\n")
    return result


def describe(result: dict) -> str:
    lines = [f"{result['checkpoint']}: {result['head']} on {result['dataset']} {result['split']}, "
             f"{result['contexts']:,} contexts"]
    for label, summary in (("log P", result), ("f(l)", result.get("transformed"))):
        if summary is None:
            continue
        eff = ", ".join(f"eps {eps:g}: {rank}" for eps, rank in summary["effective_rank"].items())
        lines.append(f"{label:6s} {summary['shape'][0]:,} x {summary['shape'][1]:,} ({summary['dtype']}) | "
                     f"Press rank {summary['press_rank']:,} | effective rank {eff} | "
                     f"sigma max {summary['sigma_max']:.4g}, min {summary['sigma_min']:.4g}")
    return "\n".join(lines)


def plot(paths: list[str], out: str | None, transformed: bool) -> Path:
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise AnalysisError(f"{missing[0]}: no such run directory or checkpoint")
    run_dirs = [Path(p) if Path(p).is_dir() else Path(p).parent for p in paths]
    out_path = Path(out) if out else default_plot_path(run_dirs)
    into_run = out_path.resolve().parent in {d.resolve() for d in run_dirs}
    with RunLock(out_path.parent) if into_run else contextlib.nullcontext():
        for note in write_spectra(run_dirs, out_path, transformed=transformed):
            print(f"warning: {note}", file=sys.stderr)
    return out_path


def default_plot_path(run_dirs: list[Path]) -> Path:
    """spectra.png next to the spectra it draws: in the run directory, or for several runs in
    the deepest folder that holds them all."""
    folder = Path(os.path.commonpath([d.resolve() for d in run_dirs]))
    return folder / "spectra.png"


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.plot:
            print(f"wrote {plot(args.paths, args.out, args.transformed)}")
            return 0
        device = select_device(args.device, option="--device")
        with RunLock(existing_checkpoint(args.paths[0]).parent):   # it writes rank_*.json there
            result = compute_ranks(args.paths[0], args.split, args.contexts, args.dtype, device,
                                   args.data_dir)
    except (ConfigError, CheckpointError, DataError, AnalysisError, RunDirectoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(describe(result))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
