"""Tables and figures from run directories (SPEC section 8).

    python report.py table runs/ptb runs/wt2 --out results/table2           # [SB] Table 2: .md + .csv
    python report.py wordsim runs/ptb --benchmarks data/word-similarity --out results/wordsim --by-head
    python report.py top5 runs/ptb/ptb-softmax-seed141 runs/ptb/ptb-mos-seed141 \
        --positions 10 200 --contexts "the stock market"
    python report.py spectra runs/ptb/*-seed141 --out results/spectra_ptb.png

A RUN argument is a run directory or a folder searched for run directories.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from analysis import AnalysisError
from analysis.runs import find_run_dirs
from data import DataError
from experiment.checkpoint import CheckpointError
from experiment.config import ConfigError


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Tables and figures from run directories.")
    commands = parser.add_subparsers(dest="command", required=True)

    table = commands.add_parser("table", help="[SB] Table 2: params, s/epoch, train/valid/test ppl "
                                              "(mean ± std), t-test vs Softmax, Press rank")
    table.add_argument("runs", nargs="+", help="run directories or folders holding them")
    table.add_argument("--out", required=True, help="output prefix: writes PREFIX.md and PREFIX.csv")
    table.add_argument("--group-by", action="append", default=[], metavar="KEY",
                       help="also split rows by this config key, e.g. head.k (repeatable; "
                            "rows are always split by dataset and head)")
    table.add_argument("--baseline", default="softmax", help="head the t-test compares against")
    table.add_argument("--exclude-from-t-test", type=int, nargs="+", default=[], metavar="SEED",
                       help="seeds left out of the t-test samples only ([SB] leaves out the authors' seed)")

    wordsim = commands.add_parser("wordsim", help="Spearman's rho of input-embedding cosine similarities")
    wordsim.add_argument("runs", nargs="+", help="run directories or folders holding them")
    wordsim.add_argument("--benchmarks",
                         help="folder of EN-*.txt files (default: $AWD_DATA_DIR/word-similarity)")
    wordsim.add_argument("--out", required=True,
                         help="output prefix: writes PREFIX.md, PREFIX.csv and PREFIX_wins.png")
    wordsim.add_argument("--by-head", action="store_true",
                         help="one row per head and dataset (rho averaged over its runs) instead of per run")

    top5 = commands.add_parser("top5", help="top-k next-word predictions side by side")
    top5.add_argument("runs", nargs="+", help="run directories (of one dataset)")
    top5.add_argument("--positions", type=int, nargs="+", default=[],
                      help="test-set positions p: predict token p+1 from the test prefix up to p")
    top5.add_argument("--contexts", nargs="+", default=[], metavar="TEXT", help="contexts as text")
    top5.add_argument("-k", type=int, default=5, help="predictions per model (default 5)")
    top5.add_argument("--out", help="also write the Markdown to this file")

    spectra = commands.add_parser("spectra", help="singular-value curves of the test log-P matrices")
    spectra.add_argument("runs", nargs="+", help="run directories or folders holding them")
    spectra.add_argument("--out", required=True, help="the PNG to write")
    spectra.add_argument("--transformed", action="store_true",
                         help="also draw the f(l) spectra of heads that have them (dashed)")
    spectra.add_argument("--first", type=int, default=500, help="indices in the normalised panel")
    spectra.add_argument("--ymax", type=float, default=0.2, help="y limit of the normalised panel")

    for sub in (wordsim, top5):
        sub.add_argument("--device", default="cpu", help="cpu, mps, cuda, cuda:N or auto")
        sub.add_argument("--data-dir", help="folder holding ptb/ and wikitext-2/ (default: the runs' own)")
    return parser.parse_args(argv)


def run(args) -> str:
    """Do the command; what to print."""
    run_dirs = find_run_dirs(args.runs)
    if args.command == "table":
        from analysis.tables import write_table
        return write_table(run_dirs, Path(args.out), args.group_by, args.baseline, args.exclude_from_t_test)

    if args.command == "spectra":
        from analysis.spectra import write_spectra
        missing = write_spectra(run_dirs, Path(args.out), args.transformed, args.first, args.ymax)
        return "\n".join([f"missing: {m}" for m in missing] + [f"wrote {args.out}"])

    from experiment.loading import select_device
    device = select_device(args.device, option="--device")
    if args.command == "wordsim":
        from analysis.wordsim import by_head, read_benchmarks, score_runs, write_wordsim
        folder = args.benchmarks or (os.environ.get("AWD_DATA_DIR") and
                                     str(Path(os.environ["AWD_DATA_DIR"]) / "word-similarity"))
        if not folder:
            raise AnalysisError("--benchmarks: give the folder of benchmark files (or set $AWD_DATA_DIR)")
        benchmarks = read_benchmarks(Path(folder))
        rows = score_runs(run_dirs, benchmarks, device, args.data_dir)
        return write_wordsim(by_head(rows) if args.by_head else rows, benchmarks, Path(args.out))

    from analysis.predictions import top_k_report
    if args.k < 1:
        raise AnalysisError(f"-k {args.k}: expected at least 1")
    text = top_k_report(run_dirs, args.positions, args.contexts, args.k, device, args.data_dir)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        print(run(args))
    except (AnalysisError, ConfigError, CheckpointError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
