"""Tables and figures from run directories (docs/reference.md section 8).

    python report.py table runs/ptb runs/wt2 --out results/table2           # [SB] Table 2: .md + .csv
    python report.py table runs/table5 --paper table5 --out results/table5  # an [SB] table's layout + its numbers
    python report.py wordsim runs/ptb --benchmarks data/word-similarity --out results/wordsim --by-head
    python report.py top5 runs/ptb/ptb-softmax-seed141 runs/ptb/ptb-mos-seed141 \
        --positions 10 200 --contexts "the stock market"
    python report.py spectra runs/ptb/*-seed141 --out results/spectra_ptb.png
    python report.py correlation runs/gss_grid --out results/figure2         # [SB] Figure 2, Pearson r
    python report.py capacity runs/mos_k --out results/figure6            # [SB] Figure 6
    python report.py mos-rank runs/mos_k runs/mos_dropoutl --out results/figure5   # [SB] Figure 5
    python report.py robustness runs/ptb-mos-seed28 --out results/sm_tables14-16   # after rank.py --robustness
    python report.py published --out docs/published.md                        # the paper's numbers
    python report.py curves results/cpu_ptb --out results/cpu_ptb/report/curves  # valid ppl by epoch
    python report.py versus results/cpu_ptb --key model.emsize --out results/cpu_ptb/report/d_sweep
    python report.py methods results/cpu_ptb --out results/cpu_ptb/report/methods  # plain/cache/dynamic

A RUN argument is a run directory or a folder searched for run directories. Each command writes
its files under the --out prefix (PREFIX.md, and PREFIX.png / PREFIX.csv as it says) and prints
the Markdown. The paper's numbers drawn and printed beside the measured ones are those of
analysis/published.py.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from analysis import AnalysisError
from analysis.published import PUBLISHED_TABLES
from analysis.runs import find_run_dirs
from data import DataError
from experiment.checkpoint import CheckpointError
from experiment.config import ConfigError


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Tables and figures from run directories.")
    commands = parser.add_subparsers(dest="command", required=True)

    table = commands.add_parser("table", help="[SB] Table 2: params, s/epoch, train/valid/test ppl "
                                              "(mean ± std), t-test vs Softmax, Press rank; --paper: "
                                              "Table 5, SM Tables 4/5, 10/11, 12")
    table.add_argument("runs", nargs="+", help="run directories or folders holding them")
    table.add_argument("--out", required=True, help="output prefix: writes PREFIX.md and PREFIX.csv")
    table.add_argument("--group-by", action="append", default=[], metavar="KEY",
                       help="also split rows by this config key, e.g. head.k (repeatable; "
                            "rows are always split by dataset and head)")
    table.add_argument("--baseline", help="head the t-test compares against (default softmax)")
    table.add_argument("--paper", choices=list(PUBLISHED_TABLES),
                       help="take the layout of this [SB] table (its columns, its rows split by the key "
                            "it varies, its row names) and print its published numbers beside")
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
    spectra.add_argument("--out", help="the PNG to write (default: spectra.png in the run directory, "
                                       "or in the folder holding all the runs)")
    spectra.add_argument("--transformed", action="store_true",
                         help="also draw the f(l) spectra of heads that have them (dashed)")
    spectra.add_argument("--first", type=int, default=500, help="indices in the normalised panel")
    spectra.add_argument("--ymax", type=float, default=0.2, help="y limit of the normalised panel")

    figures = {
        "correlation": "[SB] Figure 2: Press rank against test ppl of the GSS(c, k) runs, Pearson r "
                       "beside the paper's (PREFIX.png, .md, .csv)",
        "capacity": "[SB] Figure 6: MoS train / test ppl and parameters against K (PREFIX.png, .md)",
        "mos-rank": "[SB] Figure 5: MoS test ppl against Press rank as K grows and as dropoutl falls "
                    "(PREFIX.png, .md)",
        "robustness": "[SB] SM Tables 14-16 from robustness_test.json (rank.py --robustness) "
                      "(PREFIX.md, .png)",
    }
    for name, description in figures.items():
        sub = commands.add_parser(name, help=description, description=description)
        sub.add_argument("runs", nargs="+", help="run directories or folders holding them")
        sub.add_argument("--out", required=True, help="output prefix, e.g. results/figure2")

    curves = commands.add_parser("curves", help="validation ppl against epoch, one line per head (mean "
                                                "over its runs, their range shaded), the ASGD switch "
                                                "marked (PREFIX.png, .md)")
    curves.add_argument("runs", nargs="+", help="run directories or folders holding them")
    curves.add_argument("--out", required=True, help="output prefix, e.g. results/curves")
    curves.add_argument("--group-by", action="append", default=[], metavar="KEY",
                        help="also one line per value of this config key, e.g. model.emsize")

    versus = commands.add_parser("versus", help="test ppl and Press rank against a config key, one "
                                                "line per head (PREFIX.png, .md, .csv)")
    versus.add_argument("runs", nargs="+", help="run directories or folders holding them")
    versus.add_argument("--key", required=True, help="the config key on the x axis, e.g. model.emsize")
    versus.add_argument("--out", required=True, help="output prefix, e.g. results/d_sweep")

    methods = commands.add_parser("methods", help="valid / test ppl plain, with the neural cache and "
                                                  "with dynamic evaluation, before and after "
                                                  "finetuning (PREFIX.md, .csv)")
    methods.add_argument("runs", nargs="+", help="run directories or folders holding them")
    methods.add_argument("--out", required=True, help="output prefix, e.g. results/methods")

    published = commands.add_parser("published", help="every number of [SB] the reports compare "
                                                       "against, as Markdown (docs/published.md)")
    published.add_argument("--out", help="also write the Markdown to this file")

    for sub in (wordsim, top5):
        sub.add_argument("--device", default="cpu", help="cpu, mps, cuda, cuda:N or auto")
        sub.add_argument("--data-dir", help="folder holding ptb/ and wikitext-2/ (default: the runs' own)")
    for sub in commands.choices.values():
        if any(action.dest == "runs" for action in sub._actions):
            sub.add_argument("--only", action="append", default=[], metavar="KEY=V1,V2",
                             help="keep the runs whose config has one of these values of KEY, "
                                  "e.g. model.emsize=32 or head.name=softmax,mos (repeatable: all must hold)")
    return parser.parse_args(argv)


def select_runs(run_dirs: list[Path], only: list[str]) -> list[Path]:
    """The run directories whose config.yaml matches every --only KEY=V1,V2 (as text)."""
    from analysis.runs import config_matches
    for text in only:
        key, _, values = text.partition("=")
        if not key or not values:
            raise AnalysisError(f"--only {text!r}: expected KEY=VALUE[,VALUE...], e.g. model.emsize=32")
        wanted = {v.strip() for v in values.split(",")}
        run_dirs = [d for d in run_dirs if config_matches(d, key.strip(), wanted)]
        if not run_dirs:
            raise AnalysisError(f"--only {text}: no run has that value (after the --only before it)")
    return run_dirs


def run(args) -> str:
    """Do the command; what to print."""
    if args.command == "published":
        from analysis.tables import published_markdown
        text = published_markdown()
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text, encoding="utf-8")
        return text
    run_dirs = select_runs(find_run_dirs(args.runs), args.only)
    if args.command == "table":
        from analysis.tables import write_table
        paper_baseline = args.paper and PUBLISHED_TABLES[args.paper].baseline
        if paper_baseline and args.baseline:
            raise AnalysisError(f"--baseline: [SB]'s p-values in --paper {args.paper} compare against "
                                f"{paper_baseline}; leave --baseline out")
        return write_table(run_dirs, Path(args.out), args.group_by, args.baseline or "softmax",
                           args.exclude_from_t_test, args.paper)

    if args.command == "curves":
        from analysis.curves import write_curves
        return write_curves(run_dirs, Path(args.out), args.group_by)

    if args.command == "versus":
        from analysis.versus import write_versus
        return write_versus(run_dirs, args.key, Path(args.out))

    if args.command == "methods":
        from analysis.methods import write_methods
        return write_methods(run_dirs, Path(args.out))

    if args.command == "correlation":
        from analysis.correlation import write_correlation
        return write_correlation(run_dirs, Path(args.out))

    if args.command in ("capacity", "mos-rank"):
        from analysis.mos_sweeps import write_mos_figure
        return write_mos_figure(run_dirs, Path(args.out), "capacity" if args.command == "capacity" else "rank")

    if args.command == "robustness":
        from analysis.robustness import write_robustness
        return write_robustness(run_dirs, Path(args.out))

    if args.command == "spectra":
        from analysis.spectra import write_spectra
        path, missing = write_spectra(run_dirs, Path(args.out) if args.out else None,
                                      args.transformed, args.first, args.ymax)
        return "\n".join([f"missing: {m}" for m in missing] + [f"wrote {path}"])

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
