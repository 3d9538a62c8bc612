"""Tokens per second of the evaluation methods against plain evaluation, at batch size 1.

    AWD_DATA_DIR=... python benchmarks/bench_eval_methods.py [--config configs/ptb/softmax.yaml]
        [--tokens 5000] [--device cuda] [--ms-batches 20]

The model is the config's (untrained weights: speed does not depend on them) on the first
--tokens of the test split, read as evaluate.py reads it: plain evaluation in bptt chunks (and,
`plain_5000`, in the cache's chunks of 5000, to tell the cache's own cost from its chunk length's),
the cache with its published settings (window 500 on PTB, chunks of 5000), dynamic evaluation in
segments of 5 with a gradient step after each. The gradient statistics dynamic evaluation
first collects on the training split are timed apart, per training batch (100 x 5 tokens), from
--ms-batches batches; the whole PTB training split is 1,859 such batches.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import corpus_of, run_benchmark, timed  # noqa: E402
from data.batching import batchify  # noqa: E402
from evaluation import cache, dynamic  # noqa: E402
from experiment.cli import ArgumentParser, integer_at_least_1  # noqa: E402
from experiment.config import ConfigError, load_config  # noqa: E402
from evaluation.loop import evaluate_nll  # noqa: E402
from experiment.loading import select_device, set_float32_precision  # noqa: E402
from model import build_model  # noqa: E402


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/ptb/softmax.yaml")
    parser.add_argument("--tokens", type=integer_at_least_1, default=5000,
                        help="test tokens read by each method (more than the cache's window + 1: 501 on "
                             "PTB, 3,786 on WikiText-2)")
    parser.add_argument("--ms-batches", type=integer_at_least_1, default=20, help="training batches timed for the statistics")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    args = parser.parse_args()

    device = select_device(args.device, "--device")
    config = load_config(args.config)
    corpus = corpus_of(config)
    set_float32_precision(False)            # evaluate.py evaluates in IEEE float32
    torch.manual_seed(0)
    model = build_model(config, corpus.vocab_size).to(device).eval()
    source = batchify(corpus.test[:args.tokens + 1], 1, device)
    tokens = source.size(0) - 1
    cache_settings = cache.PUBLISHED[config.data.dataset]
    dynamic_settings = dataclasses.replace(dynamic.PUBLISHED[config.data.dataset],
                                           ms_batches=args.ms_batches)
    mixed = cache.positions_mixed(tokens, cache_settings.window, cache_settings.bptt, cache_settings.start)
    if mixed == 0:      # the cache's timing would be plain evaluation's, under the cache's name
        least = cache_settings.window + 1
        fix = (f"give more than {least}" if tokens == args.tokens else
               f"the config's test split has only {tokens:,}: give a config whose corpus has more")
        raise ConfigError(f"--tokens {args.tokens}: the cache (window {cache_settings.window}) is used only "
                          f"after {least} positions, so a text of {tokens:,} would time plain evaluation "
                          f"under the cache's name; {fix}")

    warm = source[:200]                       # first calls pay one-time allocation costs
    evaluate_nll(model, warm, config.train.bptt)
    cache.cache_nll(model, warm, cache_settings)
    rates = {"plain": tokens / timed(lambda: evaluate_nll(model, source, config.train.bptt), device),
             "plain_5000": tokens / timed(lambda: evaluate_nll(model, source, 5000), device),
             "cache": tokens / timed(lambda: cache.cache_nll(model, source, cache_settings), device)}
    statistics = []
    ms_seconds = timed(lambda: statistics.append(
        dynamic.gradient_statistics(model, corpus.train, dynamic_settings)), device)
    evaluator = dynamic.DynamicEvaluator(model, statistics[0], dynamic_settings)
    rates["dynamic"] = tokens / timed(lambda: evaluator.nll(source), device)
    evaluator.reset()

    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"{config.head_name} on {config.data.dataset}, {tokens:,} test tokens at batch size 1")
    for name, rate in rates.items():
        print(f"{name:10s} {rate:9,.0f} tokens/s   {rate / rates['plain']:6.3f}x plain")
    # The batches read: fewer than --ms-batches where the split has fewer (divided by the number
    # asked, a shorter split's time per batch came out too small).
    timed_batches = statistics[0].batches
    per_batch = ms_seconds / timed_batches
    full = dynamic.training_batches(corpus.train, dataclasses.replace(dynamic_settings, ms_batches=None))
    print(f"gradient statistics: {per_batch * 1e3:.1f} ms per training batch of "
          f"{dynamic_settings.ms_batch_size} x {dynamic_settings.bptt} ({timed_batches:,} timed); the whole "
          f"training split ({full:,} batches) about {per_batch * full / 60:.1f} min")
    print(json.dumps({**{f"{k}_tokens_per_s": round(v, 1) for k, v in rates.items()},
                      "ms_seconds_per_batch": round(per_batch, 4), "ms_batches_timed": timed_batches,
                      "ms_batches_full": full}))


if __name__ == "__main__":
    run_benchmark(main)
