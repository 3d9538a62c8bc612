"""Shared pytest fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Tiny test models gain nothing from several threads and lose much when the cores are
# shared; one thread for this process and every subprocess it starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bitwise MKL products whatever the memory alignment, as train.py sets for its process (here
# before any product, whichever test module imports train first).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import errno  # noqa: E402
import signal  # noqa: E402

# The tests stop scripts with SIGINT and SIGHUP, as a terminal does. A pytest started with them
# ignored (under nohup, in a script's background job) would hand that on to every script it
# starts, and the scripts keep a signal ignored that they were started with
# (experiment/cli.py's handle_stop_signal): the terminal's dispositions, before any module
# reads them.
for _signum, _handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, _handler)

import pytest  # noqa: E402
import torch  # noqa: E402

# SIGINT, SIGTERM and SIGHUP as a terminal gives them (after the reset above).
TERMINAL_SIGNALS = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


@pytest.fixture(autouse=True)
def stop_signals_as_a_terminal_gives_them():
    """Each test starts with SIGINT, SIGTERM and SIGHUP as a terminal gives them, whatever an
    earlier test in this process left: a stop handler restored to SIG_IGN (StopSignals after a
    signal stop, handle_stop_signal in a process that found one ignored) would be inherited by
    every script a later test starts, which keeps it ignored (seen in CI: a SIGHUP test's
    train.py trained on to exit 0)."""
    for signum, handler in TERMINAL_SIGNALS.items():
        signal.signal(signum, handler)

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Make the repository's packages importable when pytest is run as `pytest`
# (which, unlike `python -m pytest`, does not put the working directory on sys.path).
REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def real_corpora_dir(environ, repo_root: Path) -> Path | None:
    """Where the tests read the real corpora: $AWD_DATA_DIR (set by CI), else the repository's
    corpora/ when it holds both (where a first run downloads them); None: neither."""
    if environ.get("AWD_DATA_DIR"):
        return Path(environ["AWD_DATA_DIR"])
    local = repo_root / "corpora"
    return local if all((local / name).is_dir() for name in ("ptb", "wikitext-2")) else None


def missing_corpus_line(folder: Path, environ) -> str | None:
    """Why `folder` (real_corpora_dir's) cannot serve the tests (None: it holds every split file
    of both corpora). A folder set by hand and wrong (AWD_DATA_DIR=.../ptb, say) fails the tests
    that read it with this one line, not a skip that hides it nor a FileNotFoundError from
    every fixture that copies a slice."""
    from data.download import DATASETS, SPLIT_FILES, missing_split_files
    missing = [path for dataset in DATASETS for path in missing_split_files(folder / dataset)]
    if not missing:
        return None
    named = f"AWD_DATA_DIR={folder}" if environ.get("AWD_DATA_DIR") else str(folder)
    return (f"{named}: no {missing[0]}; the tests read {' and '.join(DATASETS)}, each "
            f"{', '.join(SPLIT_FILES)}, from the folder AWD_DATA_DIR names, else corpora/")


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The read-only folder with the real corpora (real_corpora_dir), exported as $AWD_DATA_DIR
    so that the commands the tests start read it too."""
    folder = real_corpora_dir(os.environ, REPO_ROOT)
    if folder is None:
        pytest.skip("AWD_DATA_DIR is not set and corpora/ does not hold ptb/ and wikitext-2/: "
                    "set it to the folder holding them")
    if line := missing_corpus_line(folder, os.environ):
        pytest.fail(line, pytrace=False)
    os.environ["AWD_DATA_DIR"] = str(folder)
    return folder


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """Keep the token cache of the test session out of the user's ~/.cache."""
    if "AWD_CACHE_DIR" not in os.environ:
        os.environ["AWD_CACHE_DIR"] = str(tmp_path_factory.mktemp("awd-cache"))
    yield


def copy_first_lines(source: Path, target: Path, lines: dict[str, int]) -> None:
    """target/<split>.txt: the first lines[split] lines of source/<split>.txt."""
    target.mkdir(parents=True, exist_ok=True)
    for split, count in lines.items():
        with open(source / f"{split}.txt", encoding="utf-8") as f:
            head = [next(f) for _ in range(count)]
        (target / f"{split}.txt").write_text("".join(head), encoding="utf-8")


@pytest.fixture(scope="session")
def ptb_slice(shared_data_dir, tmp_path_factory) -> Path:
    """A data dir whose ptb/ holds the first lines of the real PTB splits (fast end-to-end runs)."""
    root = tmp_path_factory.mktemp("ptb-slice")
    copy_first_lines(shared_data_dir / "ptb", root / "ptb", {"train": 150, "valid": 30, "test": 30})
    return root


# A model small enough that an epoch over `ptb_slice` takes about a second on CPU.
TINY = ["model.emsize=16", "model.nhid=24", "model.nhidlast=16", "train.batch_size=4",
        "train.bptt=8", "train.max_seq_len_delta=4", "train.eval_batch_size=2",
        "run.device=cpu", "run.log_interval=10", "run.tensorboard=false",
        "data.allow_modified_corpus=true"]   # the fixtures are slices of PTB, not PTB


@pytest.fixture
def tiny_overrides(ptb_slice) -> list[str]:
    return [f"data.data_dir={ptb_slice}"] + TINY


@pytest.fixture(scope="session")
def small_data(ptb_slice, tmp_path_factory) -> Path:
    """The first lines of the PTB slice: an epoch of the TINY model is ~50 steps."""
    root = tmp_path_factory.mktemp("small-ptb")
    (root / "ptb").mkdir()
    for split, lines in (("train", 80), ("valid", 12), ("test", 12)):
        text = (ptb_slice / "ptb" / f"{split}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (root / "ptb" / f"{split}.txt").write_text("".join(text[:lines]), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def tiny_run(small_data, tmp_path_factory) -> Path:
    """One finished epoch of the TINY Softmax model on `small_data` (best.pt, metrics, ...)."""
    import train
    run_dir = tmp_path_factory.mktemp("runs") / "ptb-softmax"
    assert train.main(["configs/ptb/softmax.yaml", f"data.data_dir={small_data}", *TINY,
                       "train.epochs=1", f"run.dir={run_dir}"]) == 0
    return run_dir


def disk_full(fd):
    """A stand-in for os.fsync on a full disk (monkeypatch.setattr(os, "fsync", disk_full)): the
    run directory's atomic writes find it so before their rename."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def enospc_after(limit: int):
    """A stand-in for torch.save that writes `limit` bytes and then finds the disk full (the
    OSError reaches torch's writer, as from a real full disk)."""
    real_save = torch.save

    def save(obj, f):
        class Full:
            written = 0

            def write(self, data):
                if self.written + len(data) > limit:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.written += len(data)
                return f.write(data)

            def flush(self):
                f.flush()

        real_save(obj, Full())
    return save


def head_overrides(name: str) -> list[str]:
    """Config overrides that give head `name` the options its class has for tiny models
    (HEADS[name].small_options()), and, for a head whose g need not have the embedding's size,
    a last LSTM layer of another size than TINY's emsize, so that the difference is exercised."""
    import dataclasses
    from experiment.config import overrides_setting
    from model.heads import HEADS
    head = HEADS[name]
    overrides = [f"head.name={name}"] + overrides_setting("head", dataclasses.asdict(head.small_options()))
    return overrides + ([] if head.requires_nhidlast_equal_emsize else ["model.nhidlast=12"])


def doc_section(page: str, section: str) -> str:
    """The text of the section `## {section}` of a Markdown page of the repository (README.md or a
    guide in docs/, `page` relative to the repository root), up to the next `## ` heading."""
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    assert f"\n## {section}\n" in text, f'{page} has no section "## {section}"'
    return text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]


def doc_blocks(page: str, section: str, languages: str) -> list[tuple[str, str]]:
    """(first line, code) of each fenced block in the section `section` of the page `page` (e.g.
    "docs/heads.md", "Adding a head"), for blocks of the given languages (a regex alternation,
    e.g. "python|yaml"): what a recipe says to write."""
    import re
    blocks = re.findall(rf"```(?:{languages})\n(.*?)```", doc_section(page, section), re.S)
    return [(block.splitlines()[0], block) for block in blocks]


def parser_of(parse_args, monkeypatch):
    """The argparse parser that `parse_args` (a script's parse_args(argv), or a benchmark's main()
    that parses sys.argv) builds, caught when it would parse."""
    import argparse
    built = []

    def catch(self, *args, **kwargs):
        built.append(self)
        raise SystemExit(0)

    for method in ("parse_args", "parse_intermixed_args", "parse_known_args"):
        monkeypatch.setattr(argparse.ArgumentParser, method, catch)
    monkeypatch.setattr(sys, "argv", [getattr(parse_args, "__module__", "script")])
    with pytest.raises(SystemExit):
        parse_args([]) if parse_args.__code__.co_argcount else parse_args()
    return built[0]
