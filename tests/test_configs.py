"""Every table row's config resolves and builds the parameter count of [SB] Table 2 (SPEC section 6)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiment.config import load_config
from model import build_model, count_parameters

VOCAB = {"ptb": 10_000, "wt2": 33_278}
# Exact counts; the papers print them truncated to two decimals (24.22M, 24.32M, 21.50M, ...).
PARAMS = {
    ("ptb", "softmax"): 24_221_600, ("ptb", "ss"): 24_221_600, ("ptb", "gss"): 24_221_600,
    ("ptb", "plif"): 24_321_600, ("ptb", "plif_frozen"): 24_221_600,
    ("ptb", "mos"): 21_500_620, ("ptb", "moc"): 21_500_620,
    ("wt2", "softmax"): 33_556_078, ("wt2", "ss"): 33_556_078, ("wt2", "gss"): 33_556_078,
    ("wt2", "plif"): 33_656_078, ("wt2", "plif_frozen"): 33_556_078,
    ("wt2", "mos"): 34_909_528, ("wt2", "moc"): 34_909_528,
}
PAPER = {"ptb": {"softmax": "24.22", "ss": "24.22", "gss": "24.22", "plif": "24.32", "mos": "21.50"},
         "wt2": {"softmax": "33.55", "ss": "33.55", "gss": "33.55", "plif": "33.65", "mos": "34.90"}}


def test_every_row_has_a_config_and_nothing_else():
    rows = {(p.parent.name, p.stem) for p in Path("configs").glob("*/*.yaml") if "base" not in p.stem}
    assert rows == set(PARAMS)


@pytest.mark.parametrize("dataset, head", sorted(PARAMS))
def test_parameter_count(dataset, head):
    config = load_config(f"configs/{dataset}/{head}.yaml")
    assert config.head_name == head
    assert config.train.asgd_trigger == "et" and config.train.asgd_switch_epoch == 200
    with torch.device("meta"):                      # shapes only: no memory, no init time
        n = count_parameters(build_model(config, VOCAB[dataset]))
    assert n == PARAMS[(dataset, head)]
    if head in PAPER[dataset]:
        assert f"{int(n / 1e4) / 100:.2f}" == PAPER[dataset][head]


def test_nt_asgd_is_one_override_away():
    config = load_config("configs/ptb/mos.yaml", ["train.asgd_trigger=nt"])
    assert config.train.asgd_trigger == "nt" and config.train.nonmono == 5


@pytest.mark.parametrize("dataset", ["ptb", "wt2"])
def test_mixture_rows_use_the_mos_hyperparameters(dataset):
    mos = load_config(f"configs/{dataset}/mos.yaml")
    expected = {"ptb": (0.4, 0.225, 20.0, 12, 28, 280, 960, 620, None, 40),
                "wt2": (0.55, 0.2, 15.0, 15, 1881, 300, 1150, 650, 5, 20)}[dataset]
    m, t = mos.model, mos.train
    assert (m.dropouti, m.dropouth, t.lr, t.batch_size, t.seed, m.emsize, m.nhid, m.nhidlast,
            t.small_batch_size, t.max_seq_len_delta) == expected
    assert (mos.head.components, mos.head.dropoutl) == (15, 0.29)
