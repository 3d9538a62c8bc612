"""Tests for data.download against a local HTTP server on 127.0.0.1 (no network)."""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

import data.download as download
from data import DataError, ensure_corpus

Handler = http.server.BaseHTTPRequestHandler
Route = Callable[[Handler], None]

FAKE = {
    "train.txt": b"the cat sat\nthe dog sat\n",
    "valid.txt": b"a cat\n",
    "test.txt": b"the bird\n",
}
PTB_MEMBER = "./simple-examples/data/ptb.{}.txt"
WT2_MEMBER = "wikitext-2/wiki.{}.tokens"


# --- a local HTTP server ----------------------------------------------------


class LocalServer:
    """Serves `routes` (path -> handler function) and records each request."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.user_agents: list[str] = []
        outer = self

        class RequestHandler(Handler):
            def do_GET(self) -> None:
                outer.user_agents.append(self.headers.get("User-Agent", ""))
                route = outer.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                else:
                    route(self)

            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RequestHandler)
        # A short poll interval keeps shutdown() (and so each test) fast.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"


@pytest.fixture
def server() -> Iterator[LocalServer]:
    srv = LocalServer()
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def serve(body: bytes, *, declared_length: int | None = None) -> Route:
    """Answer 200 with `body`; a larger `declared_length` makes the server close
    the connection before the announced number of bytes has been sent."""

    def route(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(declared_length or len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return route


def serve_to_custom_agents(body: bytes) -> Route:
    """Like the WikiText mirror: 403 for Python's default User-Agent."""

    def route(handler: Handler) -> None:
        if handler.headers.get("User-Agent", "").startswith("Python-urllib"):
            handler.send_error(403)
        else:
            serve(body)(handler)

    return route


def redirect(location: str) -> Route:
    def route(handler: Handler) -> None:
        handler.send_response(302)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return route


def refused_url() -> str:
    """A 127.0.0.1 URL on a port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple-examples.tgz"


# --- archives ---------------------------------------------------------------


def make_tgz(members: dict[str, bytes], *, compresslevel: int = 6) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=compresslevel) as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def make_zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)  # writestr keeps names verbatim
    return buffer.getvalue()


def ptb_members(files: dict[str, bytes] = FAKE) -> dict[str, bytes]:
    members = {PTB_MEMBER.format(name[: -len(".txt")]): data for name, data in files.items()}
    members["./simple-examples/data/ptb.char.train.txt"] = b"c a t\n"  # not needed
    return members


def wt2_members(files: dict[str, bytes] = FAKE) -> dict[str, bytes]:
    return {WT2_MEMBER.format(name[: -len(".txt")]): data for name, data in files.items()}


@pytest.fixture
def fake_checksums(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {name: hashlib.sha256(data).hexdigest() for name, data in FAKE.items()}
    for dataset in download.SOURCES:
        monkeypatch.setitem(download.CHECKSUMS, dataset, table)


def assert_no_corpus_and_no_leftovers(data_dir: Path, dataset: str) -> None:
    folder = data_dir / dataset
    for name in FAKE:
        assert not (folder / name).exists()
    assert list(data_dir.rglob("*")) == []        # nor the folder made for the download


# --- tests ------------------------------------------------------------------


def test_ptb_download_and_extraction(tmp_path: Path, server: LocalServer, fake_checksums: None):
    server.routes["/simple-examples.tgz"] = serve(make_tgz(ptb_members()))
    folder = ensure_corpus("ptb", tmp_path / "corpora", urls=[server.url("/simple-examples.tgz")])
    assert folder == tmp_path / "corpora" / "ptb"
    # Exactly the three split files, nothing else (no temp files, no extra members).
    assert sorted(p.name for p in folder.iterdir()) == ["test.txt", "train.txt", "valid.txt"]
    for name, content in FAKE.items():
        assert (folder / name).read_bytes() == content
    assert server.user_agents == [download.USER_AGENT]


def test_existing_corpus_is_not_downloaded(tmp_path: Path):
    folder = tmp_path / "ptb"
    folder.mkdir()
    for name in FAKE:
        (folder / name).write_text("x\n")
    assert ensure_corpus("ptb", tmp_path, urls=[refused_url()]) == folder


@pytest.mark.parametrize("first_failure", ["404", "html-page"])
def test_mirror_used_when_first_url_fails(
    tmp_path: Path, server: LocalServer, fake_checksums: None, first_failure: str
):
    if first_failure == "html-page":  # e.g. an error page served with status 200
        server.routes["/s3/wikitext-2-v1.zip"] = serve(b"<html>Access Denied</html>")
    server.routes["/mirror/wikitext-2-v1.zip"] = serve_to_custom_agents(make_zip(wt2_members()))
    urls = [server.url("/s3/wikitext-2-v1.zip"), server.url("/mirror/wikitext-2-v1.zip")]
    folder = ensure_corpus("wikitext-2", tmp_path, urls=urls)
    for name, content in FAKE.items():
        assert (folder / name).read_bytes() == content
    assert len(server.user_agents) == 2


def test_redirect_is_followed_with_our_user_agent(
    tmp_path: Path, server: LocalServer, fake_checksums: None
):
    server.routes["/old.zip"] = redirect("/new.zip")
    server.routes["/new.zip"] = serve_to_custom_agents(make_zip(wt2_members()))
    folder = ensure_corpus("wikitext-2", tmp_path, urls=[server.url("/old.zip")])
    assert (folder / "train.txt").read_bytes() == FAKE["train.txt"]


def test_real_ptb_files_pass_the_real_checksums(
    tmp_path: Path, server: LocalServer, shared_data_dir: Path
):
    real = {name: (shared_data_dir / "ptb" / name).read_bytes() for name in FAKE}
    server.routes["/simple-examples.tgz"] = serve(make_tgz(ptb_members(real), compresslevel=1))
    folder = ensure_corpus("ptb", tmp_path, urls=[server.url("/simple-examples.tgz")])
    for name, content in real.items():
        assert (folder / name).read_bytes() == content


def test_checksum_mismatch_leaves_no_file(
    tmp_path: Path, server: LocalServer, fake_checksums: None
):
    tampered = dict(FAKE, **{"train.txt": b"the cat sat on a mat\n"})
    server.routes["/simple-examples.tgz"] = serve(make_tgz(ptb_members(tampered)))
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path, urls=[server.url("/simple-examples.tgz")])
    message = str(info.value)
    assert "\n" not in message
    assert "checksum mismatch for ptb/train.txt" in message
    assert hashlib.sha256(FAKE["train.txt"]).hexdigest() in message
    assert hashlib.sha256(tampered["train.txt"]).hexdigest() in message
    assert str(tmp_path / "ptb") in message
    assert_no_corpus_and_no_leftovers(tmp_path, "ptb")


def test_interrupted_transfer_then_retry(
    tmp_path: Path, server: LocalServer, fake_checksums: None
):
    archive = make_tgz(ptb_members())
    url = server.url("/simple-examples.tgz")
    server.routes["/simple-examples.tgz"] = serve(
        archive[: len(archive) // 2], declared_length=len(archive)
    )
    with pytest.raises(DataError, match="interrupted"):
        ensure_corpus("ptb", tmp_path, urls=[url])
    assert_no_corpus_and_no_leftovers(tmp_path, "ptb")

    server.routes["/simple-examples.tgz"] = serve(archive)
    folder = ensure_corpus("ptb", tmp_path, urls=[url])
    assert (folder / "valid.txt").read_bytes() == FAKE["valid.txt"]


def test_offline_error_says_where_to_put_the_files(tmp_path: Path):
    url = refused_url()
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path, urls=[url])
    message = str(info.value)
    assert "\n" not in message
    assert url in message and "refused" in message.lower()
    assert str(tmp_path / "ptb") in message
    assert all(name in message for name in FAKE)
    assert f"point data.data_dir or --data-dir, now {tmp_path}," in message   # the setting that named it
    assert_no_corpus_and_no_leftovers(tmp_path, "ptb")


def test_an_awd_data_dir_without_the_corpus_is_named_as_set(tmp_path: Path, monkeypatch):
    """A newcomer's AWD_DATA_DIR=/nonexistent read "(or set AWD_DATA_DIR ...)", as if it were unset."""
    monkeypatch.setenv("AWD_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path / "nowhere", urls=[refused_url()])
    assert f"(or point AWD_DATA_DIR, now {tmp_path / 'nowhere'}, or pass --data-dir or data.data_dir= to a folder holding ptb/)" \
        in str(info.value)
    # set, but a run's data.data_dir names another folder, read first: pointing it again would not help
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path / "elsewhere", urls=[refused_url()])
    assert (f"(or point data.data_dir or --data-dir, now {tmp_path / 'elsewhere'}, to a folder holding ptb/; "
            f"AWD_DATA_DIR, {tmp_path / 'nowhere'}, is not read while data.data_dir or --data-dir is set)"
            ) in str(info.value)


def test_the_offline_hint_names_the_setting_that_chose_the_folder(tmp_path: Path, monkeypatch):
    """A --data-dir (or data.data_dir) was told "(or set AWD_DATA_DIR / pass --data-dir ...)": it had
    passed one, and AWD_DATA_DIR is not read while it is given."""
    import data.corpus
    monkeypatch.delenv("AWD_DATA_DIR", raising=False)
    monkeypatch.setattr(data.corpus, "DEFAULT_DATA_DIR", tmp_path / "corpora")
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path / "named", urls=[refused_url()])
    assert (f"(or point data.data_dir or --data-dir, now {tmp_path / 'named'}, to a folder holding ptb/)"
            in str(info.value))
    assert "AWD_DATA_DIR" not in str(info.value)
    with pytest.raises(DataError) as info:           # the default corpora/, nothing set
        ensure_corpus("ptb", tmp_path / "corpora", urls=[refused_url()])
    assert "(or set AWD_DATA_DIR / pass --data-dir or data.data_dir= to a folder holding ptb/)" in str(info.value)


def test_a_failed_download_removes_the_folders_it_made_and_no_other(tmp_path: Path):
    """A mistyped data dir that does not exist: not left behind as empty folders."""
    with pytest.raises(DataError):
        ensure_corpus("ptb", tmp_path / "typo" / "data", urls=[refused_url()])
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine" / "ptb").mkdir(parents=True)       # folders the user made stay
    with pytest.raises(DataError):
        ensure_corpus("ptb", tmp_path / "mine", urls=[refused_url()])
    assert (tmp_path / "mine" / "ptb").is_dir()


def test_default_sources_match_the_spec():
    assert download.SOURCES["ptb"].urls == (
        "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",
    )
    assert download.SOURCES["wikitext-2"].urls == (
        "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip",
        "https://wikitext.smerity.com/wikitext-2-v1.zip",
    )
    assert set(download.SOURCES["ptb"].members.values()) == set(FAKE)
    assert set(download.SOURCES["wikitext-2"].members.values()) == set(FAKE)


def test_unknown_dataset(tmp_path: Path):
    with pytest.raises(DataError, match="ptb, wikitext-2"):
        ensure_corpus("enwik8", tmp_path)


@pytest.mark.parametrize("fmt", ["tgz", "zip"])
@pytest.mark.parametrize("kind", ["parent", "absolute"])
def test_unsafe_archive_members_are_refused(
    tmp_path: Path, server: LocalServer, fake_checksums: None, fmt: str, kind: str
):
    data_dir = tmp_path / "data"
    outside = tmp_path / "outside.txt"
    bad_name = "../../outside.txt" if kind == "parent" else str(outside)
    dataset, members = ("ptb", ptb_members()) if fmt == "tgz" else ("wikitext-2", wt2_members())
    members[bad_name] = b"pwned\n"
    archive = make_tgz(members) if fmt == "tgz" else make_zip(members)
    server.routes["/archive"] = serve(archive)

    with pytest.raises(DataError, match="unsafe member path"):
        ensure_corpus(dataset, data_dir, urls=[server.url("/archive")])
    assert not outside.exists()
    assert_no_corpus_and_no_leftovers(data_dir, dataset)


def test_unwritable_data_dir_gives_a_data_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    def read_only(*args: object, dir: str, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", dir)

    # Tests run as root, where chmod cannot make a folder read-only.
    monkeypatch.setattr(download.tempfile, "mkstemp", read_only)
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path, urls=[refused_url()])
    assert "cannot write ptb files" in str(info.value)
    assert str(tmp_path / "ptb") in str(info.value)


# --- a corpus folder partly filled, a data dir that is a dataset's folder ----


def served_ptb(server: LocalServer) -> str:
    server.routes["/simple-examples.tgz"] = serve(make_tgz(ptb_members()))
    return server.url("/simple-examples.tgz")


def test_some_split_files_present_is_refused_not_completed(
    tmp_path: Path, server: LocalServer, fake_checksums: None
):
    """A custom train.txt and valid.txt beside a downloaded published test.txt trained without a word."""
    folder = tmp_path / "ptb"
    folder.mkdir()
    (folder / "train.txt").write_text("my own text\n")
    (folder / "valid.txt").write_text("my own valid\n")
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path, urls=[served_ptb(server)])
    message = str(info.value)
    assert "\n" not in message
    assert f"{folder} holds train.txt, valid.txt but not test.txt" in message
    assert "all of train.txt, valid.txt, test.txt or none" in message
    assert server.user_agents == []                       # nothing was fetched
    assert sorted(p.name for p in folder.iterdir()) == ["train.txt", "valid.txt"]


def test_offline_a_partial_folder_names_only_the_missing_files(tmp_path: Path):
    folder = tmp_path / "ptb"
    folder.mkdir()
    (folder / "train.txt").write_text("my own text\n")
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path, urls=[refused_url()])
    assert f"{folder} holds train.txt but not valid.txt, test.txt:" in str(info.value)


def test_a_split_path_that_is_a_directory_is_named_as_one(tmp_path: Path, server: LocalServer):
    (tmp_path / "ptb" / "test.txt").mkdir(parents=True)
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path, urls=[served_ptb(server)])
    assert str(info.value) == f"{tmp_path / 'ptb' / 'test.txt'} is a directory: expected the ptb split file test.txt"
    assert server.user_agents == []


@pytest.mark.parametrize("named_by", ["AWD_DATA_DIR", "--data-dir"])
@pytest.mark.parametrize("names", [("train.txt",), ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")])
def test_a_data_dir_that_is_the_dataset_folder_is_refused_before_downloading(
    tmp_path: Path, server: LocalServer, fake_checksums: None, monkeypatch, named_by: str, names: tuple
):
    """AWD_DATA_DIR=/path/data/ptb read "place ... in /path/data/ptb/ptb by hand" (and online downloaded
    a second copy into ptb/ptb)."""
    dataset_folder = tmp_path / "data" / "ptb"
    dataset_folder.mkdir(parents=True)
    for name in names:
        (dataset_folder / name).write_text("the cat\n")
    if named_by == "AWD_DATA_DIR":
        monkeypatch.setenv("AWD_DATA_DIR", str(dataset_folder))
    else:
        monkeypatch.delenv("AWD_DATA_DIR", raising=False)
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", dataset_folder, urls=[served_ptb(server)])
    message = str(info.value)
    assert "\n" not in message
    setting = "AWD_DATA_DIR" if named_by == "AWD_DATA_DIR" else "data.data_dir or --data-dir"
    assert message.startswith(f"{setting} names {dataset_folder}, which holds {', '.join(names)} itself")
    assert message.endswith(f"did you mean its parent, {tmp_path / 'data'}?")
    assert server.user_agents == []
    assert not (dataset_folder / "ptb").exists()


def test_a_data_dir_holding_split_files_under_another_name_is_told_where_they_go(tmp_path: Path):
    (tmp_path / "my_ptb").mkdir()
    (tmp_path / "my_ptb" / "train.txt").write_text("the cat\n")
    with pytest.raises(DataError) as info:
        ensure_corpus("ptb", tmp_path / "my_ptb", urls=[refused_url()])
    assert str(info.value).endswith(f"put them in {tmp_path / 'my_ptb' / 'ptb'}/ as train.txt, valid.txt, test.txt")


# --- python -m data.download ---------------------------------------------------


def test_the_command_fetches_into_the_folder_runs_read(
    tmp_path: Path, server: LocalServer, fake_checksums: None, monkeypatch, capsys
):
    from dataclasses import replace
    monkeypatch.setitem(download.SOURCES, "ptb", replace(download.SOURCES["ptb"], urls=(served_ptb(server),)))
    monkeypatch.setenv("AWD_DATA_DIR", str(tmp_path / "env"))
    assert download.main(["ptb"]) == 0                    # no --data-dir: AWD_DATA_DIR, as a run
    assert (tmp_path / "env" / "ptb" / "test.txt").read_bytes() == FAKE["test.txt"]
    assert capsys.readouterr().out == (f"ptb: train.txt, valid.txt, test.txt in {tmp_path / 'env' / 'ptb'}, "
                                       f"the published files (sha256 checked)\n")
    assert download.main(["ptb", "--data-dir", str(tmp_path / "flag")]) == 0
    assert (tmp_path / "flag" / "ptb" / "train.txt").read_bytes() == FAKE["train.txt"]
    assert f"--data-dir {tmp_path / 'flag'}" in capsys.readouterr().out.splitlines()[-1]


def test_the_command_fails_in_one_line_with_exit_2(tmp_path: Path, monkeypatch, capsys):
    from dataclasses import replace
    monkeypatch.setitem(download.SOURCES, "ptb", replace(download.SOURCES["ptb"], urls=(refused_url(),)))
    assert download.main(["ptb", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: could not download ptb") and err.count("\n") == 1
    assert download.main(["ptb", "enwik8", "--data-dir", str(tmp_path)]) == 2   # before any download
    assert capsys.readouterr().err == "error: unknown dataset 'enwik8': expected one of ptb, wikitext-2\n"


def test_python_m_data_download_checks_files_already_there(tmp_path: Path):
    """`python -m data.download` did nothing (exit 0, and runpy's RuntimeWarning). Files placed by hand
    are checked too: here not the published ones, so exit 2 naming the file, and nothing downloaded."""
    import subprocess
    import sys
    (tmp_path / "ptb").mkdir()
    for name, content in FAKE.items():
        (tmp_path / "ptb" / name).write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "data.download", "ptb", "--data-dir", str(tmp_path)],
                          cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {tmp_path / 'ptb'}: checksum mismatch for ptb/train.txt")
    assert proc.stderr.count("\n") == 1                   # one line: no traceback, no RuntimeWarning
    assert sorted(p.name for p in (tmp_path / "ptb").iterdir()) == sorted(FAKE)
