"""Why MoC did not learn in the miniature (docs/results_cpu.md): the share of the clipped
gradient that reaches the LSTM layers over the first SGD steps, Softmax against MoC and MoS
(or, with HEAD:D arguments, any miniature head at any d).

    AWD_DATA_DIR=../shared/data python results/cpu_ptb/diagnostics/gradient_share.py > gradient_share.txt
    AWD_DATA_DIR=../shared/data python results/cpu_ptb/diagnostics/gradient_share.py softmax:16 plif:16 plif:32 \
        > gradient_share_plif.txt

HEAD:D arguments choose the heads and d (emsize = nhidlast); without them Softmax, MoC, MoS at d = 32.

A one-off measurement, not part of the package: the miniature configs, seed 1, plain SGD at
lr 20 with [SB]'s weight decay and clipping at 0.25, loss = cross-entropy only (no AR/TAR), the
same training batches for every head.
"""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))   # the repository root
from data.batching import batchify, get_batch                   # noqa: E402
from data.corpus import load_corpus                             # noqa: E402
from experiment.config import load_config                       # noqa: E402
from model import build_model                                   # noqa: E402

STEPS, EVERY = 160, 20
torch.set_num_threads(1)
corpus = load_corpus("ptb", os.environ.get("AWD_DATA_DIR"))
for choice in sys.argv[1:] or ["softmax:32", "moc:32", "mos:32"]:
    head, d = choice.split(":")
    config = load_config(Path(__file__).resolve().parents[3] / f"configs/ptb_mini/{head}.yaml",
                         [f"model.emsize={d}"])
    torch.manual_seed(config.train.seed)
    model = build_model(config, corpus.vocab_size).train()
    train = batchify(corpus.train, config.train.batch_size)
    sgd = torch.optim.SGD(model.parameters(), lr=config.train.lr, weight_decay=config.train.wdecay)
    hidden = model.init_hidden(config.train.batch_size)
    for step in range(STEPS + 1):
        x, y = get_batch(train, step * config.train.bptt, config.train.bptt)
        hidden = [(h.detach(), c.detach()) for h, c in hidden]
        out = model(x, hidden, targets=y)
        hidden = out.hidden
        loss = -out.target_log_probs.mean()
        sgd.zero_grad()
        loss.backward()
        lstm = torch.sqrt(sum((p.grad ** 2).sum() for n, p in model.named_parameters()
                              if n.startswith("body.rnns")))
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.clip)
        if step % EVERY == 0:
            spread = out.last_raw_output.std(dim=(0, 1)).mean()
            print(f"{head:8s} d {d:>3s} step {step:4d}  loss {loss.item():.3f}  gradient norm {total:.3f}"
                  f"  LSTM share {lstm / total:.3f}  last-layer output std over positions {spread:.4f}",
                  flush=True)
        sgd.step()
