"""report.py convergence: each run's last-window improvement and whether it converged."""
from __future__ import annotations

import csv
import json
import math

import pytest
import yaml

import report
from analysis.convergence import last_window_gain


def make_run(folder, name, head, val_ppls, switch, planned, early_stop=False, emsize=32, seed=1):
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    config = {"data": {"dataset": "ptb"}, "head": {"name": head}, "model": {"emsize": emsize},
              "train": {"epochs": planned, "seed": seed}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for epoch, ppl in enumerate(val_ppls, 1):
        record = {"epoch": epoch, "optimizer": "ASGD" if epoch > switch else "SGD", "seconds": 1.0,
                  "train_ppl": ppl, "val_ppl": ppl, "val_loss": math.log(ppl)}
        if early_stop and epoch == len(val_ppls):
            record["early_stop"] = True
        lines.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_last_window_gain_uses_the_best_so_far():
    assert last_window_gain([300, 200, 150, 149, 160, 151, 148.5, 150], 5) == pytest.approx(1 - 148.5 / 150)
    assert math.isnan(last_window_gain([300, 200, 150], 5))


def test_convergence_says_for_each_run_whether_and_why(tmp_path, capsys):
    runs = tmp_path / "runs"
    make_run(runs, "flat", "softmax", [400, 300, 200, 150, 149.5, 149.3, 149.2, 149.1, 149.0], 3, 9)
    make_run(runs, "falling", "mos", [400, 300, 200, 150, 140, 130, 120, 110, 100], 3, 9, seed=2)
    make_run(runs, "stopped", "gss", [400, 300, 200, 150, 149, 148.9], 3, 40, early_stop=True)
    # the plateau rule's stop just under 1%: shown with three decimals, not rounded up to 1.00%
    make_run(runs, "plateau", "mixtape", [400, 300, 200, 126.3564, 126.0, 125.8, 125.5, 125.3, 125.0952], 3, 70,
             early_stop=True)
    make_run(runs, "training", "ss", [400, 300, 200, 150, 140, 130, 120], 3, 40)
    make_run(runs, "young", "moc", [400, 300], 3, 40)
    make_run(runs, "short", "softmax", [400], 3, 1, seed=3)         # a one-epoch smoke run, finished
    out = tmp_path / "report" / "convergence"
    assert report.main(["convergence", str(runs), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = {row["run"]: row for row in csv.DictReader(open(f"{out}.csv"))}
    assert rows["flat"]["converged"] == "True"
    assert float(rows["flat"]["gain_last_5"]) == pytest.approx(1 - 149.0 / 150, abs=1e-6)
    assert rows["falling"]["converged"] == "False" and float(rows["falling"]["gain_last_5"]) > 0.3
    assert rows["stopped"]["converged"] == "True" and rows["stopped"]["stopped_early"] == "True"
    assert rows["training"]["converged"] == "False" and rows["young"]["gain_last_5"] == ""
    assert rows["flat"]["asgd_from"] == "4"
    assert "| Softmax | 32 | 1 | 9 of 9 | 4 | 149.00 (9) | 0.667% | yes: under 1% over the last 5 epochs |" in text
    assert "| 0.998% | yes: under 1% over the last 5 epochs (its early stop ended it after epoch 9) |" in text
    assert "| MoS | 32 | 2 | 9 of 9 | 4 | 100.00 (9) |" in text and "no: 9 epochs trained, still improving" in text
    assert "yes: the early-stop rule ended it after epoch 6" in text
    assert "not yet (training)" in text and "not yet: 2 epochs, fewer than 6" in text
    assert "| 1 of 1 | - | 400.00 (1) | - | cannot tell: 1 epoch, all it planned, fewer than the 6 the rule reads |" in text
    assert (tmp_path / "report" / "convergence.md").read_text() == text.rstrip("\n") + "\n"
    # a wider tolerance: the falling run still has not converged, the training one has not either
    assert report.main(["convergence", str(runs), "--out", str(out), "--gain", "0.05", "--window", "2"]) == 0
    rows = {row["run"]: row for row in csv.DictReader(open(f"{out}.csv"))}
    assert rows["falling"]["converged"] == "False" and float(rows["falling"]["gain_last_2"]) == pytest.approx(1 - 100 / 120, abs=1e-6)


@pytest.mark.parametrize("args, message", [(["--gain", "1.5"], "--gain: expected a fraction in (0, 1)"),
                                           (["--window", "0"], "--window: expected an integer >= 1")])
def test_bad_options_are_one_line(args, message, tmp_path, capsys):
    make_run(tmp_path / "runs", "a", "softmax", [300, 200], 1, 2)
    with pytest.raises(SystemExit) as stop:
        report.main(["convergence", str(tmp_path / "runs"), "--out", str(tmp_path / "c"), *args])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_run_without_an_epoch_is_one_line(tmp_path, capsys):
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    (tmp_path / "runs" / "empty" / "config.yaml").write_text("head: {name: softmax}\n")
    assert report.main(["convergence", str(tmp_path / "runs"), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("no metrics.jsonl (no epoch finished yet)") and "\n" not in err
