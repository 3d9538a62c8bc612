"""Word-level corpora: tokenisation, vocabulary and a checksum-keyed token cache.

Tokenisation follows docs/reference.md section 1: every line (empty ones included) is split on
whitespace and gets an `<eos>`; ids are numbered in order of first appearance over
train, then valid, then test.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .download import (
    CHECKSUMS,
    SPLIT_FILES,
    TOKEN_COUNTS,
    DataError,
    check_dataset,
    ensure_corpus,
    file_sha256,
    missing_split_files,
)

EOS = "<eos>"
DATA_DIR_ENV = "AWD_DATA_DIR"
CACHE_DIR_ENV = "AWD_CACHE_DIR"
# How a train.py user accepts a modified corpus (load_corpus's `allowed_by`, for its refusal's hint).
ALLOWED_BY_CONFIG = "set data.allow_modified_corpus=true"
DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent / "corpora"
DEFAULT_CACHE_DIR = Path("~/.cache/awd_lstm")
# Bump when the tokenisation or the cache layout changes, so old caches are ignored.
CACHE_VERSION = 1

log = logging.getLogger(__name__)


@dataclass(eq=False)  # eq=False: comparing tensors field by field is ambiguous
class Corpus:
    name: str
    vocab: list[str]  # id -> word
    train: torch.Tensor  # 1-D int64 ids
    valid: torch.Tensor
    test: torch.Tensor
    folder: Path | None = None  # where the split files were read from
    published: bool = True  # every split file byte for byte the published one
    sha256: dict[str, str] = field(default_factory=dict)  # split -> its file's sha256

    def record(self) -> dict:
        """What run.json (the text a run trained on) and a result file (evaluate.py's, rank.py's:
        the text it was computed on) say of the corpus."""
        return {"folder": None if self.folder is None else str(self.folder.absolute()),
                "published": self.published,
                "tokens": {"valid": self.valid.numel(), "test": self.test.numel()},
                "sha256": dict(self.sha256)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def word_to_id(self) -> dict[str, int]:
        """word -> id, built on first use and shared afterwards (do not mutate)."""
        return self._word_index

    @cached_property
    def _word_index(self) -> dict[str, int]:
        return {word: i for i, word in enumerate(self.vocab)}

    @property
    def vocab_sha256(self) -> str:
        """Identifies the vocabulary; checkpoints store it to detect a mismatch."""
        return vocab_sha256(self.vocab)

    def check_batchable(self, split: str, batch_size: int, setting: str, min_rows: int = 2) -> None:
        """DataError unless `split` cut into `batch_size` columns gives at least `min_rows` rows
        (evaluation needs 2: one input and its target; a training step 3). `setting` names the
        option that chose the batch size."""
        tokens = len(getattr(self, split))
        if tokens // batch_size < min_rows:
            where = self.folder / f"{split}.txt" if self.folder else f"the {split} split"
            raise DataError(f"{where}: {tokens:,} tokens, too few for {setting}={batch_size} "
                            f"(needs at least {min_rows * batch_size:,} tokens)")


def vocab_sha256(vocab: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(vocab).encode("utf-8")).hexdigest()


def resolve_data_dir(flag_value: str | Path | None) -> Path:
    """The corpora root: the --data-dir flag, else $AWD_DATA_DIR, else `corpora/`
    at the repository root."""
    chosen = flag_value or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(chosen).expanduser()


def resolve_token_cache_dir(cache_dir: str | Path | None) -> Path:
    chosen = cache_dir or os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
    return Path(chosen).expanduser()


def load_corpus(
    dataset: str,
    data_dir: str | Path | None = None,
    *,
    download: bool = True,
    cache_dir: str | Path | None = None,
    allow_modified: bool = False,
    allowed_by: str | None = ALLOWED_BY_CONFIG,
) -> Corpus:
    """Load `dataset` ("ptb" or "wikitext-2") from `<data dir>/<dataset>/`,
    downloading it first if allowed, and tokenise it (or reuse cached ids).

    Split files whose sha256 is not the published one are refused (a DataError naming the
    file and its token count) unless `allow_modified`; the error's hint names `allowed_by`,
    what the caller's user does to allow it (None: the caller has no way to)."""
    check_dataset(dataset)
    root = resolve_data_dir(data_dir)
    folder = root / dataset
    missing = missing_split_files(folder)
    if missing and not download:
        raise DataError(
            f"missing corpus file {missing[0]}: expected {', '.join(SPLIT_FILES)} "
            f"in {folder} (downloading is disabled)"
        )
    if missing:
        ensure_corpus(dataset, root)

    paths = [folder / name for name in SPLIT_FILES]
    hashes = [file_sha256(p) for p in paths]  # read once: for the cache key and the check
    key = _token_cache_key(hashes)
    cache_path = resolve_token_cache_dir(cache_dir) / f"{dataset}-{key[:32]}.npz"
    cached = _read_token_cache(cache_path, key)
    if cached is None:
        cached = tokenize(paths)
        _write_token_cache(cache_path, key, *cached)
    vocab, arrays = cached
    if not allow_modified:
        _check_published(dataset, paths, hashes, arrays, allowed_by)
    train, valid, test = arrays
    return Corpus(
        name=dataset,
        vocab=vocab,
        train=_as_tensor(train),
        valid=_as_tensor(valid),
        test=_as_tensor(test),
        folder=folder,
        published=all(digest == CHECKSUMS[dataset][path.name] for path, digest in zip(paths, hashes)),
        sha256={path.stem: digest for path, digest in zip(paths, hashes)},
    )


def differing_splits(trained: dict | None, used: dict | None, splits=("train", "valid", "test")) -> list[str]:
    """The splits among `splits` whose text differs between two corpus records (Corpus.record():
    the one run.json keeps of the text a run trained on, and another), by sha256. A published
    corpus is one text wherever it is read from, and the vocabulary check cannot tell a test split
    replaced by other sentences of the same words: only a modified corpus's hashes tell its texts
    apart. Records without hashes (written before they were kept) differ in nothing."""
    trained_hashes, used_hashes = (trained or {}).get("sha256") or {}, (used or {}).get("sha256") or {}
    return [split for split in splits
            if split in trained_hashes and split in used_hashes and trained_hashes[split] != used_hashes[split]]


def describe_text_change(trained: dict, used: dict, splits: list[str]) -> str:
    """ "test.txt (sha256 1a2b3c4d5e6f... in /data/ptb; 9f8e7d6c5b4a... in /other/ptb at training)" """
    return "; ".join(f"{split}.txt (sha256 {used['sha256'][split][:12]}... in {used.get('folder')}, "
                     f"{trained['sha256'][split][:12]}... in {trained.get('folder')} at training)"
                     for split in splits)


def _check_published(
    dataset: str, paths: Sequence[Path], hashes: Sequence[str], arrays: Sequence[np.ndarray],
    allowed_by: str | None,
) -> None:
    """Refuse a split file that is not byte for byte the published one (a half-copied
    train.txt trains without complaint otherwise)."""
    for path, digest, ids in zip(paths, hashes, arrays):
        if digest == CHECKSUMS[dataset][path.name]:
            continue
        expected = TOKEN_COUNTS[dataset][path.name]
        difference = (
            "its bytes differ" if len(ids) == expected else f"expected {expected:,} tokens"
        )
        raise DataError(
            f"{path}: {len(ids):,} tokens, not the published {dataset} {path.stem} split "
            f"({difference}; sha256 {digest[:12]}... instead of {CHECKSUMS[dataset][path.name][:12]}...); "
            f"restore the file" + (f", or {allowed_by} to use it on purpose" if allowed_by else "")
        )


class _Vocabulary(dict):
    """word -> id mapping that gives an unseen word the next id on lookup, so a
    whole line can be mapped with one `map` call (much faster than a Python loop
    over words with explicit membership tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.words: list[str] = []

    def __missing__(self, word: str) -> int:
        self[word] = index = len(self.words)
        self.words.append(word)
        return index


def tokenize(paths: Sequence[Path]) -> tuple[list[str], list[np.ndarray]]:
    """Return the vocabulary (id -> word) and one int32 id array per file."""
    vocab = _Vocabulary()
    arrays = []
    for path in paths:
        ids: list[int] = []
        # newline="\n": a line is what ends in "\n", as in the published files;
        # the stray "\r" of CRLF files is whitespace and dropped by split().
        try:
            with open(path, encoding="utf-8", newline="\n") as f:
                for line in f:
                    ids.extend(map(vocab.__getitem__, line.split()))
                    ids.append(vocab[EOS])
        except (OSError, UnicodeDecodeError) as err:
            raise DataError(f"cannot read corpus file {path} as UTF-8 text ({err})") from err
        arrays.append(np.array(ids, dtype=np.int32))
    return vocab.words, arrays


def _as_tensor(ids: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(ids.astype(np.int64))


def _token_cache_key(file_hashes: Sequence[str]) -> str:
    """Changes whenever a source file's bytes or the cache version change."""
    parts = [f"v{CACHE_VERSION}"] + list(file_hashes)
    return hashlib.sha256(" ".join(parts).encode("ascii")).hexdigest()


# The cache is one .npz (a zip of .npy arrays, loaded with allow_pickle=False):
# the three id arrays, the vocabulary as "\n"-joined UTF-8 bytes (words never
# contain whitespace) and the full key, to reject a file that merely has the
# right name.


def _read_token_cache(path: Path, key: str) -> tuple[list[str], list[np.ndarray]] | None:
    """The cached vocabulary and ids, or None if absent, unreadable or invalid."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            if bytes(npz["key"]).decode("ascii") != key:
                return None
            text = bytes(npz["vocab"]).decode("utf-8")
            vocab = text.split("\n") if text else []
            arrays = [npz[name] for name in ("train", "valid", "test")]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        log.warning("ignoring unreadable token cache %s (%s); rebuilding it", path, err)
        return None
    if not _ids_are_valid(arrays, len(vocab)) or len(set(vocab)) != len(vocab):
        log.warning("ignoring inconsistent token cache %s; rebuilding it", path)
        return None
    return vocab, arrays


def _ids_are_valid(arrays: list[np.ndarray], vocab_size: int) -> bool:
    return all(
        a.ndim == 1
        and a.dtype == np.int32
        and (a.size == 0 or (int(a.min()) >= 0 and int(a.max()) < vocab_size))
        for a in arrays
    )


def _write_token_cache(
    path: Path, key: str, vocab: list[str], arrays: list[np.ndarray]
) -> None:
    """Write atomically (temp file + os.replace) so a crash never leaves a
    truncated file under the final name; on failure, carry on without a cache."""
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(
            prefix=f".{path.stem}-", suffix=".tmp", dir=path.parent
        )
        with os.fdopen(fd, "wb") as f:
            np.savez(
                f,
                key=np.frombuffer(key.encode("ascii"), dtype=np.uint8),
                vocab=np.frombuffer("\n".join(vocab).encode("utf-8"), dtype=np.uint8),
                train=arrays[0],
                valid=arrays[1],
                test=arrays[2],
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except OSError as err:
        log.warning("cannot write token cache %s (%s); continuing without it", path, err)
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
