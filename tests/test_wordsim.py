"""Word similarity: benchmark files, Spearman's rho of cosine similarities, the win-count matrix."""
from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import data.corpus
import report
from analysis import AnalysisError
from analysis.wordsim import (Benchmark, ModelScores, Score, by_head, read_benchmark, read_benchmarks, score, win_counts,
                             write_wordsim)
from data import load_corpus

# [SB] SM Table 13: pairs with a word outside the PTB vocabulary, per benchmark.
SB_PTB_SKIPPED = {"WS-353-ALL": 116, "WS-353-SIM": 66, "WS-353-REL": 80, "RG-65": 55, "MC-30": 21,
                  "MTurk-287": 146, "MTurk-771": 346, "MEN-TR-3k": 1952, "YP-130": 65, "VERB-143": 9,
                  "RW-STANFORD": 1889, "SimVerb-3500": 1746, "SIMLEX-999": 424}


@pytest.fixture(scope="module")
def benchmark_dir(shared_data_dir) -> Path:
    return shared_data_dir / "word-similarity"


def fan() -> tuple[np.ndarray, dict[str, int]]:
    """'base' and four words at growing angles from it: cosine similarity falls from a1 to a4."""
    angles = np.radians([0, 10, 20, 40, 80])
    words = ["base", "a1", "a2", "a3", "a4"]
    return np.stack([np.cos(angles), np.sin(angles)], axis=1) * [[1], [2], [3], [0.5], [7]], \
        {w: i for i, w in enumerate(words)}


def test_spearman_on_a_hand_made_embedding():
    embeddings, word_to_id = fan()
    pairs = [("base", f"a{i}") for i in range(1, 5)]
    same = Benchmark("same", [(a, b, s) for (a, b), s in zip(pairs, [9.0, 7.0, 4.0, 1.0])])
    assert dataclasses.astuple(score(embeddings, word_to_id, same))[:3] == pytest.approx((1.0, 4, 0))
    reversed_ = Benchmark("rev", [(a, b, s) for (a, b), s in zip(pairs, [1.0, 4.0, 7.0, 9.0])])
    assert score(embeddings, word_to_id, reversed_).rho == pytest.approx(-1.0)
    # ranks 2,1,3,4 against 1,2,3,4: rho = 1 - 6 * 2 / (4 * 15) = 0.8; an unknown word is skipped
    swapped = Benchmark("swap", [(a, b, s) for (a, b), s in zip(pairs, [7.0, 9.0, 4.0, 1.0])]
                        + [("base", "zebra", 5.0), ("zebra", "a1", 2.0)])
    assert dataclasses.astuple(score(embeddings, word_to_id, swapped))[:3] == pytest.approx((0.8, 4, 2))
    one = Benchmark("one", [("base", "a1", 1.0), ("base", "zebra", 2.0)])
    result = score(embeddings, word_to_id, one)
    assert math.isnan(result.rho) and (result.used, result.skipped) == (1, 1)


def test_benchmark_files_are_read_lower_cased_and_bad_lines_named(tmp_path):
    path = tmp_path / "EN-TOY-3.txt"
    path.write_text("Tiger\tcat\t7.35\r\n\nplane car 5.77\nbroken line\n")
    with pytest.raises(AnalysisError) as error:
        read_benchmark(path)
    assert str(error.value) == f"{path}:4: expected 'word1 word2 score', got 'broken line'"
    path.write_text("Tiger\tcat\t7.35\r\n\nplane car 5.77\n")
    assert read_benchmark(path) == Benchmark("TOY-3", [("tiger", "cat", 7.35), ("plane", "car", 5.77)])
    path.write_text("a b c\n")
    with pytest.raises(AnalysisError, match=":1: expected"):
        read_benchmark(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisError, match="no benchmark files"):
        read_benchmarks(tmp_path / "empty")


def test_the_13_benchmarks_and_the_ptb_vocabulary_give_sb_table_13(benchmark_dir, shared_data_dir):
    benchmarks = read_benchmarks(benchmark_dir)
    for b in benchmarks:
        lines = [l for l in (benchmark_dir / f"EN-{b.name}.txt").read_text().splitlines() if l.strip()]
        assert len(b.pairs) == len(lines)
    corpus = load_corpus("ptb", shared_data_dir)
    embeddings = np.random.default_rng(0).normal(size=(corpus.vocab_size, 4))
    skipped = {b.name: score(embeddings, corpus.word_to_id(), b).skipped for b in benchmarks}
    assert skipped == SB_PTB_SKIPPED


def test_win_counts():
    rhos = np.array([[0.5, 0.2, 0.9],
                     [0.4, 0.3, np.nan],
                     [0.5, 0.1, 0.1]])
    assert win_counts(rhos).tolist() == [[0, 1, 2],     # a tie is no win; nan is never above or below
                                         [1, 0, 1],
                                         [0, 1, 0]]


def test_report_on_a_trained_run(tiny_run, benchmark_dir, tmp_path):
    out = tmp_path / "ws"
    assert report.main(["wordsim", str(tiny_run), "--benchmarks", str(benchmark_dir), "--out", str(out)]) == 0
    with open(out.with_suffix(".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == ["ptb-softmax"]
    ckpt = torch.load(tiny_run / "best.pt", weights_only=True)
    corpus = load_corpus("ptb", ckpt["config"]["data"]["data_dir"], allow_modified=True)
    embeddings = ckpt["model"]["body.encoder.weight"].double().numpy()
    for b in read_benchmarks(benchmark_dir):
        expected = score(embeddings, corpus.word_to_id(), b)
        assert int(rows[0][f"{b.name}_used"]) + int(rows[0][f"{b.name}_skipped"]) == len(b.pairs)
        assert int(rows[0][f"{b.name}_used"]) == expected.used
        if expected.used >= 2:
            assert float(rows[0][b.name]) == pytest.approx(expected.rho)
    markdown = out.with_suffix(".md").read_text()
    assert "| pairs used / skipped (ptb) |" in markdown
    assert out.with_name("ws_wins.png").read_bytes()[:4] == b"\x89PNG"

    assert report.main(["wordsim", str(tiny_run), "--benchmarks", str(benchmark_dir), "--by-head",
                        "--out", str(tmp_path / "heads")]) == 0
    assert "| Softmax | 1 |" in (tmp_path / "heads.md").read_text()


def test_a_row_of_several_runs_gives_its_n_and_spread(tmp_path):
    """--by-head averages rho over a head's seeds: the row says how many and their sample std,
    in the Markdown and the CSV; a row of one run has no spread."""
    benchmarks = [Benchmark("A", []), Benchmark("B", [])]
    runs = [ModelScores(f"ptb-mos-seed{i}", "ptb", "mos", [Score(a, 10, 2), Score(b, 8, 4)], "ptb-vocab")
            for i, (a, b) in enumerate([(0.10, 0.30), (0.20, 0.50), (0.30, 0.40)])]
    runs.append(ModelScores("ptb-softmax-seed1", "ptb", "softmax", [Score(0.25, 10, 2), Score(0.35, 8, 4)], "ptb-vocab"))
    rows = by_head(runs)
    assert [(r.label, r.runs) for r in rows] == [("MoS", 3), ("Softmax", 1)]
    assert rows[0].scores[0].rho == pytest.approx(0.2) and rows[0].scores[0].std == pytest.approx(0.1)
    assert rows[0].scores[1].std == pytest.approx(np.std([0.3, 0.5, 0.4], ddof=1))
    assert math.isnan(rows[1].scores[0].std)
    markdown = write_wordsim(rows, benchmarks, tmp_path / "ws")
    assert "| MoS | 3 | 0.2000 ± 0.1000 | 0.4000 ± 0.1000 |" in markdown
    assert "| Softmax | 1 | 0.2500 | 0.3500 |" in markdown
    assert "not a test" in markdown
    # a benchmark with fewer than two pairs in the vocabulary has no rho: a dash, said why, not "nan"
    lone = [ModelScores("ptb-ss-seed1", "ptb", "ss", [Score(float("nan"), 1, 11), Score(0.3, 8, 4)], "ptb-vocab")]
    text = write_wordsim(lone, benchmarks, tmp_path / "lone")
    assert "| ptb-ss-seed1 | 1 | — | 0.3000 |" in text and "nan" not in text
    assert "—: fewer than two of the benchmark's pairs in the vocabulary, so no rho." in text
    with open(tmp_path / "ws.csv", newline="") as f:
        csv_rows = {r["model"]: r for r in csv.DictReader(f)}
    assert csv_rows["MoS"]["runs"] == "3" and float(csv_rows["MoS"]["A_std"]) == pytest.approx(0.1)
    assert csv_rows["Softmax"]["A_std"] == "" and csv_rows["Softmax"]["B_used"] == "8"


def test_a_benchmark_file_not_in_utf8_is_named_with_its_line(tiny_run, tmp_path, capsys):
    """A Latin-1 benchmark file is one line naming the file, its line and UTF-8 (exit 2), as a
    corpus file's is, not a UnicodeDecodeError traceback."""
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    path = folder / "EN-X.txt"
    path.write_bytes(b"tiger cat 7.35\ncaf\xe9 coffee 3.0\n")
    with pytest.raises(AnalysisError) as error:
        read_benchmark(path)
    assert str(error.value).startswith(f"{path}:2: not UTF-8 text (byte 0xe9)")
    assert report.main(["wordsim", str(tiny_run), "--benchmarks", str(folder), "--out", str(tmp_path / "ws")]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"error: {path}:2: not UTF-8") and stderr.count("\n") == 1
    # a benchmark name that is not a readable file is one line too
    path.unlink()
    (folder / "EN-DIR.txt").mkdir()
    with pytest.raises(AnalysisError, match=r"EN-DIR\.txt: cannot read the benchmark file"):
        read_benchmarks(folder)


def test_only_the_en_files_of_the_folder_are_benchmarks(tmp_path):
    """The published benchmarks are EN-*.txt, as --benchmarks' help says: a README.txt beside them
    is not read (it was refused as a bad benchmark line)."""
    (tmp_path / "EN-TOY-2.txt").write_text("tiger cat 7.35\nplane car 5.77\n")
    (tmp_path / "README.txt").write_text("These are the word-similarity benchmarks.\n")
    assert read_benchmarks(tmp_path) == [Benchmark("TOY-2", [("tiger", "cat", 7.35), ("plane", "car", 5.77)])]
    (tmp_path / "EN-TOY-2.txt").unlink()
    with pytest.raises(AnalysisError, match=r"no benchmark files \(EN-\*\.txt"):
        read_benchmarks(tmp_path)


def test_pairs_and_wins_are_per_vocabulary(tmp_path):
    """Runs of different vocabularies (here two PTB runs on different corpus files, and a WikiText-2
    run) are scored on different pairs: the Markdown gives each vocabulary's pairs used / skipped,
    and no win is counted between rows of different vocabularies; --by-head refuses to average
    their rho."""
    benchmarks = [Benchmark("A", []), Benchmark("B", [])]
    rows = [ModelScores("ptb-softmax", "ptb", "softmax", [Score(0.5, 10, 2), Score(0.4, 8, 4)], "ptb-1"),
            ModelScores("ptb-mos", "ptb", "mos", [Score(0.6, 10, 2), Score(0.5, 8, 4)], "ptb-1"),
            ModelScores("ptb-mos-edited", "ptb", "mos", [Score(0.1, 7, 5), Score(0.2, 6, 6)], "ptb-2"),
            ModelScores("wt2-mos", "wikitext-2", "mos", [Score(0.9, 11, 1), Score(0.9, 12, 0)], "wt2")]
    text = write_wordsim(rows, benchmarks, tmp_path / "ws")
    assert "| pairs used / skipped (ptb: ptb-softmax, ptb-mos) |  | 10 / 2 | 8 / 4 |" in text
    assert "| pairs used / skipped (ptb: ptb-mos-edited) |  | 7 / 5 | 6 / 6 |" in text
    assert "| pairs used / skipped (wikitext-2) |  | 11 / 1 | 12 / 0 |" in text
    assert "| ptb-softmax | 0 | 0 | — | — |" in text
    assert "| ptb-mos | 2 | 0 | — | — |" in text
    assert "| wt2-mos | — | — | — | 0 |" in text
    assert "—: the two rows have different vocabularies" in text
    assert (tmp_path / "ws_wins.png").read_bytes()[:4] == b"\x89PNG"
    # one vocabulary: one row named by its dataset, every win counted, no note
    text = write_wordsim(rows[:2], benchmarks, tmp_path / "one")
    assert "| pairs used / skipped (ptb) |" in text and "different vocabularies" not in text
    with pytest.raises(AnalysisError, match=r"--by-head: MoS \(ptb\): the runs have different vocabularies "
                                            r"\(ptb-1: ptb-mos; ptb-2: ptb-mos-edited\)"):
        by_head(rows)
    assert [r.label for r in by_head([rows[0], rows[1], rows[3]])] == ["Softmax (ptb)", "MoS (ptb)", "MoS (wikitext-2)"]


def test_the_benchmarks_default_to_the_data_directorys_folder(tiny_run, benchmark_dir, tmp_path, monkeypatch,
                                                              capsys):
    """Without --benchmarks and $AWD_DATA_DIR, the benchmarks are word-similarity/ in the data
    directory the corpora default to (as a plan's wordsim step reads them); a folder that is not
    there is one line saying where it looked and how to point elsewhere."""
    default = tmp_path / "corpora"
    (default / "word-similarity").mkdir(parents=True)
    for name in ("EN-MC-30.txt", "EN-WS-353-ALL.txt"):
        (default / "word-similarity" / name).write_bytes((benchmark_dir / name).read_bytes())
    monkeypatch.setattr(data.corpus, "DEFAULT_DATA_DIR", default)
    monkeypatch.delenv("AWD_DATA_DIR", raising=False)
    assert report.main(["wordsim", str(tiny_run), "--out", str(tmp_path / "ws")]) == 0
    with open(tmp_path / "ws.csv", newline="") as f:
        assert "WS-353-ALL_used" in next(csv.DictReader(f))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("AWD_DATA_DIR", str(elsewhere))
    capsys.readouterr()
    assert report.main(["wordsim", str(tiny_run), "--out", str(tmp_path / "ws")]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"error: {elsewhere / 'word-similarity'}: no such benchmark folder") and stderr.count("\n") == 1
    assert "$AWD_DATA_DIR" in stderr and "--benchmarks FOLDER" in stderr
