"""Top-k next-word predictions of a tiny trained run, checked against evaluation's log-probs."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import report
import train
from analysis import AnalysisError
from analysis.predictions import make_contexts, predict
from data.batching import batchify
from experiment.evaluation import iterate_chunks
from experiment.loading import load_trained
from tests.conftest import TINY


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and the machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_run(ptb_slice, tmp_path_factory) -> Path:
    """One epoch of the TINY model on the first lines of the PTB slice."""
    data = tmp_path_factory.mktemp("small-ptb")
    (data / "ptb").mkdir()
    for split, lines in (("train", 80), ("valid", 12), ("test", 12)):
        text = (ptb_slice / "ptb" / f"{split}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (data / "ptb" / f"{split}.txt").write_text("".join(text[:lines]), encoding="utf-8")
    run_dir = tmp_path_factory.mktemp("runs") / "ptb-softmax"
    assert train.main(["configs/ptb/softmax.yaml", f"data.data_dir={data}", *TINY,
                       "train.epochs=1", f"run.dir={run_dir}"]) == 0
    return run_dir


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
