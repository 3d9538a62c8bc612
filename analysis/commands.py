"""report.py's subcommands, as a table: each is its arguments and the function that runs it.

Adding a report is one entry in COMMANDS (and the analysis module it calls). The plan loader
(launch/plans.py) parses a plan's report commands with `check` when the plan is loaded, so a
mistyped command is found before any run trains.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from experiment.cli import ArgumentParser
from model.heads import HEADS

from . import AnalysisError
from .pooling import refuse_repeated_runs
from .published import PUBLISHED_TABLES
from .runs import config_value, find_run_dirs, read_run_config, value_matches

RUNS_HELP = "run directories or folders holding them"


@dataclass(frozen=True)
class Command:
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[..., str]          # (args, run_dirs) -> the Markdown to print; (args) without runs
    reads_runs: bool = True


def output_prefix(text: str) -> str:
    """An argparse type for --out PREFIX (PREFIX.md, .csv, .png are written): refused in one line
    where the files could not be written as named, rather than a traceback after the work or
    x.md.md beside the x.md that was meant."""
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a prefix for the files written (e.g. results/report/NAME)")
    if text.endswith("/") or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: a folder; give a prefix inside it, e.g. {path / 'NAME'} "
                                         f"(NAME.md, NAME.csv ... are written)")
    if path.suffix.lower() in (".md", ".csv", ".png", ".json", ".pdf", ".svg"):
        raise argparse.ArgumentTypeError(f"{text}: a prefix, not a file name: the files are {path.stem}.md, "
                                         f"{path.stem}.csv ...; give {path.with_suffix('')}")
    return writable_parent(text)


def markdown_file(text: str) -> str:
    """An argparse type for --out FILE (the Markdown also written there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected the Markdown file to write (e.g. results/report/NAME.md)")
    if text.endswith("/") or Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: a folder; give the file to write in it, e.g. "
                                         f"{Path(text) / 'NAME.md'}")
    return writable_parent(text)


def writable_parent(text: str) -> str:
    """text, unless a folder above it is a file (the folder could not be made)."""
    for parent in Path(text).parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"{text}: {parent} is a file, not a folder")
            break
    return text


def prefix_out(parser, example: str = "results/figure2") -> None:
    parser.add_argument("--out", required=True, type=output_prefix, help=f"output prefix, e.g. {example}")


def devices(parser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu, mps, cuda, cuda:N or auto")
    parser.add_argument("--data-dir", help="folder holding ptb/ and wikitext-2/ (default: the runs' own)")


def write_markdown(text: str, out: str | None) -> str:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
    return text


# ---------------------------------------------------------------------- the subcommands

def table_arguments(parser) -> None:
    parser.add_argument("--out", required=True, type=output_prefix, help="output prefix: writes PREFIX.md and PREFIX.csv")
    parser.add_argument("--group-by", action="append", default=[], metavar="KEY",
                        help="also split rows by this config key, e.g. head.k (repeatable; "
                             "rows are always split by dataset and head)")
    parser.add_argument("--baseline", help="head every row is compared with at the same setting (default softmax)")
    parser.add_argument("--paper", choices=list(PUBLISHED_TABLES),
                        help="take the layout of this [SB] table (its columns, its rows split by the key "
                             "it varies, its row names) and print its published numbers beside")
    parser.add_argument("--exclude-from-t-test", type=int, nargs="+", default=[], metavar="SEED",
                        help="seeds left out of the t-tests' samples only, the means keep them ([SB] "
                             "leaves out the authors' seed)")


def table(args, run_dirs) -> str:
    from .tables import write_table
    paper_baseline = args.paper and PUBLISHED_TABLES[args.paper].baseline
    if paper_baseline and args.baseline:
        raise AnalysisError(f"--baseline: [SB]'s p-values in --paper {args.paper} compare against "
                            f"{paper_baseline}; leave --baseline out")
    if args.baseline is not None and args.baseline not in HEADS:
        raise AnalysisError(f"--baseline {args.baseline}: expected a head's name ({', '.join(HEADS)})")
    heads = run_values(run_dirs, "head.name")
    if args.baseline is not None and args.baseline not in heads:
        raise AnalysisError(f"--baseline {args.baseline}: no run here has this head (their heads: "
                            f"{', '.join(sorted(heads))})")
    seeds = run_values(run_dirs, "train.seed")
    absent = [seed for seed in args.exclude_from_t_test if seed not in seeds]
    if absent:       # a plan trained with --limit may lack the authors' seed: said, not refused
        print(f"note: --exclude-from-t-test: no run here has seed {', '.join(map(str, absent))}, "
              f"so nothing is left out for it (the runs' seeds: {', '.join(map(str, sorted(seeds)))})",
              file=sys.stderr)
    return write_table(run_dirs, Path(args.out), args.group_by, args.baseline or "softmax",
                       args.exclude_from_t_test, args.paper)


def wordsim_arguments(parser) -> None:
    parser.add_argument("--benchmarks", metavar="FOLDER",
                        help="the folder whose EN-*.txt files are the benchmarks, other files there not read "
                             "(default: word-similarity/ in the data directory the corpora are read from: "
                             "--data-dir, else $AWD_DATA_DIR, else corpora/)")
    parser.add_argument("--out", required=True, type=output_prefix,
                        help="output prefix: writes PREFIX.md, PREFIX.csv and PREFIX_wins.png")
    parser.add_argument("--by-head", action="store_true",
                        help="one row per head and dataset (rho: the mean ± sample std over its runs, with their n) instead of per run")
    devices(parser)


def wordsim(args, run_dirs) -> str:
    from experiment.loading import select_device
    from .wordsim import benchmark_folder, by_head, read_benchmarks, score_runs, write_wordsim
    folder = Path(args.benchmarks).expanduser() if args.benchmarks else benchmark_folder(args.data_dir)
    benchmarks = read_benchmarks(folder)
    rows = score_runs(run_dirs, benchmarks, select_device(args.device, option="--device"), args.data_dir)
    return write_wordsim(by_head(rows) if args.by_head else rows, benchmarks, Path(args.out))


def top5_arguments(parser) -> None:
    parser.add_argument("--positions", type=int, nargs="+", default=[],
                        help="test-set positions p: predict token p+1 from the test prefix up to p")
    parser.add_argument("--contexts", nargs="+", default=[], metavar="TEXT", help="contexts as text")
    parser.add_argument("-k", type=int, default=5, help="predictions per model (default 5)")
    parser.add_argument("--out", type=markdown_file, help="also write the Markdown to this file")
    devices(parser)


def top5(args, run_dirs) -> str:
    from experiment.loading import select_device
    from .predictions import top_k_report
    if args.k < 1:
        raise AnalysisError(f"-k {args.k}: expected at least 1")
    device = select_device(args.device, option="--device")
    return write_markdown(top_k_report(run_dirs, args.positions, args.contexts, args.k, device,
                                       args.data_dir), args.out)


def spectra_arguments(parser) -> None:
    parser.add_argument("--out", help="the figure to write, .png, .pdf or .svg, or a folder (default: "
                                      "spectra.png in the run directory, or in the folder holding all "
                                      "the runs)")
    parser.add_argument("--transformed", action="store_true",
                        help="also draw the f(l) spectra of heads that have them (dashed)")
    parser.add_argument("--first", type=int, default=500, help="indices in the normalised panel")
    parser.add_argument("--ymax", type=float, default=0.2, help="y limit of the normalised panel")


def spectra(args, run_dirs) -> str:
    from .spectra import write_spectra
    path, missing = write_spectra(run_dirs, Path(args.out) if args.out else None,
                                  args.transformed, args.first, args.ymax)
    return "\n".join([f"warning: {m}" for m in missing] + [f"wrote {path}"])   # as rank.py --plot


def correlation(args, run_dirs) -> str:
    from .correlation import write_correlation
    return write_correlation(run_dirs, Path(args.out))


def capacity(args, run_dirs) -> str:
    from .mos_sweeps import write_mos_figure
    return write_mos_figure(run_dirs, Path(args.out), "capacity")


def mos_rank(args, run_dirs) -> str:
    from .mos_sweeps import write_mos_figure
    return write_mos_figure(run_dirs, Path(args.out), "rank")


def robustness(args, run_dirs) -> str:
    from .robustness import write_robustness
    return write_robustness(run_dirs, Path(args.out))


def curves_arguments(parser) -> None:
    prefix_out(parser, "results/curves")
    parser.add_argument("--group-by", action="append", default=[], metavar="KEY",
                        help="also one line per value of this config key, e.g. model.emsize")


def curves(args, run_dirs) -> str:
    from .curves import write_curves
    return write_curves(run_dirs, Path(args.out), args.group_by)


def versus_arguments(parser) -> None:
    parser.add_argument("--key", required=True, help="the config key on the x axis, e.g. model.emsize")
    prefix_out(parser, "results/d_sweep")


def versus(args, run_dirs) -> str:
    from .versus import write_versus
    return write_versus(run_dirs, args.key, Path(args.out))


def fraction(text: str) -> float:
    """argparse type: a number in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1), e.g. 0.01 for 1%, got {value}")
    return value


def convergence_arguments(parser) -> None:
    prefix_out(parser, "results/convergence")
    parser.add_argument("--window", type=positive_int, default=5, help="epochs looked back over (default 5)")
    parser.add_argument("--gain", type=fraction, default=0.01,
                        help="converged below this improvement of the best validation ppl over the "
                             "window, a fraction (default 0.01: 1%%)")


def convergence(args, run_dirs) -> str:
    from .convergence import write_convergence
    return write_convergence(run_dirs, Path(args.out), args.window, args.gain)


def cost(args, run_dirs) -> str:
    from .cost import write_cost
    return write_cost(run_dirs, Path(args.out))


def methods(args, run_dirs) -> str:
    from .methods import write_methods
    return write_methods(run_dirs, Path(args.out))


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (so that a plan's report command is checked when loaded)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def diagnose_arguments(parser) -> None:
    from .diagnose import MEASUREMENTS
    parser.add_argument("--measure", nargs="+", choices=MEASUREMENTS, default=list(MEASUREMENTS),
                        metavar="WHAT",
                        help="what to measure (default: all): spread (best.pt's last LSTM layer output, "
                             "std over validation positions), gradient-share (--steps SGD steps of a "
                             "fresh model: the only costly one), slopes (LMS-PLIF's, best.pt against "
                             "the run's start), perplexity (eval_best.json's test ppl beside the "
                             "unigram level); spread and slopes need best.pt")
    # None when not given: they belong to gradient-share, and diagnose() refuses them without it
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="SGD steps of the gradient share (default 160). They start from the run's "
                             "start, not from best.pt: the run's model rebuilt from config.yaml and "
                             "seeded as train.py does, plain SGD with its lr, weight decay and "
                             "clipping on consecutive train.bptt windows, cross-entropy only (AR and "
                             "TAR act on the body directly; the question is what reaches it from "
                             "the head): what explains a run that never learnt")
    parser.add_argument("--every", type=positive_int, default=None,
                        help="report the gradient share every N steps (default 20)")
    parser.add_argument("--out", type=output_prefix, help="also write PREFIX.md (the tables) and PREFIX.json (every value)")
    devices(parser)


def diagnose(args, run_dirs) -> str:
    from experiment.loading import select_device
    from .diagnose import diagnose_runs
    if "gradient-share" not in args.measure and (given := [f"--{name} {getattr(args, name)}" for name in
                                                          ("steps", "every") if getattr(args, name)]):
        raise AnalysisError(f"{given[0]}: the steps are gradient-share's, which --measure "
                            f"{' '.join(args.measure)} does not take: add gradient-share or leave it out")
    return diagnose_runs(run_dirs, args.measure, args.steps or 160, args.every or 20,
                         select_device(args.device, option="--device"), args.data_dir,
                         Path(args.out) if args.out else None)


def published_arguments(parser) -> None:
    parser.add_argument("--out", type=markdown_file, help="also write the Markdown to this file")


def published(args) -> str:
    from .tables import published_markdown
    return write_markdown(published_markdown(), args.out)


def seeds_arguments(parser) -> None:
    parser.add_argument("--change", type=float, nargs="+", required=True, metavar="PCT",
                        help="the true differences to plan for, in percent of test ppl as the reports "
                             "print them (e.g. -2 for 2%% below)")
    parser.add_argument("--spread", type=float, nargs="+", required=True, metavar="PCT",
                        help="the seed-to-seed spread of test ppl in percent, as a table report's "
                             "seed-spread line prints it (e.g. 0.66): one for every cell, or one per "
                             "cell in the order of --cells' weights (e.g. 0.15 1.02; then Welch's "
                             "interval, simulated)")
    parser.add_argument("--cells", type=int, default=2,
                        help="the cells compared: 2, one row against another (default); 4, how a "
                             "gain differs between two values (versus)")
    parser.add_argument("--power", type=float, default=0.8, help="the chance wanted that the 95%% "
                        "interval excludes zero (default 0.8)")
    parser.add_argument("--out", type=markdown_file, help="also write the Markdown to this file")


def seeds(args) -> str:
    from .stats import SEEDS_SPREAD_BELOW, power_table
    for spread in args.spread:
        if not 0 < spread < SEEDS_SPREAD_BELOW:
            raise AnalysisError(f"--spread: expected a percentage between 0 and 100, got {spread:g}")
    if args.cells not in (2, 4):
        raise AnalysisError(f"--cells: expected 2 (one row against another) or 4 (how a gain differs "
                            f"between two values), got {args.cells}")
    if len(args.spread) not in (1, args.cells):
        raise AnalysisError(f"--spread: expected one spread, or one per cell ({args.cells}), got "
                            f"{len(args.spread)}")
    if not 0 < args.power < 1:
        raise AnalysisError(f"--power: expected a probability between 0 and 1, got {args.power:g}")
    for change in args.change:
        # float() takes "nan" and "inf": neither is a change a seed count can be planned for
        if not math.isfinite(change) or change == 0 or change <= -100:
            raise AnalysisError(f"--change: expected a finite nonzero percentage above -100, got {change:g}")
    spread = args.spread[0] if len(args.spread) == 1 else args.spread
    return write_markdown(power_table(args.change, spread, args.cells, args.power), args.out)


COMMANDS: dict[str, Command] = {
    "table": Command("[SB] Table 2: n, params, s/epoch, train/valid/test ppl (mean ± std), test ppl vs "
                     "Softmax at the same setting (in %%, with its 95%% Welch interval and p), Press rank; "
                     "each row against Softmax at a common epoch; every two rows with Holm's p; the seed "
                     "spread; rows pool seeds of "
                     "one configuration only; --paper: Tables 2, 5 and 6, SM Tables 4/5, 10/11, 12 beside "
                     "[SB]'s numbers", table_arguments, table),
    "wordsim": Command("Spearman's rho of input-embedding cosine similarities; wins counted between runs "
                       "of one vocabulary only (others were scored on other pairs)", wordsim_arguments, wordsim),
    "top5": Command("top-k next-word predictions side by side", top5_arguments, top5),
    "spectra": Command("singular-value curves of the test log-P matrices", spectra_arguments, spectra),
    "correlation": Command("[SB] Figure 2: Press rank against test ppl of the GSS(c, k) runs, Pearson r "
                           "beside the paper's (PREFIX.png, .md, .csv)", lambda parser: prefix_out(parser, "results/report/figure2"), correlation),
    "capacity": Command("[SB] Figure 6: MoS train / test ppl and parameters against K (PREFIX.png, .md)",
                        lambda parser: prefix_out(parser, "results/report/figure6"), capacity),
    "mos-rank": Command("[SB] Figure 5: MoS test ppl against Press rank as K grows and as dropoutl "
                        "falls (PREFIX.png, .md)", lambda parser: prefix_out(parser, "results/report/figure5"), mos_rank),
    "robustness": Command("[SB] SM Tables 14-16 from robustness_test.json (rank.py --robustness) "
                          "(PREFIX.md, .png)", lambda parser: prefix_out(parser, "results/report/sm_tables14-16"), robustness),
    "curves": Command("validation ppl against epoch, one line per head (mean over its runs, their "
                      "range shaded), the ASGD switch marked (PREFIX.png, .md)", curves_arguments, curves),
    "versus": Command("test ppl and Press rank against a config key, one line per head; each "
                      "value's gain over Softmax, the gain averaged over the values and the gains' "
                      "differences between values with 95%% intervals; each head against itself at "
                      "another value (PREFIX.png, .md, .csv)", versus_arguments, versus),
    "convergence": Command("per run: epochs, the ASGD switch, the best validation ppl and its "
                           "improvement over the last --window epochs, converged or not "
                           "(PREFIX.md, .csv)", convergence_arguments, convergence),
    "cost": Command("CPU hours per run (training, its sittings, evaluation and rank; finetuning "
                    "on its own row) and in all, from the cpu_times.jsonl sweep.py writes "
                    "(PREFIX.md, .csv)", lambda parser: prefix_out(parser, "results/cost"), cost),
    "methods": Command("valid / test ppl plain, with the neural cache and with dynamic evaluation, "
                       "before and after finetuning; per cell of seeds, each head against Softmax and each "
                       "method against plain with 95%% intervals (PREFIX.md, .csv)",
                       lambda parser: prefix_out(parser, "results/methods"), methods),
    "diagnose": Command("what to look at first when a run did not learn: the spread of the body's "
                        "output, the LSTM's share of the gradient over a fresh model's first SGD "
                        "steps, LMS-PLIF's slope movement, test ppl beside the unigram level "
                        "(with --out: PREFIX.md, .json)", diagnose_arguments, diagnose),
    "seeds": Command("the seeds per cell at which a difference's 95%% interval excludes zero with "
                     "80%% power (--power), for given true differences and seed spread, in percent",
                     seeds_arguments, seeds, reads_runs=False),
    "published": Command("every number of [SB] the reports compare against, as Markdown "
                         "(docs/published.md)", published_arguments, published, reads_runs=False),
}


# ---------------------------------------------------------------------- parsing and running

def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="report.py", description="Tables and figures from run directories.")
    subcommands = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        sub = subcommands.add_parser(name, help=command.help, description=command.help.replace("%%", "%"))
        if command.reads_runs:
            sub.add_argument("runs", nargs="+", help=RUNS_HELP)
        command.arguments(sub)
        if command.reads_runs:
            sub.add_argument("--only", action="append", default=[], metavar="KEY=V1,V2",
                             help="keep the runs whose config has one of these values of KEY, e.g. "
                                  "model.emsize=32 or head.name=softmax,mos (repeatable: all must hold)")
    return parser


def check(argv: list[str]) -> str | None:
    """None if report.py would accept these arguments, else argparse's one-line complaint."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(argv)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return lines[-1] if lines else "not valid report.py arguments"
    return None


def config_keys_named(argv: list[str]) -> list[tuple[str, str]]:
    """(option, key) for each config key that report.py arguments it accepts name: --only's,
    --group-by's and --key's (sweep.py checks them against a plan's configs before any run)."""
    args = build_parser().parse_args(argv)
    named = [("--only", text.partition("=")[0].strip()) for text in getattr(args, "only", [])]
    named += [("--group-by", key) for key in getattr(args, "group_by", [])]
    return named + ([("--key", args.key)] if getattr(args, "key", None) else [])


def select_runs(run_dirs: list[Path], only: list[str]) -> list[Path]:
    """The run directories whose config.yaml matches every --only KEY=V1,V2 (as text)."""
    for index, text in enumerate(only):
        key, _, values = text.partition("=")
        key = key.strip()
        if not key or not values:
            raise AnalysisError(f"--only {text!r}: expected KEY=VALUE[,VALUE...], e.g. model.emsize=32")
        wanted = {v.strip() for v in values.split(",")}
        value_of = {d: config_value(read_run_config(d), key) for d in run_dirs}      # each config read once
        kept = [d for d in run_dirs if value_matches(value_of[d], wanted)]
        if kept and (absent := [v for v in wanted if not any(value_matches(value_of[d], {v}) for d in kept)]):
            # not refused: a plan's report may name runs still to come; but not silent (a typo)
            print(f"note: --only {text}: no run has {key} = {', '.join(sorted(absent))}", file=sys.stderr)
        if not kept:
            present = {value for value in value_of.values() if value is not None}
            runs = "the runs the --only before it kept" if index else "the runs"
            if not present:
                raise AnalysisError(f"--only {text}: no run's config.yaml has the key {key} "
                                    "(a config key, e.g. model.emsize)" if not index else
                                    f"--only {text}: none of {runs} has the key {key} in its config.yaml")
            raise AnalysisError(f"--only {text}: no run has that value; {runs} have {key} = "
                                f"{', '.join(sorted(map(str, present)))}")
        run_dirs = kept
    return run_dirs


def run_values(run_dirs: list[Path], key: str) -> set:
    """The values `key` has in the runs' config.yaml files (None left out)."""
    return {value for value in (config_value(read_run_config(d), key) for d in run_dirs) if value is not None}


def check_group_by(run_dirs: list[Path], keys: list[str]) -> None:
    """A --group-by key that no run has would split nothing, silently: a typo is refused."""
    for key in keys:
        if not run_values(run_dirs, key):
            raise AnalysisError(f"--group-by {key}: no run's config.yaml has this key (a config key, "
                                f"e.g. model.emsize)")


def run(args) -> str:
    """Do the command; what to print."""
    command = COMMANDS[args.command]
    if not command.reads_runs:
        return command.run(args)
    run_dirs = select_runs(find_run_dirs(args.runs), args.only)
    refuse_repeated_runs(run_dirs)
    check_group_by(run_dirs, getattr(args, "group_by", []))
    return command.run(args, run_dirs)
