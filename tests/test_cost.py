"""report.py cost: CPU hours per run and in all, from the cpu_times.jsonl that sweep.py writes."""
from __future__ import annotations

import csv
import json

import yaml

import report


def make_run(folder, name, head, times, emsize=32, seed=1, epochs=0):
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e + 1}) + "\n" for e in range(epochs)))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"head": {"name": head}, "model": {"emsize": emsize},
                                                         "train": {"seed": seed}}))
    (run_dir / "cpu_times.jsonl").write_text("".join(
        json.dumps({"script": script, "cpu_s": cpu, "user_s": cpu, "sys_s": 0.0, "wall_s": wall}) + "\n"
        for script, cpu, wall in times))
    return run_dir


def test_cost_adds_up_every_sitting_per_run_and_in_all(tmp_path, capsys):
    runs = tmp_path / "runs"
    softmax = make_run(runs, "a", "softmax", [("train.py", 3600, 3700), ("train.py", 1800, 1900),
                                             ("evaluate.py", 360, 370), ("rank.py", 180, 200)], epochs=40)
    make_run(softmax, "finetune", "softmax", [("train.py", 720, 750), ("evaluate.py", 72, 80)], epochs=6)
    make_run(runs, "b", "mos", [("train.py", 7200, 7300)], seed=2)
    out = tmp_path / "report" / "cost"
    assert report.main(["cost", str(runs), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = list(csv.DictReader(open(f"{out}.csv")))
    assert [(r["run"], r["stage"], r["train_sittings"], float(r["cpu_s"])) for r in rows] == [
        ("a", "training", "2", 5940.0), ("a/finetune", "finetuning", "1", 792.0), ("b", "training", "1", 7200.0)]
    # the training CPU time per epoch: 5,400 s over 40 epochs, 720 s over the finetuning's 6
    assert "| `a` | Softmax | 32 | 1 | training | 2 | 40 | 135.0 | 1.50 | 0.15 | 1.65 | 1.71 |" in text
    assert "| `a/finetune` | Softmax | 32 | 1 | finetuning | 1 | 6 | 120.0 |" in text
    assert "| `b` | MoS | 32 | 2 | training | 1 | 0 | - |" in text      # no epoch finished yet
    assert "| **all** |  |  |  |  | 4 | 46 |  | 3.70 | 0.17 | **3.87** |" in text
    assert "3.87 CPU-hours in all" in text and "Not counted" not in text


def test_a_run_without_cpu_times_is_named_as_not_counted(tmp_path, capsys):
    runs = tmp_path / "runs"
    make_run(runs, "a", "softmax", [("train.py", 3600, 3700)])
    (runs / "by-hand").mkdir()
    (runs / "by-hand" / "config.yaml").write_text("head: {name: mos}\n")
    assert report.main(["cost", str(runs), "--out", str(tmp_path / "c")]) == 0
    text = capsys.readouterr().out
    assert "1.00 CPU-hours in all" in text and "Not counted (no cpu_times.jsonl): `by-hand`." in text


def test_runs_without_cpu_times_are_one_line(tmp_path, capsys):
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "config.yaml").write_text("head: {name: softmax}\n")
    assert report.main(["cost", str(tmp_path / "runs"), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no run has a cpu_times.jsonl" in err and "\n" not in err


def test_a_broken_line_is_named(tmp_path, capsys):
    run = make_run(tmp_path / "runs", "a", "softmax", [("train.py", 1, 1)])
    with open(run / "cpu_times.jsonl", "a") as f:
        f.write("{oops\n")
    assert report.main(["cost", str(tmp_path / "runs"), "--out", str(tmp_path / "c")]) == 2
    assert "cpu_times.jsonl:2: not a JSON line" in capsys.readouterr().err


def test_a_broken_config_is_named(tmp_path, capsys):
    """The report commands read a run's config.yaml through one function: bad YAML is one line."""
    run = make_run(tmp_path / "runs", "a", "softmax", [("train.py", 1, 1)])
    (run / "config.yaml").write_text("head: [softmax\n")
    assert report.main(["cost", str(tmp_path / "runs"), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{run / 'config.yaml'}: not valid YAML" in err and "\n" not in err
