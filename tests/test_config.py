"""Config loading: base files, overrides, strict validation with one-line errors."""
from __future__ import annotations

import subprocess
import sys

import pytest

from experiment.config import ConfigError, config_from_dict, load_config

PTB = "configs/ptb/softmax.yaml"


def error_of(path=PTB, overrides=()):
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_head_file_merges_over_its_base():
    config = load_config(PTB)
    assert config.data.dataset == "ptb" and config.head_name == "softmax"
    assert (config.model.emsize, config.model.nhid, config.train.lr, config.train.seed) == (400, 1150, 20.0, 141)
    wt2 = load_config("configs/wt2/softmax.yaml")
    assert (wt2.model.dropouti, wt2.model.dropouth, wt2.train.lr, wt2.train.batch_size) == (0.65, 0.2, 30.0, 80)


def test_overrides_are_typed():
    config = load_config(PTB, ["train.lr=30", "train.small_batch_size=10", "run.tensorboard=false",
                               "train.asgd_trigger=nt", "model.dropout=0"])
    assert config.train.lr == 30.0 and isinstance(config.train.lr, float)
    assert config.small_batch_size == 10
    assert config.run.tensorboard is False and config.train.asgd_trigger == "nt"
    assert load_config(PTB).small_batch_size == 20      # null means the whole batch


@pytest.mark.parametrize("override, expected", [
    ("train.lr=abc", "train.lr: expected a number, got 'abc'"),
    ("train.batch_size=2.5", "train.batch_size: expected an integer"),
    ("train.foo=1", "unknown key train.foo"),
    ("model.dropout=1.5", "model.dropout: expected a probability in [0, 1), got 1.5"),
    ("model.wdrop=-0.1", "model.wdrop: expected a probability"),
    ("train.lr=0", "train.lr: expected a value > 0"),
    ("train.asgd_trigger=sometimes", "train.asgd_trigger: expected one of 'et', 'nt', 'start', 'never'"),
    ("run.tensorboard=maybe", "run.tensorboard: expected true or false"),
    ("head.name=nope", "head.name: expected one of"),
    ("head.k=2", "unknown key head.k"),
    ("model.nhidlast=300", "nhidlast must equal emsize"),
    ("train.small_batch_size=21", "small_batch_size: expected at most batch_size"),
    ("run.device=gpu", "run.device: expected auto"),
    ("lr=3", "unknown section 'lr'"),
    ("train.lr", "expected key=value"),
])
def test_bad_values_name_the_override_and_key(override, expected):
    message = error_of(overrides=[override])
    assert expected in message
    if "=" in override:
        assert f"override {override!r}" in message


def test_errors_in_files_name_the_file(tmp_path):
    (tmp_path / "base.yaml").write_text("data: {dataset: ptb}\nmodel: {emsize: 4, nhid: 4, nhidlast: 4}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: base.yaml\nhead: {name: softmax}\ntrain: {lr: 1, batch_size: 2, epochs: 1, seed: 1, bptt: fast}\n")
    message = error_of(bad)
    assert str(bad) in message and "train.bptt: expected an integer, got 'fast'" in message
    missing = tmp_path / "missing.yaml"
    missing.write_text("base: base.yaml\nhead: {name: softmax}\ntrain: {lr: 1, batch_size: 2, seed: 1}\n")
    assert "missing required key train.epochs" in error_of(missing)
    assert "config file not found" in error_of(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [1, 2\n")
    assert "not valid YAML" in error_of(broken)
    loop = tmp_path / "loop.yaml"
    loop.write_text("base: loop.yaml\n")
    assert "cycle" in error_of(loop)


def test_resolved_config_round_trips():
    config = load_config(PTB, ["train.lr=7", "run.max_steps=3"])
    assert config_from_dict(config.to_dict()) == config


def test_train_py_reports_one_line_and_starts_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "train.py", PTB, "model.dropout=1.5",
                           f"run.dir={tmp_path / 'run'}"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: override 'model.dropout=1.5': model.dropout: expected a probability in [0, 1), got 1.5"
    assert not (tmp_path / "run").exists()
