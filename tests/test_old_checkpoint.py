"""A run stopped by older code continues with today's train.py.

tests/fixtures/last_95d2751/ is a run directory (last.pt, run.json, config.yaml, metrics.jsonl)
written by the code of commit 95d2751, before train.py's checkpoint layout, run-directory checks
and logging moved into experiment/. It is the PTB Softmax model with the TINY overrides and
OLD_RUN below, on the `small_data` slice of PTB (the checkpoint's vocabulary hash is that
slice's), stopped by run.max_steps=60 five steps into epoch 2, after ET-ASGD's switch: its last.pt
holds averaged-SGD state, carried hidden states, random-number states and a validation history.
It was made with

    python train.py configs/ptb/softmax.yaml data.data_dir=SMALL_DATA <TINY> <OLD_RUN> \
        run.max_steps=60 run.dir=DIR
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

import train
from tests.conftest import TINY

PTB = "configs/ptb/softmax.yaml"
FIXTURE = Path(__file__).parent / "fixtures" / "last_95d2751"
OLD_RUN = ["model.emsize=8", "model.nhid=12", "model.nhidlast=8", "train.epochs=2",
           "train.asgd_trigger=et", "train.asgd_switch_epoch=1"]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_last_pt_of_older_code_resumes_and_ends_as_an_uninterrupted_run(small_data, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(FIXTURE, old)
    saved = torch.load(old / "last.pt", weights_only=True)
    assert saved["progress"]["step"] == 60 and saved["optimizer"]["averaged"]
    assert train.main(["--resume", str(old), f"data.data_dir={small_data}", "run.max_steps=null"]) == 0
    assert "resumed at epoch 2, step 60" in capsys.readouterr().out
    straight = tmp_path / "straight"
    assert train.main([PTB, f"data.data_dir={small_data}", *TINY, *OLD_RUN, f"run.dir={straight}"]) == 0
    resumed, expected = (torch.load(d / "last.pt", weights_only=True) for d in (old, straight))
    assert list(resumed) == list(expected)
    assert resumed["progress"]["finished"] and resumed["progress"]["step"] == expected["progress"]["step"]
    # To the last bit on the machine that wrote the fixture; another CPU's kernels may round
    # the first 60 steps differently, and a wrong resume (random numbers, hidden states, the
    # averages) differs by far more than this.
    for key, value in expected["model"].items():
        torch.testing.assert_close(resumed["model"][key], value, rtol=1e-4, atol=1e-5)
    assert [r["epoch"] for r in records(old)] == [1, 2]
    for got, want in zip(records(old), records(straight)):
        assert abs(got["val_loss"] - want["val_loss"]) < 1e-4
