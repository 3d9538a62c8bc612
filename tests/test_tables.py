"""report.py table and spectra on run directories written by hand (no training)."""
from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

import report
from analysis import AnalysisError
from analysis.runs import find_run_dirs
from analysis.spectra import collect, normalise, write_spectra
from analysis.stats import format_p
from analysis.tables import format_rank, mean_std, t_test_p_value

SOFTMAX_TEST = [57.0, 57.1, 57.2]
SS_TEST = [56.8, 56.9, 56.7, 56.85]


def make_run(root: Path, name: str, head: str, seed: int, *, test_ppl: float | None = None,
             val_losses=(4.2, 4.1, 4.15), seconds=(50.0, 52.0, 54.0), params: int = 24_221_600,
             press_rank: int | None = None, dataset: str = "ptb", epochs: int = 3, head_options=None) -> Path:
    """A run directory as train.py, evaluate.py and rank.py leave it (without checkpoints)."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    config = {"data": {"dataset": dataset}, "train": {"epochs": epochs, "seed": seed},
              "head": {"name": head, **(head_options or {})}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "run.json").write_text(json.dumps({"params": params, "vocab_size": 10000, "dataset": dataset,
                                                  "head": head, "seed": seed}))
    lines = [json.dumps({"epoch": i + 1, "seconds": s, "train_loss": 3.0 + i / 10,
                         "train_ppl": math.exp(3.0 + i / 10), "val_loss": v, "val_ppl": math.exp(v)})
             for i, (v, s) in enumerate(zip(val_losses, seconds))]
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    if test_ppl is not None:
        evaluation = {"test_ppl": test_ppl, "test_loss": math.log(test_ppl)}
        (run_dir / "eval_best.json").write_text(json.dumps(evaluation))
    if press_rank is not None:
        (run_dir / "rank_test.json").write_text(json.dumps({"press_rank": press_rank, "shape": [100, 10]}))
    return run_dir


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    for seed, ppl in enumerate(SOFTMAX_TEST, 1):
        make_run(root, f"ptb-softmax-seed{seed}", "softmax", seed, test_ppl=ppl, press_rank=402)
    for seed, ppl in enumerate(SS_TEST, 1):
        make_run(root, f"ptb-ss-seed{seed}", "ss", seed, test_ppl=ppl, press_rank=5000 + seed,
                 seconds=(60.0,) * 3)
    return root


def read_csv(path: Path) -> dict[str, dict]:
    with open(path, newline="") as f:
        return {row["model"]: row for row in csv.DictReader(f)}


def test_t_test_is_the_pooled_variance_student_test():
    p = t_test_p_value(SS_TEST, SOFTMAX_TEST)
    assert p == pytest.approx(stats.ttest_ind(SS_TEST, SOFTMAX_TEST).pvalue, rel=1e-12)
    # by hand: pooled variance, n1 + n2 - 2 degrees of freedom, two-sided
    n1, n2 = len(SS_TEST), len(SOFTMAX_TEST)
    pooled = (((n1 - 1) * statistics.variance(SS_TEST) + (n2 - 1) * statistics.variance(SOFTMAX_TEST))
              / (n1 + n2 - 2))
    t = (statistics.mean(SS_TEST) - statistics.mean(SOFTMAX_TEST)) / math.sqrt(pooled * (1 / n1 + 1 / n2))
    assert p == pytest.approx(2 * stats.t.sf(abs(t), n1 + n2 - 2), rel=1e-9)
    assert math.isnan(t_test_p_value([57.0], SOFTMAX_TEST))          # undefined, not an error
    assert mean_std(SOFTMAX_TEST) == pytest.approx((57.1, statistics.stdev(SOFTMAX_TEST)))


def test_table_values(runs, tmp_path, capsys):
    assert report.main(["table", str(runs), "--out", str(tmp_path / "t2")]) == 0
    markdown = (tmp_path / "t2.md").read_text()
    assert capsys.readouterr().out.strip() == markdown.strip()
    rows = read_csv(tmp_path / "t2.csv")
    assert list(rows) == ["Softmax", "SS"]
    ss = rows["SS"]
    assert float(ss["test_ppl_mean"]) == pytest.approx(statistics.mean(SS_TEST))
    assert float(ss["test_ppl_std"]) == pytest.approx(statistics.stdev(SS_TEST))   # ddof = 1
    # against Softmax: Welch's t on log ppl, the difference as a ratio of geometric means
    logs, log_softmax = np.log(SS_TEST), np.log(SOFTMAX_TEST)
    welch = stats.ttest_ind(logs, log_softmax, equal_var=False)
    low, high = welch.confidence_interval(0.95)
    change = 100 * math.expm1(logs.mean() - log_softmax.mean())
    assert float(ss["test_change_pct"]) == pytest.approx(change)
    assert (float(ss["test_change_low_pct"]), float(ss["test_change_high_pct"])) == \
        (pytest.approx(100 * math.expm1(low)), pytest.approx(100 * math.expm1(high)))
    assert float(ss["test_change_p"]) == pytest.approx(welch.pvalue)
    assert rows["Softmax"]["test_change_pct"] == "" and "p_value" not in ss   # [SB]'s layouts only
    # train / valid ppl come from epoch 2, the one with the lowest validation loss
    assert float(ss["train_ppl_mean"]) == pytest.approx(math.exp(3.1))
    assert float(ss["val_ppl_mean"]) == pytest.approx(math.exp(4.1))
    assert float(ss["train_ppl_std"]) == pytest.approx(0.0)
    assert float(rows["Softmax"]["seconds_per_epoch"]) == pytest.approx(52.0)
    assert ss["press_rank_values"] == "5001;5002;5003;5004" and float(ss["press_rank_mean"]) == 5002.5
    assert ss["params"] == "24221600" and ss["runs"] == "4"

    line = next(l for l in markdown.splitlines() if l.startswith("| SS "))
    interval = f"[{100 * math.expm1(low):+.1f}, {100 * math.expm1(high):+.1f}], p = {welch.pvalue:.2g}"
    assert line == (f"| SS | 4 | 24.22M | 60.0 | 22.20 ± 0.00 | 60.34 ± 0.00 | "
                    f"{statistics.mean(SS_TEST):.2f} ± {statistics.stdev(SS_TEST):.2f} | {change:+.1f}% {interval} | "
                    f"5,002.5 ± {statistics.stdev([5001, 5002, 5003, 5004]):.1f} |")   # as [SB]: mean ± std
    assert "| Softmax | 3 | 24.22M | 52.0 |" in markdown and "| baseline | 402 ± 0 |" in markdown
    assert "Every run found has all its numbers" in markdown


def test_missing_metrics_are_reported_not_dropped(runs, tmp_path):
    (runs / "ptb-ss-seed2" / "eval_best.json").unlink()
    (runs / "ptb-ss-seed3" / "rank_test.json").unlink()
    (runs / "ptb-ss-seed4" / "metrics.jsonl").unlink()
    # rank.py RUN/last.pt writes rank_test.json too: not the rank of the run's best.pt
    (runs / "ptb-ss-seed1" / "rank_test.json").write_text(json.dumps(
        {"press_rank": 9999, "shape": [100, 10], "checkpoint": str(runs / "ptb-ss-seed1" / "last.pt")}))
    make_run(runs, "ptb-softmax-unfinished", "softmax", 9, test_ppl=57.1, press_rank=402, epochs=500)
    stopped = make_run(runs, "ptb-softmax-stopped", "softmax", 8, test_ppl=57.2, press_rank=402, epochs=500)
    with open(stopped / "metrics.jsonl", "a") as f:       # finetuning ends when no longer improving
        f.write(json.dumps({"epoch": 4, "seconds": 50.0, "train_ppl": 20.0, "val_loss": 4.3,
                            "val_ppl": math.exp(4.3), "early_stop": True}) + "\n")
    assert report.main(["table", str(runs), "--out", str(tmp_path / "t")]) == 0
    markdown = (tmp_path / "t.md").read_text()
    missing = markdown.split("## Missing or incomplete")[1]
    assert f"`{runs / 'ptb-ss-seed2'}`: test_ppl (no eval_best.json" in missing
    assert f"`{runs / 'ptb-ss-seed3'}`: press_rank (no rank_test.json" in missing
    assert f"`{runs / 'ptb-ss-seed1'}`: press_rank (rank_test.json ranks last.pt, not best.pt" in missing
    assert "9,999" not in markdown
    assert f"`{runs / 'ptb-ss-seed4'}`: seconds, train_ppl, val_ppl (no metrics.jsonl" in missing
    assert f"`{runs / 'ptb-softmax-unfinished'}`: training unfinished (3 of 500 epochs)" in missing
    assert "ptb-softmax-stopped" not in missing
    line = next(l for l in markdown.splitlines() if l.startswith("| SS "))
    assert "(n=3)" in line and line.startswith("| SS | 4 |")        # cells over 3 of the row's 4 runs
    ss = read_csv(tmp_path / "t.csv")["SS"]
    assert ss["test_ppl_n"] == "3" and ss["train_ppl_n"] == "3"
    assert float(ss["test_ppl_mean"]) == pytest.approx(statistics.mean([56.8, 56.7, 56.85]))


def test_a_test_ppl_or_rank_of_another_corpus_is_reported_not_used(tmp_path):
    """A run trained on the published PTB, then evaluated and ranked on a slice
    (--data-dir, --allow-modified-corpus): their files' corpus record says so, and the table
    lists them as missing; a run trained on a modified corpus keeps its own numbers."""
    root = tmp_path / "runs"
    published = make_run(root, "ptb-softmax-published", "softmax", 1, test_ppl=57.0, press_rank=402)
    sliced = make_run(root, "ptb-softmax-sliced", "softmax", 2, test_ppl=30.0, press_rank=77)
    own = make_run(root, "ptb-softmax-own", "softmax", 3, test_ppl=58.0, press_rank=402)
    config = yaml.safe_load((own / "config.yaml").read_text())
    config["data"]["allow_modified_corpus"] = True
    (own / "config.yaml").write_text(yaml.safe_dump(config))
    slice_record = {"folder": "/tmp/slice/ptb", "published": False, "tokens": {"valid": 300, "test": 334}}
    for run_dir, record in ((published, {"folder": "corpora/ptb", "published": True, "tokens": {"valid": 73760,
                                                                                               "test": 82430}}),
                            (sliced, slice_record), (own, slice_record)):
        for name in ("eval_best.json", "rank_test.json"):
            result = json.loads((run_dir / name).read_text())
            (run_dir / name).write_text(json.dumps({**result, "corpus": record}))
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    markdown = (tmp_path / "t.md").read_text()
    missing = markdown.split("## Missing or incomplete")[1]
    for name in ("eval_best.json", "rank_test.json"):
        assert (f"{name} was computed on a corpus that is not the published one (/tmp/slice/ptb, 334 test "
                f"tokens), the run trained on the published one") in missing
    assert "ptb-softmax-published" not in missing and "ptb-softmax-own" not in missing
    assert "30.00" not in markdown and "77" not in markdown.split("## Missing")[0]
    # a modified corpus is another configuration (pooling.py): its own row
    rows = read_csv(tmp_path / "t.csv")
    published_row = rows["Softmax (data.allow_modified_corpus=False, data.data_dir=None)"]
    assert float(published_row["test_ppl_mean"]) == pytest.approx(57.0) and published_row["runs"] == "2"
    assert float(rows["Softmax (data.allow_modified_corpus=True, data.data_dir=None)"]["test_ppl_mean"]) == 58.0


def test_runs_on_other_text_of_a_modified_corpus_are_not_pooled_whatever_their_folders(tmp_path, capsys):
    """Runs on a modified corpus were told apart by data.data_dir alone (null when the folder came
    from AWD_DATA_DIR): two texts from one variable pooled as seeds, one text copied to two
    folders did not. run.json's hashes decide now; a run without them keeps the folder rule."""
    root = tmp_path / "runs"
    def trained_on(run_dir, train_hash, folder):
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        config["data"]["allow_modified_corpus"] = True
        config["data"]["data_dir"] = folder
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        info = json.loads((run_dir / "run.json").read_text())
        info["corpus"] = {"folder": f"{folder}/ptb", "published": False, "tokens": {"valid": 300, "test": 334},
                          "sha256": {"train": train_hash, "valid": "b" * 64, "test": "c" * 64}}
        (run_dir / "run.json").write_text(json.dumps(info))
    for seed, (ppl, train_hash, folder) in enumerate([(50.0, "a" * 64, "/x"), (52.0, "a" * 64, "/copy"),
                                                      (90.0, "d" * 64, "/x")], 1):
        trained_on(make_run(root, f"ptb-softmax-seed{seed}", "softmax", seed, test_ppl=ppl), train_hash, folder)
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    rows = read_csv(tmp_path / "t.csv")
    assert sorted(rows) == [f"Softmax (data.trained_text=train.txt {h * 12}, valid.txt {'b' * 12})" for h in "ad"]
    same_text = rows[f"Softmax (data.trained_text=train.txt {'a' * 12}, valid.txt {'b' * 12})"]
    assert same_text["runs"] == "2" and float(same_text["test_ppl_mean"]) == pytest.approx(51.0)
    # seed 1 on other text is another run; on the same text in another folder, a copy of it
    trained_on(make_run(root, "other-text-seed1", "softmax", 1, test_ppl=91.0), "d" * 64, "/x")
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    trained_on(make_run(root, "copy-seed1", "softmax", 1, test_ppl=50.0), "a" * 64, "/copy")
    capsys.readouterr()
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "copy-seed1" in err and "ptb-softmax-seed1" in err and "one configuration with one seed (1)" in err


def test_a_test_ppl_or_rank_of_another_head_is_reported_not_used(tmp_path):
    """An eval_best.json or rank_test.json copied in from another run names another head."""
    root = tmp_path / "runs"
    run = make_run(root, "ptb-softmax-seed1", "softmax", 1, test_ppl=57.0, press_rank=402)
    make_run(root, "ptb-softmax-seed2", "softmax", 2, test_ppl=58.0, press_rank=402)
    for name in ("eval_best.json", "rank_test.json"):
        result = json.loads((run / name).read_text())
        (run / name).write_text(json.dumps({**result, "head": "mos"}))
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    missing = (tmp_path / "t.md").read_text().split("## Missing or incomplete")[1]
    assert f"test_ppl (eval_best.json is of a mos model, the run's head is softmax: run python evaluate.py {run})" in missing
    assert f"press_rank (rank_test.json is of a mos model, the run's head is softmax: run python rank.py {run})" in missing
    assert read_csv(tmp_path / "t.csv")["Softmax"]["runs"] == "2" and \
        float(read_csv(tmp_path / "t.csv")["Softmax"]["test_ppl_mean"]) == 58.0


def test_a_test_ppl_or_rank_of_other_weights_than_best_pt_is_reported_not_used(tmp_path):
    """eval_best.json / rank_test.json carry the step of the weights they scored; a run evaluated
    after epoch 2 and then trained on to a better epoch 3 has stale ones."""
    root = tmp_path / "runs"
    fresh = make_run(root, "ptb-softmax-fresh", "softmax", 1, test_ppl=57.0, press_rank=402,
                     val_losses=(4.2, 4.1, 4.0))
    stale = make_run(root, "ptb-softmax-stale", "softmax", 2, test_ppl=50.0, press_rank=9999,
                     val_losses=(4.2, 4.1, 4.0))
    # a finetuning run that never beat its starting weights: best.pt holds them (step 0)
    kept = make_run(root, "ptb-softmax-kept", "softmax", 3, test_ppl=57.2, press_rank=402,
                    val_losses=(4.2, 4.1, 4.15))
    for run_dir, scored_step in ((fresh, 300), (stale, 200), (kept, 0)):
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        for i, record in enumerate(records):
            record["step"] = 100 * (i + 1)
            record["best_val_ppl"] = math.exp(4.05 if run_dir == kept else min(r["val_loss"] for r in records[:i + 1]))
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        for name in ("eval_best.json", "rank_test.json"):
            result = json.loads((run_dir / name).read_text())
            (run_dir / name).write_text(json.dumps({**result, "step": scored_step}))
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    markdown = (tmp_path / "t.md").read_text()
    missing = markdown.split("## Missing or incomplete")[1]
    for name in ("eval_best.json", "rank_test.json"):
        assert (f"{name} is of the weights at step 200, but metrics.jsonl puts best.pt at step 300"
                in missing)
    assert "ptb-softmax-fresh" not in missing and "ptb-softmax-kept" not in missing
    assert "50.00" not in markdown and "9,999" not in markdown
    softmax = read_csv(tmp_path / "t.csv")["Softmax"]
    assert float(softmax["test_ppl_mean"]) == pytest.approx(statistics.mean([57.0, 57.2]))


def test_rows_by_dataset_and_group_by_key(tmp_path):
    root = tmp_path / "runs"
    for seed in (1, 2):
        make_run(root, f"ptb-softmax-{seed}", "softmax", seed, test_ppl=57 + seed, press_rank=402)
        make_run(root, f"wt2-softmax-{seed}", "softmax", seed, test_ppl=64 + seed, dataset="wikitext-2",
                 params=33_556_078)
        for k in (2, 3):
            make_run(root, f"ptb-gss-k{k}-{seed}", "gss", seed, test_ppl=56 + seed / k,
                     head_options={"c": 0.0, "k": k})
    assert report.main(["table", str(root), "--group-by", "head.k", "--out", str(tmp_path / "t")]) == 0
    markdown = (tmp_path / "t.md").read_text()
    assert markdown.index("## ptb") < markdown.index("## wikitext-2")
    main_tables = markdown.split("\nMean ± ")[0]          # the common-epoch tables follow the note
    labels = [line.split("|")[1].strip() for line in main_tables.splitlines() if line.startswith("| ")
              and not line.startswith("| Model")]
    assert labels == ["Softmax", "GSS (head.k=2)", "GSS (head.k=3)", "Softmax"]   # softmax has no head.k
    assert "| 33.55M |" in markdown


def sized_run(root: Path, name: str, head_name: str, seed: int, d: int, test_ppl: float, params: int,
              **sections) -> Path:
    """make_run's directory of a model with emsize = nhidlast = d, trained at lr 20, and any
    further config values (section -> {key: value})."""
    run = make_run(root, name, head_name, seed, test_ppl=test_ppl, press_rank=d + 2, params=params)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"] = {"emsize": d, "nhidlast": d}
    config["train"]["lr"] = 20.0
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


def test_runs_of_other_configurations_are_separate_rows_not_seeds(tmp_path, capsys):
    """Issue 46: runs of different sizes were averaged into one row as if they were seeds
    ("0.18M/0.99M"). Runs pool only when every compared config key but the seed is equal
    (analysis/pooling.py); keys that cannot change a run's result may differ."""
    root = tmp_path / "runs"
    for seed, ppl in ((1, 300.0), (2, 310.0)):
        sized_run(root, f"softmax-d16-{seed}", "softmax", seed, 16, ppl, 180_416)
    for seed, ppl in ((1, 170.0), (2, 175.0)):
        sized_run(root, f"softmax-d64-{seed}", "softmax", seed, 64, ppl, 990_000)
    # a third d = 64 seed, elsewhere, on another device, logged and compiled otherwise: pooled
    sized_run(root, "softmax-d64-3", "softmax", 3, 64, 172.0, 990_000,
              run={"dir": "elsewhere", "device": "cuda", "log_interval": 7, "tensorboard": False,
                   "checkpoint_every_steps": 100, "deterministic": True, "ddp_reduce": "allreduce"},
              data={"data_dir": "/somewhere/else"})
    # at another learning rate: not a seed of the others
    sized_run(root, "softmax-d64-lr5", "softmax", 1, 64, 190.0, 990_000, train={"lr": 5.0})
    for seed, ppl in ((1, 160.0), (2, 162.0)):
        sized_run(root, f"mos-d64-{seed}", "mos", seed, 64, ppl, 1_000_000, head={"compile": seed == 1})
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    markdown = (tmp_path / "t.md").read_text()
    rows = read_csv(tmp_path / "t.csv")
    assert list(rows) == ["Softmax (model.emsize=16, model.nhidlast=16, train.lr=20.0)",
                          "Softmax (model.emsize=64, model.nhidlast=64, train.lr=5.0)",
                          "Softmax (model.emsize=64, model.nhidlast=64, train.lr=20.0)", "MoS"]
    assert "/" not in "".join(row["params"] for row in rows.values())
    d64 = rows["Softmax (model.emsize=64, model.nhidlast=64, train.lr=20.0)"]
    assert d64["runs"] == "3" and float(d64["test_ppl_mean"]) == pytest.approx(statistics.mean([170, 175, 172]))
    # MoS is compared with Softmax at its own d and lr
    change = 100 * math.expm1(np.mean(np.log([160, 162])) - np.mean(np.log([170, 175, 172])))
    assert float(rows["MoS"]["test_change_pct"]) == pytest.approx(change)
    assert "| Softmax (model.emsize=16, model.nhidlast=16, train.lr=20.0) | 2 | 0.18M |" in markdown
    # a report that cannot split a point refuses in one line naming the keys
    assert report.main(["versus", str(root), "--key", "model.emsize", "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Softmax (model.emsize=64)") and "\n" not in err, err
    assert "not seeds of one configuration" in err and "train.lr (20, 5)" in err
    assert not (tmp_path / "v.md").exists()


def test_versus_refuses_runs_of_two_corpora_in_one_line(tmp_path, capsys):
    """A newcomer's WikiText-2 Softmax run replaced PTB's three seeds in versus's cells (one cell
    per head and value) and MoS read -88% against it: runs of two corpora are refused."""
    root = tmp_path / "runs"
    for seed, ppl in enumerate((162.0, 163.0), 1):
        sized_run(root, f"ptb-softmax-{seed}", "softmax", seed, 16, ppl, 180_000)
        sized_run(root, f"ptb-mos-{seed}", "mos", seed, 16, ppl - 4, 180_000)
    wikitext = make_run(root, "wt2-softmax", "softmax", 1, test_ppl=1313.0, dataset="wikitext-2")
    config = yaml.safe_load((wikitext / "config.yaml").read_text())
    config["model"], config["train"]["lr"] = {"emsize": 16, "nhidlast": 16}, 20.0
    (wikitext / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "v"
    assert report.main(["versus", str(root), "--key", "model.emsize", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "ptb and wikitext-2" in err and str(wikitext) in err, err
    assert "--only data.dataset=ptb" in err and not (tmp_path / "v.md").exists()
    assert report.main(["versus", str(root), "--key", "model.emsize", "--only", "data.dataset=ptb",
                        "--out", str(out)]) == 0
    assert "| Softmax | 162.50 ± 0.71 (n = 2) |" in (tmp_path / "v.md").read_text()


@pytest.mark.parametrize("argv, expected", [
    (["table", "--group-by", "head.tua"], "error: --group-by head.tua: no run's config.yaml has this key"),
    (["curves", "--group-by", "model.emsze"], "error: --group-by model.emsze: no run's config.yaml has this key"),
    (["table", "--baseline", "mos"], "error: --baseline mos: no run here has this head (their heads: softmax, ss)"),
])
def test_report_options_that_would_change_nothing_are_refused_in_one_line(argv, expected, runs, tmp_path, capsys):
    """A newcomer's typo'd --group-by key, and a --baseline head with no runs, each gave the plain
    table (or a column of dashes) and exit 0."""
    out = tmp_path / "r"
    assert report.main([argv[0], str(runs), *argv[1:], "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected) and "\n" not in err, err
    assert not list(tmp_path.glob("r.*"))


def test_an_excluded_seed_that_no_run_has_is_said(runs, tmp_path, capsys):
    assert report.main(["table", str(runs), "--exclude-from-t-test", "99", "2", "--out", str(tmp_path / "t")]) == 0
    err = capsys.readouterr().err
    assert "note: --exclude-from-t-test: no run here has seed 99, so nothing is left out for it" in err
    assert "(the runs' seeds: 1, 2, 3, 4)" in err and "seed 2" not in err


def test_curves_of_two_corpora_name_each_columns_corpus(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "ptb-softmax", "softmax", 1)
    make_run(root, "wt2-softmax", "softmax", 1, dataset="wikitext-2")
    assert report.main(["curves", str(root), "--out", str(tmp_path / "c")]) == 0
    header = (tmp_path / "c.md").read_text().split("\n| epoch |")[1].split("\n")[0]
    assert header == " Softmax, ptb (n = 1) | Softmax, wikitext-2 (n = 1) |", header
    make_run(tmp_path / "one", "ptb-softmax", "softmax", 1)
    assert report.main(["curves", str(tmp_path / "one"), "--out", str(tmp_path / "c1")]) == 0
    assert "| epoch | Softmax (n = 1) |" in (tmp_path / "c1.md").read_text()


def test_a_row_of_one_run_has_its_value_and_no_interval(tmp_path):
    """n = 1: the value, no spread and no interval, in the table and against a row of three."""
    root = tmp_path / "runs"
    for seed, ppl in enumerate(SOFTMAX_TEST, 1):
        make_run(root, f"ptb-softmax-seed{seed}", "softmax", seed, test_ppl=ppl, val_losses=(4.2, 4.1, 4.0))
    make_run(root, "ptb-mos-seed1", "mos", 1, test_ppl=55.0, val_losses=(4.1, 3.95), epochs=2)
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    markdown = (tmp_path / "t.md").read_text()
    change = 100 * math.expm1(math.log(55.0) - np.mean(np.log(SOFTMAX_TEST)))
    line = next(l for l in markdown.splitlines() if l.startswith("| MoS "))
    assert line.startswith("| MoS | 1 |") and "| 55.00 |" in line and "±" not in line
    assert f"| {change:+.1f}% (n = 1: no interval) |" in line
    # at the common epoch, the earliest stop (MoS's 2): every run's valid ppl there
    common = next(l for l in markdown.split("at a common epoch")[1].splitlines() if l.startswith("| MoS "))
    valid_change = 100 * math.expm1(3.95 - 4.1)
    assert common == (f"| MoS | 2 | 3, 3, 3 | 2 | {math.exp(3.95):.2f} | "
                      f"{', '.join([f'{math.exp(4.1):.2f}'] * 3)} | {valid_change:+.1f}% (n = 1: no interval) |")
    spread = 100 * statistics.stdev(np.log(SOFTMAX_TEST))
    assert f"pooled over the 1 row with two runs or more (2 degrees of freedom): **{spread:.2f}% [" in markdown


def test_every_two_rows_with_their_interval_and_holms_p(runs, tmp_path):
    """Beside each row against Softmax, every two rows at one setting (two runs or more a side):
    the lower row against the upper, Welch on log test ppl (scipy's), and Holm's p over the pairs
    listed. A row of one run, and a row at another setting, pair with nothing."""
    gss = [57.3, 57.5]
    for seed, ppl in enumerate(gss, 1):
        make_run(runs, f"ptb-gss-seed{seed}", "gss", seed, test_ppl=ppl)
    make_run(runs, "ptb-mos-seed1", "mos", 1, test_ppl=55.0)
    make_run(runs, "wt2-mos-seed1", "mos", 1, test_ppl=60.0, dataset="wikitext-2")
    make_run(runs, "wt2-mos-seed2", "mos", 2, test_ppl=61.0, dataset="wikitext-2")
    assert report.main(["table", str(runs), "--out", str(tmp_path / "t")]) == 0
    section = (tmp_path / "t.md").read_text().split("## ptb: every two rows")[1].split("\n## ")[0]
    logs = {name: np.log(values) for name, values in (("Softmax", SOFTMAX_TEST), ("SS", SS_TEST), ("GSS", gss))}
    expected = []
    for first, second in (("SS", "Softmax"), ("GSS", "Softmax"), ("GSS", "SS")):
        welch = stats.ttest_ind(logs[first], logs[second], equal_var=False)
        low, high = welch.confidence_interval(0.95)
        change = 100 * math.expm1(logs[first].mean() - logs[second].mean())
        expected.append((f"{first} against {second}", f"{len(logs[first])} and {len(logs[second])} ({welch.df:.1f})",
                         f"{change:+.1f}% [{100 * math.expm1(low):+.1f}, {100 * math.expm1(high):+.1f}], "
                         f"p = {format_p(welch.pvalue)}", welch.pvalue))
    ps = sorted(p for *_, p in expected)
    by_hand = {ps[0]: 3 * ps[0], ps[1]: max(3 * ps[0], 2 * ps[1]), ps[2]: max(3 * ps[0], 2 * ps[1], ps[2])}
    lines = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert lines[0] == "| pair | n (Welch's df) | test ppl: % [95% CI], p | Holm's p (over the 3 pairs) |"
    assert lines[1:] == [f"| {pair} | {n} | {interval} | {format_p(min(1.0, by_hand[p]))} |"
                         for pair, n, interval, p in expected]
    # the pair against Softmax is the main table's interval
    ss_line = next(l for l in (tmp_path / "t.md").read_text().splitlines() if l.startswith("| SS | 4 |"))
    assert expected[0][2] in ss_line
    assert "MoS" not in section and "## wikitext-2: every two rows" not in (tmp_path / "t.md").read_text()


def test_a_row_of_cpu_and_gpu_seeds_gives_its_epoch_time_per_device(runs, tmp_path):
    """Seeds trained on a GPU pooled with a CPU's (the GPU seeds plan): the time column keeps the
    devices apart rather than averaging minutes with seconds."""
    for seed in (2, 3):
        info = json.loads((runs / f"ptb-softmax-seed{seed}" / "run.json").read_text())
        info["device_name"] = "cuda (NVIDIA H200)"
        (runs / f"ptb-softmax-seed{seed}" / "run.json").write_text(json.dumps(info))
        metrics = runs / f"ptb-softmax-seed{seed}" / "metrics.jsonl"
        metrics.write_text("".join(json.dumps({**json.loads(line), "seconds": 4.0}) + "\n"
                                   for line in metrics.read_text().splitlines()))
    info = json.loads((runs / "ptb-softmax-seed1" / "run.json").read_text())
    (runs / "ptb-softmax-seed1" / "run.json").write_text(json.dumps({**info, "device": "cpu"}))
    assert report.main(["table", str(runs), "--out", str(tmp_path / "t")]) == 0
    line = next(l for l in (tmp_path / "t.md").read_text().splitlines() if l.startswith("| Softmax |"))
    assert line.startswith("| Softmax | 3 | 24.22M | 52.0 on cpu, 4.0 on cuda |")
    softmax = read_csv(tmp_path / "t.csv")["Softmax"]
    assert softmax["seconds_per_epoch"] == "" and softmax["seconds_per_epoch_by_device"] == "cpu:52.0;cuda:4.0"
    assert read_csv(tmp_path / "t.csv")["SS"]["seconds_per_epoch"] == "60.0"


def test_run_directories_below_a_folder_but_not_inside_a_run(runs):
    make_run(runs / "ptb-softmax-seed1", "finetune", "softmax", 1)     # train.py --finetune's place
    make_run(runs / "more", "ptb-mos-seed1", "mos", 1)
    found = find_run_dirs([runs, runs / "ptb-ss-seed1", runs / "ptb-softmax-seed1" / "finetune"])
    assert [str(p.relative_to(runs)) for p in found] == [
        "more/ptb-mos-seed1", *(f"ptb-softmax-seed{s}" for s in (1, 2, 3)),
        *(f"ptb-ss-seed{s}" for s in (1, 2, 3, 4)), "ptb-softmax-seed1/finetune"]


def test_seeds_left_out_of_the_t_test_only(runs, tmp_path):
    assert report.main(["table", str(runs), "--out", str(tmp_path / "t"), "--exclude-from-t-test", "1"]) == 0
    ss = read_csv(tmp_path / "t.csv")["SS"]
    welch = stats.ttest_ind(np.log(SS_TEST[1:]), np.log(SOFTMAX_TEST[1:]), equal_var=False)
    assert float(ss["test_change_p"]) == pytest.approx(welch.pvalue)
    assert float(ss["test_ppl_mean"]) == pytest.approx(statistics.mean(SS_TEST))
    pair = next(l for l in (tmp_path / "t.md").read_text().splitlines() if l.startswith("| SS against Softmax |"))
    assert pair.startswith(f"| SS against Softmax | 3 and 2 ({welch.df:.1f}) |") and f"p = {format_p(welch.pvalue)} |" in pair


def test_bad_input_is_one_line(runs, tmp_path, capsys):
    assert report.main(["table", str(tmp_path / "nowhere"), "--out", str(tmp_path / "t")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'nowhere'}: no such run directory"
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisError, match="holds none"):
        find_run_dirs([tmp_path / "empty"])
    (runs / "ptb-ss-seed1" / "metrics.jsonl").write_text('{"epoch": 1}\nnot json\n')
    assert report.main(["table", str(runs), "--out", str(tmp_path / "t")]) == 2
    assert capsys.readouterr().err.strip().endswith("ptb-ss-seed1/metrics.jsonl:2: not a JSON line")
    # a misspelled baseline wrote a table whose comparison column was "—" in every row
    assert report.main(["table", str(runs), "--baseline", "softmx", "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip() == ("error: --baseline softmx: expected a head's name (softmax, ss, "
                                               "gss, plif, plif_frozen, mos, moc, mixtape)")
    assert not (tmp_path / "b.md").exists()


# ---------------------------------------------------------------------- spectra

def test_spectra_figure_from_saved_singular_values(tmp_path, capsys):
    root = tmp_path / "runs"
    rng = np.random.default_rng(0)
    for name, decay in (("softmax", 0.05), ("mos", 0.01)):
        run_dir = make_run(root, f"ptb-{name}", name, 1)
        np.save(run_dir / "singular_values_test_logp.npy", np.exp(-decay * np.arange(800)) * 1e3)
    np.save(root / "ptb-mos" / "singular_values_test_transformed.npy", rng.random(800))
    make_run(root, "ptb-ss", "ss", 1)                         # not ranked yet
    out = tmp_path / "fig" / "spectra.png"
    assert report.main(["spectra", str(root), "--out", str(out), "--transformed"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert f"warning: {root / 'ptb-ss'}: no singular_values_test_logp.npy (run python rank.py {root / 'ptb-ss'})" in printed
    # a folder of runs given where run directories are expected (rank.py --plot FOLDER)
    assert collect([root], transformed=False)[1] == [
        f"{root}: no singular_values_test_logp.npy (a folder of runs, not a run directory: give its runs "
        f"({root}/RUN ...), or plot them all with python report.py spectra {root} --out FIGURE.png)"]
    curves, missing = collect([root / "ptb-mos", root / "ptb-softmax"], transformed=True)
    assert [(label, dashed) for label, _, dashed in curves] == \
        [("MoS, seed 1", False), ("MoS, seed 1 f(l)", True), ("Softmax, seed 1", False)]
    # two runs that the head, d and seed do not tell apart keep their directory names
    twin = make_run(root, "ptb-mos-lr5", "mos", 1)
    np.save(twin / "singular_values_test_logp.npy", np.ones(5))
    assert [label for label, _, _ in collect([root / "ptb-mos", twin, root / "ptb-softmax"], False)[0]] == \
        ["ptb-mos", "ptb-mos-lr5", "Softmax, seed 1"]
    assert missing == []           # a head without transformed logits has no f(l) file to miss
    ss = make_run(root, "ptb-ss-ranked", "ss", 2)      # ranked, but its f(l) file is gone
    np.save(ss / "singular_values_test_logp.npy", np.ones(5))
    assert collect([ss], transformed=True)[1] == [
        f"{ss}: no singular_values_test_transformed.npy (run python rank.py {ss})"]
    # --transformed over heads that have no f(l) at all says so instead of drawing no dashed curve
    assert collect([root / "ptb-softmax"], transformed=True)[1] == [
        "no f(l) curve: none of these runs' heads has transformed logits (those of SS, GSS, LMS-PLIF, "
        "LMS-PLIF† have)"]
    np.testing.assert_allclose(normalise(np.array([4.0, 2.0, 1.0])), [1.0, 1 / 3, 0.0])
    with pytest.raises(AnalysisError, match="no singular values found"):
        write_spectra([root / "ptb-ss"], tmp_path / "none.png")


def test_spectra_older_than_best_pt_are_left_out_and_unlike_ones_named(tmp_path):
    """A spectrum of weights that best.pt no longer holds (rank.py, then training on) is left
    out with a note, as report.py table leaves out its rank; a last.pt ranked by choice is drawn
    and named; float32 beside float64 spectra (another rounding floor) are named in the legend."""
    root = tmp_path / "runs"
    records = {"softmax": {"step": 10, "dtype": "float32"}, "mos": {"step": 20, "dtype": "float64"},
               "ss": {"step": 30, "dtype": "float32", "checkpoint": str(root / "ptb-ss" / "last.pt")}}
    for head, record in records.items():
        run_dir = make_run(root, f"ptb-{head}", head, 1)
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps({**r, "step": 10 * r["epoch"]}) + "\n"
                                                       for r in metrics))       # best.pt: epoch 2, step 20
        np.save(run_dir / "singular_values_test_logp.npy", np.exp(-0.05 * np.arange(50)))
        (run_dir / "rank_test.json").write_text(json.dumps({"press_rank": 5, "contexts": 50, "head": head,
                                                            "checkpoint": str(run_dir / "best.pt"), **record}))
    runs = [root / "ptb-softmax", root / "ptb-mos", root / "ptb-ss"]
    curves, notes = collect(runs, transformed=False)
    assert [label for label, _, _ in curves] == ["MoS, seed 1, float64", "SS, seed 1, last.pt, float32"]
    assert notes == [
        f"{runs[0]}: its spectra are left out: rank_test.json is of the weights at step 10, but "
        f"metrics.jsonl puts best.pt at step 20: run python rank.py {runs[0]} --contexts 50 again",
        "the spectra are not alike (precisions float32, float64): the legend names each curve's; rank "
        "them alike (rank.py --dtype, --contexts) to compare tails"]
    assert [label for label, _, _ in collect(runs[1:2], transformed=False)[0]] == ["MoS, seed 1"]
    # ranked over different numbers of contexts: named too
    record = json.loads((runs[1] / "rank_test.json").read_text())
    (runs[1] / "rank_test.json").write_text(json.dumps({**record, "dtype": "float32", "contexts": 40}))
    curves, notes = collect(runs[1:], transformed=False)
    assert [label for label, _, _ in curves] == ["MoS, seed 1, 40 contexts", "SS, seed 1, last.pt, 50 contexts"]
    assert notes[-1].startswith("the spectra are not alike (contexts 40, 50): ")
    # of two corpora (each vocabulary bounds its rank): named in the legend and the note
    record = json.loads((runs[2] / "rank_test.json").read_text())
    (runs[2] / "rank_test.json").write_text(json.dumps({**record, "contexts": 40, "dataset": "wikitext-2",
                                                        "shape": [40, 4615]}))
    (runs[1] / "rank_test.json").write_text(json.dumps({**json.loads((runs[1] / "rank_test.json").read_text()),
                                                        "dataset": "ptb", "shape": [40, 6431]}))
    curves, notes = collect(runs[1:], transformed=False)
    assert [label for label, _, _ in curves] == ["MoS, seed 1, ptb (V = 6,431)",
                                                 "SS, seed 1, last.pt, wikitext-2 (V = 4,615)"]
    assert notes[-1] == ("the spectra are not alike (corpora ptb (V = 6,431), wikitext-2 (V = 4,615)): the legend "
                         "names each curve's; a spectrum has as many values as its corpus's vocabulary, which "
                         "bounds its rank: compare runs of one corpus; rank them alike (rank.py --dtype, "
                         "--contexts) to compare tails")


def test_a_run_without_best_pt_is_told_what_it_lacks_not_a_command_that_fails(tmp_path):
    """report.py spectra told a run that had not validated an epoch to run rank.py on it, which
    refuses it (no validated model yet); its last.pt can be ranked."""
    from analysis.spectra import how_to_rank
    run_dir = make_run(tmp_path / "runs", "ptb-mos", "mos", 1)
    assert how_to_rank(run_dir) == f"run python rank.py {run_dir}"      # validated: its best.pt is elsewhere
    (run_dir / "metrics.jsonl").unlink()
    assert how_to_rank(run_dir) == "no best.pt yet: the run has not validated an epoch"
    (run_dir / "last.pt").write_bytes(b"")
    assert how_to_rank(run_dir) == (f"no best.pt yet: the run has not validated an epoch; its last.pt can be "
                                    f"ranked, python rank.py {run_dir / 'last.pt'}")


@pytest.mark.parametrize("script", ["rank", "report"])
def test_a_figure_path_that_matplotlib_cannot_write_as_named_is_refused_first(tmp_path, monkeypatch, capsys, script):
    """--out x.txt was matplotlib's traceback; --out spectra (no suffix) wrote spectra.png and
    printed "wrote spectra"; an existing folder now receives spectra.png in it."""
    import rank
    root = tmp_path / "runs"
    run_dir = make_run(root, "ptb-softmax", "softmax", 1)
    np.save(run_dir / "singular_values_test_logp.npy", np.exp(-0.05 * np.arange(50)))
    main = rank.main if script == "rank" else report.main
    argv = ["--plot", str(run_dir)] if script == "rank" else ["spectra", str(run_dir)]
    for bad in ("x.txt", "spectra"):
        assert main([*argv, "--out", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: --out {tmp_path / bad}: expected a figure file ending in .png, .pdf, "
                       f".svg, or an existing folder (which receives spectra.png)\n")
    assert not list(tmp_path.glob("x*")) and not (tmp_path / "spectra.png").exists()
    folder = tmp_path / "figs"
    folder.mkdir()
    assert main([*argv, "--out", str(folder)]) == 0
    assert f"wrote {folder / 'spectra.png'}" in capsys.readouterr().out
    assert (folder / "spectra.png").read_bytes()[:4] == b"\x89PNG"
    # a path that cannot be written (a file where its folder should be) is one line, not a traceback
    blocked = folder / "spectra.png" / "x.png"
    assert main([*argv, "--out", str(blocked)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {blocked}: cannot write the figure there (")


def test_rank_plot_and_report_spectra_draw_through_one_function(tmp_path, monkeypatch):
    """rank.py --plot and report.py spectra are two doors to one figure: the same curves reach
    the same plotting call, and both default to spectra.png next to the runs."""
    import rank
    from analysis import spectra
    root = tmp_path / "runs"
    for name, decay in (("softmax", 0.05), ("mos", 0.01)):
        run_dir = make_run(root, f"ptb-{name}", name, 1)
        np.save(run_dir / "singular_values_test_logp.npy", np.exp(-decay * np.arange(50)) * 1e3)
    calls = []
    monkeypatch.setattr(spectra, "plot_spectra", lambda curves, path, first, ymax: calls.append(
        ([(label, values.tolist(), dashed) for label, values, dashed in curves], path, first, ymax)))
    runs = [str(root / "ptb-mos"), str(root / "ptb-softmax")]
    assert rank.main(["--plot", *runs]) == 0
    assert report.main(["spectra", *runs]) == 0
    assert len(calls) == 2 and calls[0] == calls[1]
    assert calls[0][1] == root.resolve() / "spectra.png"


def test_spectra_draw_a_runs_log_p_and_f_l_curves_in_one_colour(tmp_path, monkeypatch):
    """Eleven curves from seven runs (more than one colour cycle): each run keeps one colour,
    solid for log P and dashed for f(l), and no two runs share one."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from analysis.spectra import plot_spectra
    seen = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, dpi=None: seen.append(
        [(line.get_label(), line.get_color(), line.get_linestyle()) for line in fig.axes[0].get_lines()]))
    values = np.linspace(10.0, 1.0, 20)
    curves = [(f"run{i}{suffix}", values, bool(suffix)) for i in range(7)
              for suffix in (("", " f(l)") if i < 4 else ("",))]
    plot_spectra(curves, tmp_path / "s.png")
    lines = seen[0]
    colour = {label: c for label, c, _ in lines}
    assert [colour[f"run{i} f(l)"] == colour[f"run{i}"] for i in range(4)] == [True] * 4
    assert len({colour[f"run{i}"] for i in range(7)}) == 7
    assert {label: style for label, _, style in lines}["run2 f(l)"] == "--"


def test_the_report_says_where_each_rows_runs_trained(runs, tmp_path):
    """run.json's device_name (older runs: device, or on a CPU the processors cpu_times.jsonl's
    train.py lines name): one line when all share one, else per row."""
    assert report.main(["table", str(runs), "--out", str(tmp_path / "one")]) == 0
    assert "Where the runs trained (run.json, else cpu_times.jsonl): every run on unrecorded." in \
        (tmp_path / "one.md").read_text()
    for run_dir in sorted(runs.iterdir()):
        info = json.loads((run_dir / "run.json").read_text())
        gpu = run_dir.name in ("ptb-softmax-seed3", "ptb-ss-seed4")
        info.update(device="cuda" if gpu else "cpu", **({"device_name": "cuda:0 (NVIDIA H200)"} if gpu else {}))
        (run_dir / "run.json").write_text(json.dumps(info))
    assert report.main(["table", str(runs), "--out", str(tmp_path / "mixed")]) == 0
    markdown = (tmp_path / "mixed.md").read_text()
    assert "- Softmax: 2 on cpu, 1 on cuda:0 (NVIDIA H200)\n- SS: 3 on cpu, 1 on cuda:0 (NVIDIA H200)" in markdown
    # a run that records its processor beside older ones that do not: the older ones' model unrecorded
    info = json.loads((runs / "ptb-softmax-seed1" / "run.json").read_text())
    (runs / "ptb-softmax-seed1" / "run.json").write_text(json.dumps({**info, "device_name": "cpu (EPYC)"}))
    assert report.main(["table", str(runs), "--out", str(tmp_path / "named")]) == 0
    assert "- Softmax: 1 on cpu (model not recorded), 1 on cpu (EPYC), 1 on cuda:0 (NVIDIA H200)" in \
        (tmp_path / "named.md").read_text()
    # an older CPU run without device_name whose cpu_times.jsonl names the processor of its training
    # (two sittings, two machines; evaluate.py's line and a line without a processor do not count)
    lines = [{"script": "train.py", "processor": "EPYC"}, {"script": "train.py", "processor": "Xeon"},
             {"script": "train.py"}, {"script": "evaluate.py", "processor": "Other"}]
    (runs / "ptb-softmax-seed2" / "cpu_times.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert report.main(["table", str(runs), "--out", str(tmp_path / "timed")]) == 0
    assert "- Softmax: 1 on cpu (EPYC and Xeon), 1 on cpu (EPYC), 1 on cuda:0 (NVIDIA H200)" in \
        (tmp_path / "timed.md").read_text()


def test_a_rank_cell_says_a_spread_of_zero_as_such():
    """Seeds that all reach one rank print it with ± 0, as report.py versus does, so that a row of
    several runs is not read as one run's value; one run prints its value alone."""
    assert format_rank([34, 34, 34], 3) == "34 ± 0"
    assert format_rank([34], 1) == "34"
    assert format_rank([940, 950], 2) == "945.0 ± 7.1"
    assert format_rank([34, 34], 3) == "34 ± 0 (n=2)"


def test_one_pair_is_its_own_holm_family_and_the_rank_note_gives_the_contexts(tmp_path):
    """A table with one testable pair says that Holm's p is its own p (not "over the 1 pairs");
    the note says over how many test contexts the ranks were taken, and when runs differ."""
    root = tmp_path / "runs"
    for seed, ppl in ((1, 100.0), (2, 101.0)):
        make_run(root, f"ptb-softmax-seed{seed}", "softmax", seed, test_ppl=ppl, press_rank=34)
        make_run(root, f"ptb-mos-seed{seed}", "mos", seed, test_ppl=ppl - 5, press_rank=900 + seed)
    for run_dir in root.iterdir():
        rank = json.loads((run_dir / "rank_test.json").read_text())
        rank["contexts"] = 300 if run_dir.name == "ptb-mos-seed2" else 10_000
        rank["dtype"] = "float64" if run_dir.name == "ptb-mos-seed1" else "float32"
        (run_dir / "rank_test.json").write_text(json.dumps(rank))
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    text = (tmp_path / "t.md").read_text()
    assert "| pair | n (Welch's df) | test ppl: % [95% CI], p | Holm's p (one pair: its own p) |" in text
    # ranks taken over other contexts or in another precision are not pooled: listed, with the
    # command that ranks them as the rest (a run not ranked yet gets the same options)
    assert ("over the first 10,000 test contexts in float32 (rank.py --contexts, --dtype; the same for every "
            "run: a rank taken otherwise is listed under Missing or incomplete)") in text
    missing = text.split("## Missing or incomplete")[1]
    for name, contexts, dtype in (("ptb-mos-seed1", 10_000, "float64"), ("ptb-mos-seed2", 300, "float32")):
        assert (f"press_rank (rank_test.json is over {contexts} contexts in {dtype}, the other ranks here over "
                f"10000 in float32: run python rank.py {root / name} --contexts 10000)") in missing
    rows = read_csv(tmp_path / "t.csv")
    assert rows["MoS"]["press_rank_mean"] == "" and float(rows["Softmax"]["press_rank_mean"]) == 34
    make_run(root, "ptb-softmax-seed3", "softmax", 3, test_ppl=100.5)          # not ranked yet
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    assert (f"press_rank (no rank_test.json: run python rank.py {root / 'ptb-softmax-seed3'} --contexts 10000)"
            in (tmp_path / "t.md").read_text())
    # versus lists the ranks it leaves out beside its table, a run not ranked yet among them
    assert report.main(["versus", str(root), "--key", "train.epochs", "--out", str(tmp_path / "v")]) == 0
    text = (tmp_path / "v.md").read_text()
    assert (f"- `{root / 'ptb-mos-seed2'}`: rank_test.json is over 300 contexts in float32, the other ranks "
            f"here over 10000 in float32: run python rank.py {root / 'ptb-mos-seed2'} --contexts 10000\n" in text)
    assert (f"- `{root / 'ptb-softmax-seed3'}`: no rank_test.json: run python rank.py "
            f"{root / 'ptb-softmax-seed3'} --contexts 10000\n" in text)
    # each corpus its own setting ([SB]: PTB over all its contexts, WikiText-2 over the first 33,320)
    wt2 = make_run(root, "wikitext-2-softmax-seed1", "softmax", 1, test_ppl=70.0, press_rank=300,
                   dataset="wikitext-2")
    (wt2 / "rank_test.json").write_text(json.dumps({"press_rank": 300, "shape": [33320, 33278],
                                                   "contexts": 33320, "dtype": "float32"}))
    assert report.main(["table", str(root), "--out", str(tmp_path / "t")]) == 0
    missing = (tmp_path / "t.md").read_text().split("## Missing or incomplete")[1]
    assert "wikitext-2-softmax-seed1" not in missing and "ptb-mos-seed2" in missing
