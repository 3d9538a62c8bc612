"""report.py curves, versus and methods (the CPU results' figures and tables) on run directories
written by hand (no training)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

import report
from analysis.runs import head_label
from analysis.stats import format_p
from tests.test_tables import make_run


def cpu_run(root: Path, head: str, seed: int, d: int = 32, val_ppl=(500.0, 300.0, 250.0, 240.0),
            switch_after: int | None = 2, **kwargs) -> Path:
    """make_run's directory with model.emsize in its config and ASGD in its metrics."""
    losses = [math.log(p) for p in val_ppl]
    run = make_run(root, f"ptb-{head}-model.emsize={d}-seed{seed}", head, seed, val_losses=losses,
                   seconds=(10.0,) * len(losses), epochs=len(losses), **kwargs)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"] = {"emsize": d, "nhidlast": d}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        r["optimizer"] = "ASGD" if switch_after is not None and r["epoch"] > switch_after else "SGD"
        r["switched_to_asgd"] = r["epoch"] == switch_after
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def ranked_runs(root: Path, runs) -> Path:
    """Evaluated and ranked runs: (head, seed, d, test ppl, Press rank) each."""
    for head, seed, d, test_ppl, press_rank in runs:
        cpu_run(root, head, seed, d=d, test_ppl=test_ppl, press_rank=press_rank)
    return root


def test_curves_draw_the_mean_and_range_per_head_with_the_switch(tmp_path, capsys):
    root = tmp_path / "runs"
    cpu_run(root, "softmax", 1, val_ppl=(500.0, 300.0, 250.0, 240.0))
    cpu_run(root, "softmax", 2, val_ppl=(520.0, 320.0, 270.0, 260.0))
    cpu_run(root, "mos", 1, val_ppl=(480.0, 290.0, 230.0))          # one epoch fewer
    out = tmp_path / "report" / "curves"
    assert report.main(["curves", str(root), "--out", str(out)]) == 0
    text = (tmp_path / "report" / "curves.md").read_text()
    assert (tmp_path / "report" / "curves.png").stat().st_size > 10_000
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert lines[0] == "| epoch | Softmax (n = 2) | MoS (n = 1) |"
    assert lines[1] == "| 1 | 510.0 (500.0–520.0) | 480.0 |"
    assert lines[3] == "| 3 | 260.0 (250.0–270.0) † | 230.0 † |"       # ASGD after epoch 2
    assert lines[4] == "| 4 | 250.0 (240.0–260.0) † |  |"


def test_versus_gives_test_ppl_and_rank_against_the_key(tmp_path, capsys):
    root = ranked_runs(tmp_path / "runs", [("softmax", 1, 16, 300.0, 18), ("softmax", 1, 32, 250.0, 34),
                                           ("softmax", 2, 32, 260.0, 34), ("mos", 1, 16, 280.0, 9000)])
    out = tmp_path / "versus"
    assert report.main(["versus", str(root), "--key", "model.emsize", "--out", str(out)]) == 0
    text = (tmp_path / "versus.md").read_text()
    assert "| Softmax | 300.00 (n = 1) | 255.00 ± 7.07 (n = 2) | 18 | 34 ± 0 (n = 2) |" in text
    assert "| MoS | 280.00 (n = 1) |  | 9,000 |  |" in text
    # the change against Softmax at the same d: 280 / 300 - 1, one run each so no interval; none
    # where Softmax or MoS is missing
    assert ("| head | model.emsize = 16 | model.emsize = 32 |\n|---|---|---|\n"
            "| MoS | -6.7% (n = 1: no interval) |  |") in text
    with open(tmp_path / "versus.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["head"], r["model.emsize"], r["runs"], r["press_rank"]) for r in rows] == \
        [("softmax", "16", "1", "18.0"), ("softmax", "32", "2", "34.0"), ("mos", "16", "1", "9000.0")]
    assert (tmp_path / "versus.png").is_file()
    # a key the runs do not have is one line
    assert report.main(["versus", str(root), "--key", "model.nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: --key model.nope: no run's config.yaml has this key (a config key, e.g. "
                   "model.emsize)"), err
    # a key every run shares: the table of its one value, and a note that says why nothing is compared
    assert report.main(["versus", str(root), "--only", "model.emsize=32", "--key", "model.emsize",
                        "--out", str(out)]) == 0
    text = (tmp_path / "versus.md").read_text()
    assert "Every run here has model.emsize = 32: no gain across values of model.emsize" in text
    assert "note: versus --key model.emsize: every run has model.emsize = 32" in capsys.readouterr().err


def test_versus_gives_each_gain_and_the_gains_difference_with_intervals(tmp_path):
    """Known answers: the gain at each d is Welch's interval on log test ppl (scipy's), the
    difference of the gains between two d's the four-cell interval worked by hand."""
    test_ppl = {("softmax", 16): [300.0, 310.0, 305.0], ("mos", 16): [280.0, 284.0],
                ("softmax", 32): [250.0, 262.0], ("mos", 32): [238.0, 240.0, 236.0]}
    root = ranked_runs(tmp_path / "runs", [(head, seed, d, ppl, 100) for (head, d), ppls in test_ppl.items()
                                           for seed, ppl in enumerate(ppls, 1)])
    assert report.main(["versus", str(root), "--key", "model.emsize", "--out", str(tmp_path / "v")]) == 0
    text = (tmp_path / "v.md").read_text()
    logs = {cell: np.log(values) for cell, values in test_ppl.items()}
    for d in (16, 32):
        welch = stats.ttest_ind(logs["mos", d], logs["softmax", d], equal_var=False)
        low, high = welch.confidence_interval(0.95)
        change = 100 * math.expm1(logs["mos", d].mean() - logs["softmax", d].mean())
        assert (f"{change:+.1f}% [{100 * math.expm1(low):+.1f}, {100 * math.expm1(high):+.1f}], "
                f"p = {welch.pvalue:.2g}") in text
    samples = [logs["mos", 16], logs["softmax", 16], logs["mos", 32], logs["softmax", 32]]
    value = (samples[0].mean() - samples[1].mean()) - (samples[2].mean() - samples[3].mean())
    terms = [s.var(ddof=1) / s.size for s in samples]
    df = sum(terms) ** 2 / sum(t ** 2 / (s.size - 1) for t, s in zip(terms, samples))
    half = stats.t.ppf(0.975, df) * math.sqrt(sum(terms))
    p = 2 * stats.t.sf(abs(value) / math.sqrt(sum(terms)), df)
    between = text.split("How the gain differs")[1].split("## Each head")[0]
    assert "| head | model.emsize = 16 against 32 |" in between
    row = next(line for line in between.splitlines() if line.startswith("| MoS |"))
    assert row == (f"| MoS | {100 * math.expm1(value):+.1f}% [{100 * math.expm1(value - half):+.1f}, "
                   f"{100 * math.expm1(value + half):+.1f}], p = {p:.2g} |")
    # and each head against Softmax at their common epoch (all four stop at epoch 4 here)
    assert "| MoS, model.emsize = 16 | 4, 4 | 4, 4, 4 | 4 |" in text


def test_versus_averages_a_gain_over_the_values_and_sets_each_head_against_itself(tmp_path):
    """Known answers: the gain averaged over d is a one-sample t over each d's difference of mean
    log test ppl (scipy's ttest_1samp, one run at d = 64 included); each head at a higher d against
    itself at a lower, Welch (scipy's) with Holm's p over the pairs, cells of one run left out."""
    test_ppl = {("softmax", 16): [300.0, 310.0], ("mos", 16): [280.0, 290.0],
                ("softmax", 32): [250.0, 262.0, 255.0], ("mos", 32): [238.0, 240.0, 236.0],
                ("softmax", 64): [200.0, 204.0], ("mos", 64): [193.0]}
    root = ranked_runs(tmp_path / "runs", [(head, seed, d, ppl, 100) for (head, d), ppls in test_ppl.items()
                                           for seed, ppl in enumerate(ppls, 1)])
    assert report.main(["versus", str(root), "--key", "model.emsize", "--out", str(tmp_path / "v")]) == 0
    text = (tmp_path / "v.md").read_text()
    logs = {cell: np.log(values) for cell, values in test_ppl.items()}
    gains = [logs["mos", d].mean() - logs["softmax", d].mean() for d in (16, 32, 64)]
    one_sample = stats.ttest_1samp(gains, 0.0)
    low, high = one_sample.confidence_interval(0.95)
    assert (f"| MoS | 16, 32, 64 | {100 * math.expm1(np.mean(gains)):+.1f}% [{100 * math.expm1(low):+.1f}, "
            f"{100 * math.expm1(high):+.1f}], p = {format_p(one_sample.pvalue)} | {format_p(one_sample.pvalue)} |") in text
    own = text.split("## Each head against itself at another model.emsize")[1].split("\nWhere")[0]
    expected = []
    for head, high_d, low_d in (("softmax", 32, 16), ("softmax", 64, 16), ("softmax", 64, 32), ("mos", 32, 16)):
        welch = stats.ttest_ind(logs[head, high_d], logs[head, low_d], equal_var=False)
        w_low, w_high = welch.confidence_interval(0.95)
        change = 100 * math.expm1(logs[head, high_d].mean() - logs[head, low_d].mean())
        expected.append((f"{head_label(head)}, model.emsize = {high_d} against model.emsize = {low_d}",
                         f"{change:+.1f}% [{100 * math.expm1(w_low):+.1f}, {100 * math.expm1(w_high):+.1f}], "
                         f"p = {format_p(welch.pvalue)}", welch.pvalue))
    rows = [line.split(" | ") for line in own.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0][-1] == "Holm's p (over the 4 pairs) |"
    assert [(r[0].lstrip("| "), r[2]) for r in rows[1:]] == [(pair, interval) for pair, interval, _ in expected]
    smallest = min(p for *_, p in expected)
    assert any(r[3] == f"{format_p(4 * smallest)} |" for r in rows[1:])      # the smallest p, times 4
    assert "MoS, model.emsize = 64" not in own                         # one run: no interval
    alone = text.split("gain over these values of model.emsize alone |")[1]
    assert "| MoS | 16, 32, 64 | " + f"{100 * math.expm1(np.mean(gains)):+.1f}% (n = 1: no interval) |" in alone


def test_versus_reads_the_averaged_gain_over_these_values_alone_with_their_seed_noise(tmp_path):
    """Known answer: the same mean of the three gains, read over these d's alone, has as its noise
    each cell's seed noise only: weights +-1/3 over the six cells, Welch-Satterthwaite's degrees of
    freedom (written out here), a narrower interval than the one-sample t's over the gains."""
    test_ppl = {("softmax", 16): [300.0, 310.0], ("mos", 16): [280.0, 290.0],
                ("softmax", 32): [250.0, 262.0, 255.0], ("mos", 32): [238.0, 240.0, 236.0],
                ("softmax", 64): [200.0, 204.0], ("mos", 64): [193.0, 195.0]}
    root = ranked_runs(tmp_path / "runs", [(head, seed, d, ppl, 100) for (head, d), ppls in test_ppl.items()
                                           for seed, ppl in enumerate(ppls, 1)])
    assert report.main(["versus", str(root), "--key", "model.emsize", "--out", str(tmp_path / "v")]) == 0
    text = (tmp_path / "v.md").read_text()
    logs = {cell: np.log(values) for cell, values in test_ppl.items()}
    value = sum(logs["mos", d].mean() - logs["softmax", d].mean() for d in (16, 32, 64)) / 3
    terms = [logs[cell].var(ddof=1) / logs[cell].size / 9 for cell in logs]
    df = sum(terms) ** 2 / sum(term ** 2 / (logs[cell].size - 1) for term, cell in zip(terms, logs))
    se = math.sqrt(sum(terms))
    half, p = stats.t.ppf(0.975, df) * se, 2 * stats.t.sf(abs(value) / se, df)
    alone = text.split("gain over these values of model.emsize alone |")[1].split("\n\n")[0]
    assert (f"| MoS | 16, 32, 64 | {100 * math.expm1(value):+.1f}% [{100 * math.expm1(value - half):+.1f}, "
            f"{100 * math.expm1(value + half):+.1f}], p = {format_p(p)} |") in alone


def test_methods_puts_plain_cache_and_dynamic_side_by_side(tmp_path, capsys):
    root = tmp_path / "runs"
    run = cpu_run(root, "softmax", 2, test_ppl=200.0)
    (run / "eval_best.json").write_text(json.dumps({"val_ppl": 210.0, "test_ppl": 200.0}))
    finetuned = run / "finetune"
    finetuned.mkdir()
    for name, (val, test) in {"eval_best.json": (205.0, 195.0), "eval_best_cache.json": (180.0, 170.0),
                              "eval_best_dynamic.json": (175.5, 165.25)}.items():
        (finetuned / name).write_text(json.dumps({"val_ppl": val, "test_ppl": test}))
    cpu_run(root, "mos", 1, test_ppl=190.0)            # neither finetuned nor evaluated with a method
    out = tmp_path / "methods"
    assert report.main(["methods", str(root), "--out", str(out)]) == 0
    text = (tmp_path / "methods.md").read_text()
    assert "| Softmax (seed 2) | trained | 210.00 | — | — | 200.00 | — | — |" in text
    assert "| Softmax (seed 2) | finetuned | 205.00 | 180.00 | 175.50 | 195.00 | 170.00 | 165.25 |" in text
    assert "MoS" not in text
    with open(tmp_path / "methods.csv", newline="") as f:
        assert [(r["head"], r["emsize"], r["weights"]) for r in csv.DictReader(f)] == [
            ("softmax", "32", "trained"), ("softmax", "32", "finetuned")]
    # Runs of several d, as a d-sweep's: each row names its d.
    for d in (16, 64):
        swept = cpu_run(tmp_path / "sweep", "softmax", 1, d=d)
        (swept / "eval_best_cache.json").write_text(json.dumps({"val_ppl": 150.0 - d, "test_ppl": 140.0 - d}))
    assert report.main(["methods", str(tmp_path / "sweep"), "--out", str(out)]) == 0
    text = (tmp_path / "methods.md").read_text()
    assert "| Softmax, d = 16 (seed 1) | trained |" in text and "| Softmax, d = 64 (seed 1) | trained |" in text
    empty = tmp_path / "empty"
    cpu_run(empty, "mos", 1, test_ppl=190.0)
    assert report.main(["methods", str(empty), "--out", str(out)]) == 2
    assert "no run was finetuned" in capsys.readouterr().err


def test_methods_set_the_cells_seeds_together_with_intervals(tmp_path):
    """Known answers: each head against Softmax under each method, Welch on log test ppl
    (scipy's); each method against plain within a cell, a one-sample t on each run's log ratio
    (scipy's ttest_1samp); a cell of one run gets no interval."""
    plain = {("softmax", 1): 200.0, ("softmax", 2): 204.0, ("mos", 1): 190.0, ("mos", 2): 193.0}
    cache = {("softmax", 1): 186.0, ("softmax", 2): 191.0, ("mos", 1): 180.0, ("mos", 2): 181.5}
    root = tmp_path / "runs"
    for (head, seed), ppl in plain.items():
        run = cpu_run(root, head, seed)
        (run / "eval_best.json").write_text(json.dumps({"val_ppl": 1.0, "test_ppl": ppl}))
        (run / "eval_best_cache.json").write_text(json.dumps({"val_ppl": 1.0, "test_ppl": cache[head, seed]}))
    (root / "ptb-mos-model.emsize=32-seed1" / "eval_best_dynamic.json").write_text(
        json.dumps({"val_ppl": 1.0, "test_ppl": 170.0}))
    assert report.main(["methods", str(root), "--out", str(tmp_path / "m")]) == 0
    text = (tmp_path / "m.md").read_text()

    def interval(result, value):
        low, high = result.confidence_interval(0.95)
        return (f"{100 * math.expm1(value):+.1f}% [{100 * math.expm1(low):+.1f}, "
                f"{100 * math.expm1(high):+.1f}], p = {format_p(result.pvalue)}")
    logs = {method: {head: np.log([values[head, s] for s in (1, 2)]) for head in ("softmax", "mos")}
            for method, values in (("plain", plain), ("cache", cache))}
    against = [interval(stats.ttest_ind(logs[m]["mos"], logs[m]["softmax"], equal_var=False),
                        logs[m]["mos"].mean() - logs[m]["softmax"].mean()) for m in ("plain", "cache")]
    # no Softmax run was evaluated dynamically: nothing to set MoS's one dynamic run against
    assert f"| MoS, trained | {against[0]} | {against[1]} |  |" in text
    for head in ("softmax", "mos"):
        ratios = logs["cache"][head] - logs["plain"][head]
        within = interval(stats.ttest_1samp(ratios, 0.0), ratios.mean())
        assert f"| {head_label(head)}, trained | {within} |" in text, within
    gain = 100 * math.expm1(math.log(170.0 / 190.0))
    assert f"| MoS, trained | {interval(stats.ttest_1samp(logs['cache']['mos'] - logs['plain']['mos'], 0.0), (logs['cache']['mos'] - logs['plain']['mos']).mean())} | {gain:+.1f}% (n = 1: no interval) |" in text


def test_methods_name_their_settings_and_pool_only_runs_evaluated_alike(tmp_path, capsys):
    """The report lists each method's settings; a cell whose seeds ran the cache at different
    settings is refused in one line, while runs searched on validation (each its own pair) pool."""
    root = tmp_path / "runs"
    published = {"window": 500, "theta": 1.0, "lam": 0.1, "bptt": 5000, "start": "reference"}
    for seed in (1, 2):
        run = cpu_run(root, "softmax", seed)
        (run / "eval_best.json").write_text(json.dumps({"val_ppl": 1.0, "test_ppl": 200.0 + seed}))
        (run / "eval_best_cache.json").write_text(json.dumps(
            {"val_ppl": 1.0, "test_ppl": 190.0 + seed, "settings": {**published, "theta": 0.5 * seed, "lam": 0.2},
             "search": {"thetas": [0.5, 1.0], "lambdas": [0.2], "val_ppl": [[1.0], [1.0]]}}))
    assert report.main(["methods", str(root), "--out", str(tmp_path / "m")]) == 0
    text = (tmp_path / "m.md").read_text()
    assert ("- cache: window 500, bptt 5000, start reference, theta, lam searched on valid (every run)"
            in text), text
    (root / "ptb-softmax-model.emsize=32-seed2" / "eval_best_cache.json").write_text(json.dumps(
        {"val_ppl": 1.0, "test_ppl": 191.0, "settings": {**published, "lam": 0.0}}))
    capsys.readouterr()
    assert report.main(["methods", str(root), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Softmax, trained: its runs' cache results were computed at different settings (")
    assert "\n" not in err and "lam 0.0" in err and "searched on valid" in err


def test_methods_pool_and_compare_plain_results_only_at_the_same_batch_sizes(tmp_path, capsys):
    """Plain evaluation's settings are its batch sizes: a cell whose seeds were evaluated at
    different test batch sizes, or a head whose plain numbers are at another batch size than
    Softmax's in the same cell, is refused in one line rather than pooled or compared."""
    root = tmp_path / "runs"
    for head, seed, test_batch in (("softmax", 1, 1), ("softmax", 2, 1), ("mos", 1, 1), ("mos", 2, 1)):
        run = cpu_run(root, head, seed)
        (run / "eval_best.json").write_text(json.dumps(
            {"val_ppl": 1.0, "test_ppl": 200.0 + seed, "val_batch_size": 10, "test_batch_size": test_batch}))
        (run / "eval_best_cache.json").write_text(json.dumps({"val_ppl": 1.0, "test_ppl": 190.0 + seed}))
    assert report.main(["methods", str(root), "--out", str(tmp_path / "m")]) == 0
    assert "- plain: valid batch size 10, test batch size 1 (every run)" in (tmp_path / "m.md").read_text()
    # a plain result at another test batch size than the run's own is not the run's (as in a
    # table): left out with its note, not pooled
    mos2 = root / "ptb-mos-model.emsize=32-seed2" / "eval_best.json"
    mos2.write_text(json.dumps({"val_ppl": 1.0, "test_ppl": 150.0, "val_batch_size": 10, "test_batch_size": 10}))
    assert report.main(["methods", str(root), "--out", str(tmp_path / "m")]) == 0
    markdown = (tmp_path / "m.md").read_text()
    assert (f"- `{mos2.parent}`: eval_best.json is at test batch size 10, the run's train.test_batch_size "
            f"is 1: run python evaluate.py {mos2.parent}") in markdown
    mos2.write_text(json.dumps({"val_ppl": 1.0, "test_ppl": 150.0, "val_batch_size": 10, "test_batch_size": 1}))
    # a method's seeds at different settings are not one measurement; nor a head's against Softmax's
    cache = {"val_ppl": 1.0, "test_ppl": 150.0}
    (mos2.parent / "eval_best_cache.json").write_text(json.dumps({**cache, "settings": {"theta": 0.3}}))
    capsys.readouterr()
    assert report.main(["methods", str(root), "--out", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == (
        "error: MoS, trained: its runs' cache results were computed at different settings (not recorded / "
        "theta 0.3): evaluate them alike, or choose runs with --only\n")
    (root / "ptb-mos-model.emsize=32-seed1" / "eval_best_cache.json").write_text(
        json.dumps({**cache, "settings": {"theta": 0.3}}))
    assert report.main(["methods", str(root), "--out", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == (
        "error: MoS, trained and Softmax, trained: their cache results were computed at different settings "
        "(theta 0.3 / not recorded): evaluate them alike, or choose runs with --only\n")


def test_methods_refuse_unlike_runs_in_a_cell_and_say_the_seeds_they_leave_out(tmp_path, capsys):
    """A newcomer's cell pooled a WikiText-2 run with PTB's, and a MoS at another lr; a cell's
    seeds evaluated plainly only were left out without a word."""
    import yaml
    root = tmp_path / "runs"
    for head, seed in (("softmax", 1), ("softmax", 2), ("mos", 1), ("mos", 2), ("mos", 3)):
        run = cpu_run(root, head, seed)
        (run / "eval_best.json").write_text(json.dumps({"val_ppl": 1.0, "test_ppl": 200.0 + seed}))
        if seed < 3:
            (run / "eval_best_cache.json").write_text(json.dumps({"val_ppl": 1.0, "test_ppl": 190.0 + seed}))
    assert report.main(["methods", str(root), "--out", str(tmp_path / "m")]) == 0
    assert ("A cell holds only its runs above. Seeds of these cells evaluated plainly only, neither finetuned "
            "nor with a method, are not in them (MoS 1); report.py table pools every seed.") in \
        (tmp_path / "m.md").read_text()
    config_path = root / "ptb-mos-model.emsize=32-seed2" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["train"]["lr"] = 5
    config_path.write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert report.main(["methods", str(root), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: MoS at d = 32: the runs are not seeds of one configuration, they differ in "
                          "train.lr (") and err.count("\n") == 1, err


def test_a_test_ppl_at_another_batch_size_than_the_runs_own_is_listed_not_pooled(tmp_path):
    root = tmp_path / "runs"
    for seed in (1, 2):
        run = cpu_run(root, "softmax", seed, test_ppl=200.0 + seed)
    (run / "eval_best.json").write_text(json.dumps({"test_ppl": 150.0, "test_batch_size": 10}))
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    text = (tmp_path / "t.md").read_text()
    assert (f"test_ppl (eval_best.json is at test batch size 10, the run's train.test_batch_size is 1: "
            f"run python evaluate.py {run})") in text.split("## Missing or incomplete")[1]
    assert "150.00" not in text and "201.00" in text


def test_curves_of_a_run_without_an_epoch_is_one_line(tmp_path, capsys):
    run = cpu_run(tmp_path / "runs", "softmax", 1)
    (run / "metrics.jsonl").write_text("")
    assert report.main(["curves", str(run), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "no epoch finished" in err, err


def test_only_keeps_the_runs_with_those_config_values(tmp_path, capsys):
    root = ranked_runs(tmp_path / "runs", [("softmax", 1, 16, 300.0, 18), ("softmax", 1, 32, 250.0, 34),
                                           ("mos", 1, 32, 240.0, 9000), ("ss", 1, 32, 245.0, 5000)])
    out = tmp_path / "t"
    assert report.main(["table", str(root), "--only", "model.emsize=32", "--only", "head.name=softmax,mos",
                        "--out", str(out)]) == 0
    main_table = (tmp_path / "t.md").read_text().split("\nMean ± ")[0]
    rows = [line for line in main_table.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0] for row in rows] == ["| Softmax", "| MoS"]
    assert "250.00" in rows[0] and "300.00" not in rows[0]
    for only, message in (("model.emsize", "expected KEY=VALUE"),
                          ("model.emsize=8", "model.emsize=8: no run has that value; the runs have "
                                             "model.emsize = 16, 32"),
                          ("modle.emsize=32", "no run's config.yaml has the key modle.emsize")):
        assert report.main(["table", str(root), "--only", only, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --only") and "\n" not in err and message in err, err
    # a second --only that keeps nothing names the runs the first one kept, and their values
    assert report.main(["table", str(root), "--only", "head.name=softmax", "--only", "model.emsize=64",
                        "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == ("error: --only model.emsize=64: no run has that value; the runs "
                                               "the --only before it kept have model.emsize = 16, 32")


def test_a_copy_of_a_run_is_refused_not_counted_as_another_seed(tmp_path, capsys):
    """A newcomer gave a folder and a copy of two of its runs: methods counted four MoS seeds and
    its p fell from 0.14 to 0.0039. Every report reading runs refuses one configuration and seed twice."""
    import shutil
    root = ranked_runs(tmp_path / "runs", [("softmax", 1, 32, 250.0, 34), ("softmax", 2, 32, 252.0, 34),
                                           ("mos", 1, 32, 240.0, 900)])
    copy = tmp_path / "copy" / "ptb-mos-model.emsize=32-seed1"
    shutil.copytree(root / "ptb-mos-model.emsize=32-seed1", copy)
    for command in ("table", "cost", "curves"):
        assert report.main([command, str(root), str(tmp_path / "copy"), "--out", str(tmp_path / command)]) == 2
        assert capsys.readouterr().err == (
            f"error: {root / 'ptb-mos-model.emsize=32-seed1'} and {copy} are one configuration with one seed (1): "
            f"a copy, or the seed trained twice; a report counts each seed once: give one of them\n")
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0


def test_only_matches_numbers_as_numbers_and_names_a_value_no_run_has(tmp_path, capsys):
    root = ranked_runs(tmp_path / "runs", [("softmax", 1, 16, 300.0, 18), ("mos", 1, 32, 240.0, 900)])
    assert report.main(["table", str(root), "--only", "model.emsize=32.0", "--out", str(tmp_path / "t")]) == 0
    assert "| MoS |" in (tmp_path / "t.md").read_text() and "| Softmax |" not in (tmp_path / "t.md").read_text()
    capsys.readouterr()
    assert report.main(["table", str(root), "--only", "head.name=mos,softmx", "--out", str(tmp_path / "t")]) == 0
    assert "note: --only head.name=mos,softmx: no run has head.name = softmx\n" in capsys.readouterr().err


@pytest.mark.parametrize("out, message", [
    ("", "expected a prefix for the files written (e.g. results/report/NAME)"),
    ("{tmp}/", "{tmp}/: a folder; give a prefix inside it, e.g. {tmp}/NAME (NAME.md, NAME.csv ... are written)"),
    ("{tmp}/x.md", "{tmp}/x.md: a prefix, not a file name: the files are x.md, x.csv ...; give {tmp}/x"),
    ("{tmp}/file/x", "{tmp}/file/x: {tmp}/file is a file, not a folder"),
])
def test_an_output_prefix_that_cannot_be_written_as_named_is_refused_first(out, message, tmp_path, capsys):
    """--out x.md wrote x.md.md; --out DIR/ wrote DIR.md beside it; a file as a parent and an
    empty --out were tracebacks after the work."""
    root = ranked_runs(tmp_path / "runs", [("softmax", 1, 32, 250.0, 34)])
    (tmp_path / "file").write_text("")
    for command in ("table", "cost", "methods", "capacity"):
        with pytest.raises(SystemExit) as exit_info:
            report.main([command, str(root), "--out", out.format(tmp=tmp_path)])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == (f"report.py {command}: error: argument --out: "
                                           f"{message.format(tmp=tmp_path)}\n")


@pytest.mark.parametrize("test_ppl", [float("inf"), float("nan"), 0.0, -5.0, 0.5, "abc", None])
def test_a_test_ppl_that_is_not_a_perplexity_is_refused_in_one_line(test_ppl, tmp_path, capsys):
    """evaluate.py writes inf (a loss past float64's range) or NaN for a diverged run; a hand-made
    file may hold anything. Pooled, inf and nan printed '+inf% [+nan, +nan], p = nan' and a
    'nan% [nan, nan]' seed spread; 0, a negative or a string was a traceback; None silently left
    the run out. Each report refuses in one line naming the file."""
    root = ranked_runs(tmp_path / "runs", [("softmax", 1, 16, 100.0, 10), ("softmax", 2, 16, 101.0, 10),
                                           ("mos", 1, 16, 95.0, 10), ("softmax", 1, 32, 90.0, 10),
                                           ("mos", 1, 32, 85.0, 10)])
    bad = root / "ptb-mos-model.emsize=32-seed2"
    cpu_run(root, "mos", 2, d=32, press_rank=10)
    (bad / "eval_best.json").write_text(json.dumps({"test_ppl": test_ppl, "test_loss": 4.0}))
    for command in (["table"], ["versus", "--key", "model.emsize"]):
        assert report.main([command[0], str(root), *command[1:], "--out", str(tmp_path / "r")]) == 2
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert captured.out == "" and "\n" not in err, err
        assert err.startswith(f"error: {bad / 'eval_best.json'}: test_ppl is {test_ppl!r}, not a perplexity"), err
        assert ("the run diverged" in err) == (isinstance(test_ppl, float) and not math.isfinite(test_ppl))
