"""benchmarks/gpu_check.py, the self-check a user runs first on a new GPU machine: here, its
quick mode on the CPU (CI has no GPU), which runs every check against the CPU."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import gpu_check
from experiment.config import load_config
from model.heads import HEADS

REPO = Path(__file__).resolve().parent.parent


def test_the_self_check_runs_on_the_cpu_and_says_no_gpu_was_found(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--fast", "--device", "cpu"],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "AWD_CACHE_DIR": str(tmp_path)})
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "torch " in out and "no GPU found: every check below runs on the CPU" in out
    assert "[ok] LSTM: cpu vs CPU" in out
    # Every head whose options have `compile` (Mixtape's included), from the registry.
    compiled = [name for name, head in HEADS.items()
                if "compile" in getattr(head.Options, "__dataclass_fields__", {})]
    assert {"ss", "gss", "plif", "plif_frozen", "mos", "mixtape"} <= set(compiled)
    for name in compiled:
        assert f"[ok] {name} kernels: compiled" in out or f"{name} kernels: fell back to eager" in out
    for name in HEADS:
        assert f"[ok] {name} training: " in out
    assert "| [SB] V100 55 s/epoch" in out and "| [SB] V100 100 s/epoch" in out
    for name in ("softmax", "mos", "mixtape"):
        assert f"[ok] group {name}: " in out
    assert "[ok] rank.py tiny" in out and "[ok] MoS cache chunk tiny" in out
    assert "[ok] gloo 2 processes: largest parameter difference to 1 process" in out
    assert "checks passed" in out.strip().splitlines()[-1] and "failed" not in out.strip().splitlines()[-1]


@dataclasses.dataclass(frozen=True)
class CappedOptions:
    cap: float | None = None
    scale: float = 1e-05


class CappedHead(HEADS["softmax"]):
    Options = CappedOptions
    label = "Capped"


def test_a_heads_small_options_reach_its_config_as_they_are(monkeypatch):
    """A small option None was written head.cap=None, which YAML reads as the string 'None': the
    kernels and training checks of such a head stopped on its config."""
    monkeypatch.setitem(HEADS, "capped", CappedHead)
    config = load_config("configs/ptb/softmax.yaml", ["head={}", "head.name=capped", *gpu_check.small("capped")])
    assert config.head == CappedOptions()


def test_a_bad_device_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "gpu"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: --device: expected")


def test_one_section_alone(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--fast", "--device", "cpu", "--only",
                           "group"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "AWD_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[ok] group mos: " in proc.stdout and "== LSTM: device against the CPU" not in proc.stdout
    assert "[ok] group mos, one product per member: " in proc.stdout
    assert "[ok] group mos, backward split by gate: " in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "9 of 9 checks passed"


def test_the_cpu_rank_row_names_no_budget_its_backend_does_not_take(monkeypatch):
    """--fast's 10 MiB decomposition budget bounds the GPU's torch backend only; the CPU's row
    printed it beside a larger measured peak, a bound that read as broken, and passed."""
    import torch
    monkeypatch.setattr(gpu_check, "mos_cache_peak", lambda *args, **kwargs: (0, 1))
    report = gpu_check.Report()
    gpu_check.memory_bounds(report, torch.device("cpu"), fast=True, full_svd=False)
    rank_row = report.checks[0]
    assert rank_row.name == "rank.py tiny (V = 1,000)" and rank_row.ok
    assert rank_row.detail.startswith("LAPACK backend on the CPU (R: 3.8 MiB of host memory), which takes no budget; "
                                      "measured peak ")
    assert "budget 10" not in rank_row.detail


def test_the_group_rows_fail_a_batched_step_off_by_more_than_rounding(monkeypatch, capsys):
    """The group rows can fail: one member's batched output off by 1e-4 (far more than float32
    rounding; its gradients then differ by about that much) is FAILED, the others stay ok."""
    import torch

    import model.group
    from benchmarks import gpu_check
    real = model.group.grouped_forward

    def off(bodies, *args, **kwargs):
        grouped = real(bodies, *args, **kwargs)
        scale = torch.ones(len(bodies), 1, 1, 1)
        scale[1] += 1e-4                                                         # the MoS member
        return grouped._replace(output=grouped.output * scale)
    monkeypatch.setattr(model.group, "grouped_forward", off)
    report = gpu_check.Report()
    gpu_check.group_agreement(report, torch.device("cpu"), fast=True)
    assert [(c.name, c.ok) for c in report.checks] == [
        (f"group {head}{way}", head != "mos")
        for way in ("", ", one product per member", ", backward split by gate")
        for head in ("softmax", "mos", "mixtape")]
