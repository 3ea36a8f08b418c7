"""A hostile package index against envbuild.index.client and the file cache: what a page may list (http(s)
only), how much a page or a download may send (bounded, refused while it arrives, nothing left
behind), and every field of a page in a wrong shape. Each ends in one line naming the index."""

from __future__ import annotations

import io
import json
import os
import textwrap
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.errors import InputError, RemoteError
from envbuild.index.client import MAX_DOWNLOAD, MAX_PAGE, IndexClient
from envbuild.index.filecache import FileCache
from tests.lib.pyindex import (
    JSON_TYPE,
    PyIndex,
    Route,
    endless,
    make_sdist,
    one_line,
    wheels_at,
    write_file_index,
)

WHEEL = "alpha-1.0-py3-none-any.whl"


@pytest.fixture()
def dists(tmp_path: Path) -> Path:
    return wheels_at(tmp_path / "dists", "alpha")


# --- what a page may list ---------------------------------------------------------------------


@pytest.mark.parametrize("html_only", [False, True], ids=["json", "html"])
@pytest.mark.parametrize("url", ["file:///dev/zero", "ftp://127.0.0.1/alpha.whl", "javascript:alert(1)", "data:,x"])
def test_a_page_listing_anything_but_http_is_refused(dists: Path, html_only: bool, url: str) -> None:
    with PyIndex(dists, html_only=html_only) as index:
        index.relink(WHEEL, url)
        with pytest.raises(RemoteError) as info:
            IndexClient().project(index.url, "alpha")
    message = one_line(info)
    assert message.startswith(f"index {index.url} answered a malformed page for alpha: ")
    assert message.endswith(f"url {url!r} is not an http(s) URL")


@pytest.mark.parametrize("url", ["file:///dev/zero", "file:///etc/passwd", "ftp://127.0.0.1/x.whl", "gopher://x/"])
def test_download_fetches_nothing_but_http(url: str) -> None:
    out = io.BytesIO()
    with pytest.raises(RemoteError) as info:
        IndexClient().download(url, out)
    assert one_line(info) == f"{url}: refusing to download: only http(s) URLs are fetched from an index"
    assert out.getvalue() == b""


def test_a_relative_url_resolves_against_the_page(dists: Path, tmp_path: Path) -> None:
    with PyIndex(dists) as index:
        index.relink(WHEEL, f"../../files/{WHEEL}")
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None and listed.url == index.url.replace("/simple", f"/files/{WHEEL}")
        path = FileCache(tmp_path / "cache").fetch(listed.url, index.sha256(WHEEL), WHEEL, client.download)
    assert path.read_bytes() == (dists / WHEEL).read_bytes()


def test_a_redirect_to_another_scheme_is_refused(dists: Path, tmp_path: Path) -> None:
    with PyIndex(dists) as index:
        index.route(f"/files/{WHEEL}", Route(302, {"Location": "file:///dev/zero"}))
        index.route("/simple/beta/", Route(301, {"Location": "file:///etc/passwd"}))
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        cache = FileCache(tmp_path / "cache")
        with pytest.raises(RemoteError) as download:
            cache.fetch(listed.url, index.sha256(WHEEL), WHEEL, client.download)
        with pytest.raises(RemoteError) as page:
            client.project(index.url, "beta")
    assert one_line(download) == (
        f"{listed.url}: download failed: redirected to a URL that is not http(s): 'file:///dev/zero'"
    )
    assert one_line(page) == (
        f"index {index.url} out of reach for beta: redirected to a URL that is not http(s): 'file:///etc/passwd'"
    )
    assert cache.get(index.sha256(WHEEL)) is None and cache.temporary_files() == []


# --- how much an index may send ---------------------------------------------------------------


def test_a_download_is_refused_once_it_passes_the_size_the_index_states(dists: Path, tmp_path: Path) -> None:
    size = (dists / WHEEL).stat().st_size
    with PyIndex(dists) as index:
        index.route(f"/files/{WHEEL}", Route(200, {}, endless()))  # /dev/zero behind an http URL
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None and listed.size == size  # PEP 700, from the JSON page
        cache = FileCache(tmp_path / "cache")
        with pytest.raises(RemoteError) as info:
            cache.fetch(listed.url, index.sha256(WHEEL), WHEEL, client.download)
    assert one_line(info) == f"{listed.url} passed the size the index states ({size} bytes); refused"
    assert cache.get(index.sha256(WHEEL)) is None and cache.temporary_files() == []


def test_without_a_stated_size_the_download_limit_bounds_it(dists: Path) -> None:
    with PyIndex(dists, html_only=True) as index:  # HTML pages state no size
        index.route(f"/files/{WHEEL}", Route(200, {}, endless()))
        client = IndexClient(max_download=1 << 20)
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None and listed.size is None
        out = io.BytesIO()
        with pytest.raises(RemoteError) as info:
            client.download(listed.url, out)
    assert one_line(info) == (
        f"{listed.url} passed the download limit ($ENVBUILD_MAX_DOWNLOAD) ({1 << 20} bytes); refused"
    )
    assert len(out.getvalue()) <= 1 << 20  # refused before the chunk that passed it was written


def test_a_declared_length_over_the_bound_is_refused_before_the_body(dists: Path) -> None:
    with PyIndex(dists) as index:
        index.route(f"/files/{WHEEL}", Route(200, {"Content-Length": str(10**12)}, endless()))
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        out = io.BytesIO()
        with pytest.raises(RemoteError, match=r"is 1000000000000 bytes, more than the size the index states"):
            client.download(listed.url, out)
    assert out.getvalue() == b""


def test_a_stated_size_over_the_limit_is_refused_before_any_request(dists: Path) -> None:
    with PyIndex(dists) as index:
        index.state_size(WHEEL, 10 << 30)
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        with pytest.raises(RemoteError) as info:
            client.download(listed.url, io.BytesIO())
    assert one_line(info) == (
        f"{listed.url}: refusing to download: the index states {10 << 30} bytes, more than the limit of "
        f"{MAX_DOWNLOAD} (raise $ENVBUILD_MAX_DOWNLOAD if that is right)"
    )
    assert f"/files/{WHEEL}" not in index.requests


def test_the_download_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert IndexClient().max_download == MAX_DOWNLOAD == 4 << 30
    for text, size in (("1M", 1 << 20), ("8G", 8 << 30), ("8GiB", 8 << 30), ("123", 123)):
        monkeypatch.setenv("ENVBUILD_MAX_DOWNLOAD", text)
        assert IndexClient().max_download == size
    monkeypatch.setenv("ENVBUILD_MAX_DOWNLOAD", "lots")
    with pytest.raises(InputError, match=r"\$ENVBUILD_MAX_DOWNLOAD: expected a positive size .* got 'lots'"):
        IndexClient()


def test_a_page_that_never_ends_is_refused_at_the_page_limit(dists: Path) -> None:
    with PyIndex(dists) as index:
        route = index.route("/simple/alpha/", Route(200, {"Content-Type": JSON_TYPE}, endless(b'{"files": [' * 4096)))
        with pytest.raises(RemoteError) as info:
            IndexClient().project(index.url, "alpha")
    assert (
        one_line(info)
        == f"index {index.url}: the page for alpha passed the page size limit ({MAX_PAGE} bytes); refused"
    )
    assert route.sent >= MAX_PAGE


def test_a_page_declaring_hundreds_of_mb_is_refused_at_once(dists: Path) -> None:
    with PyIndex(dists) as index:
        headers = {"Content-Type": JSON_TYPE, "Content-Length": str(500 << 20)}
        index.route("/simple/alpha/", Route(200, headers, endless()))
        with pytest.raises(RemoteError, match=rf"the page for alpha is {500 << 20} bytes, more than the page size"):
            IndexClient().project(index.url, "alpha")


# --- every field in a wrong shape -------------------------------------------------------------


def page(**entry: object) -> bytes:
    base: dict[str, object] = {"filename": WHEEL, "url": f"/files/{WHEEL}", "hashes": {"sha256": "a" * 64}}
    return json.dumps({"meta": {"api-version": "1.1"}, "name": "alpha", "files": [{**base, **entry}]}).encode()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (page(size=-1), "files[0]: size -1 is not a byte count"),
        (page(size="12"), "files[0]: size '12' is not a byte count"),
        (page(size=True), "files[0]: size True is not a byte count"),
        (page(size=1.5), "files[0]: size 1.5 is not a byte count"),
        (page(hashes={"sha256": "zz"}), "files[0]: hashes.sha256 'zz' is not 64 hex digits"),
        (
            page(hashes={"sha256": "a" * 64 + "\n"}),
            "files[0]: hashes.sha256 '" + "a" * 64 + "\\n' is not 64 hex digits",
        ),
        (page(hashes={"sha256": 12}), "files[0]: hashes.sha256 12 is not 64 hex digits"),
        (page(yanked={}), "files[0]: yanked {} is neither a bool nor a reason"),
        (page(yanked=1), "files[0]: yanked 1 is neither a bool nor a reason"),
        (page(filename="../../evil.whl"), "files[0]: filename '../../evil.whl' is not a plain file name"),
        (page(filename="a\nb.whl"), "files[0]: filename 'a\\nb.whl' is not a plain file name"),
        (page(filename=""), "files[0]: filename '' is not a plain file name"),
        (page(url="/files/a\x1b[2Jb.whl"), "files[0]: url 'http://HOST/files/a\\x1b[2Jb.whl' holds control characters"),
        (b"[" * 100_000, "not JSON (nested too deeply)"),
        (b'{"files": ' + b"[" * 100_000, "not JSON (nested too deeply)"),
        (b"\xff\xfe garbage", "not JSON (Expecting value: line 1 column 1 (char 0))"),
    ],
)
def test_malformed_fields_refuse_the_page(dists: Path, body: bytes, why: str) -> None:
    with PyIndex(dists) as index:
        index.answer("alpha", body)
        with pytest.raises(RemoteError) as info:
            IndexClient().project(index.url, "alpha")
    host = index.url.split("/")[2]
    assert one_line(info) == f"index {index.url} answered a malformed page for alpha: {why.replace('HOST', host)}"


def test_html_anchors_hostile_and_harmless(dists: Path) -> None:
    sha = "b" * 64
    listing = (
        '<a href="../">Parent Directory</a> <a href="?C=N;O=D">Name</a> '  # a served directory listing
        f'<a href="/files/{WHEEL}#sha256={sha}" data-yanked="bad\x1b[31m&#10;release">{WHEEL}</a>'
    )
    with PyIndex(dists) as index:
        index.answer("alpha", listing.encode(), content_type="text/html")
        index.answer("beta", b'<a href="/files/beta-1.0.tar.gz#sha256=nothex">x</a>', content_type="text/html")
        client = IndexClient()
        alpha = client.project(index.url, "alpha")
        with pytest.raises(RemoteError) as info:
            client.project(index.url, "beta")
    assert [f.filename for f in alpha.files] == [WHEEL]  # directory links skipped, not refused
    assert alpha.files[0].yanked and alpha.files[0].yanked_reason == "bad\\x1b[31m\\nrelease"
    assert one_line(info).endswith("link 0: sha256 'nothex' is not 64 hex digits")


def test_a_file_index_serves_only_regular_files_inside_it(dists: Path, tmp_path: Path) -> None:
    url = write_file_index(tmp_path / "simple", dists)
    client = IndexClient()
    listed = client.project(url, "alpha").file(WHEEL)
    assert listed is not None and listed.url == (tmp_path / "simple" / "files" / WHEEL).as_uri()
    out = io.BytesIO()
    client.download(listed.url, out)
    assert out.getvalue() == (dists / WHEEL).read_bytes()

    evil = tmp_path / "evil"
    (evil / "zero").mkdir(parents=True)
    (evil / "files").mkdir()
    os.symlink("/dev/zero", evil / "files" / "zero-1.0-py3-none-any.whl")
    entry = {"filename": "zero-1.0-py3-none-any.whl", "url": "../files/zero-1.0-py3-none-any.whl", "hashes": {}}
    (evil / "zero" / "index.json").write_text(json.dumps({"files": [entry]}))
    (evil / "outside").mkdir()
    outside = {"filename": "x-1.0-py3-none-any.whl", "url": "file:///etc/passwd", "hashes": {}}
    (evil / "outside" / "index.json").write_text(json.dumps({"files": [outside]}))
    (evil / "device").mkdir()
    os.symlink("/dev/zero", evil / "device" / "index.json")
    zero = client.project(evil.as_uri(), "zero").files[0]
    with pytest.raises(RemoteError) as symlinked:
        client.download(zero.url, io.BytesIO())
    assert one_line(symlinked) == f"{zero.url}: refusing to read it: not inside the file:// index {evil.as_uri()}"
    with pytest.raises(RemoteError, match=r"url 'file:///etc/passwd' is outside the file:// index"):
        client.project(evil.as_uri(), "outside")
    with pytest.raises(RemoteError, match=r"device/index.json is not a regular file"):
        client.project(evil.as_uri(), "device")


# --- end to end: one line, exit 1, nothing written ----------------------------------------------


def test_lock_verify_reports_a_hostile_index_in_one_line(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with PyIndex(dists) as index:
        index.relink(WHEEL, "file:///dev/zero")
        lock = tmp_path / "hostile.lock.yaml"
        lock.write_text(
            textwrap.dedent(f"""\
                version: 1
                name: hostile
                index: {index.url}
                sources: []
                packages:
                  - {{name: alpha, version: "1.0", files: [{{filename: {WHEEL}, sha256: "{index.sha256(WHEEL)}"}}]}}
                """)
        )
        code = main(["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    [result] = [r for r in json.loads(out)["results"] if r["kind"] == "package"]
    assert result["status"] == "unreachable"
    assert result["detail"] == (
        f"index {index.url} answered a malformed page for alpha: files[0]: url 'file:///dev/zero' is not an http(s) URL"
    )
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("html_only", [False, True], ids=["json", "html"])
def test_a_tar_gz_labelled_gzip_encoded_is_cached_as_the_bytes_sent(tmp_path: Path, html_only: bool) -> None:
    """A host that serves an sdist with ``Content-Encoding: gzip`` (an S3 object uploaded so, a web server's
    ``AddEncoding x-gzip .gz``) sends the file itself: its sha256 is the lock's, as pip and uv read it.
    Undone, the .tar.gz became a .tar, refused as larger than the index states or as a wrong sha256."""
    dists = wheels_at(tmp_path / "dists", "alpha")
    sdist = make_sdist(dists, "alpha", "1.0")
    data = sdist.read_bytes()
    labelled = {"Content-Type": "application/x-tar", "Content-Encoding": "gzip", "Content-Length": str(len(data))}
    with PyIndex(dists, html_only=html_only) as index:
        index.route(f"/files/{sdist.name}", Route(200, labelled, data))
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(sdist.name)
        assert listed is not None
        path = FileCache(tmp_path / "cache").fetch(listed.url, index.sha256(sdist.name), sdist.name, client.download)
    assert path.read_bytes() == data
