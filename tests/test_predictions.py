"""Top-k next-word predictions of a tiny trained run, checked against evaluation's log-probs."""
from __future__ import annotations


import pytest
import torch

import report
from analysis import AnalysisError
from analysis.predictions import make_contexts, predict
from data.batching import batchify
from evaluation.loop import iterate_chunks
from experiment.loading import load_trained


@pytest.fixture(scope="module")
def trained(tiny_run):
    return load_trained(tiny_run, torch.device("cpu"))


def test_predictions_are_the_rows_evaluation_scores(trained):
    corpus, bptt = trained.corpus, trained.config.train.bptt
    rows = torch.cat([out.log_probs[:, 0] for out, _ in
                      iterate_chunks(trained.model, batchify(corpus.test, 1), bptt)])
    last = corpus.test.numel() - 2
    positions = [0, 7, bptt, 3 * bptt + 1, last]      # chunk starts, middles and the very end
    contexts = make_contexts(corpus, positions, [])
    predictions = predict(trained.model, bptt, corpus.vocab, contexts, k=5)
    for p, context, top in zip(positions, contexts, predictions):
        probs = [prob for _, prob in top]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0
        expected = torch.topk(rows[p].double().exp(), 5)
        assert [w for w, _ in top] == [corpus.vocab[i] for i in expected.indices.tolist()]
        assert probs == pytest.approx(expected.values.tolist(), rel=1e-6)
        assert context.true_next == corpus.vocab[int(corpus.test[p + 1])]


def test_a_text_context_is_the_same_as_the_test_position_it_spells(trained):
    corpus, bptt = trained.corpus, trained.config.train.bptt
    p = 2 * bptt + 3
    text = " ".join(corpus.vocab[i] for i in corpus.test[: p + 1].tolist())
    by_position, by_text = predict(trained.model, bptt, corpus.vocab,
                                   make_contexts(corpus, [p], [text]), k=5)
    assert [w for w, _ in by_text] == [w for w, _ in by_position]
    assert [q for _, q in by_text] == pytest.approx([q for _, q in by_position], rel=1e-5)


def test_bad_contexts(trained):
    with pytest.raises(AnalysisError, match="'markit' is not in the ptb vocabulary"):
        make_contexts(trained.corpus, [], ["the stock markit"])
    n = trained.corpus.test.numel()
    with pytest.raises(AnalysisError, match=f"positions run from 0 to {n - 2}"):
        make_contexts(trained.corpus, [n - 1], [])


def test_markdown_side_by_side(tiny_run, tmp_path, capsys):
    out = tmp_path / "top5.md"
    assert report.main(["top5", str(tiny_run), "--positions", "10", "--contexts", "the company",
                        "--out", str(out)]) == 0
    text = out.read_text()
    assert capsys.readouterr().out.strip() == text.strip()
    assert "## test position 10" in text and "## text 'the company'" in text
    assert "→ true next word: **`" in text
    assert text.count("| 1 | `") + text.count("| 1 | **`") == 2      # one table per context
    assert report.main(["top5", str(tiny_run), "--contexts", "the nonword"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: context 'the nonword': 'nonword' is not in the ptb vocabulary"


@pytest.mark.parametrize("command", ["top5", "wordsim"])
def test_a_run_without_best_pt_is_one_line_that_points_nowhere_refused(command, tiny_run, tmp_path, capsys):
    """The message offered RUN/last.pt, which report.py refuses (it takes run directories)."""
    import shutil
    early = tmp_path / "early"
    shutil.copytree(tiny_run, early, ignore=shutil.ignore_patterns("best.pt"))
    extra = ["--positions", "3"] if command == "top5" else ["--out", str(tmp_path / "ws")]
    assert report.main([command, str(early), *extra]) == 2
    assert capsys.readouterr().err == (
        f"error: {early}: the run has no validated model yet (a last.pt, no best.pt: train.py writes it when "
        f"the run first validates); report.py {command} reads it\n")
