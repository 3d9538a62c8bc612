"""How far LMS-PLIF's learnt slopes moved in the miniature (docs/results_cpu.md): the
run's best.pt against the slopes it started from, rebuilt by seeding and building the model
as train.py does (checked on the frozen-PLIF run, whose slopes never move: difference 0).

    python results/cpu_ptb/diagnostics/plif_slopes.py results/cpu_ptb > plif_slopes.txt

Needs the runs' checkpoints (best.pt), which are not committed: run it where the plan ran.
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))   # the repository root
from experiment import checkpoint                               # noqa: E402
from experiment.config import config_from_dict                  # noqa: E402
from model import build_model                                   # noqa: E402

root = Path(sys.argv[1])
for run in sorted(root.glob("ptb-plif*")):
    if not (run / "best.pt").is_file():
        continue
    saved = checkpoint.load(run / "best.pt", map_location="cpu")
    config = config_from_dict(saved["config"], source=str(run / "best.pt"))
    torch.manual_seed(config.train.seed)
    start = build_model(config, saved["model"]["body.encoder.weight"].shape[0]).head.v
    v = saved["model"]["head.v"]
    moved = (F.softplus(v) - F.softplus(start)).abs()
    print(f"{run.name}: {v.numel():,} slopes, max |v - v_start| {(v - start).abs().max():.2e}, "
          f"slope change mean {moved.mean():.2e} max {moved.max():.2e}")
