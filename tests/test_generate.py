"""generate.py: word-by-word sampling from a trained model, for every head; reproducible by
seed; nothing written into the run directory; bad input is one line and exit 2."""
from __future__ import annotations

from pathlib import Path

import pytest

import generate
import train
from model.heads import HEADS
from tests.conftest import TINY, head_overrides


def snapshot(folder):
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}


@pytest.mark.parametrize("head", list(HEADS))
def test_every_head_samples_reproducibly_and_writes_nothing(head, small_data, tmp_path, capsys):
    run = tmp_path / head
    # lr 5: at the configs' lr 20 an epoch of the tiny model on this slice can collapse a head
    # onto one word (Mixtape's does: its context and gate biases saturate their tanh), and the
    # test needs a distribution for the seed to sample from.
    assert train.main(["configs/ptb/softmax.yaml", f"data.data_dir={small_data}", *TINY,
                       *head_overrides(head), "train.epochs=1", "train.lr=5", f"run.dir={run}"]) == 0
    before = snapshot(run)
    capsys.readouterr()
    texts = []
    for seed in (3, 3, 4):
        assert generate.main([str(run), "--words", "40", "--seed", str(seed)]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] != texts[2]          # the seed decides the text
    # 40 words: each is a vocabulary word or <eos> (a line break)
    vocab = {word for split in ("train", "valid", "test")          # the vocabulary of all three splits
             for word in (small_data / "ptb" / f"{split}.txt").read_text().split()}
    words = texts[0].replace("\n", " <eos> ").split()
    assert len(words) in (40, 41) and set(words) <= vocab | {"<eos>"}
    assert snapshot(run) == before                    # no checkpoint or file written


# 1e-320 is a float64 subnormal: dividing the log-probabilities themselves by it sent every one
# to -inf, a distribution of NaNs, and the sampler raised.
@pytest.mark.parametrize("temperature", [1e-4, 1e-320])
def test_low_temperature_keeps_to_the_most_probable_word(tiny_run, temperature):
    import torch
    from experiment.loading import load_trained
    run = load_trained(tiny_run, torch.device("cpu"))
    ids = run.corpus.word_to_id()
    cold = generate.sample(run.model, run.corpus.vocab, 30, temperature, torch.Generator().manual_seed(1))
    sampled = torch.tensor([ids[w] for w in cold.replace("\n", " <eos> ").split()]).view(-1, 1)
    # T -> 0: after the first (uniformly drawn) word, each word is the model's most probable one
    # given the words before it
    log_probs = run.model(sampled, run.model.init_hidden(1)).log_probs[:-1, 0]
    assert torch.equal(log_probs.argmax(-1), sampled[1:, 0])
    hot = generate.sample(run.model, run.corpus.vocab, 30, 1.0, torch.Generator().manual_seed(1))
    assert hot.split()[0] == cold.split()[0] and hot != cold    # T = 1 samples: another text


def test_any_temperature_above_zero_samples_from_the_command_line(tiny_run, capsys):
    for temperature in ("1e-320", "1e300"):
        assert generate.main([str(tiny_run), "--words", "5", "--temperature", temperature]) == 0
        assert len(capsys.readouterr().out.replace("\n", " <eos> ").split()) in (5, 6)


def test_the_text_goes_to_out_too(tiny_run, tmp_path, capsys):
    out = tmp_path / "sample.txt"
    assert generate.main([str(tiny_run), "--words", "12", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    text = printed[:-1]                                   # print's own newline
    # the file holds the text, ending in one newline (the text's own where it ends a line)
    assert out.read_text() == (text if text.endswith("\n") else text + "\n")
    # each word followed by a space, <eos> by a line break: a space was left at every line's end
    assert "\n" in text and not any(line.endswith(" ") for line in text.splitlines())


def test_an_out_that_cannot_be_written_is_refused_before_sampling(tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(generate, "sample", lambda *a: pytest.fail("sampled before --out was checked"))
    for out, message in ((tmp_path / "no" / "sample.txt", f"--out {tmp_path / 'no' / 'sample.txt'}: no folder "
                                                          f"{tmp_path / 'no'}"),
                         (tmp_path, f"--out {tmp_path}: a folder; expected a file name")):
        assert generate.main([str(tiny_run), "--words", "12", "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full, where every write fails")
def test_an_out_whose_write_fails_is_one_line_and_exit_1(tiny_run, capsys):
    # exit 2 before, as for bad input; a write that fails is exit 1 in every other script
    assert generate.main([str(tiny_run), "--words", "3", "--out", "/dev/full"]) == 1
    assert capsys.readouterr().err == "error: --out /dev/full: cannot write (No space left on device)\n"


def test_an_out_that_would_replace_a_file_of_the_run_is_refused(tiny_run, tmp_path, monkeypatch, capsys):
    # --out runs/x/best.pt wrote the sample over the checkpoint it came from, exit 0
    import shutil
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    monkeypatch.setattr(generate, "sample", lambda *a: pytest.fail("sampled before --out was checked"))
    before = snapshot(run)
    for name in ("best.pt", "last.pt", "config.yaml", "metrics.jsonl"):
        assert generate.main([str(run), "--words", "3", "--out", str(run / name)]) == 2
        assert capsys.readouterr().err == (f"error: --out {run / name}: a file of the run directory {run}, "
                                           f"which generate.py leaves as it is; give the sample a file "
                                           f"name of its own\n")
    assert snapshot(run) == before
    monkeypatch.undo()
    assert generate.main([str(run), "--words", "3", "--out", str(run / "sample.txt")]) == 0   # a new file


BAD_TEMPERATURES = {"0": "0.0", "-1": "-1.0", "nan": "nan", "inf": "inf"}
BAD_INPUT = [("--words 0", "--words: expected an integer >= 1, got 0"), ("--device tpu", "--device")] + [
    (f"--temperature {given}", f"--temperature: expected a finite number > 0, got {shown}")
    for given, shown in BAD_TEMPERATURES.items()]


@pytest.mark.parametrize("options, message", BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2(options, message, tiny_run, capsys):
    assert generate.main([str(tiny_run), *options.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err, err


def test_a_missing_run_is_one_line(tmp_path, capsys):
    assert generate.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "nope" in err, err
