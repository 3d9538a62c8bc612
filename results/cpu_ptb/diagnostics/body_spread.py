"""Did the LSTM body learn? (docs/results_cpu.md): for every trained run, how much the last
LSTM layer's output varies over positions of the validation text. A body that never trained
gives every context nearly the same output, and the head the same distribution: the unigram
level of perplexity (MoC at d = 32, LMS-PLIF at d = 16).

    AWD_DATA_DIR=../shared/data python results/cpu_ptb/diagnostics/body_spread.py results/cpu_ptb > body_spread.txt

The number: the standard deviation over 7,000 positions (the first 700 validation tokens of each
of 10 batch columns) of each unit of the last layer's output (before dropout), averaged over
units; with the trained weights of best.pt in evaluation mode. Needs the runs' checkpoints
(best.pt), which are not committed: run it where the plans ran.
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))   # the repository root
from data.batching import batchify                              # noqa: E402
from experiment.loading import load_trained                     # noqa: E402

torch.set_num_threads(1)
root = Path(sys.argv[1])
for run in sorted(root.glob("ptb-*")):
    if not (run / "best.pt").is_file() or not (run / "eval_best.json").is_file():
        continue
    trained = load_trained(run, torch.device("cpu"))
    model = trained.model
    text = batchify(trained.corpus.valid, 10)[:700]
    with torch.no_grad():
        out = model(text, model.init_hidden(10))
    spread = out.last_raw_output.reshape(-1, out.last_raw_output.shape[-1]).std(dim=0).mean()
    test_ppl = json.loads((run / "eval_best.json").read_text())["test_ppl"]
    print(f"{run.name:45s} output std over positions {spread:.4f}   test ppl {test_ppl:7.2f}", flush=True)
