"""Validation and test perplexity of a trained model (docs/reference.md section 3: test batch size 1).

    python evaluate.py runs/ptb-softmax-seed141            # its best.pt
    python evaluate.py runs/x/last.pt --json               # a checkpoint file; JSON last line

The results are also written beside the checkpoint as eval_<checkpoint name>.json, with the
epoch and step of the weights and whether they are the ASGD averages or the raw weights.
"""
from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from data import DataError
from data.batching import batchify
from experiment.checkpoint import CheckpointError, existing_checkpoint
from experiment.config import ConfigError
from experiment.evaluation import evaluate_nll, perplexity
from experiment.loading import load_trained, select_device
from experiment.progress import TrainingProgress
from experiment.run_directory import RunDirectoryError, RunLock, write_text_atomic


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Validation and test perplexity of a trained model.")
    parser.add_argument("path", help="run directory (uses its best.pt) or checkpoint file")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--data-dir", help="folder holding ptb/ and wikitext-2/ (default: $AWD_DATA_DIR)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, mps, cuda, cuda:N")
    parser.add_argument("--valid-batch-size", type=int, help="default: the run's train.eval_batch_size")
    parser.add_argument("--test-batch-size", type=int, help="default: the run's train.test_batch_size (1)")
    return parser.parse_args(argv)


def weights_evaluated(ckpt: dict) -> dict:
    """Which weights a checkpoint holds: best.pt those validated after its epoch (the ASGD
    averages once averaging runs); last.pt the model's own weights where training stands, after
    its last complete epoch or within the epoch in progress (the averages are in its optimizer
    state)."""
    if ckpt.get("kind") == "last":
        p = TrainingProgress.from_dict(ckpt["progress"])
        complete = p.position == 0               # at an epoch boundary: `epoch` is the next one
        return {"epoch": p.completed_epochs if complete else p.epoch, "epoch_complete": complete,
                "step": p.step, "weights": "raw", "asgd": ckpt["optimizer"]["averaged"]}
    return {"epoch": ckpt["epoch"], "epoch_complete": True, "step": ckpt["step"],
            "weights": "averaged" if ckpt["averaged"] else "raw", "asgd": ckpt["averaged"]}


def describe_weights(w: dict) -> str:
    if w["step"] == 0:
        where = "the initial weights (no training step taken)"
    elif w["epoch_complete"]:
        where = f"weights after epoch {w['epoch']} (step {w['step']})"
    else:
        where = f"weights from within epoch {w['epoch']} (step {w['step']}, the epoch unfinished)"
    if w["weights"] == "averaged":
        return f"{where}, the ASGD averages"
    return f"{where}, raw" + (" (not the ASGD averages validation uses)" if w["asgd"] else "")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        for name in ("valid_batch_size", "test_batch_size"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {value}")
        device = select_device(args.device, option="--device")
        with RunLock(existing_checkpoint(args.path).parent):   # it writes eval_*.json there
            run = load_trained(args.path, device, args.data_dir)
            return evaluate(run, args)
    except (ConfigError, CheckpointError, DataError, RunDirectoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def evaluate(run, args) -> int:
    t = run.config.train
    splits = (("val", "valid", run.corpus.valid, args.valid_batch_size or t.eval_batch_size,
               "--valid-batch-size" if args.valid_batch_size else "train.eval_batch_size"),
              ("test", "test", run.corpus.test, args.test_batch_size or t.test_batch_size,
               "--test-batch-size" if args.test_batch_size else "train.test_batch_size"))
    for _, split, _, batch_size, setting in splits:
        run.corpus.check_batchable(split, batch_size, setting)
    weights = weights_evaluated(run.checkpoint)
    results = {"checkpoint": str(run.path), "dataset": run.config.data.dataset,
               "head": run.config.head_name, **weights}
    device = next(run.model.parameters()).device
    for name, _, ids, batch_size, _ in splits:
        data = batchify(ids, batch_size, device)
        with tqdm(total=data.size(0) - 1, unit="step", desc=f"{name} (batch {batch_size})",
                  leave=False, disable=None) as bar:
            nll = evaluate_nll(run.model, data, t.bptt, progress=bar)
        results[f"{name}_loss"] = nll
        results[f"{name}_ppl"] = perplexity(nll)
        results[f"{name}_batch_size"] = batch_size

    print(f"{run.path}: {results['head']} on {results['dataset']}, {describe_weights(weights)}")
    print(f"valid ppl {results['val_ppl']:.2f} (batch {results['val_batch_size']}) | "
          f"test ppl {results['test_ppl']:.2f} (batch {results['test_batch_size']})")
    # Saved beside the checkpoint for the result tables (eval_best.json for best.pt).
    write_text_atomic(run.run_dir / f"eval_{run.path.stem}.json", json.dumps(results, indent=1) + "\n")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
