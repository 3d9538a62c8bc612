"""report.py cost: CPU hours per run and in all, from the cpu_times.jsonl that sweep.py writes."""
from __future__ import annotations

import csv
import json

import yaml

import report


def make_run(folder, name, head, times, emsize=32, seed=1, epochs=0, epoch_records=None):
    """A run directory: `times` its cpu_times.jsonl lines (script, CPU s, wall s[, more keys]),
    `epochs` bare metrics.jsonl records (or `epoch_records`, the records' extra keys)."""
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    records = epoch_records if epoch_records is not None else [{}] * epochs
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e + 1, **r}) + "\n"
                                                   for e, r in enumerate(records)))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"head": {"name": head}, "model": {"emsize": emsize},
                                                         "train": {"seed": seed}}))
    (run_dir / "cpu_times.jsonl").write_text("".join(
        json.dumps({"script": t[0], "cpu_s": t[1], "user_s": t[1], "sys_s": 0.0, "wall_s": t[2],
                    **(t[3] if len(t) > 3 else {})}) + "\n"
        for t in times))
    return run_dir


def cost_rows(runs, tmp_path, capsys):
    out = tmp_path / "report" / "cost"
    assert report.main(["cost", str(runs), "--out", str(out)]) == 0
    return {r["run"]: r for r in csv.DictReader(open(f"{out}.csv"))}, capsys.readouterr().out


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


NEW = {"cpu_in_metrics": True}       # a train.py line of a sweep.py that knows cpu_seconds


def test_training_is_counted_once_from_the_sittings_lines_start_up_included(tmp_path, capsys):
    """The marked train.py line holds the epochs' cpu_seconds and the sitting's start-up and last
    save: counted once, from the line (adding the epochs would double it; the epochs alone would
    leave out the 5 s outside them)."""
    runs = tmp_path / "runs"
    epochs = [{"seconds": 90.0, "cpu_seconds": 100.0}, {"seconds": 90.0, "cpu_seconds": 110.0}]
    make_run(runs, "a", "softmax", [("train.py", 215, 200, NEW), ("evaluate.py", 10, 11)], epoch_records=epochs)
    rows, text = cost_rows(runs, tmp_path, capsys)
    assert float(rows["a"]["train_cpu_s"]) == 215.0 and float(rows["a"]["cpu_s"]) == 225.0
    assert rows["a"]["record"] == "complete" and "≥" not in text
    assert "| `a` | Softmax | 32 | 1 | training | 1 | 2 | 107.5 | 0.06 |" in text
    assert "its start-up included" in text


def test_a_killed_sitting_keeps_its_epochs_cost_and_its_wall_time_is_a_lower_bound(tmp_path, capsys):
    """Four epochs of 100 s, the first two in a sitting that was killed (no line): their CPU
    time is in metrics.jsonl, their wall time nowhere."""
    runs = tmp_path / "runs"
    epochs = [{"seconds": 100.0, "cpu_seconds": 100.0}] * 4
    make_run(runs, "a", "softmax", [("train.py", 205, 210, NEW)], epoch_records=epochs)
    rows, text = cost_rows(runs, tmp_path, capsys)
    assert float(rows["a"]["train_cpu_s"]) == 400.0 and rows["a"]["record"] == "wall lower bound"
    assert "| training | ≥ 2 | 4 | 100.0 | 0.11 | 0.00 | 0.11 | ≥ 0.06 |" in text     # its line's and the killed one
    assert "a sitting of train.py ended without its line" in text and "at least" not in text


def test_a_killed_sitting_of_a_run_without_cpu_seconds_makes_its_cpu_time_a_lower_bound(tmp_path, capsys):
    """A run begun before cpu_seconds: three epochs, one sitting's line covering one of them."""
    runs = tmp_path / "runs"
    make_run(runs, "old", "mos", [("train.py", 105, 110)], epoch_records=[{"seconds": 100.0}] * 3)
    make_run(runs, "ok", "softmax", [("train.py", 3600, 3700)], epoch_records=[{"seconds": 1000.0}] * 3)
    rows, text = cost_rows(runs, tmp_path, capsys)
    assert rows["old"]["record"] == "cpu lower bound" and rows["ok"]["record"] == "complete"
    assert "| `old` | MoS | 32 | 1 | training | ≥ 2 | 3 | - | ≥ 0.03 | 0.00 | ≥ 0.03 | ≥ 0.03 |" in text
    assert "| `ok` | Softmax | 32 | 1 | training | 1 | 3 | 1200.0 | 1.00 |" in text
    assert "at least 1.03 CPU-hours in all" in text and "**≥ 1.03**" in text


def test_a_run_resumed_by_the_new_train_py_counts_both_records_and_an_estimate_is_marked(tmp_path, capsys):
    """Two epochs before cpu_seconds, from a killed sitting that a line marked "estimated" stands
    for, then two with cpu_seconds from a marked sitting."""
    runs = tmp_path / "runs"
    how = "the epochs' wall seconds times the CPU/wall ratio of the run's next sitting"
    epochs = [{"seconds": 100.0}] * 2 + [{"seconds": 100.0, "cpu_seconds": 95.0}] * 2
    make_run(runs, "a", "gss", [("train.py", 190, 200, {"estimated": how}), ("train.py", 195, 205, NEW),
                                ("rank.py", 50, 50)], epoch_records=epochs)
    rows, text = cost_rows(runs, tmp_path, capsys)
    # The lines: 190 estimated + 195 measured (the epochs' 190 and its start-up).
    assert float(rows["a"]["train_cpu_s"]) == 385.0 and rows["a"]["record"] == "sitting estimated"
    # The estimate stands for the sitting's wall time too: every figure holding it is starred.
    assert "| `a` | GSS | 32 | 1 | training | 2 | 4 | 96.2* | 0.11* | 0.01 | 0.12* | 0.13* |" in text
    assert "| **all** |  |  |  |  | 2 | 4 |  | 0.11* | 0.01 | **0.12*** | 0.13* |" in text
    assert f"*: `a`, a sitting estimated: {how}" in text and "≥" not in text


def test_each_run_names_the_processors_its_lines_ran_on(tmp_path, capsys):
    """CPU seconds of different machines differ (this project's runs: by up to 1.4 times), so the
    table says where each run's were measured; lines from before sweep.py recorded it say so."""
    runs = tmp_path / "runs"
    make_run(runs, "a", "softmax", [("train.py", 360, 370, {"processor": "AMD EPYC"}),
                                    ("rank.py", 36, 37)], epochs=3)
    make_run(runs, "b", "mos", [("train.py", 360, 370, {"processor": "AMD EPYC"})], epochs=3)
    rows, text = cost_rows(runs, tmp_path, capsys)
    assert "| 0.10 | 0.01 | 0.11 | 0.11 | AMD EPYC, unrecorded |" in text and "| 0.10 | 0.10 | AMD EPYC |" in text
    assert rows["a"]["processors"] == "AMD EPYC; unrecorded"


def test_a_run_trained_on_a_gpu_is_marked_and_left_out_of_the_cpu_totals(tmp_path, capsys):
    """GPU seeds pooled with a CPU's (the converged study's folder): their cpu_times lines hold the
    GPU host's CPU time, which is not what they cost; the table says where each run trained and
    the CPU-hours are the CPU runs'. A folder of CPU runs alone keeps its layout."""
    runs = tmp_path / "runs"
    make_run(runs, "a", "softmax", [("train.py", 3600, 3700)], epochs=2)
    (runs / "a" / "run.json").write_text(json.dumps({"device": "cpu", "device_name": "cpu (AMD EPYC)"}))
    rows, text = cost_rows(runs, tmp_path, capsys)
    assert "Trained on" not in text and "| **all** |" in text
    make_run(runs, "b", "softmax", [("train.py", 720, 600)], seed=2, epochs=2)
    (runs / "b" / "run.json").write_text(json.dumps({"device": "cuda", "device_name": "cuda (NVIDIA H200)"}))
    rows, text = cost_rows(runs, tmp_path, capsys)
    assert "1.00 CPU-hours in all (the runs trained on a CPU)" in text
    assert "1 of them trained on a GPU (Trained on)" in text
    header = next(line for line in text.splitlines() if line.startswith("| Run |"))
    assert header.endswith("| Processor | Trained on |")
    assert next(l for l in text.splitlines() if l.startswith("| `b` |")).endswith("| cuda (NVIDIA H200) |")
    assert next(l for l in text.splitlines() if l.startswith("| **all on a CPU** |")).split(" | ")[5] == "1"
