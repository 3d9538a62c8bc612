"""The log-P matrix of a trained model and its Press and epsilon-effective ranks (docs/reference.md section 7).

    python rank.py runs/ptb-softmax-seed141                       # test set, all contexts, float32
    python rank.py runs/wikitext-2-mos-seed1881 --contexts 33320 --json  # the first 33,320 contexts, as [SB]
    python rank.py --plot runs/a runs/b --out spectra.png         # overlay saved test spectra
                                                                  # (default: runs/spectra.png)
    python rank.py runs/ptb-mos-seed28 --robustness               # [SB] SM Tables 14-16 (below)

The model runs in eval mode over the split at batch size 1 in bptt chunks, exactly as
evaluation does; every context contributes one row of log-probabilities over the whole
vocabulary (and, for SS/GSS/PLIF, one row of transformed logits f(l)). Rows are streamed into
a running QR factorisation (spectrum/), so memory is O(V^2) whatever the number of contexts,
and the singular values are those of the exact R factor (a full SVD, never A^T A).

Writes beside the checkpoint: rank_<split>.json and singular_values_<split>_{logp,transformed}.npy.

--robustness runs [SB] SM section 5's Algorithms 1 and 2 (spectrum/robustness.py) instead: they
need U and V, so the log-P rows of the first --contexts contexts (default 10,000, as [SB]) are
stacked into one dense matrix, decomposed in float64 unless --dtype says otherwise (the SM's
errors of 1e-28 are float64 rounding), and the result is written to robustness_<split>.json
(`report.py robustness` turns it into SM Tables 14-16). In float64 the same contexts' Press rank
in float32 is measured too: [SB]'s Press ranks are float32's, and the SM's 8,933 for its matrix
is set beside both.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

from experiment.cli import ArgumentParser, add_corpus_arguments, run_script, seed_argument, quiet_interrupt_while_starting

if __name__ == "__main__":        # (not when a test imports the script)
    quiet_interrupt_while_starting()   # before torch's import, which takes seconds: a Ctrl-C there is one line

import numpy as np
import torch
from tqdm import tqdm

from data import DataError
from data.batching import batchify
from experiment.checkpoint import CheckpointError, existing_checkpoint
from experiment.config import ConfigError
from evaluation.loop import iterate_chunks
from experiment.loading import describe_weights, load_trained, select_device
from experiment.run_directory import RunDirectoryError, analysis_lock, error_exit_code, write_atomic, write_text_atomic
from analysis import AnalysisError
from spectrum import StreamingSingularValues, rank_summary
from spectrum.streaming import CUSOLVER_GESVD_MAX_N, NonFiniteMatrix, torch_backend_bytes
from spectrum.robustness import NOISE_SCALES, matrix_ranks, press_rank_robustness

DTYPES = {"float32": torch.float32, "float64": torch.float64}
ROBUSTNESS_CONTEXTS = 10_000           # [SB] SM 5.1: "the top 10,000 contexts"


COMPUTE_OPTIONS = ("split", "contexts", "dtype", "json", "device", "data_dir", "allow_modified_corpus",
                   "max_memory")
# Share of a GPU's free memory (after the model is loaded) the decomposition may use by default:
# the rest is for the model's forward passes and the allocator's fragmentation.
FREE_MEMORY_SHARE = 0.8


def noise_scale(text: str) -> float:
    """An argparse type: Algorithm 2's c, a finite float64 > 0; the text as given in the error
    (1e-400 reads as 0.0, and "got 0.0" hid why)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        underflow = " (below float64's smallest, it reads as 0)" if value == 0 and any(
            digit in "123456789" for digit in text.lower().partition("e")[0]) else ""
        raise argparse.ArgumentTypeError(f"expected a finite value > 0, got {text!r}{underflow}")
    return value


def parse_args(argv=None):
    parser = ArgumentParser(prog="rank.py",
                            description="Ranks of the log-probability matrix of a trained model.")
    parser.add_argument("paths", nargs="+", help="run directory (uses best.pt) or checkpoint; several with --plot")
    parser.add_argument("--split", choices=("test", "valid"), help="default: test")
    parser.add_argument("--contexts", type=int, help="use only the first N contexts (default: all)")
    parser.add_argument("--dtype", choices=tuple(DTYPES),
                        help="precision of the model's forward pass, the matrix and its decomposition "
                             "(default float32, as [SB]; float64 with --robustness)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--device", help="auto (CUDA when present; the default), cpu, mps, cuda, cuda:N")
    add_corpus_arguments(parser, "the run's data.data_dir, else $AWD_DATA_DIR, else the "
                                 "repository's corpora/")
    parser.add_argument("--max-memory", type=float, metavar="GIB",
                        help="GPU memory the decomposition may use, in GiB (default: 80%% of the "
                             "free memory); what does not fit runs on the CPU (a GPU only: refused "
                             "on the CPU)")
    parser.add_argument("--plot", action="store_true",
                        help="draw the saved test spectra of the given runs in one figure (no computation)")
    parser.add_argument("--transformed", action="store_true", help="with --plot: add the f(l) spectra")
    parser.add_argument("--out", help="with --plot: the figure to write, .png, .pdf or .svg, or a folder "
                                      "(default: spectra.png in the run directory, or in the folder "
                                      "holding all the runs)")
    robust = parser.add_argument_group(
        "robustness of the Press rank ([SB] SM section 5, Tables 14-16)",
        "Algorithm 1: keep the top --keep singular values of the dense log-P matrix and rebuild it "
        "from its own SVD --iterations times; Algorithm 2: add N(0, c/n^2) noise to the kept "
        "singular values for each c of --noise-scales. Writes robustness_<split>.json.")
    robust.add_argument("--robustness", action="store_true",
                        help=f"run both algorithms (on the first {ROBUSTNESS_CONTEXTS:,} contexts "
                             "unless --contexts is given)")
    robust.add_argument("--keep", type=int, default=10, help="singular values kept (default 10)")
    robust.add_argument("--iterations", type=int, default=10, help="Algorithm 1 repetitions (default 10)")
    robust.add_argument("--noise-scales", type=noise_scale, nargs="+", default=list(NOISE_SCALES), metavar="C",
                        help="Algorithm 2's c values (default: SM Table 15's, 1e-2 ... 1e-32)")
    robust.add_argument("--seed", type=seed_argument, default=0, help="seed of Algorithm 2's noise (default 0)")
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
        args.split, args.device = args.split or "test", args.device or "auto"
    if args.contexts is not None and args.contexts < 1:
        parser.error(f"--contexts: expected an integer >= 1, got {args.contexts}")
    if args.max_memory is not None and not (math.isfinite(args.max_memory) and args.max_memory > 0):
        parser.error(f"--max-memory: expected a number of GiB > 0, got {args.max_memory}")
    if args.robustness and args.plot:
        parser.error("--robustness and --plot do different things: give one")
    if not args.robustness:
        for name in ("keep", "iterations", "noise_scales", "seed"):
            if getattr(args, name) != parser.get_default(name):
                parser.error(f"--{name.replace('_', '-')} is an option of --robustness")
    for name in ("keep", "iterations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected an integer >= 1, got {getattr(args, name)}")
    if args.dtype is None:
        args.dtype = "float64" if args.robustness else "float32"
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


def open_split(path: str, split: str, contexts: int | None, dtype: str, device: torch.device,
               data_dir: str | None, allow_modified_corpus: bool = False):
    """(the trained run, its model in `dtype`, the split at batch size 1, the number of contexts)."""
    run = load_trained(path, device, data_dir, allow_modified_corpus=allow_modified_corpus)
    model = run.model.to(DTYPES[dtype])
    ids = run.corpus.test if split == "test" else run.corpus.valid
    run.corpus.check_batchable(split, 1, "batch size")
    source = batchify(ids, 1, device)
    available = source.size(0) - 1                     # contexts with a next token
    if contexts is not None and contexts > available:
        print(f"note: {contexts:,} contexts asked, the {split} split has {available:,}; all are used",
              file=sys.stderr)
    return run, model, source, min(contexts or available, available)


def describe_run(run, split: str, limit: int) -> dict:
    return {"checkpoint": str(run.path), "head": run.config.head_name,
            "dataset": run.config.data.dataset, "split": split, "contexts": limit, **run.weights(),
            "corpus": run.corpus.record()}


def decomposition_budget(device: torch.device, max_memory_gib: float | None) -> int | None:
    """Bytes of `device` memory the decompositions may use: --max-memory, or on a GPU a share of
    its free memory; None (no bound) on the CPU."""
    if max_memory_gib is not None:
        return int(max_memory_gib * 2**30)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(FREE_MEMORY_SHARE * free)


def open_streams(names: list[str], vocab: int, dtype: str, device: torch.device,
                 budget: int | None) -> dict[str, StreamingSingularValues]:
    """A stream per name, sharing `budget`: each takes what its torch backend needs from what
    the ones before left, and one that no longer fits runs the LAPACK backend on the CPU."""
    streams = {}
    for name in names:
        stream = StreamingSingularValues(vocab, dtype=dtype, device=device, max_memory=budget)
        if budget is not None and stream.backend == "torch":
            budget -= torch_backend_bytes(vocab, stream.block_rows, np.dtype(stream.dtype).itemsize)
        streams[name] = stream
    return streams


def cpu_svd_note(name: str, stream: StreamingSingularValues) -> str | None:
    """Why a stream decomposed on the GPU takes its final SVD on the CPU (minutes at
    WikiText-2's size), or None when it does not."""
    if stream.device.type != "cuda" or stream.final_svd_device().type != "cpu":
        return None
    n = stream.n_cols
    reason = (f"past the {CUSOLVER_GESVD_MAX_N:,} x {CUSOLVER_GESVD_MAX_N:,} cuSOLVER's gesvd takes"
              if n > CUSOLVER_GESVD_MAX_N else "R, its copy and the workspace exceed the memory budget")
    return f"the final SVD of the {n:,} x {n:,} R ({name}) runs on the CPU's LAPACK: {reason}; it can take many minutes"


@contextlib.contextmanager
def non_finite_refused(run, name: str, split: str):
    """A NaN or inf entry of the matrix (a diverged model; the streams check each block, some
    only when they decompose it): one line, and no rank written of it."""
    try:
        yield
    except NonFiniteMatrix as e:
        raise AnalysisError(f"{run.path}: the {name} matrix of the {split} split: {e}; nothing written") from None


def compute_ranks(path: str, split: str, contexts: int | None, dtype: str, device: torch.device,
                  data_dir: str | None, max_memory_gib: float | None = None,
                  allow_modified_corpus: bool = False) -> dict:
    run, model, source, limit = open_split(path, split, contexts, dtype, device, data_dir,
                                           allow_modified_corpus)
    vocab = run.corpus.vocab_size
    streams = None
    with tqdm(total=limit, unit="ctx", desc=f"log-P rows ({split})", disable=None) as bar:
        for log_probs, transformed in log_p_rows(model, source, run.config.train.bptt, limit):
            blocks = {"logp": log_probs, "transformed": transformed}
            if streams is None:
                names = [name for name, rows in blocks.items() if rows is not None]
                streams = open_streams(names, vocab, dtype, device, decomposition_budget(device, max_memory_gib))
            for name, stream in streams.items():
                with non_finite_refused(run, name, split):
                    stream.update(blocks[name])
            bar.update(log_probs.size(0))

    result = describe_run(run, split, limit)
    for name, stream in streams.items():
        if note := cpu_svd_note(name, stream):
            print(f"note: {note}", file=sys.stderr)
        with non_finite_refused(run, name, split):
            values = stream.singular_values()        # one at a time: each frees its R
        write_atomic(run.run_dir / f"singular_values_{split}_{name}.npy",
                     lambda f, values=values: np.save(f, values))
        summary = rank_summary(values, stream.shape, dtype)
        if name == "logp":
            result.update(summary)
        else:
            result["transformed"] = summary
    write_text_atomic(run.run_dir / f"rank_{split}.json", json.dumps(result, indent=1, allow_nan=False) + "\n")
    return result


def compute_robustness(path: str, split: str, contexts: int | None, dtype: str, device: torch.device,
                       data_dir: str | None, keep: int, iterations: int, scales, seed: int,
                       allow_modified_corpus: bool = False) -> dict:
    """[SB] SM section 5 on the dense log-P matrix of the first `contexts` contexts."""
    run, model, source, limit = open_split(path, split, contexts or ROBUSTNESS_CONTEXTS, dtype,
                                           device, data_dir, allow_modified_corpus)
    matrix = dense_log_p(model, source, run.config.train.bptt, limit, split)
    result = describe_run(run, split, limit)
    try:
        result.update(press_rank_robustness(matrix, keep, iterations, scales, seed))
    except ValueError as e:
        raise AnalysisError(f"{run.path}: {e}") from None
    if DTYPES[dtype] != torch.float32:
        # [SB] counts Press ranks with float32's epsilon: the same contexts from a float32 model
        # pass (the checkpoint's own weights, which the float64 copy holds exactly)
        del matrix
        matrix = dense_log_p(model.to(torch.float32), source, run.config.train.bptt, limit, split)
        result["original_float32"] = matrix_ranks(matrix)
    write_text_atomic(run.run_dir / f"robustness_{split}.json", json.dumps(result, indent=1, allow_nan=False) + "\n")
    return result


def dense_log_p(model, source: torch.Tensor, bptt: int, limit: int, split: str) -> torch.Tensor:
    """The log-P rows of the first `limit` contexts as one dense (limit, V) matrix."""
    rows = []
    with tqdm(total=limit, unit="ctx", desc=f"log-P rows ({split})", disable=None) as bar:
        for log_probs, _ in log_p_rows(model, source, bptt, limit):
            rows.append(log_probs)
            bar.update(log_probs.size(0))
    return torch.cat(rows)


def describe_robustness(result: dict) -> str:
    original = result["original"]
    lines = [f"{result['checkpoint']}: {result['head']} on {result['dataset']} {result['split']}, "
             f"{describe_weights(result)}; {result['contexts']:,} contexts, {original['dtype']}: Press rank {original['press_rank']:,}"
             + (f" (float32: {result['original_float32']['press_rank']:,})" if "original_float32" in result else "")
             + f"; top {result['keep']} singular values kept"]
    for record in result["reconstruction"]:
        lines.append(f"  Algorithm 1, iteration {record['iteration']:2d}: Press rank {record['press_rank']:,}, "
                     f"mean squared error {record['error']:.3g}")
    for record in result["noise"]:
        eff = " / ".join(str(rank) for rank in record["effective_rank"].values())
        lines.append(f"  Algorithm 2, c = {record['c']:.0e}: Press rank {record['press_rank']:,}, "
                     f"effective ranks {eff}")
    return "\n".join(lines)


def describe(result: dict) -> str:
    lines = [f"{result['checkpoint']}: {result['head']} on {result['dataset']} {result['split']}, "
             f"{result['contexts']:,} contexts; {describe_weights(result)}"]
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
    # Imported here: the analysis package brings scipy.stats and matplotlib, about 1.7 s of
    # start-up that every rank.py of a sweep would pay for a figure it seldom draws.
    from analysis.spectra import write_spectra
    path, notes = write_spectra(run_dirs, Path(out) if out else None, transformed=transformed)
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    return path


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.plot:
            print(f"wrote {plot(args.paths, args.out, args.transformed)}")
            return 0
        device = select_device(args.device, option="--device")
        if args.max_memory is not None and device.type == "cpu":
            raise AnalysisError("--max-memory bounds the decomposition's memory on a GPU; on the CPU "
                                "(the device here) LAPACK takes what it needs: leave --max-memory out")
        with analysis_lock(existing_checkpoint(args.paths[0]), "rank.py"):    # its results go there
            if args.robustness:
                result = compute_robustness(args.paths[0], args.split, args.contexts, args.dtype,
                                            device, args.data_dir, args.keep, args.iterations,
                                            args.noise_scales, args.seed, args.allow_modified_corpus)
            else:
                result = compute_ranks(args.paths[0], args.split, args.contexts, args.dtype, device,
                                       args.data_dir, args.max_memory, args.allow_modified_corpus)
    except (ConfigError, CheckpointError, DataError, AnalysisError, RunDirectoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return error_exit_code(e)
    print(describe_robustness(result) if args.robustness else describe(result))
    if args.json:
        print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    run_script(main)
