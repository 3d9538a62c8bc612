"""Validation and test perplexity of a trained model (SPEC section 3: test batch size 1).

    python evaluate.py runs/ptb-softmax-seed141            # its best.pt
    python evaluate.py runs/x/last.pt --json               # a checkpoint file; JSON last line

The results are also written beside the checkpoint as eval_<checkpoint name>.json.
"""
from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from data import DataError
from data.batching import batchify
from experiment.checkpoint import CheckpointError
from experiment.config import ConfigError
from experiment.evaluation import evaluate_nll, perplexity
from experiment.loading import load_trained, select_device


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Validation and test perplexity of a trained model.")
    parser.add_argument("path", help="run directory (uses its best.pt) or checkpoint file")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--data-dir", help="folder holding ptb/ and wikitext-2/ (default: $AWD_DATA_DIR)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    parser.add_argument("--valid-batch-size", type=int, help="default: the run's train.eval_batch_size")
    parser.add_argument("--test-batch-size", type=int, help="default: the run's train.test_batch_size (1)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        for name in ("valid_batch_size", "test_batch_size"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {value}")
        run = load_trained(args.path, select_device(args.device), args.data_dir)
    except (ConfigError, CheckpointError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    t = run.config.train
    # best.pt records the epoch it was saved after; last.pt its progress (epoch in progress).
    where = run.checkpoint.get("progress", run.checkpoint)
    results = {"checkpoint": str(run.path), "dataset": run.config.data.dataset,
               "head": run.config.head_name, "epoch": where.get("epoch"), "step": where.get("step")}
    device = next(run.model.parameters()).device
    for split, ids, batch_size in (("val", run.corpus.valid, args.valid_batch_size or t.eval_batch_size),
                                   ("test", run.corpus.test, args.test_batch_size or t.test_batch_size)):
        data = batchify(ids, batch_size, device)
        with tqdm(total=data.size(0) - 1, unit="step", desc=f"{split} (batch {batch_size})",
                  leave=False, disable=None) as bar:
            nll = evaluate_nll(run.model, data, t.bptt, progress=bar)
        results[f"{split}_loss"] = nll
        results[f"{split}_ppl"] = perplexity(nll)
        results[f"{split}_batch_size"] = batch_size

    print(f"{run.path}: {results['head']} on {results['dataset']}, epoch {results['epoch']}, "
          f"step {results['step']}")
    print(f"valid ppl {results['val_ppl']:.2f} (batch {results['val_batch_size']}) | "
          f"test ppl {results['test_ppl']:.2f} (batch {results['test_batch_size']})")
    # Saved beside the checkpoint for the result tables (eval_best.json for best.pt).
    (run.run_dir / f"eval_{run.path.stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
