"""Every table row's config resolves and builds the parameter count [SB] prints for it:
Table 2 (docs/reference.md section 6), Table 5 and SM Tables 4/5 (docs/reference.md section 9)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import train
from analysis.published import PUBLISHED_TABLES
from launch.plans import load_plan
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
    # [SB] Table 5: MoS† and Softmax† (d = d' = 280), Softmax‡ (d = d' = 340)
    ("ptb", "fair_mos_d280"): 17_535_200, ("ptb", "fair_softmax_d280"): 16_350_800,
    ("ptb", "fair_softmax_d340"): 17_560_880,
}
PAPER = {"ptb": {"softmax": "24.22", "ss": "24.22", "gss": "24.22", "plif": "24.32", "mos": "21.50",
                 "fair_mos_d280": "17.53", "fair_softmax_d280": "16.35", "fair_softmax_d340": "17.56"},
         "wt2": {"softmax": "33.55", "ss": "33.55", "gss": "33.55", "plif": "33.65", "mos": "34.90"}}
DATASET_DIR = {"ptb": "ptb", "wikitext-2": "wt2"}


def millions(n: int) -> str:
    """A parameter count as [SB] prints it: millions truncated (not rounded) to two decimals."""
    return f"{int(n / 1e4) / 100:.2f}"


def count(config) -> int:
    with torch.device("meta"):                      # shapes only: no memory, no init time
        return count_parameters(build_model(config, VOCAB[DATASET_DIR[config.data.dataset]]))


CONFIGS = sorted(p for p in Path("configs").glob("*/*.yaml") if "base" not in p.stem)


def test_every_table_row_has_a_config():
    assert {(p.parent.name, p.stem) for p in CONFIGS} >= set(PARAMS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_config_resolves_and_builds(path):
    """Any config (a new head's too) loads strictly and builds a model of its dataset."""
    config = load_config(path)
    # configs/<dataset>/ or a variant of it, configs/<dataset>_<variant>/ (ptb_mini)
    assert DATASET_DIR[config.data.dataset] == path.parent.name.split("_")[0]
    assert count(config) > 0


@pytest.mark.parametrize("dataset, head", sorted(PARAMS))
def test_parameter_count(dataset, head):
    config = load_config(f"configs/{dataset}/{head}.yaml")
    assert head.startswith("fair_") or config.head_name == head
    assert config.train.asgd_trigger == "et" and config.train.asgd_switch_epoch == 200
    n = count(config)
    assert n == PARAMS[(dataset, head)]
    if head in PAPER[dataset]:
        assert millions(n) == PAPER[dataset][head]


@pytest.mark.parametrize("name, params", [("fair_mos_d280", 17_535_200), ("fair_softmax_d280", 16_350_800),
                                          ("fair_softmax_d340", 17_560_880)])
def test_table5_dry_run_on_the_real_vocabulary(shared_data_dir, name, params, tmp_path, capsys):
    assert train.main([f"configs/ptb/{name}.yaml", f"data.data_dir={shared_data_dir}", "--dry-run",
                       f"run.dir={tmp_path / 'never'}"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["params"] == params and summary["vocab_size"] == 10_000
    assert not (tmp_path / "never").exists()


def test_table5_rows_have_the_hyperparameters_of_sm_table9():
    rows = {name: load_config(f"configs/ptb/{name}.yaml")
            for name in ("fair_mos_d280", "fair_softmax_d280", "fair_softmax_d340")}
    for name, config in rows.items():
        m, t = config.model, config.train
        d = 340 if name.endswith("d340") else 280
        assert (m.emsize, m.nhidlast, m.nhid, t.batch_size) == (d, d, 960, 12)     # d = d'
    # (dropoute, dropouti, dropouth, dropout, embedding noise, weight decay); Softmax† has
    # none of its own in the paper and uses MoS†'s.
    table9 = {"fair_softmax_d340": (0.125, 0.28, 0.225, 0.26, 0.15, 1.5e-6),
              "fair_mos_d280": (0.1, 0.4, 0.225, 0.4, 0.10, 1.2e-6),
              "fair_softmax_d280": (0.1, 0.4, 0.225, 0.4, 0.10, 1.2e-6)}
    for name, expected in table9.items():
        m = rows[name].model
        assert (m.dropoute, m.dropouti, m.dropouth, m.dropout, m.emb_noise, rows[name].train.wdecay) == expected
    assert rows["fair_mos_d280"].head_name == "mos" and rows["fair_mos_d280"].head.components == 15


@pytest.mark.parametrize("table", ["sm-tables4-5", "sm-table12"])
def test_mos_sweeps_are_overrides_with_the_published_parameter_counts(table):
    """SM Tables 4/5 (K) and 12 (dropoutl) are configs/*/mos.yaml with head.components or
    head.dropoutl overridden; every published row's count is what [SB] prints."""
    published = PUBLISHED_TABLES[table]
    checked = 0
    for row in published.rows:
        overrides = [f"{key}={value}" for key, value in row.setting.items()]
        config = load_config(f"configs/{DATASET_DIR[row.dataset]}/mos.yaml", overrides)
        n = count(config)
        if row.params is not None:
            assert f"{millions(n)}M" == row.params, (row.dataset, row.label)
            checked += 1
        else:                                       # dropoutl does not change the count
            assert n == PARAMS[(DATASET_DIR[row.dataset], "mos")]
    assert checked == (9 if table == "sm-tables4-5" else 0)


def test_mos_component_counts_exactly():
    # K adds (nhidlast + 1) x K d_emb (latent) + nhidlast x K (prior) parameters
    for dataset, k, params in (("ptb", 5, 19_755_620), ("ptb", 10, 20_628_120), ("ptb", 20, 22_373_120),
                               ("wt2", 10, 33_929_778), ("wt2", 20, 35_889_278)):
        assert count(load_config(f"configs/{dataset}/mos.yaml", [f"head.components={k}"])) == params


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


MINI = sorted(Path("configs/ptb_mini").glob("*.yaml"))


@pytest.mark.parametrize("path", [p for p in MINI if p.stem != "base"], ids=lambda p: p.stem)
def test_the_miniature_configs_share_one_body_and_halve_sbs_dropout(path):
    """Every miniature head has the same body and training (only its head differs), nhidlast
    follows emsize (the d-sweep's grid), and every dropout rate is [SB]'s PTB rate (that of
    configs/ptb/base.yaml; dropoutl: the [SB] row's) halved."""
    mini, sb, sb_row = (load_config(p) for p in (path, "configs/ptb/softmax.yaml", f"configs/ptb/{path.stem}.yaml"))
    base = load_config("configs/ptb_mini/softmax.yaml")
    assert (mini.model, mini.train) == (base.model, base.train)
    m = mini.model
    assert (m.emsize, m.nhidlast, m.nhid, m.nlayers) == (32, 32, 256, 3)
    assert load_config(path, ["model.emsize=16"]).model.nhidlast == 16
    halved = {name: getattr(sb.model, name) / 2 for name in ("dropout", "dropouth", "dropouti", "dropoute", "wdrop")}
    assert {name: getattr(m, name) for name in halved} == pytest.approx(halved)
    if hasattr(mini.head, "dropoutl"):
        assert mini.head.dropoutl == pytest.approx(sb_row.head.dropoutl / 2)
    t = mini.train
    # the converged study's schedule (the pilot's), which the 6-epoch plans override with theirs
    assert (t.epochs, t.asgd_trigger, t.asgd_switch_epoch, t.plateau_gain, t.plateau_window) == \
        (70, "et", 30, 0.01, 5)
    for plan in ("sweeps/cpu_seven_heads.yaml", "sweeps/cpu_d_sweep.yaml"):
        short = load_config(path, list(load_plan(plan).experiments[0].overrides)).train
        assert (short.epochs, short.asgd_switch_epoch, short.plateau_gain) == (6, 4, None)
        assert short.epochs - short.asgd_switch_epoch >= short.epochs / 3   # a third of the run averaged
    assert (t.lr, t.batch_size, t.bptt, t.clip, t.alpha, t.beta, t.wdecay) == \
        (sb.train.lr, sb.train.batch_size, sb.train.bptt, sb.train.clip, sb.train.alpha, sb.train.beta, sb.train.wdecay)
