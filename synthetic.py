"""The softmax bottleneck on a laptop: the synthetic experiment of [LMS] section 5.1.

    python synthetic.py                                  # the default grid, results in runs/synthetic
    python synthetic.py --words 1000 --dims 8 64 --seeds 0 1 2 --out /tmp/small --json
    python synthetic.py --heads softmax lms --set lms.units=20 --alpha 0.01 0.1 1

For every alpha, M and seed, N true distributions P*(.|c_j) ~ Dirichlet(alpha) over M words are
drawn once; for every D and head, word embeddings (M x D, the head's tied decoder) and one free
context vector per distribution (N x D, the head's input g) are fitted by full-batch Adam on the
cross-entropy to P* until the mean KL stops falling (bottleneck/problem.py). Reported per cell:
the % of contexts whose mode matches (argmax P* = argmax Q) and the mean KL(P*||Q).

Heads (bottleneck.problem.SYNTHETIC_HEADS): every head of the registry (model/heads), with the
options of bottleneck.problem.HEAD_DEFAULTS, and lms (LMS with the monotone network of [LMS]
eq. 14, K = 10 hidden units). By default: softmax (Linear-Softmax), mos (MoS, K = 4), lms, plif
(LMS-PLIF), ss, gss. As in [LMS] (eqs. 1, 11, 12), no head has a per-word decoder bias: the
heads' b (l = E g + b) is held at zero and not trained; --decoder-bias trains it, as the language
model does (the fits before this option existed had it).

Writes to --out: results.md (one table per alpha and M), results.csv (every fit),
mode_match_alpha<a>.png and kl_alpha<a>.png (the paper's Figures 2 and 3: one line per head,
one panel per M), settings.json (everything this run was given). --json prints the rows as the
last line of stdout. Same seeds, same numbers (on the same device and torch build). results.csv
grows by a row as each fit ends, so a grid stopped part-way (Ctrl-C, SIGTERM, a session's end)
keeps its fits: the same command again fits only the rest.
--from-csv A/results.csv B/results.csv --out C writes one table and one pair of figures for the
results of several runs (a grid split over processes or machines) without fitting anything: each
fit once, and one N for each (alpha, M), and all with or all without --decoder-bias, since a
cell is the mean over seeds of one setting.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from experiment.cli import ArgumentParser, integer_at_least_0, integer_at_least_1, number_at_least, run_script, quiet_interrupt_while_starting

if __name__ == "__main__":        # (not when a test imports the script)
    quiet_interrupt_while_starting()   # before torch's import, which takes seconds: a Ctrl-C there is one line

import torch
from tqdm import tqdm

from bottleneck.problem import (SYNTHETIC_HEADS, FitSettings, SyntheticModel, fit, head_options,
                                sample_targets)
from bottleneck.report import Row, from_csv, to_csv, to_markdown, write_figures
from experiment.config import ConfigError
from experiment.loading import memory_refused, select_device
from experiment.run_directory import RunDirectoryError, RunLock, error_exit_code, write_text_atomic


# The default grid's heads, in the order of its table columns and figure legends.
DEFAULT_HEADS = ["softmax", "mos", "lms", "plif", "ss", "gss"]


def _override(text: str) -> tuple[str, str, str]:
    head_and_key, sep, value = text.partition("=")
    head, dot, key = head_and_key.partition(".")
    if not (sep and dot and head and key):
        raise argparse.ArgumentTypeError(f"expected HEAD.OPTION=VALUE, got {text!r}")
    if head not in SYNTHETIC_HEADS:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown head {head!r} "
                                         f"(heads: {', '.join(SYNTHETIC_HEADS)})")
    return head, key, value


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(prog="synthetic.py", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    positive = number_at_least(float, 0, "a finite value > 0", strict=True)
    p.add_argument("--alpha", nargs="+", type=positive, default=[0.1],
                   help="Dirichlet concentration(s) (default 0.1)")
    p.add_argument("--dims", nargs="+", type=integer_at_least_1, default=[8, 16, 32, 64, 128],
                   help="embedding sizes D")
    p.add_argument("--words", nargs="+", type=number_at_least(int, 2, "an integer >= 2"),
                   default=[1000, 10000], help="vocabulary sizes M")
    p.add_argument("--contexts", type=integer_at_least_1, default=10000,
                   help="N, the number of true distributions (the paper used 100,000)")
    p.add_argument("--heads", nargs="+", choices=list(SYNTHETIC_HEADS), default=DEFAULT_HEADS,
                   help=f"default: {' '.join(DEFAULT_HEADS)}")
    p.add_argument("--seeds", nargs="+", type=integer_at_least_0, default=[0],
                   help="one fit per seed: P* and the initial parameters are drawn from it")
    p.add_argument("--set", dest="overrides", action="append", type=_override, default=[],
                   metavar="HEAD.OPTION=VALUE",
                   help="a head option, e.g. mos.components=8, lms.units=20, plif.knots=1000")
    p.add_argument("--decoder-bias", action="store_true",
                   help="train a decoder bias b in every head (l = E g + b, as in the language "
                        "model; the logits' rank can then reach D + 1); default: [LMS]'s l = E g")
    p.add_argument("--no-compile", action="store_true",
                   help="eager kernels only (torch.compile is otherwise tried, with eager fallback)")
    defaults = FitSettings()
    p.add_argument("--lr", type=positive, default=defaults.lr, help="Adam learning rate")
    p.add_argument("--max-steps", type=integer_at_least_1, default=defaults.max_steps,
                   help="full-batch steps at most per fit")
    p.add_argument("--tol", type=number_at_least(float, 0, "a finite value >= 0"), default=defaults.tol,
                   help="stop when the mean KL fell by less than this fraction over --window steps")
    p.add_argument("--window", type=integer_at_least_1, default=defaults.window,
                   help=f"steps the stopping rule looks back over (--tol; default {defaults.window})")
    p.add_argument("--lr-drops", type=integer_at_least_0, default=defaults.lr_drops,
                   help="on a stall, divide the lr by 10 and go on, at most this many times")
    p.add_argument("--batch-contexts", type=integer_at_least_1, default=defaults.batch_contexts,
                   help="contexts per chunk of the full-batch gradient (memory only, same result)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    p.add_argument("--out", type=Path, default=Path("runs/synthetic"),
                   help="folder that receives settings.json, results.csv, results.md and the "
                        "figures (default runs/synthetic)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON, as the last line")
    p.add_argument("--from-csv", nargs="+", type=Path, metavar="CSV",
                   help="fit nothing: write the table and figures of earlier runs' results.csv "
                        "files (e.g. a grid split over several processes) to --out")
    args = p.parse_args(argv)
    # A value given twice fits the same cells again (hours at M = 10,000), the table averages the
    # copies as if they were seeds, and --from-csv refuses the results.csv it leaves.
    for option in ("--alpha", "--dims", "--words", "--seeds", "--heads"):
        values = getattr(args, option[2:])
        repeated = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if repeated is not None:
            shown = f"{repeated:g}" if isinstance(repeated, float) else repeated
            p.error(f"{option}: {shown} is given twice: each value once")
    if args.from_csv:
        # the grid and fit options would be ignored: the CSVs hold fits already made
        fitting = [a for a in p._actions if a.dest not in ("help", "from_csv", "out", "json")
                   and getattr(args, a.dest) != a.default]
        if fitting:
            p.error(f"{fitting[0].option_strings[0]} is an option of fitting; --from-csv fits nothing "
                    f"(it tables the fits in the CSVs as they are): leave it out")
    return args


def write_outputs(rows: list[Row], out: Path, print_json: bool) -> int:
    """results.csv, results.md and the figures in `out`; the table on stdout (and the rows)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "results.csv", to_csv(rows))
        write_text_atomic(out / "results.md", to_markdown(rows))
        figures = write_figures(rows, out)
    except (RunDirectoryError, OSError) as error:
        print(f"synthetic.py: {error}", file=sys.stderr)
        return error_exit_code(error)
    print(to_markdown(rows))
    print(f"wrote {out / 'results.md'}, {out / 'results.csv'}, "
          + ", ".join(str(f) for f in figures))
    if print_json:
        print(json.dumps([asdict(row) for row in rows]))
    return 0


def out_folder_for_join(out: Path, inputs: list[Path]) -> None:
    """Refuse an --out where --from-csv would replace results it cannot give back: a fitting run's
    folder (its settings.json would then describe another table) or one of the joined files."""
    if (out / "settings.json").is_file():
        raise ValueError(f"--out {out}: holds the results of a fitting run (settings.json), whose "
                         f"results.csv the join would replace: give the join a folder of its own")
    target = (out / "results.csv").resolve()
    if any(path.resolve() == target for path in inputs):
        raise ValueError(f"--out {out}: its results.csv is one of the --from-csv files, which the join "
                         f"would replace: give the join a folder of its own")


def fits_made_before(out: Path, settings: dict) -> list[Row]:
    """The fits that an earlier process with the same settings wrote into `out` (stopped part-way,
    or finished): this run fits only the others. Fits made with other settings are a ValueError
    naming the first setting that differs, not mixed into one table (a cell is a mean over seeds
    of one setting; device and torch build are settings here, as the same seed gives the same
    numbers only on the same ones)."""
    settings_path, results = out / "settings.json", out / "results.csv"
    if not settings_path.is_file():
        if results.is_file():
            raise ValueError(f"--out {out}: holds a results.csv but no settings.json (a --from-csv "
                             f"join's folder?), so its fits' settings are unknown: give this run a "
                             f"folder of its own")
        return []
    try:
        earlier = json.loads(settings_path.read_text(encoding="utf-8"))
        rows = from_csv(results.read_text(encoding="utf-8"), str(results)) if results.is_file() else []
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--out {out}: its earlier fits cannot be read ({error}): give this run "
                         f"another --out") from None
    now = json.loads(json.dumps(settings))          # as settings.json holds them (lists, not tuples)
    differing = next((key for key in now if earlier.get(key) != now[key]), None)
    if differing is not None:
        raise ValueError(f"--out {out}: holds fits made with other settings ({differing}: "
                         f"{json.dumps(earlier.get(differing))} there, {json.dumps(now[differing])} "
                         f"here): give this run another --out, or finish that one with its own "
                         f"command (settings.json)")
    return rows


def make_out_folder(out: Path) -> None:
    """--out, created if need be; a ValueError naming it where it cannot be."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file, expected a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--out {out}: cannot create this folder ({error.strerror or error})") from None


def rows_from_csv(paths: list[Path]) -> list[Row]:
    """The rows of several results.csv, refused where they cannot be pooled: a cell of the table is
    the mean over seeds of one (alpha, M, D, head) at one N, so a fit seen twice (a file given
    twice, or grids that overlap) or an (alpha, M) fitted at two N is a ValueError naming both files.
    So are fits with and without --decoder-bias: the heads differ (rank up to D + 1 against D), and
    the table and figures would set them side by side as one model."""
    rows: list[Row] = []
    fit_source: dict[tuple, Path] = {}
    n_source: dict[tuple, tuple[int, Path]] = {}
    bias_source: Optional[tuple[bool, Path]] = None
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}: cannot be read ({error})") from None
        for row in from_csv(text, str(path)):
            fit = (row.alpha, row.words, row.dim, row.head, row.seed)
            if fit in fit_source:
                raise ValueError(f"{path}: the fit alpha {row.alpha:g}, M {row.words}, D {row.dim}, "
                                 f"{row.head}, seed {row.seed} is also in {fit_source[fit]}: each fit once "
                                 f"(a file given twice, or grids that overlap)")
            contexts, first = n_source.setdefault((row.alpha, row.words), (row.contexts, path))
            if contexts != row.contexts:
                raise ValueError(f"{path}: alpha {row.alpha:g}, M {row.words} was fitted at N = {row.contexts:,} "
                                 f"here and N = {contexts:,} in {first}: a table pools the fits of one N "
                                 f"(join the CSVs of each N apart)")
            bias_source = bias_source or (row.decoder_bias, path)
            if row.decoder_bias != bias_source[0]:
                said = {True: "with --decoder-bias", False: "without --decoder-bias"}
                raise ValueError(f"{path}: alpha {row.alpha:g}, M {row.words}, D {row.dim}, {row.head}, "
                                 f"seed {row.seed} was fitted {said[row.decoder_bias]} and the fits of "
                                 f"{bias_source[1]} {said[bias_source[0]]}: a table pools fits of one "
                                 f"kind (join the CSVs of each apart)")
            fit_source[fit] = path
            rows.append(row)
    if not rows:
        raise ValueError(f"{', '.join(map(str, paths))}: no result rows")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_csv:
        try:
            out_folder_for_join(args.out, args.from_csv)
            rows = rows_from_csv(args.from_csv)
            make_out_folder(args.out)
        except ValueError as error:
            print(f"synthetic.py: {error}", file=sys.stderr)
            return 2
        return write_outputs(rows, args.out, args.json)
    out_lock = RunLock(args.out, way_out="wait for it to end, or give this run another --out "
                                         "(--from-csv joins the results of several)")
    try:
        device = select_device(args.device, "--device")
        fit_settings = FitSettings(lr=args.lr, max_steps=args.max_steps, tol=args.tol,
                                   window=args.window, lr_drops=args.lr_drops,
                                   batch_contexts=args.batch_contexts)
        overrides: dict[str, dict[str, str]] = {}
        for head, key, value in args.overrides:
            overrides.setdefault(head, {})[key] = value
        options = {head: head_options(head, overrides.get(head), compile=not args.no_compile)
                   for head in args.heads}
        unused = sorted(set(overrides) - set(args.heads))
        if unused:
            raise ValueError(f"--set names {', '.join(unused)}, which --heads does not run")
        make_out_folder(args.out)
        # One fitting process per --out: two (a grid split over processes, each left at the default
        # --out) would each replace the other's results.csv with its own at its end.
        out_lock.acquire()
        settings = {"alpha": args.alpha, "dims": args.dims, "words": args.words,
                    "contexts": args.contexts, "heads": args.heads, "seeds": args.seeds,
                    "decoder_bias": args.decoder_bias,
                    "head_options": {h: asdict(o) for h, o in options.items()},
                    "fit": asdict(fit_settings), "device": str(device),
                    "torch": torch.__version__}
        done = fits_made_before(args.out, settings)
        write_text_atomic(args.out / "settings.json", json.dumps(settings, indent=2) + "\n")
    except (ValueError, ConfigError, RunDirectoryError, OSError) as error:
        out_lock.release()
        print(f"synthetic.py: {error}", file=sys.stderr)
        return 2
    if done:
        print(f"synthetic.py: {len(done)} fit(s) of this grid are in {args.out / 'results.csv'} "
              f"already (an earlier run of this command): fitting the others", file=sys.stderr)
    try:
        return fit_grid(args, device, fit_settings, options, done)
    finally:
        out_lock.release()


def fit_grid(args: argparse.Namespace, device: torch.device, fit_settings: FitSettings,
             options: dict, done: list[Row]) -> int:
    """Every fit of the grid not in `done` (fits_made_before), results.csv rewritten as each
    ends, then the outputs (write_outputs)."""
    rows: list[Row] = list(done)
    made = {(r.alpha, r.words, r.seed, r.dim, r.head) for r in done}
    cells = len(args.alpha) * len(args.words) * len(args.seeds) * len(args.dims) * len(args.heads)
    bar = tqdm(total=cells, initial=len(made), unit="fit", file=sys.stderr, dynamic_ncols=True)
    last_shown = [0.0]

    def show_step(step: int, kl: float) -> None:
        # A fit of M = 10,000 can take an hour: its step and KL are shown, once a second at most.
        now = time.monotonic()
        bar.set_postfix_str(f"step {step} KL {kl:.4f}", refresh=now - last_shown[0] >= 1.0)
        if now - last_shown[0] >= 1.0:
            last_shown[0] = now
    for alpha in args.alpha:
        for words in args.words:
            for seed in args.seeds:
                if all((alpha, words, seed, dim, head) in made for dim in args.dims for head in args.heads):
                    continue
                targets = sample_targets(args.contexts, words, alpha, seed, device)
                for dim in args.dims:
                    for head in args.heads:
                        if (alpha, words, seed, dim, head) in made:
                            continue
                        where = f"alpha {alpha:g} M {words} seed {seed} D {dim} {head}"
                        bar.set_description(where)
                        torch.manual_seed(seed)
                        try:
                            model = SyntheticModel(SYNTHETIC_HEADS[head], options[head],
                                                   args.contexts, words, dim,
                                                   decoder_bias=args.decoder_bias).to(device)
                            result = fit(model, targets, fit_settings, show_step)
                        except (FloatingPointError, RuntimeError) as error:
                            refused = memory_refused(error) if isinstance(error, RuntimeError) else None
                            if isinstance(error, RuntimeError) and refused is None:
                                raise
                            bar.close()
                            # The fits done so far (hours of them, maybe) are written, not lost.
                            if rows and write_outputs(rows, args.out, args.json) != 0:
                                return 2
                            kept = (f"the {len(rows)} fit(s) before it are in {args.out / 'results.csv'}"
                                    if rows else "no fit finished before it")
                            if refused:          # a --set size with a typo's zeros: bad input
                                print(f"synthetic.py: {where}: the model does not fit in this machine's "
                                      f"memory ({refused}); is a --set size too large? ({kept})",
                                      file=sys.stderr)
                                return 2
                            print(f"synthetic.py: {where}: {error}; try a smaller --lr, with another "
                                  f"--out ({kept})", file=sys.stderr)
                            return 1
                        rows.append(Row(alpha, words, dim, args.contexts, head,
                                        SYNTHETIC_HEADS[head].label, seed,
                                        round(result.mode_match, 4), round(result.kl, 6),
                                        result.steps, result.converged,
                                        round(result.seconds, 2), args.decoder_bias))
                        # Kept as it ends: a fit at M = 10,000 can take an hour, a grid many sessions.
                        try:
                            write_text_atomic(args.out / "results.csv", to_csv(rows))
                        except (RunDirectoryError, OSError) as error:
                            bar.close()
                            print(f"synthetic.py: {error}", file=sys.stderr)
                            return error_exit_code(error)
                        bar.update()
                        del model
                del targets
    bar.close()
    return write_outputs(rows, args.out, args.json)


if __name__ == "__main__":
    run_script(main)
