"""Training-step cost of the AWD-LSTM body against a plain LSTM stack, and eval throughput.

    AWD_DATA_DIR=../shared/data python benchmarks/bench_step.py [--config configs/ptb/softmax.yaml] [--device cuda]

The AWD step is train.py's own Trainer.train_step (forward with every dropout, AR/TAR,
backward, clipping, SGD) at bptt 70 with the config's batch size. The plain step is an
embedding, three nn.LSTM layers of the same sizes, the tied decoder and the same loss,
clipping and SGD, with no dropout of any kind. Steps are interleaved (AWD, plain, AWD, ...)
so drifts in machine speed hit both; medians are reported. Target: AWD <= 1.10x plain.
The guard rails' share: the per-step checks alone (the extremes of every weight, stacked with
the loss and the gradient norm, read in one sync and tested for finiteness), timed on their own
and divided by the AWD step.

    python benchmarks/bench_step.py --config configs/ptb_mini/softmax.yaml   # the CPU miniature
"""
from __future__ import annotations

import json
import math
import resource
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import train  # noqa: E402
from benchmarks.common import (TrainerStep, corpus_of, interleaved_times, medians, run_benchmark,  # noqa: E402
                               timed)
from data.batching import batchify, get_batch  # noqa: E402
from experiment.cli import ArgumentParser, integer_at_least_1  # noqa: E402
from experiment.config import load_config  # noqa: E402
from evaluation.loop import evaluate_nll  # noqa: E402
from experiment.loading import select_device, set_float32_precision  # noqa: E402


class PlainLSTMModel(nn.Module):
    def __init__(self, vocab_size: int, emsize: int, nhid: int, nhidlast: int):
        super().__init__()
        self.encoder = nn.Embedding(vocab_size, emsize)
        self.rnns = nn.ModuleList([nn.LSTM(emsize, nhid), nn.LSTM(nhid, nhid), nn.LSTM(nhid, nhidlast)])
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, ids):
        x = self.encoder(ids)
        for rnn in self.rnns:
            x, _ = rnn(x)
        return F.log_softmax(F.linear(x, self.encoder.weight, self.bias), dim=-1)


def guard_rail_times(awd_step: TrainerStep, reps: int, device: torch.device) -> list[float]:
    """Seconds of train_step's finiteness checks alone, on the trained model's weights: what a
    step pays for never saving a non-finite model."""
    trainer = awd_step.trainer
    totals = torch.zeros(2, device=device)
    grad_norm = torch.tensor(0.25, device=device)

    def checks():
        values = torch.cat([totals, grad_norm.reshape(1), train.extremes(trainer.params)])
        assert all(map(math.isfinite, values.tolist()))

    return [timed(checks, device) for _ in range(reps)]


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/ptb/softmax.yaml")
    parser.add_argument("--steps", type=integer_at_least_1, default=15, help="timed steps of each model (median)")
    parser.add_argument("--eval-tokens", type=integer_at_least_1, default=3500, help="test tokens for eval throughput")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    parser.add_argument("--glibc-default-malloc", action="store_true",
                        help="leave glibc's malloc as it is (train.py keeps freed memory in the heap): "
                             "the system time this costs shows in system_s_per_step")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    device = select_device(args.device, "--device")        # bad input: run_benchmark's one line, exit 2
    corpus = corpus_of(load_config(args.config, args.overrides))
    awd_step = TrainerStep(args.config, corpus, device, args.overrides,
                           keep_freed_memory=not args.glibc_default_malloc)
    config, model = awd_step.config, awd_step.model

    m, t = config.model, config.train
    plain = PlainLSTMModel(corpus.vocab_size, m.emsize, m.nhid, m.nhidlast).to(device)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=t.lr, weight_decay=t.wdecay)
    plain_data = batchify(corpus.train, t.batch_size, device)
    position = [0]

    def plain_step():
        inputs, targets = get_batch(plain_data, position[0], t.bptt)
        position[0] += t.bptt
        plain_opt.zero_grad(set_to_none=True)
        log_probs = plain(inputs)
        F.nll_loss(log_probs.view(-1, log_probs.size(-1)), targets.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), t.clip)
        plain_opt.step()

    before = resource.getrusage(resource.RUSAGE_SELF)
    times = interleaved_times({"awd": awd_step, "plain": plain_step}, args.steps, warmup=2, device=device)
    after = resource.getrusage(resource.RUSAGE_SELF)
    steps_run = 2 * (args.steps + 2)                   # both models, warm-up included
    system_s = (after.ru_stime - before.ru_stime) / steps_run
    user_s = (after.ru_utime - before.ru_utime) / steps_run
    awd_times, plain_times = times["awd"], times["plain"]
    awd, base = medians(times).values()

    checks_s = statistics.median(guard_rail_times(awd_step, args.steps, device))

    set_float32_precision(False)        # evaluate.py evaluates in IEEE float32, whatever run.tf32 trained with
    test = batchify(corpus.test[: args.eval_tokens + 1], 1, device)
    seconds = timed(lambda: evaluate_nll(model, test, t.bptt), device)
    result = {
        "config": args.config, "device": str(device), "threads": torch.get_num_threads(),
        "batch_size": t.batch_size, "bptt": t.bptt,
        "awd_step_s": round(awd, 4), "plain_step_s": round(base, 4), "ratio": round(awd / base, 4),
        # each AWD step against the plain step run right after it: robust to slow drifts
        "paired_ratio_median": round(statistics.median(a / p for a, p in zip(awd_times, plain_times)), 4),
        "awd_steps_s": [round(x, 4) for x in awd_times], "plain_steps_s": [round(x, 4) for x in plain_times],
        "eval_batch1_tokens_per_s": round((test.size(0) - 1) / seconds, 1),
        "checks_s": round(checks_s, 6), "checks_share_of_awd_step": round(checks_s / awd, 4),
        "system_s_per_step": round(system_s, 4), "user_s_per_step": round(user_s, 4),
        "glibc_default_malloc": args.glibc_default_malloc,
    }
    print(f"AWD step  {awd:.3f} s (median of {args.steps})")
    print(f"plain step {base:.3f} s  -> ratio {awd / base:.3f}, median paired ratio "
          f"{result['paired_ratio_median']:.3f} (target <= 1.10)")
    print(f"guard-rail checks {checks_s * 1000:.2f} ms a step = {100 * checks_s / awd:.2f}% of the AWD step")
    print(f"CPU time a step (both models): user {user_s * 1000:.0f} ms, system {system_s * 1000:.0f} ms"
          + (" (glibc's default malloc)" if args.glibc_default_malloc else ""))
    print(f"evaluation at batch size 1: {result['eval_batch1_tokens_per_s']:.0f} tokens/s")
    print(json.dumps(result))


if __name__ == "__main__":
    run_benchmark(main)
