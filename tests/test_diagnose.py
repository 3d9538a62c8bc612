"""report.py diagnose (analysis/diagnose.py) on tiny runs trained here: the body's output spread,
the LSTM's share of the gradient from the run's start, LMS-PLIF's slope movement, the unigram
level; the command's tables and files; bad input is one line and exit 2."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import evaluate
import report
import train
from analysis import commands
from analysis.diagnose import (body_spread, diagnose_run, gradient_shares, slope_movement,
                               unigram_perplexity)
from experiment.loading import load_trained
from model import build_model
from tests.conftest import TINY, head_overrides

PTB = "configs/ptb/softmax.yaml"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def runs(small_data, tmp_path_factory) -> dict[str, Path]:
    """One epoch (~50 steps) of Softmax, LMS-PLIF and LMS-PLIF†; Softmax evaluated; and a run
    stopped before its first validation."""
    root = tmp_path_factory.mktemp("diagnose")
    made = {}
    for head in ("softmax", "plif", "plif_frozen"):
        made[head] = root / f"ptb-{head}"
        assert train.main([PTB, f"data.data_dir={small_data}", *TINY, *head_overrides(head),
                           "train.epochs=1", f"run.dir={made[head]}"]) == 0
    assert evaluate.main([str(made["softmax"]), "--device", "cpu"]) == 0
    made["early"] = root / "ptb-early"
    assert train.main([PTB, f"data.data_dir={small_data}", *TINY, "run.max_steps=2",
                       f"run.dir={made['early']}"]) == 0
    return made


def test_the_spread_of_a_constant_body_is_0_and_of_a_trained_one_is_not(runs):
    trained = load_trained(runs["softmax"], CPU)
    spread = body_spread(trained.model, trained.corpus.valid)
    # by the definition: 10 columns of the validation text, each unit's std over all positions
    valid = trained.corpus.valid.numpy()
    columns = valid[: len(valid) // 10 * 10].reshape(10, -1).T[:700]
    with torch.no_grad():
        raw = trained.model(torch.from_numpy(columns), trained.model.init_hidden(10)).last_raw_output
    assert spread > 0
    assert spread == pytest.approx(raw.numpy().reshape(-1, raw.shape[-1]).std(axis=0, ddof=1).mean(), rel=1e-5)
    # A last layer with every weight and bias 0: each gate 1/2, the cell input tanh(0) = 0, so the
    # cell and the output stay exactly 0 at every position.
    with torch.no_grad():
        for p in trained.model.body.rnns[-1].parameters():
            p.zero_()
    assert body_spread(trained.model, trained.corpus.valid) == 0.0


def test_frozen_slopes_did_not_move_and_learnt_ones_did(runs):
    frozen = slope_movement(load_trained(runs["plif_frozen"], CPU))
    assert (frozen.v_max, frozen.slope_mean, frozen.slope_max) == (0.0, 0.0, 0.0)   # the start rebuilt right
    learnt = slope_movement(load_trained(runs["plif"], CPU))
    assert learnt.slopes == 16 and learnt.v_max > 0 and 0 < learnt.slope_mean <= learnt.slope_max
    assert slope_movement(load_trained(runs["softmax"], CPU)) is None        # no slopes


def test_the_gradient_share_is_that_of_the_runs_start(runs):
    trained = load_trained(runs["softmax"], CPU)
    config, corpus = trained.config, trained.corpus
    samples = gradient_shares(config, corpus, steps=4, every=2, device=CPU)
    assert [s.step for s in samples] == [0, 2, 4]
    assert all(0 < s.lstm_share <= 1 and s.grad_norm > 0 for s in samples)
    # Step 0 computed directly: the seeded model train.py starts from, one cross-entropy backward
    # on the first bptt window of the training columns.
    t = config.train
    torch.manual_seed(t.seed)
    model = build_model(config, corpus.vocab_size).train()
    train_ids = corpus.train[: len(corpus.train) // t.batch_size * t.batch_size].view(t.batch_size, -1).t()
    out = model(train_ids[: t.bptt], model.init_hidden(t.batch_size), train_ids[1: t.bptt + 1])
    loss = -out.target_log_probs.mean()
    loss.backward()
    squares = {name: p.grad.pow(2).sum().item() for name, p in model.named_parameters()}
    total = math.sqrt(sum(squares.values()))
    lstm = math.sqrt(sum(v for name, v in squares.items() if name.startswith("body.rnns.")))
    assert samples[0].loss == pytest.approx(loss.item(), rel=1e-6)
    assert samples[0].grad_norm == pytest.approx(total, rel=1e-5)
    assert samples[0].lstm_share == pytest.approx(lstm / total, rel=1e-5)
    assert gradient_shares(config, corpus, steps=4, every=2, device=CPU) == samples   # seeded: repeatable


def test_the_unigram_level_is_the_training_frequencies_perplexity():
    assert unigram_perplexity(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 1]), 3) == (pytest.approx(2.0), False)
    # a test word the training split never has: add-one, (3 + 1) / (4 + 3) and (0 + 1) / 7
    ppl, smoothed = unigram_perplexity(torch.tensor([0, 0, 0, 1]), torch.tensor([0, 2]), 3)
    assert smoothed and ppl == pytest.approx(math.exp(-(math.log(4 / 7) + math.log(1 / 7)) / 2))


def test_diagnose_prints_a_table_and_writes_markdown_and_json(runs, tmp_path, capsys):
    out = tmp_path / "report" / "diagnosis"
    names = ("softmax", "plif", "plif_frozen")
    assert report.main(["diagnose", *(str(runs[n]) for n in names), "--steps", "2", "--every", "1",
                        "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == (tmp_path / "report" / "diagnosis.md").read_text().strip()
    found = json.loads((tmp_path / "report" / "diagnosis.json").read_text())
    assert found["settings"]["steps"] == 2 and [r["head"] for r in found["runs"]] == list(names)
    # where it was measured: the gradient share's later steps depend on the processor's rounding
    from experiment.loading import device_name
    assert found["settings"]["device"] == device_name(CPU) and found["settings"]["torch"] == torch.__version__
    assert "commit" in found["settings"]["code"]
    assert f"- Measured on {device_name(CPU)}, torch {torch.__version__}." in printed
    softmax, plif, frozen = found["runs"]
    test_ppl = json.loads((runs["softmax"] / "eval_best.json").read_text())["test_ppl"]
    assert softmax["test_ppl"] == test_ppl and plif["test_ppl"] is None
    assert softmax["slopes"] is None and frozen["slopes"]["slope_max"] == 0 and plif["slopes"]["slope_max"] > 0
    assert [s["step"] for s in plif["gradient"]] == [0, 1, 2]
    # the same numbers as the functions give
    expected = diagnose_run(runs["softmax"], ["spread", "perplexity"], 2, 1, CPU)
    assert softmax["spread"] == expected.spread and softmax["unigram_ppl"] == expected.unigram_ppl
    lines = printed.splitlines()
    header = next(line for line in lines if line.startswith("| run "))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "run", "head", "d", "seed", "test ppl", "unigram ppl", "body spread", "slope change (max)",
        "LSTM share"]
    row = next(line for line in lines if line.startswith("| ptb-softmax "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["ptb-softmax", "Softmax", "16", "141", f"{test_ppl:.2f}"]
    assert cells[6] == f"{expected.spread:.4f}" and cells[7] == "—"
    frozen_row = next(line for line in lines if line.startswith("| ptb-plif_frozen "))
    assert "0.00e+00" in frozen_row
    steps = [line for line in lines if line.startswith("| ptb-plif ")]
    assert len(steps) == 1 + 3                       # its summary row and steps 0, 1, 2


def test_measure_chooses_and_the_gradient_share_needs_no_best_pt(runs, capsys):
    assert report.main(["diagnose", str(runs["early"]), "--measure", "gradient-share", "perplexity",
                        "--steps", "1"]) == 0
    printed = capsys.readouterr().out
    assert "LSTM share" in printed and "body spread" not in printed and "slopes" not in printed


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys):
    assert report.main(["diagnose", str(tmp_path / "nope")]) == 2
    assert "nope: no such run directory" in one_line(capsys)
    (tmp_path / "empty").mkdir()
    assert report.main(["diagnose", str(tmp_path / "empty")]) == 2
    assert "not a run directory and holds none" in one_line(capsys)
    assert report.main(["diagnose", str(runs["early"])]) == 2
    assert (f"{runs['early']}: the run has no validated model yet (a last.pt, no best.pt: train.py writes "
            f"it when the run first validates); spread and "
            f"slopes read it, --measure gradient-share perplexity need none") in one_line(capsys)
    assert report.main(["diagnose", str(runs["softmax"]), "--measure", "gradient-share",
                        "--steps", "100000"]) == 2
    assert "--steps 100000: the training split gives" in one_line(capsys)
    assert report.main(["diagnose", str(runs["softmax"]), "--device", "gpu"]) == 2
    assert "--device" in one_line(capsys)
    for argv, message in ((["--steps", "x"], "argument --steps: expected an integer >= 1, got 'x'"),
                          (["--every", "0"], "argument --every: expected an integer >= 1, got 0"),
                          (["--measure", "loss"], "argument --measure: invalid choice: 'loss'")):
        with pytest.raises(SystemExit) as exit_info:
            report.main(["diagnose", str(runs["softmax"]), *argv])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_plans_may_call_diagnose():
    assert commands.check(["diagnose", "runs/x", "--measure", "spread", "slopes", "--out", "r/d"]) is None
    assert commands.check(["diagnose", "runs/x", "--steps", "0"]).endswith(
        "argument --steps: expected an integer >= 1, got 0")


def test_a_named_data_dir_without_the_corpus_is_refused_not_downloaded_into(tiny_run, tmp_path, capsys):
    """Every measure, not only those that load best.pt: --measure perplexity tried a download."""
    import report
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report.main(["diagnose", str(tiny_run), "--measure", "perplexity", "--data-dir", str(empty)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --data-dir {empty}: no train.txt in {empty / 'ptb'}: give the folder that holds "
                   f"ptb/, or leave --data-dir out for the run's own"), err
    assert not any(empty.iterdir())


def test_a_test_ppl_of_other_weights_than_best_pt_is_not_shown(runs, tmp_path, capsys):
    """As report.py table: eval_best.json computed before the run trained on and improved (its
    step is not best.pt's by metrics.jsonl) is of another model; diagnose said its number."""
    import shutil
    run = tmp_path / "ptb-softmax"
    shutil.copytree(runs["softmax"], run, ignore=shutil.ignore_patterns("*.pt"))
    evaluation = json.loads((run / "eval_best.json").read_text())
    assert report.main(["diagnose", str(run), "--measure", "perplexity"]) == 0
    assert f"| {evaluation['test_ppl']:.2f} " in capsys.readouterr().out     # of best.pt: shown
    (run / "eval_best.json").write_text(json.dumps({**evaluation, "step": evaluation["step"] - 1}))
    assert report.main(["diagnose", str(run), "--measure", "perplexity"]) == 0
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("| ptb-softmax "))
    assert [c.strip() for c in row.strip("|").split("|")][4] == "—"
    assert (f"- ptb-softmax: test ppl not shown: eval_best.json is of the weights at step "
            f"{evaluation['step'] - 1:,}, but metrics.jsonl puts best.pt at step {evaluation['step']:,}: "
            f"run python evaluate.py {run} again") in printed


@pytest.mark.parametrize("option", ["--steps", "--every"])
def test_the_gradient_share_steps_without_the_gradient_share_are_refused(runs, option, capsys):
    assert report.main(["diagnose", str(runs["softmax"]), "--measure", "perplexity", "spread", option, "5"]) == 2
    assert one_line(capsys) == (f"error: {option} 5: the steps are gradient-share's, which --measure "
                                f"perplexity spread does not take: add gradient-share or leave it out")
