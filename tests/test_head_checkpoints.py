"""Weights saved by older code load into today's heads and give the same outputs.

tests/fixtures/heads_17f87ca.pt was written by the code of commit 17f87ca, before the heads
shared their decoder and their log_softmax(f(l)) form: for every registry head a tiny
LanguageModel (2 LSTM layers, V = 13, d_emb = 6) with perturbed weights, its state_dict, the
order of its parameters and its outputs in eval mode on fixed word ids; and the same for the
synthetic experiment's monotone network on a fixed g. Loading is strict, so every name in
those state_dicts (`head.decoder.bias`, `head.v`, ...) must still exist, and nothing new may.
The outputs are compared to float32 rounding, not bit for bit: on another CPU than the one
that wrote the fixture (an AMD EPYC here) the same code differs in the last bit or two (up to
4.8e-7), through its BLAS kernels; a weight in the wrong place differs by far more.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bottleneck.monotone import MonotoneHead
from model import LanguageModel
from model.body import AWDLSTMBody
from model.heads import HEADS

FIXTURE = torch.load(Path(__file__).parent / "fixtures" / "heads_17f87ca.pt", weights_only=True)


def assert_same_outputs(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=2e-6)


def test_the_fixture_covers_every_head_the_registry_had_then():
    # Heads added since (Mixtape) had no checkpoints before them; the registry keeps its order.
    assert list(HEADS)[:len(FIXTURE["models"])] == list(FIXTURE["models"])
    assert len(FIXTURE["models"]) == 7


@pytest.mark.parametrize("name", list(FIXTURE["models"]))
def test_an_old_model_state_dict_loads_strictly_and_gives_the_same_outputs(name):
    saved, sizes = FIXTURE["models"][name], FIXTURE["sizes"]
    head_class = HEADS[name]
    body = AWDLSTMBody(sizes["vocab"], sizes["emsize"], sizes["nhid"], saved["nhidlast"],
                       sizes["nlayers"], 0.4, 0.3, 0.4, 0.1, 0.5)
    head = head_class(head_class.Options(**saved["options"]), sizes["vocab"], sizes["emsize"],
                      saved["nhidlast"], body.encoder.weight)
    model = LanguageModel(body, head).eval()
    model.load_state_dict(saved["state_dict"], strict=True)
    assert list(model.state_dict()) == list(saved["state_dict"])
    # last.pt stores the optimizer's state by parameter position, so the order must hold too.
    assert [n for n, _ in model.named_parameters()] == saved["parameter_names"]
    ids, targets = FIXTURE["ids"], FIXTURE["targets"]
    with torch.no_grad():
        out = model(ids, model.init_hidden(ids.shape[1]))
        target_log_probs = model(ids, model.init_hidden(ids.shape[1]), targets).target_log_probs
    assert_same_outputs(out.log_probs, saved["log_probs"])
    if saved["transformed_logits"] is None:
        assert out.transformed_logits is None
    else:
        assert_same_outputs(out.transformed_logits, saved["transformed_logits"])
    assert_same_outputs(target_log_probs, saved["target_log_probs"])


def test_an_old_monotone_head_state_dict_loads_strictly_and_gives_the_same_outputs():
    saved, sizes = FIXTURE["monotone"], FIXTURE["sizes"]
    weight = torch.nn.Parameter(torch.zeros(sizes["vocab"], sizes["emsize"]))
    head = MonotoneHead(MonotoneHead.Options(**saved["options"]), sizes["vocab"],
                        sizes["emsize"], sizes["emsize"], weight).eval()
    head.load_state_dict(saved["state_dict"], strict=True)
    assert list(head.state_dict()) == list(saved["state_dict"])
    assert [n for n, _ in head.named_parameters()] == saved["parameter_names"]
    with torch.no_grad():
        out = head(saved["g"])
    assert_same_outputs(out.log_probs, saved["log_probs"])
    assert_same_outputs(out.transformed_logits, saved["transformed_logits"])
