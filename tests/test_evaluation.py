"""evaluation/loop.py: the perplexity loop every split, run and report uses."""
from __future__ import annotations

import pytest
import torch

from data.batching import batchify
from experiment.config import load_config
from evaluation.loop import evaluate_nll, iterate_chunks
from model import build_model
from model.heads import HEADS

from conftest import TINY, head_overrides

VOCAB = 50


def tiny_model(head: str):
    overrides = [o for o in TINY if not o.startswith("run.")] + head_overrides(head)
    config = load_config(f"configs/ptb/{head}.yaml", overrides)
    torch.manual_seed(0)
    model = build_model(config, VOCAB)
    with torch.no_grad():    # logits that vary between contexts, as in a trained model
        model.body.encoder.weight.mul_(20)
        model.head.decoder.bias.normal_()
    return model


@pytest.mark.parametrize("head", list(HEADS))
def test_evaluate_nll_is_the_mean_nll_of_the_full_log_probs_over_one_long_sequence(head):
    """evaluate_nll takes the targets-only path in bptt chunks; the reference runs the whole
    split as one sequence through forward() and its full log-probabilities."""
    model = tiny_model(head)
    source = batchify(torch.randint(VOCAB, (203,), generator=torch.Generator().manual_seed(1)), 2)
    nll = evaluate_nll(model, source, bptt=8)
    model.eval()
    with torch.no_grad():
        out = model(source[:-1], model.init_hidden(2))
        expected = -out.log_probs.gather(-1, source[1:].unsqueeze(-1)).double().mean().item()
    assert nll == pytest.approx(expected, rel=1e-6)
    chunked = torch.cat([out.log_probs.gather(-1, t.unsqueeze(-1)).view(-1)
                         for out, t in iterate_chunks(model, source, 8)])
    assert -chunked.double().mean().item() == pytest.approx(nll, rel=1e-6)


HOST_READS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")


class HostReads:
    """Counts the calls that copy a tensor's value to the host (each one waits for the device)."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self.recording(name, getattr(torch.Tensor, name)))

    def recording(self, name, method):
        def read(tensor, *args, **kwargs):
            self.calls.append(name)
            return method(tensor, *args, **kwargs)
        return read


@pytest.mark.parametrize("head", list(HEADS))
def test_evaluation_reads_the_device_once_per_split(head, monkeypatch):
    model = tiny_model(head)
    source = batchify(torch.randint(VOCAB, (400,)), 2)          # 25 chunks of 8
    expected = evaluate_nll(model, source, bptt=8)
    reads = HostReads(monkeypatch)
    assert evaluate_nll(model, source, bptt=8) == expected
    assert len(reads.calls) == 1, reads.calls
