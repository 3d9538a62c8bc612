"""Every head in the registry trains, checkpoints and resumes through the same train.py."""
from __future__ import annotations

import pytest
import torch

import train
from model.heads import HEADS
from tests.conftest import TINY, head_overrides


def run(head, small_data, run_dir, *extra):
    return train.main([f"configs/ptb/{head}.yaml", f"data.data_dir={small_data}", *TINY,
                       *head_overrides(head), "train.small_batch_size=2", *extra,
                       f"run.dir={run_dir}"])


@pytest.mark.parametrize("head", list(HEADS))
def test_a_resumed_run_equals_an_uninterrupted_one(head, small_data, tmp_path):
    assert run(head, small_data, tmp_path / "straight", "run.max_steps=6") == 0
    assert run(head, small_data, tmp_path / "resumed", "run.max_steps=3") == 0
    assert train.main(["--resume", str(tmp_path / "resumed"), "run.max_steps=6"]) == 0
    straight = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed" / "last.pt", weights_only=True)
    assert resumed["progress"]["step"] == 6
    for key, tensor in straight["model"].items():
        assert torch.equal(tensor, resumed["model"][key]), key
        assert torch.isfinite(tensor).all(), key


def test_frozen_plif_slopes_do_not_move_and_are_checkpointed(small_data, tmp_path):
    assert run("plif_frozen", small_data, tmp_path / "frozen", "run.max_steps=1") == 0
    first = torch.load(tmp_path / "frozen" / "last.pt", weights_only=True)["model"]
    assert train.main(["--resume", str(tmp_path / "frozen"), "run.max_steps=8"]) == 0
    later = torch.load(tmp_path / "frozen" / "last.pt", weights_only=True)["model"]
    assert torch.equal(first["head.v"], later["head.v"])                     # saved, and unchanged
    assert not torch.equal(first["head.decoder.bias"], later["head.decoder.bias"])   # it did train
    # the learnt variant does move its slopes, with their own learning rate
    assert run("plif", small_data, tmp_path / "learnt", "run.max_steps=1") == 0
    start = torch.load(tmp_path / "learnt" / "last.pt", weights_only=True)["model"]["head.v"]
    assert train.main(["--resume", str(tmp_path / "learnt"), "run.max_steps=8"]) == 0
    end = torch.load(tmp_path / "learnt" / "last.pt", weights_only=True)["model"]["head.v"]
    assert not torch.equal(start, end)
