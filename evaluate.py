"""Validation and test perplexity of a trained model (docs/reference.md section 3: test batch size 1).

    python evaluate.py runs/ptb-softmax-seed141            # its best.pt
    python evaluate.py runs/x/last.pt --json               # a checkpoint file; JSON last line
    python evaluate.py runs/ptb-softmax-seed141 --cache    # with the neural cache ([Cache])
    python evaluate.py runs/ptb-softmax-seed141 --cache-search   # tune theta, lambda on valid first
    python evaluate.py runs/ptb-mos-seed28 --dynamic       # dynamic evaluation ([DynEval])

The results are also written beside the checkpoint as eval_<checkpoint name>.json (with a
method: eval_<checkpoint name>_<method>.json), with the epoch and step of the weights and whether
they are the ASGD averages or the raw weights. The methods read both splits at batch size 1 and
default to the published settings of the run's dataset (evaluation/cache.py,
evaluation/dynamic.py); the checkpoint is never written.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

from experiment.cli import ArgumentParser, add_corpus_arguments, run_script, quiet_interrupt_while_starting

if __name__ == "__main__":        # (not when a test imports the script)
    quiet_interrupt_while_starting()   # before torch's import, which takes seconds: a Ctrl-C there is one line

from tqdm import tqdm

from data import DataError
from data.batching import batchify
from experiment.checkpoint import CheckpointError, existing_checkpoint
from evaluation import cache, dynamic
from experiment.config import ConfigError
from evaluation.loop import evaluate_nll, perplexity
from experiment.loading import describe_weights, load_trained, select_device
from experiment.run_directory import RunDirectoryError, analysis_lock, error_exit_code, write_text_atomic


def parse_args(argv=None):
    parser = ArgumentParser(prog="evaluate.py",
                            description="Validation and test perplexity of a trained model.")
    parser.add_argument("path", help="run directory (uses its best.pt) or checkpoint file")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_corpus_arguments(parser, "the run's data.data_dir, else $AWD_DATA_DIR, else the "
                                 "repository's corpora/")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, mps, cuda, cuda:N")
    parser.add_argument("--valid-batch-size", type=int, help="default: the run's train.eval_batch_size")
    parser.add_argument("--test-batch-size", type=int, help="default: the run's train.test_batch_size (1)")
    method = parser.add_argument_group(
        "evaluation methods (batch size 1; defaults: the published settings of the run's dataset)")
    method.add_argument("--cache", action="store_true", help="the neural cache of Grave et al. 2017")
    method.add_argument("--cache-window", type=int, help="past positions in the cache (PTB 500, WT2 3785)")
    method.add_argument("--cache-theta", type=float, help="the cache's inverse temperature (PTB 1.0, WT2 0.662)")
    method.add_argument("--cache-lambda", type=float, help="the cache's weight in [0, 1) (PTB 0.1, WT2 0.1279)")
    method.add_argument("--cache-bptt", type=int,
                        help="positions per forward pass (PTB 5000, WT2 2000); with --cache-start "
                             "reference it also decides which positions start a chunk")
    method.add_argument("--cache-start", choices=cache.START_RULES,
                        help="where the cache starts being used: reference (default: AWD-LSTM's "
                             "pointer.py, once a whole window of history exists, not at the first "
                             "position of a chunk) or available (from the second position on)")
    method.add_argument("--cache-search", action="store_true",
                        help="--cache with theta and lambda chosen on the validation split from a grid")
    method.add_argument("--dynamic", action="store_true",
                        help="dynamic evaluation of Krause et al. 2018 (RMS with decay to the global prior)")
    method.add_argument("--dynamic-lr", type=float, help="step size (0.002)")
    method.add_argument("--dynamic-lambda", type=float, help="decay towards the trained weights (PTB 0.075, WT2 0.02)")
    method.add_argument("--dynamic-epsilon", type=float, help="added to the gradient RMS (PTB 0.001, WT2 0.002)")
    method.add_argument("--dynamic-bptt", type=int, help="positions per segment (5)")
    method.add_argument("--dynamic-ms-batch-size", type=int,
                        help="columns of the training batches for the gradient statistics (100)")
    method.add_argument("--dynamic-ms-batches", type=int,
                        help="use only the first N training batches for them (default: the whole split)")
    args = parser.parse_args(argv)
    args.cache = args.cache or args.cache_search
    for name in ("cache", "dynamic"):
        given = [key for key in vars(args) if key.startswith(f"{name}_") and getattr(args, key) not in (None, False)]
        if given and not getattr(args, name):
            parser.error(f"--{given[0].replace('_', '-')} belongs to --{name}")
    if args.cache_search and (args.cache_theta is not None or args.cache_lambda is not None):
        flag = "--cache-theta" if args.cache_theta is not None else "--cache-lambda"
        parser.error(f"{flag}: --cache-search chooses theta and lambda on the validation split; "
                     "give them with --cache instead")
    if args.cache and args.dynamic:
        parser.error("--cache and --dynamic are two methods: give one")
    if (args.cache or args.dynamic) and (args.valid_batch_size or args.test_batch_size):
        parser.error("--cache and --dynamic read both splits at batch size 1: leave out the batch sizes")
    args.method = "cache" if args.cache else "dynamic" if args.dynamic else None
    return args


# Flag -> settings field of each method.
METHOD_FLAGS = {"cache": {"cache_window": "window", "cache_theta": "theta", "cache_lambda": "lam",
                          "cache_bptt": "bptt", "cache_start": "start"},
                "dynamic": {"dynamic_lr": "lr", "dynamic_lambda": "lam", "dynamic_epsilon": "epsilon",
                            "dynamic_bptt": "bptt", "dynamic_ms_batch_size": "ms_batch_size",
                            "dynamic_ms_batches": "ms_batches"}}


def method_settings(args, dataset: str):
    """The published settings of the method for the dataset, with the flags given replacing them."""
    published = (cache if args.method == "cache" else dynamic).PUBLISHED[dataset]
    given = {field: getattr(args, flag) for flag, field in METHOD_FLAGS[args.method].items()
             if getattr(args, flag) is not None}
    try:
        return dataclasses.replace(published, **given)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        for name in ("valid_batch_size", "test_batch_size"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {value}")
        device = select_device(args.device, option="--device")
        with analysis_lock(existing_checkpoint(args.path), "evaluate.py"):   # it writes its results there
            run = load_trained(args.path, device, args.data_dir,
                               allow_modified_corpus=args.allow_modified_corpus)
            return evaluate_with_method(run, args) if args.method else evaluate(run, args)
    except (ConfigError, CheckpointError, DataError, RunDirectoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return error_exit_code(e)


# The splits are "valid" and "test" (the corpus's names); in result files (eval_*.json, as in
# metrics.jsonl and last.pt's progress) the validation split's keys are val_loss, val_ppl, ...,
# the names every saved result and report reads.
RESULT_KEY = {"valid": "val", "test": "test"}


def evaluate(run, args) -> int:
    t = run.config.train
    batch_sizes = {"valid": (args.valid_batch_size or t.eval_batch_size,
                             "--valid-batch-size" if args.valid_batch_size else "train.eval_batch_size"),
                   "test": (args.test_batch_size or t.test_batch_size,
                            "--test-batch-size" if args.test_batch_size else "train.test_batch_size")}
    for split, (batch_size, setting) in batch_sizes.items():
        run.corpus.check_batchable(split, batch_size, setting)
    weights = run.weights()
    results = {"checkpoint": str(run.path), "dataset": run.config.data.dataset,
               "head": run.config.head_name, **weights, "corpus": run.corpus.record()}
    device = next(run.model.parameters()).device
    for split, (batch_size, _) in batch_sizes.items():
        data = batchify(getattr(run.corpus, split), batch_size, device)
        with tqdm(total=data.size(0) - 1, unit="step", desc=f"{split} (batch {batch_size})",
                  leave=False, disable=None) as bar:
            nll = evaluate_nll(run.model, data, t.bptt, progress=bar)
        key = RESULT_KEY[split]
        results[f"{key}_loss"] = nll
        results[f"{key}_ppl"] = perplexity(nll)
        results[f"{key}_batch_size"] = batch_size

    report(run, results, args, f"eval_{run.path.stem}.json")
    return 0


def report(run, results: dict, args, file_name: str) -> None:
    """Print the results and save them beside the checkpoint (eval_best.json for best.pt), with
    a note where that rewrites a file of other settings; a loss that is not finite is refused."""
    refuse_non_finite(results, run.config.model.nhidlast)
    # after the weights' words, which end in "raw" or "the ASGD averages": "raw with cache" read
    # as if the cache were a kind of weights
    method = {"cache": "; evaluated with the neural cache", "dynamic": "; evaluated with dynamic evaluation",
              None: ""}[results.get("method")]
    print(f"{run.path}: {results['head']} on {results['dataset']}, "
          f"{describe_weights(run.weights())}{method}")
    print(f"valid ppl {results['val_ppl']:.2f} (batch {results['val_batch_size']}) | "
          f"test ppl {results['test_ppl']:.2f} (batch {results['test_batch_size']})")
    path = run.run_dir / file_name
    before = read_previous_result(path)
    write_text_atomic(path, json.dumps(results, indent=1, allow_nan=False) + "\n")
    if before is not None and (note := rewrite_note(path, before, results)):
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps(results, allow_nan=False))


def refuse_non_finite(results: dict, hidden_size: int) -> None:
    """A perplexity that is not a finite number (a NaN or infinite loss, or one past exp's range
    in float64, 709.78 nats a word, which only a broken model reaches) is neither written nor shown:
    a ConfigError naming the method, its settings and the cause (`hidden_size`: the last LSTM
    layer's)."""
    bad = {split: results[f"{key}_loss"] for split, key in RESULT_KEY.items()
           if not math.isfinite(results[f"{key}_ppl"])}
    if not bad:
        return
    losses = " and ".join(f"{split} loss {loss:.4g}" for split, loss in bad.items()) + (
        "" if all(map(math.isnan, bad.values())) else " (past 709.78 nats the perplexity overflows float64)")
    method, settings = results.get("method"), results.get("settings", {})
    broken = "the model's log-probabilities of the text are not usable numbers"
    if method is None:
        lead, cause = (f"plain evaluation (valid batch size {results['val_batch_size']}, test batch size "
                       f"{results['test_batch_size']})", broken)
    else:
        safe_theta = cache.largest_safe_theta(hidden_size)
        if method == "cache" and settings["theta"] > safe_theta:
            culprits = ["theta"]
            cause = (f"the cache's scores theta <h_t, h_i> overflow float32 (the model's precision, in which "
                     f"AWD-LSTM's pointer.py computes them too); give a --cache-theta of at most {safe_theta:.3g}")
        elif method == "dynamic":
            culprits = ["lr", "epsilon"]
            cause = ("the steps lr * g / (S + epsilon) made the weights diverge; give a smaller "
                     "--dynamic-lr or a larger --dynamic-epsilon")
        else:
            culprits, cause = [], broken
        said = method_settings_in_words(method, settings)
        lead = " ".join(said[field] for field in culprits) or f"--{method}"
        lead += f" (with {', '.join(text for field, text in said.items() if field not in culprits)})"
    raise ConfigError(f"{lead}: {losses}: {cause}; nothing written")


def method_settings_in_words(method: str, settings: dict) -> dict[str, str]:
    """A result's method settings as the flags that give them, e.g. {"theta": "--cache-theta 1"}."""
    flags = {field: flag.replace("_", "-") for flag, field in METHOD_FLAGS[method].items()}
    return {field: f"--{flags.get(field, field)} {setting_in_words(value)}" for field, value in settings.items()}


def setting_in_words(value) -> str:
    if value is None:
        return "unset"
    return f"{value:g}" if isinstance(value, float) else str(value)


def read_previous_result(path: Path) -> dict | None:
    """The result file a run of evaluate.py is about to rewrite: its JSON object, {} where it
    holds something else, None where there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return {}
    try:
        result = json.loads(text)
    except ValueError:
        return {}
    return result if isinstance(result, dict) else {}


def result_settings(results: dict) -> dict[str, str]:
    """What a result's numbers were computed with besides the run's config, each in words: the
    weights, the batch sizes, the text and the method's settings. An earlier evaluate.py's file
    may lack some; only those present are said."""
    said = {}
    if "step" in results:
        said["weights"] = f"the {results.get('weights')} weights of step {results['step']}"
    for key, name in (("val_batch_size", "valid batch size"), ("test_batch_size", "test batch size")):
        if key in results:
            said[key] = f"{name} {results[key]}"
    corpus = results.get("corpus") or {}
    if "folder" in corpus:
        said["corpus"] = f"the corpus in {corpus['folder']}"
    for split, digest in (corpus.get("sha256") or {}).items():
        said[f"{split} text"] = f"the {split} text of sha256 {digest[:8]}..."
    if "method" in results:
        said["method"] = "--cache-search" if "search" in results else f"--{results['method']}"
        said.update(method_settings_in_words(results["method"], results.get("settings") or {}))
    return said


def rewrite_note(path: Path, before: dict, now: dict) -> str | None:
    """One line saying what a rewritten result file held where its settings differ from the new
    one's (the earlier numbers are gone from the run directory otherwise); None where they agree."""
    if not before:
        return f"note: rewrote {path}, which held no result of evaluate.py"
    old, new = result_settings(before), result_settings(now)
    changed = [key for key in old if key in new and old[key] != new[key]]
    if "corpus" in changed:                      # another folder's text: the folder says it
        changed = [key for key in changed if not key.endswith(" text")]
    if not changed:
        return None
    numbers = ", ".join(f"{name} ppl {before[key]:.2f}" for name, key in (("valid", "val_ppl"), ("test", "test_ppl"))
                        if isinstance(before.get(key), (int, float)))
    return (f"note: rewrote {path} (before: {numbers or 'no perplexities'} with "
            f"{', '.join(old[key] for key in changed)}; now {', '.join(new[key] for key in changed)})")


def evaluate_with_method(run, args) -> int:
    """Validation and test perplexity with the neural cache or dynamic evaluation."""
    settings = method_settings(args, run.config.data.dataset)
    for split in RESULT_KEY:
        run.corpus.check_batchable(split, 1, "batch size")
    device = next(run.model.parameters()).device
    splits = {split: batchify(getattr(run.corpus, split), 1, device) for split in RESULT_KEY}
    results = {"checkpoint": str(run.path), "dataset": run.config.data.dataset,
               "head": run.config.head_name, **run.weights(), "corpus": run.corpus.record(),
               "method": args.method}

    def bar(name: str, total: int, unit: str = "tok"):
        return tqdm(total=total, unit=unit, desc=f"{name} ({args.method})", leave=False, disable=None)

    if args.method == "cache":
        # A cache that never mixes in gives the plain numbers under the cache's name: refuse it.
        mixed = {split: cache.positions_mixed(source.size(0) - 1, settings.window, settings.bptt, settings.start)
                 for split, source in splits.items()}
        for split, count in mixed.items():
            positions = splits[split].size(0) - 1
            if count == 0 and positions > settings.window + 1:
                raise ConfigError(
                    f"--cache-bptt {settings.bptt}: with --cache-start {settings.start} the first "
                    f"position of every chunk uses p_model alone, and chunks of {settings.bptt} "
                    f"position have nothing else, so the cache is never used and its numbers would "
                    f"be the plain ones; give a longer --cache-bptt or --cache-start available")
            if count == 0:
                raise ConfigError(
                    f"--cache-window {settings.window}: the {split} split's {positions} "
                    f"positions are no more than the window + 1, so with --cache-start {settings.start} the "
                    f"cache is never used and its numbers would be the plain ones; give a shorter "
                    f"--cache-window or --cache-start available")
        results["cache_positions"] = mixed
        if args.cache_search:
            with bar("search on valid", splits["valid"].size(0) - 1) as progress:
                settings, grid = cache.search(run.model, splits["valid"], settings.window, settings.bptt,
                                              progress=progress, start=settings.start)
            print(describe_search(grid))
            print(f"best: theta {settings.theta:g}, lambda {settings.lam:g} "
                  f"(valid ppl {perplexity(grid.min().item()):.2f})")
            edges = [f"{name} {value:g} is its {'smallest' if value == grid_values[0] else 'largest'}"
                     for name, value, grid_values in (("theta", settings.theta, cache.SEARCH_THETAS),
                                                      ("lambda", settings.lam, cache.SEARCH_LAMBDAS))
                     if value in (grid_values[0], grid_values[-1])]
            if edges:
                print(f"note: the best pair is on the grid's edge ({'; '.join(edges)}): the best "
                      "setting may lie outside the grid")
            results["search"] = {"thetas": list(cache.SEARCH_THETAS), "lambdas": list(cache.SEARCH_LAMBDAS),
                                 "val_ppl": perplexity_grid(grid)}
        for split, source in splits.items():
            with bar(split, source.size(0) - 1) as progress:
                results[f"{RESULT_KEY[split]}_loss"] = cache.cache_nll(run.model, source, settings, progress)
    else:
        run.corpus.check_batchable("train", settings.ms_batch_size, "--dynamic-ms-batch-size")
        check_dynamic_segments(run.corpus, splits, settings)
        steps = dynamic.training_batches(run.corpus.train, settings)
        with bar("gradient statistics on train", steps, unit="batch") as progress:
            statistics = dynamic.gradient_statistics(run.model, run.corpus.train, settings, progress)
        evaluator = dynamic.DynamicEvaluator(run.model, statistics, settings)
        results["paper_units"] = dynamic.paper_units(settings, statistics)
        for split, source in splits.items():
            with bar(split, source.size(0) - 1) as progress:
                results[f"{RESULT_KEY[split]}_loss"] = evaluator.nll(source, progress)
        evaluator.reset()
    results["settings"] = dataclasses.asdict(settings)
    for key in RESULT_KEY.values():
        results[f"{key}_ppl"] = perplexity(results[f"{key}_loss"])
        results[f"{key}_batch_size"] = 1
    report(run, results, args, f"eval_{run.path.stem}_{args.method}.json")
    return 0


def check_dynamic_segments(corpus, splits: dict, settings) -> None:
    """Refuse settings whose dynamic evaluation would not be what it is called: a split read as
    one segment is scored before any step (its numbers would be the plain ones), and more
    training batches asked than the split has would be recorded but not read."""
    for split, source in splits.items():
        positions = source.size(0) - 1
        if positions <= settings.bptt:
            raise ConfigError(
                f"--dynamic-bptt {settings.bptt}: the {split} split's {positions} positions make one "
                f"segment, scored before any step, so its numbers would be the plain ones; give a "
                f"shorter --dynamic-bptt (it also sets the training batches' length for the "
                f"gradient statistics)")
    available = dynamic.training_batches(corpus.train, dataclasses.replace(settings, ms_batches=None))
    if settings.ms_batches is not None and settings.ms_batches > available:
        raise ConfigError(
            f"--dynamic-ms-batches {settings.ms_batches}: the training split has {available} batches "
            f"of {settings.ms_batch_size} columns x {settings.bptt} positions; give at most "
            f"{available}, or leave it out for all of them")


def perplexity_grid(grid) -> list[list[float]]:
    return [[round(perplexity(nll), 4) for nll in row] for row in grid.tolist()]


def describe_search(grid) -> str:
    """The validation perplexity of every (theta, lambda) of the search, the best marked."""
    best = grid.min().item()
    lines = ["cache search on the validation split (ppl; * best):",
             "theta \\ lambda " + " ".join(f"{lam:>9g}" for lam in cache.SEARCH_LAMBDAS)]
    for theta, row in zip(cache.SEARCH_THETAS, grid.tolist()):
        lines.append(f"{theta:>14g} " + " ".join(
            f"{perplexity(nll):8.2f}" + ("*" if nll == best else " ") for nll in row))
    return "\n".join(lines)


if __name__ == "__main__":
    run_script(main)
