"""Tests for data.corpus: tokenisation, vocabulary order, the token cache and errors."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import data.corpus as corpus_module
from data import Corpus, DataError, load_corpus, resolve_data_dir
from data.download import CHECKSUMS

EXPECTED = {
    # dataset: (train, valid, test tokens, vocabulary size), docs/reference.md section 1
    "ptb": (929_589, 73_760, 82_430, 10_000),
    "wikitext-2": (2_088_628, 217_646, 245_569, 33_278),
}

SMALL = {
    "train.txt": "the cat sat\n\n the dog  sat \n",
    "valid.txt": "a cat\n",
    "test.txt": "the bird\n",
}


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never let a test write to the user's ~/.cache, even if it forgets cache_dir."""
    cache = tmp_path / "env-cache"
    monkeypatch.setenv("AWD_CACHE_DIR", str(cache))
    return cache


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the real corpora, so each is tokenised once per module."""
    return tmp_path_factory.mktemp("real-cache")


def load_small(*args, **kwargs) -> Corpus:
    """load_corpus for the small corpora written here, which are not the published files."""
    return load_corpus(*args, allow_modified=True, **kwargs)


def write_corpus(root: Path, dataset: str = "ptb", files: dict[str, str] = SMALL) -> Path:
    folder = root / dataset
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def forbid_tokenize(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokenize() called although a valid cache exists")

    monkeypatch.setattr(corpus_module, "tokenize", boom)


def assert_same_corpus(a: Corpus, b: Corpus) -> None:
    assert a.vocab == b.vocab
    for split in ("train", "valid", "test"):
        assert torch.equal(getattr(a, split), getattr(b, split))


# --- the real corpora -------------------------------------------------------


@pytest.mark.parametrize("dataset", sorted(EXPECTED))
def test_real_token_counts_and_vocab(dataset: str, shared_data_dir: Path, real_cache: Path):
    corpus = load_corpus(dataset, shared_data_dir, download=False, cache_dir=real_cache)
    n_train, n_valid, n_test, n_vocab = EXPECTED[dataset]
    assert corpus.name == dataset
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (n_train, n_valid, n_test)
    assert corpus.vocab_size == len(corpus.vocab) == n_vocab
    for ids in (corpus.train, corpus.valid, corpus.test):
        assert ids.dtype == torch.int64 and ids.dim() == 1
    assert corpus.record() == {"folder": str(shared_data_dir / dataset), "published": True,
                               "tokens": {"valid": n_valid, "test": n_test},
                               "sha256": {split: CHECKSUMS[dataset][f"{split}.txt"] for split in ("train", "valid", "test")}}


@pytest.mark.parametrize("dataset", sorted(EXPECTED))
def test_real_ids_numbered_by_first_appearance(
    dataset: str, shared_data_dir: Path, real_cache: Path
):
    corpus = load_corpus(dataset, shared_data_dir, download=False, cache_dir=real_cache)
    ids = torch.cat([corpus.train, corpus.valid, corpus.test]).numpy()
    # Id k must first appear right after ids 0..k-1 have appeared: every id is at
    # most one more than the largest id seen before it, starting from 0.
    previous_max = np.maximum.accumulate(np.concatenate([[-1], ids[:-1]]))
    assert (ids <= previous_max + 1).all()
    assert ids.max() == corpus.vocab_size - 1

    with open(shared_data_dir / dataset / "train.txt", encoding="utf-8") as f:
        first_line = f.readline().split()
    decoded = [corpus.vocab[i] for i in corpus.train[: len(first_line) + 1].tolist()]
    assert decoded == first_line + ["<eos>"]
    if first_line:  # PTB: its first word gets id 0
        assert corpus.train[0].item() == 0 and corpus.vocab[0] == first_line[0]
    # <eos> gets the id of its first appearance: after the first line's words.
    assert corpus.word_to_id()["<eos>"] == len(dict.fromkeys(first_line))


def test_real_vocab_sha256_and_word_to_id(shared_data_dir: Path, real_cache: Path):
    corpus = load_corpus("ptb", shared_data_dir, download=False, cache_dir=real_cache)
    expected = hashlib.sha256("\n".join(corpus.vocab).encode("utf-8")).hexdigest()
    assert corpus.vocab_sha256 == expected
    w2i = corpus.word_to_id()
    assert len(w2i) == corpus.vocab_size
    assert all(corpus.vocab[i] == w for w, i in w2i.items())


def test_real_corpus_second_load_comes_from_cache(
    shared_data_dir: Path, real_cache: Path, monkeypatch: pytest.MonkeyPatch
):
    first = load_corpus("wikitext-2", shared_data_dir, download=False, cache_dir=real_cache)
    forbid_tokenize(monkeypatch)
    second = load_corpus("wikitext-2", shared_data_dir, download=False, cache_dir=real_cache)
    assert_same_corpus(first, second)


# --- tokenisation and the cache, on a small corpus ---------------------------


def test_small_corpus_tokenisation(tmp_path: Path):
    write_corpus(tmp_path)
    corpus = load_small("ptb", tmp_path, cache_dir=tmp_path / "cache")
    # Every line, the empty one included, ends with <eos>.
    assert corpus.vocab == ["the", "cat", "sat", "<eos>", "dog", "a", "bird"]
    assert corpus.train.tolist() == [0, 1, 2, 3, 3, 0, 4, 2, 3]
    assert corpus.valid.tolist() == [5, 1, 3]
    assert corpus.test.tolist() == [0, 6, 3]


def test_second_load_uses_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    write_corpus(tmp_path)
    first = load_small("ptb", tmp_path, cache_dir=tmp_path / "cache")
    forbid_tokenize(monkeypatch)
    second = load_small("ptb", tmp_path, cache_dir=tmp_path / "cache")
    assert_same_corpus(first, second)


def test_cache_dir_from_environment(tmp_path: Path, isolated_cache: Path):
    write_corpus(tmp_path)
    load_small("ptb", tmp_path)
    assert len(list(isolated_cache.glob("ptb-*.npz"))) == 1


def test_cache_is_keyed_by_file_checksums(tmp_path: Path):
    folder = write_corpus(tmp_path)
    cache = tmp_path / "cache"
    load_small("ptb", tmp_path, cache_dir=cache)
    (folder / "test.txt").write_text("the zebra\n", encoding="utf-8")
    edited = load_small("ptb", tmp_path, cache_dir=cache)
    assert edited.vocab[-1] == "zebra"
    assert edited.test.tolist() == [0, 6, 3]
    assert len(list(cache.glob("ptb-*.npz"))) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_cache_is_rebuilt(
    tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    write_corpus(tmp_path)
    cache = tmp_path / "cache"
    good = load_small("ptb", tmp_path, cache_dir=cache)
    (cache_file,) = cache.glob("ptb-*.npz")
    content = cache_file.read_bytes()
    damaged = {
        "garbage": b"not a cache" * 10,
        "truncated": content[: len(content) // 2],
        "empty": b"",
    }
    cache_file.write_bytes(damaged[damage])

    with caplog.at_level(logging.WARNING, logger="data.corpus"):
        rebuilt = load_small("ptb", tmp_path, cache_dir=cache)
    assert_same_corpus(good, rebuilt)
    assert len(caplog.records) == 1 and "cache" in caplog.records[0].getMessage()
    # The rebuilt cache is valid again.
    forbid_tokenize(monkeypatch)
    assert_same_corpus(good, load_small("ptb", tmp_path, cache_dir=cache))


def test_cache_with_out_of_range_ids_is_rebuilt(tmp_path: Path):
    write_corpus(tmp_path)
    cache = tmp_path / "cache"
    good = load_small("ptb", tmp_path, cache_dir=cache)
    (cache_file,) = cache.glob("ptb-*.npz")
    with np.load(cache_file) as npz:
        arrays = dict(npz)
    arrays["train"] = arrays["train"] + 100
    np.savez(cache_file, **arrays)
    assert_same_corpus(good, load_small("ptb", tmp_path, cache_dir=cache))


def test_unwritable_cache_dir_is_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    write_corpus(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a directory cannot be created below a file, even as root
    with caplog.at_level(logging.WARNING, logger="data.corpus"):
        corpus = load_small("ptb", tmp_path, cache_dir=blocker / "cache")
    assert corpus.vocab_size == 7
    assert len(caplog.records) == 1 and "continuing without" in caplog.records[0].getMessage()
    assert list(tmp_path.glob("**/*.tmp")) == []


def test_cache_files_are_not_pickles(tmp_path: Path):
    write_corpus(tmp_path)
    cache = tmp_path / "cache"
    load_small("ptb", tmp_path, cache_dir=cache)
    (cache_file,) = cache.glob("ptb-*.npz")
    with np.load(cache_file, allow_pickle=False) as npz:
        assert all(npz[name].dtype != object for name in npz.files)


# --- data directory and errors ----------------------------------------------


def test_resolve_data_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWD_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(str(tmp_path / "flag")) == tmp_path / "flag"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("AWD_DATA_DIR")
    repo_root = Path(corpus_module.__file__).resolve().parent.parent
    assert resolve_data_dir(None) == repo_root / "corpora"


def test_unknown_dataset_lists_valid_names(tmp_path: Path):
    with pytest.raises(DataError) as info:
        load_corpus("wikitext-103", tmp_path)
    message = str(info.value)
    assert "wikitext-103" in message and "ptb" in message and "wikitext-2" in message
    assert "\n" not in message


def test_missing_split_file_without_download(tmp_path: Path):
    write_corpus(tmp_path, files={"train.txt": "a\n", "valid.txt": "b\n"})
    with pytest.raises(DataError) as info:
        load_small("ptb", tmp_path, download=False)
    message = str(info.value)
    assert str(tmp_path / "ptb" / "test.txt") in message
    assert "\n" not in message


def test_missing_files_trigger_the_downloader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls = []

    def fake_ensure_corpus(dataset: str, data_dir: Path) -> Path:
        calls.append((dataset, Path(data_dir)))
        return write_corpus(Path(data_dir), dataset)

    monkeypatch.setattr(corpus_module, "ensure_corpus", fake_ensure_corpus)
    corpus = load_small("wikitext-2", tmp_path, cache_dir=tmp_path / "cache")
    assert calls == [("wikitext-2", tmp_path)]
    assert corpus.name == "wikitext-2" and corpus.vocab_size == 7


def test_non_utf8_file_gives_a_data_error(tmp_path: Path):
    folder = write_corpus(tmp_path)
    (folder / "valid.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(DataError, match="valid.txt as UTF-8"):
        load_small("ptb", tmp_path, cache_dir=tmp_path / "cache")


# --- the corpus read is the corpus meant -----------------------------------------


def copy_ptb(shared_data_dir: Path, root: Path, train_lines: int | None = None) -> Path:
    """The real PTB files in root/ptb, train.txt cut to its first `train_lines` lines."""
    folder = root / "ptb"
    folder.mkdir(parents=True)
    for name in ("train.txt", "valid.txt", "test.txt"):
        (folder / name).write_bytes((shared_data_dir / "ptb" / name).read_bytes())
    if train_lines is not None:
        lines = (folder / "train.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / "train.txt").write_text("".join(lines[:train_lines]), encoding="utf-8")
    return folder


def test_a_modified_corpus_is_refused_naming_the_file_and_its_token_count(
    shared_data_dir: Path, tmp_path: Path
):
    folder = copy_ptb(shared_data_dir, tmp_path, train_lines=21_034)    # half of train.txt
    with pytest.raises(DataError) as info:
        load_corpus("ptb", tmp_path, cache_dir=tmp_path / "cache")
    message = str(info.value)
    half = load_corpus("ptb", tmp_path, cache_dir=tmp_path / "cache", allow_modified=True)
    assert message.startswith(f"{folder / 'train.txt'}: {len(half.train):,} tokens")
    assert "expected 929,589 tokens" in message and "data.allow_modified_corpus=true" in message
    assert "\n" not in message and half.vocab_size < 10_000
    assert half.record()["published"] is False       # what evaluate.py and rank.py then record


def test_same_token_count_but_other_bytes_is_refused(shared_data_dir: Path, tmp_path: Path):
    folder = copy_ptb(shared_data_dir, tmp_path)
    text = (folder / "test.txt").read_text(encoding="utf-8")
    (folder / "test.txt").write_text(text.replace(" the ", " teh ", 1), encoding="utf-8")
    with pytest.raises(DataError, match=r"test.txt: 82,430 tokens, .*its bytes differ"):
        load_corpus("ptb", tmp_path, cache_dir=tmp_path / "cache")


def test_each_file_is_hashed_once_per_load(
    shared_data_dir: Path, real_cache: Path, monkeypatch: pytest.MonkeyPatch
):
    hashed = []
    real_sha256 = corpus_module.file_sha256
    monkeypatch.setattr(corpus_module, "file_sha256", lambda p: hashed.append(p) or real_sha256(p))
    for _ in range(2):        # tokenised, then from the cache: the same hashes serve both
        load_corpus("ptb", shared_data_dir, download=False, cache_dir=real_cache)
    assert sorted(p.name for p in hashed) == sorted(["train.txt", "valid.txt", "test.txt"] * 2)


def test_split_too_short_for_a_batch_size_names_file_and_setting(tmp_path: Path):
    folder = write_corpus(tmp_path)
    corpus = load_small("ptb", tmp_path, cache_dir=tmp_path / "cache")
    corpus.check_batchable("valid", 1, "train.eval_batch_size")        # 3 tokens: 3 rows
    with pytest.raises(DataError) as info:
        corpus.check_batchable("valid", 2, "train.eval_batch_size")
    assert str(info.value) == (f"{folder / 'valid.txt'}: 3 tokens, too few for "
                               f"train.eval_batch_size=2 (needs at least 4 tokens)")
    with pytest.raises(DataError, match="train.txt: 9 tokens, too few for train.batch_size=4"):
        corpus.check_batchable("train", 4, "train.batch_size", min_rows=3)


def test_the_tests_read_awd_data_dir_else_a_corpora_folder_holding_both(tmp_path: Path):
    """The real-corpora fixture's folder: $AWD_DATA_DIR when set; else the repository's corpora/
    only when it holds both corpora (a fresh clone after the quick start's PTB alone: skipped)."""
    from tests.conftest import real_corpora_dir
    assert real_corpora_dir({}, tmp_path) is None
    (tmp_path / "corpora" / "ptb").mkdir(parents=True)
    assert real_corpora_dir({}, tmp_path) is None
    (tmp_path / "corpora" / "wikitext-2").mkdir()
    assert real_corpora_dir({}, tmp_path) == tmp_path / "corpora"
    assert real_corpora_dir({"AWD_DATA_DIR": "/data"}, tmp_path) == Path("/data")
    assert real_corpora_dir({"AWD_DATA_DIR": ""}, tmp_path) == tmp_path / "corpora"


def test_an_awd_data_dir_without_both_corpora_is_one_line_naming_the_file_it_lacks(tmp_path: Path):
    """AWD_DATA_DIR naming ptb/ itself (a newcomer's slip) fails the corpus tests with one line,
    not a FileNotFoundError deep in every fixture."""
    from tests.conftest import missing_corpus_line
    for dataset in ("ptb", "wikitext-2"):
        (tmp_path / dataset).mkdir()
        for name in ("train.txt", "valid.txt", "test.txt"):
            (tmp_path / dataset / name).write_text("a b\n", encoding="utf-8")
    set_by_hand = {"AWD_DATA_DIR": str(tmp_path / "ptb")}
    assert missing_corpus_line(tmp_path, set_by_hand) is None
    assert missing_corpus_line(tmp_path / "ptb", set_by_hand) == (
        f"AWD_DATA_DIR={tmp_path / 'ptb'}: no {tmp_path / 'ptb' / 'ptb' / 'train.txt'}; the tests read ptb "
        f"and wikitext-2, each train.txt, valid.txt, test.txt, from the folder AWD_DATA_DIR names, else corpora/")
    (tmp_path / "wikitext-2" / "test.txt").unlink()           # corpora/, AWD_DATA_DIR unset
    assert missing_corpus_line(tmp_path, {}).startswith(f"{tmp_path}: no {tmp_path / 'wikitext-2' / 'test.txt'};")


def test_a_wrong_awd_data_dir_fails_the_tests_that_read_it_with_that_line(tmp_path: Path):
    (tmp_path / "test_reads.py").write_text("def test_reads(ptb_slice):\n    pass\n", encoding="utf-8")
    (tmp_path / "conftest.py").write_text("from tests.conftest import ptb_slice, shared_data_dir  # noqa: F401\n",
                                          encoding="utf-8")
    env = {**os.environ, "AWD_DATA_DIR": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
                             str(tmp_path / "test_reads.py")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"AWD_DATA_DIR={tmp_path}: no {tmp_path / 'ptb' / 'train.txt'}" in result.stdout
    assert "FileNotFoundError" not in result.stdout and "Traceback" not in result.stdout
