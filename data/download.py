"""Fetch the PTB and WikiText-2 corpora from their public sources (docs/reference.md section 1).

`ensure_corpus` downloads the archive, reads only the three split files out of it,
checks their sha256 and only then moves them to their final names, so the final
paths only ever hold complete, verified files.

Ahead of time (e.g. for compute nodes without network), from the repository root:

    python -m data.download [ptb] [wikitext-2] [--data-dir DIR]

fetches and verifies the named corpora (both when none is named) into the folder the
training code reads (--data-dir, else $AWD_DATA_DIR, else corpora/) and prints where they are.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import itertools
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import IO, Iterable, Iterator, Sequence

from tqdm import tqdm

SPLITS = ("train", "valid", "test")
SPLIT_FILES = tuple(f"{split}.txt" for split in SPLITS)

# The WikiText mirror rejects Python's default "Python-urllib/x.y" agent.
USER_AGENT = "awd-lstm-repro/1.0 (corpus downloader)"
TIMEOUT_SECONDS = 60.0
_CHUNK = 1 << 20


class DataError(Exception):
    """A corpus cannot be found, fetched or read; the message is one line naming
    the file, folder or value at fault and what was expected."""


@dataclass(frozen=True)
class Source:
    """Where a dataset comes from: archive URLs (tried in order) and which archive
    member becomes which split file of the dataset's folder."""

    urls: tuple[str, ...]
    archive_format: str  # "tgz" or "zip"
    members: dict[str, str]  # archive member name -> split file name


SOURCES: dict[str, Source] = {
    "ptb": Source(
        urls=("http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",),
        archive_format="tgz",
        members={f"./simple-examples/data/ptb.{s}.txt": f"{s}.txt" for s in SPLITS},
    ),
    "wikitext-2": Source(
        urls=(
            "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip",
            "https://wikitext.smerity.com/wikitext-2-v1.zip",
        ),
        archive_format="zip",
        members={f"wikitext-2/wiki.{s}.tokens": f"{s}.txt" for s in SPLITS},
    ),
}
DATASETS = tuple(SOURCES)

# sha256 of the split files, as published with the corpora copies this project was
# developed against (their README gives md5 and sha256). The WikiText-2
# train.txt there was rebuilt from the token stream; its hash equals the one of
# the train.txt that pytorch/examples ships as a renamed copy of wiki.train.tokens,
# but byte identity with the zip member has not been checked against the zip
# itself, so a mismatch message tells the user how to place a verified copy.
CHECKSUMS: dict[str, dict[str, str]] = {
    "ptb": {
        "train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
        "valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
        "test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
    },
    "wikitext-2": {
        "train.txt": "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",
        "valid.txt": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
        "test.txt": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
    },
}


# Tokens of each split file (its words plus one <eos> per line; docs/reference.md section 1). With the
# checksums they let a mismatch say how far a file on disk is from the published one.
TOKEN_COUNTS: dict[str, dict[str, int]] = {
    "ptb": {"train.txt": 929_589, "valid.txt": 73_760, "test.txt": 82_430},
    "wikitext-2": {"train.txt": 2_088_628, "valid.txt": 217_646, "test.txt": 245_569},
}


class _SourceFailed(Exception):
    """One URL did not yield a verified corpus; the message is the short reason."""


def check_dataset(dataset: str) -> None:
    if dataset not in SOURCES:
        raise DataError(
            f"unknown dataset {dataset!r}: expected one of {', '.join(DATASETS)}"
        )


def missing_split_files(folder: Path) -> list[Path]:
    return [folder / name for name in SPLIT_FILES if not (folder / name).is_file()]


def ensure_corpus(
    dataset: str, data_dir: str | Path, *, urls: Sequence[str] | None = None
) -> Path:
    """Return `data_dir/<dataset>` once it holds train.txt, valid.txt and test.txt,
    downloading them first if none is there. Some there and others missing is refused
    (the published ones are not mixed with files put there by hand), as is a data dir
    that is itself a dataset's folder. `urls` replaces the dataset's source URLs (tests
    point it at a local server)."""
    check_dataset(dataset)
    source = SOURCES[dataset]
    data_dir = Path(data_dir).expanduser()
    folder = data_dir / dataset
    if not missing_split_files(folder):
        return folder
    _check_not_a_dataset_folder(dataset, data_dir)
    _check_all_or_none(dataset, folder)
    # The folders made for the download, removed again (if still empty) when it fails.
    made = list(itertools.takewhile(lambda p: not p.exists(), (folder, *folder.parents)))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(
            f"cannot create corpus folder {folder} ({_one_line(err)}); "
            f"{_manual_hint(dataset, data_dir)}"
        ) from err
    try:
        return _fetch_first(dataset, source, urls if urls is not None else source.urls, data_dir)
    except DataError:
        for path in made:                      # the deepest first
            try:
                path.rmdir()
            except OSError:                    # not empty, or not ours to remove
                break
        raise


def _check_not_a_dataset_folder(dataset: str, data_dir: Path) -> None:
    """Refuse a data dir that holds split files itself: it names a dataset's folder (e.g.
    AWD_DATA_DIR=/data/ptb), and downloading into /data/ptb/ptb would hide the mistake."""
    archive_names = (PurePosixPath(member).name for member in SOURCES[dataset].members)
    found = [name for name in (*SPLIT_FILES, *archive_names) if (data_dir / name).is_file()]
    if not found:
        return
    setting = _data_dir_setting(data_dir)
    named = f"{setting} names {data_dir}" if setting else f"the data dir {data_dir}"
    fix = (f"did you mean its parent, {data_dir.parent}?" if data_dir.name in DATASETS
           else f"put them in {data_dir / dataset}/ as {', '.join(SPLIT_FILES)}")
    raise DataError(
        f"{named}, which holds {', '.join(found)} itself: the data dir is the folder holding "
        f"{'/ and '.join(DATASETS)}/, {dataset} is read from {data_dir / dataset}; {fix}"
    )


def _check_all_or_none(dataset: str, folder: Path) -> None:
    """Refuse a dataset folder with some split files but not all: downloading the missing
    ones would mix published splits with files put there by hand (and grow the vocabulary)."""
    for name in SPLIT_FILES:
        if (folder / name).exists() and not (folder / name).is_file():
            kind = "a directory" if (folder / name).is_dir() else "not a regular file"
            raise DataError(f"{folder / name} is {kind}: expected the {dataset} split file {name}")
    present = [name for name in SPLIT_FILES if (folder / name).is_file()]
    if present:
        missing = [path.name for path in missing_split_files(folder)]
        raise DataError(
            f"{folder} holds {', '.join(present)} but not {', '.join(missing)}: expected all of "
            f"{', '.join(SPLIT_FILES)} or none (none: {dataset} is downloaded there); nothing was "
            f"downloaded: add {', '.join(missing)}, or move the others away to get the published {dataset}"
        )


def _fetch_first(dataset: str, source: Source, urls: Sequence[str], data_dir: Path) -> Path:
    """The first of `urls` that yields the verified split files in `data_dir/<dataset>`."""
    folder = data_dir / dataset
    failures = []
    for url in urls:
        try:
            _fetch_verified(dataset, source, url, folder)
            return folder
        except _SourceFailed as err:
            failures.append(f"{url}: {err}")
        except OSError as err:  # writing into `folder` failed: another URL won't help
            raise DataError(
                f"cannot write {dataset} files into {folder} ({_one_line(err)}); "
                f"{_manual_hint(dataset, data_dir)}"
            ) from err
    raise DataError(
        f"could not download {dataset} ({'; '.join(failures) or 'no URLs given'}); "
        f"{_manual_hint(dataset, data_dir)}"
    )


_EXPLICIT_SETTING = "data.data_dir or --data-dir"


def _data_dir_setting(data_dir: Path) -> str | None:
    """Which setting named `data_dir`, as data.corpus.resolve_data_dir picks it: "AWD_DATA_DIR",
    _EXPLICIT_SETTING (read before AWD_DATA_DIR), or None for the default corpora/. Callers pass
    only the resolved folder, so this is inferred from it and the environment."""
    # data.corpus imports this module, so it is loaded by the time an error is worded.
    from .corpus import DATA_DIR_ENV, DEFAULT_DATA_DIR
    env = os.environ.get(DATA_DIR_ENV)
    if env and Path(env).expanduser() == data_dir:
        return DATA_DIR_ENV
    if not env and data_dir == DEFAULT_DATA_DIR:
        return None
    return _EXPLICIT_SETTING


def _manual_hint(dataset: str, data_dir: Path) -> str:
    setting = _data_dir_setting(data_dir)
    env = os.environ.get("AWD_DATA_DIR")
    # Name the setting that chose the folder: "set AWD_DATA_DIR" reads as if it were unset, and
    # AWD_DATA_DIR is not read at all while data.data_dir or --data-dir names a folder.
    # --data-dir is train.py's, evaluate.py's and rank.py's; data.data_dir=DIR every config's
    # (train.py, sweep.py, the benchmarks, which have no --data-dir).
    other = ("set AWD_DATA_DIR / pass --data-dir or data.data_dir=" if setting is None
             else f"point AWD_DATA_DIR, now {env}, or pass --data-dir or data.data_dir=" if setting == "AWD_DATA_DIR"
             else f"point {setting}, now {data_dir},")
    unread = (f"; AWD_DATA_DIR, {env}, is not read while {setting} is set"
              if env and setting not in (None, "AWD_DATA_DIR") else "")
    return (
        f"place {', '.join(SPLIT_FILES)} of {dataset} in {data_dir / dataset} by hand "
        f"(or {other} to a folder holding {dataset}/{unread})"
    )


def _fetch_verified(dataset: str, source: Source, url: str, folder: Path) -> None:
    """Download `url`, extract and verify the split files, then move them into
    `folder`. Raises _SourceFailed; leaves no temporary file behind."""
    with _temp_path(folder, ".download") as archive_path:
        _download(url, archive_path, dataset)
        with _temp_dir(folder) as staging:
            _extract_members(source, archive_path, staging)
            _verify(dataset, staging)
            for name in SPLIT_FILES:
                os.replace(staging / name, folder / name)


@contextmanager
def _temp_path(folder: Path, suffix: str) -> Iterator[Path]:
    """A fresh hidden file name in `folder`, removed on exit."""
    fd, name = tempfile.mkstemp(prefix=".awd-", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


@contextmanager
def _temp_dir(folder: Path) -> Iterator[Path]:
    """A hidden staging folder inside `folder` (same file system, so os.replace
    into `folder` is atomic), removed with its contents on exit."""
    path = Path(tempfile.mkdtemp(prefix=".awd-extract-", dir=folder))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _download(url: str, dest: Path, dataset: str) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        # urlopen follows redirects and keeps the User-Agent header on them.
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            length_header = response.headers.get("Content-Length")
            expected = int(length_header) if length_header else None
            with open(dest, "wb") as out:
                received = _copy_with_progress(response, out, expected, dataset, url)
    except urllib.error.HTTPError as err:
        raise _SourceFailed(f"HTTP {err.code} {err.reason}") from err
    except urllib.error.URLError as err:
        raise _SourceFailed(_one_line(err.reason)) from err
    except TimeoutError as err:
        raise _SourceFailed(f"timed out after {TIMEOUT_SECONDS:g} s") from err
    # Reset connections, broken chunked encoding, a malformed Content-Length, ...
    except (OSError, http.client.HTTPException, ValueError) as err:
        raise _SourceFailed(_one_line(err)) from err
    # http.client returns short reads silently when a connection closes early.
    if expected is not None and received != expected:
        raise _SourceFailed(
            f"transfer interrupted after {received} of {expected} bytes"
        )


def _copy_with_progress(
    response: IO[bytes], out: IO[bytes], total: int | None, dataset: str, url: str
) -> int:
    received = 0
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc=f"downloading {dataset} from {url}",
        file=sys.stderr,
    ) as bar:
        while chunk := response.read(_CHUNK):
            out.write(chunk)
            received += len(chunk)
            bar.update(len(chunk))
    return received


def _extract_members(source: Source, archive_path: Path, staging: Path) -> None:
    """Copy the source's members (and nothing else) into `staging` under their
    split file names, after checking every member name in the archive."""
    try:
        if source.archive_format == "tgz":
            _extract_from_tar(source, archive_path, staging)
        else:
            _extract_from_zip(source, archive_path, staging)
    # OSError covers gzip.BadGzipFile; EOFError and zlib.error truncated or
    # corrupt compressed data (e.g. an HTML error page served as the archive).
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as err:
        raise _SourceFailed(
            f"cannot extract from the {source.archive_format} archive ({_one_line(err)})"
        ) from err


def _extract_from_tar(source: Source, archive_path: Path, staging: Path) -> None:
    with tarfile.open(archive_path, "r:*") as archive:
        members = archive.getmembers()
        _check_member_names(m.name for m in members)
        by_name = {_normalise(m.name): m for m in members}
        for member_name, split_file in source.members.items():
            member = by_name.get(_normalise(member_name))
            if member is None or not member.isfile():
                raise _SourceFailed(f"archive has no regular file {member_name}")
            stream = archive.extractfile(member)
            assert stream is not None  # extractfile only returns None for non-files
            with stream, open(staging / split_file, "wb") as out:
                shutil.copyfileobj(stream, out, _CHUNK)


def _extract_from_zip(source: Source, archive_path: Path, staging: Path) -> None:
    with zipfile.ZipFile(archive_path) as archive:
        infos = archive.infolist()
        _check_member_names(info.filename for info in infos)
        by_name = {_normalise(info.filename): info for info in infos}
        for member_name, split_file in source.members.items():
            info = by_name.get(_normalise(member_name))
            if info is None or info.is_dir():
                raise _SourceFailed(f"archive has no file {member_name}")
            with archive.open(info) as stream, open(staging / split_file, "wb") as out:
                shutil.copyfileobj(stream, out, _CHUNK)


def _check_member_names(names: Iterable[str]) -> None:
    """Refuse archives with members that would land outside the target folder if
    some tool extracted them, even though only the split files are read: such an
    archive is not the published one. Windows path rules are the strictest (they
    treat both slashes as separators and know drive letters), so use them."""
    for name in names:
        path = PureWindowsPath(name)
        if path.drive or path.root or ".." in path.parts:
            raise _SourceFailed(f"refusing archive with unsafe member path {name!r}")


def _normalise(member_name: str) -> str:
    """'./a/b' and 'a/b' name the same member."""
    return str(PurePosixPath(member_name))


def _verify(dataset: str, staging: Path) -> None:
    for name, expected in CHECKSUMS[dataset].items():
        actual = file_sha256(staging / name)
        if actual != expected:
            raise _SourceFailed(
                f"checksum mismatch for {dataset}/{name}: expected sha256 {expected}, "
                f"got {actual}"
            )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def ensure_published_corpus(dataset: str, data_dir: Path) -> Path:
    """`data_dir/<dataset>` holding the published split files: downloaded if none is there,
    and checked against their sha256 either way (files already there were never checked)."""
    folder = ensure_corpus(dataset, data_dir)
    try:
        _verify(dataset, folder)
    except _SourceFailed as err:
        raise DataError(
            f"{folder}: {err}; runs refuse it unless data.allow_modified_corpus=true: restore the "
            f"file, or move the split files away and run this again to download them"
        ) from None
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data.download",
        description="Download and verify corpora ahead of time (e.g. for compute nodes without network).",
    )
    parser.add_argument("datasets", nargs="*", metavar="DATASET",
                        help=f"{' and/or '.join(DATASETS)} (default: all of them)")
    parser.add_argument("--data-dir", help="folder to hold ptb/ and wikitext-2/ (default: the one runs "
                                           "read without data.data_dir: $AWD_DATA_DIR, else corpora/)")
    args = parser.parse_args(argv)
    from .corpus import resolve_data_dir  # it imports this module: not at the top
    data_dir = resolve_data_dir(args.data_dir)
    datasets = args.datasets or DATASETS
    try:
        for dataset in datasets:  # every name checked before anything is downloaded
            check_dataset(dataset)
        for dataset in datasets:
            folder = ensure_published_corpus(dataset, data_dir)
            print(f"{dataset}: {', '.join(SPLIT_FILES)} in {folder}, the published files (sha256 checked)")
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if _data_dir_setting(data_dir) == _EXPLICIT_SETTING:
        print(f"runs read them with --data-dir {data_dir}, data.data_dir={data_dir} or AWD_DATA_DIR={data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
