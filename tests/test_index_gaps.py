"""What the package index, the file cache, the resolver and the metadata reader do at the edges no other
test reached: an HTML page announcing PEP 658 metadata, a page or metadata file cut short, refused or too
large, a ``file://`` index whose pages are HTML or whose files are FIFOs, directories or gone, a cache that
cannot be written, uv that does not finish or wants another version, sdists in every broken shape. Real
indexes (tests/lib/pyindex.py), real uv, real tmpfs mounts; each outcome asserted as the user reads it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuild.errors import CacheError, RemoteError
from envbuild.index.client import MAX_METADATA, IndexClient, IndexFile
from envbuild.index.filecache import FileCache
from envbuild.lock import Lock, Package, PackageFile, Platform
from envbuild.update import resolve
from envbuild.update.resolve import ResolutionError, parse_pins, pin_files, resolve_packages
from envbuild.verify.metadata import MetadataError, MetadataReader, _sdist_members, read_metadata, sdist_requirements
from tests.lib.pyindex import (
    JSON_TYPE,
    PyIndex,
    Route,
    Trickle,
    dead_port_url,
    make_sdist,
    make_wheel,
    one_line,
    wheel_metadata,
    wheels_at,
    write_file_index,
)
from tests.lib.tmpfs import MiB, Tmpfs, mounted_tmpfs

WHEEL = "alpha-1.0-py3-none-any.whl"
ARM = Platform(os="linux", arch="aarch64", python="3.12")


@pytest.fixture()
def dists(tmp_path: Path) -> Path:
    return wheels_at(tmp_path / "dists", "alpha", "beta")


def listed(client: IndexClient, index: str, name: str = "alpha", filename: str = WHEEL) -> IndexFile:
    found = client.project(index, name).file(filename)
    assert found is not None, f"{index} does not list {filename}"
    return found


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lock_of(index: str, *packages: Package) -> Lock:
    return Lock(version=2, name="gaps", platform=ARM, index=index, sources=(), packages=packages)


# --- pages --------------------------------------------------------------------------------------


def test_an_html_page_announcing_metadata_by_hash_is_read_like_a_json_one(dists: Path) -> None:
    """PEP 714's ``data-core-metadata="sha256=…"``: the metadata file is read and checked, no range request."""
    with PyIndex(dists, html_only=True, metadata=True) as index:
        client = IndexClient()
        wheel = listed(client, index.url)
        [pinned] = pin_files([wheel], client, index.url, {})
    digest = sha256_of(wheel_metadata(dists / WHEEL))
    assert wheel.core_metadata == digest
    assert pinned == PackageFile(WHEEL, index.sha256(WHEEL), digest)
    assert f"/files/{WHEEL}.metadata" in index.requests and index.ranges == []


@pytest.mark.parametrize(
    ("content_type", "page"),
    [
        (JSON_TYPE, '{{"files": [{{"filename": "{w}", "url": "/files/{w}", "hashes": {{}}, "core-metadata": true}}]}}'),
        (
            JSON_TYPE,
            '{{"files": [{{"filename": "{w}", "url": "/files/{w}", "hashes": {{}}, '
            '"core-metadata": {{"sha256": "not hex"}}}}]}}',
        ),
        ("text/html", '<a href="/files/{w}" data-core-metadata>{w}</a>'),
        ("text/html", '<a href="/files/{w}" data-dist-info-metadata="true">{w}</a>'),
    ],
    ids=["json-true", "json-bad-hash", "html-bare", "html-true"],
)
def test_metadata_announced_without_a_hash_is_read_unchecked(dists: Path, content_type: str, page: str) -> None:
    with PyIndex(dists, metadata=True) as index:
        index.answer("alpha", page.format(w=WHEEL).encode(), content_type=content_type)
        client = IndexClient()
        wheel = listed(client, index.url)
        assert wheel.core_metadata == ""
        assert client.core_metadata(wheel) == wheel_metadata(dists / WHEEL)


def test_anchors_without_a_link_are_skipped(dists: Path) -> None:
    with PyIndex(dists) as index:
        page = (
            f'<a name="top"></a><a href="">nothing</a><a href="/files/{WHEEL}#sha256={index.sha256(WHEEL)}">{WHEEL}</a>'
        )
        index.answer("alpha", page.encode(), content_type="text/html")
        files = IndexClient().project(index.url, "alpha").files
    assert [(f.filename, f.sha256) for f in files] == [(WHEEL, index.sha256(WHEEL))]


def test_html_the_parser_gives_up_on_refuses_the_page_in_one_line(dists: Path) -> None:
    with PyIndex(dists) as index:
        index.answer("alpha", b"<html><![foo[ bar ]]></html>", content_type="text/html")
        with pytest.raises(RemoteError) as info:
            IndexClient().project(index.url, "alpha")
    assert one_line(info) == (
        f"index {index.url} answered a malformed page for alpha: unreadable HTML "
        "(unknown status keyword 'foo' in marked section)"
    )


@pytest.mark.parametrize(
    "declared", ["/files/", "../../files/", "{origin}/files/"], ids=["root", "relative", "absolute"]
)
def test_an_html_page_s_base_href_is_what_its_links_resolve_against(dists: Path, tmp_path: Path, declared: str) -> None:
    """As pip reads a page: its links are relative to its ``<base href>`` (itself relative to the page), not
    to the page's own URL; the file is then fetched from there and checked by its sha256."""
    cache = FileCache(tmp_path / "cache")
    with PyIndex(dists) as index:
        origin = index.url.removesuffix("/simple")
        base = declared.format(origin=origin)
        page = f'<html><head><base href="{base}"></head><body><a href="{WHEEL}#sha256={index.sha256(WHEEL)}">w</a>'
        index.answer("alpha", page.encode(), content_type="text/html")
        client = IndexClient()
        wheel = listed(client, index.url)
        assert wheel.url == f"{origin}/files/{WHEEL}"
        kept = cache.fetch(wheel.url, index.sha256(WHEEL), WHEEL, client.download)
    assert kept.read_bytes() == (dists / WHEEL).read_bytes()


@pytest.mark.parametrize(
    ("base", "why"),
    [
        ("http://[::1/files/", "<base href> 'http://[::1/files/' is not a valid URL"),
        ("ftp://127.0.0.1/files/", f"link 0: url 'ftp://127.0.0.1/files/{WHEEL}' is not an http(s) URL"),
        ("http://user:secret@127.0.0.1/files/", "carries credentials in its user part"),
    ],
    ids=["unparsed", "ftp", "credentials"],
)
def test_a_base_href_that_leads_links_astray_refuses_the_page_in_one_line(dists: Path, base: str, why: str) -> None:
    with PyIndex(dists) as index:
        page = f'<base href="{base}"><a href="{WHEEL}#sha256={index.sha256(WHEEL)}">w</a>'
        index.answer("alpha", page.encode(), content_type="text/html")
        with pytest.raises(RemoteError) as info:
            IndexClient().project(index.url, "alpha")
    message = one_line(info)
    assert message.startswith(f"index {index.url} answered a malformed page for alpha: ") and why in message
    assert "secret" not in message


# --- over HTTP: pages, downloads and metadata files cut short or refused ---------------------------


def test_a_page_cut_short_is_refused_and_the_index_is_not_written_off(dists: Path) -> None:
    with PyIndex(dists) as index:
        headers = {"Content-Type": JSON_TYPE, "Content-Length": "1000"}
        index.route("/simple/alpha/", Route(headers=headers, body=b'{"files": ['))  # then the connection closes
        client = IndexClient()
        with pytest.raises(RemoteError) as info:
            client.project(index.url, "alpha")
        assert client.project(index.url, "beta").files  # another page of the same index is still asked for
    assert one_line(info) == (
        f"index {index.url}: reading the page for alpha failed: the answer was cut short: 11 bytes read, "
        "989 more expected"
    )


def test_pages_read_ahead_are_parsed_when_asked_each_as_a_fetch_then_would_have_ended(tmp_path: Path) -> None:
    """:meth:`IndexClient.prefetch` reads pages and parses none: a page's answer, a failure to read it, a
    malformed body and a project the index does not know each reach :meth:`~IndexClient.project` as they
    would have, one request a page, none made again."""
    with PyIndex(wheels_at(tmp_path / "dists", "alpha", "beta", "gamma", "delta")) as index:
        headers = {"Content-Type": JSON_TYPE, "Content-Length": "1000"}
        index.route("/simple/beta/", Route(headers=headers, body=b'{"files": ['))  # cut short
        index.route("/simple/gamma/", Route(headers={"Content-Type": JSON_TYPE}, body=b'{"files": [7]}'))
        client = IndexClient()
        names = ("alpha", "beta", "gamma", "Alpha", "nothere", "delta")
        client.prefetch(((index.url, name) for name in names), jobs=3)
        asked = sorted(index.requests)
        assert asked == [f"/simple/{name}/" for name in ("alpha", "beta", "delta", "gamma", "nothere")]
        assert [f.filename for f in client.project(index.url, "alpha").files] == [WHEEL]
        with pytest.raises(RemoteError, match="reading the page for beta failed: the answer was cut short"):
            client.project(index.url, "beta")
        with pytest.raises(RemoteError, match=r"malformed page for gamma: files\[0\] lacks a filename"):
            client.project(index.url, "gamma")
        assert not client.project(index.url, "nothere").found
        client.prefetch([(index.url, "alpha"), (index.url, "delta")], jobs=2)  # read once already
        assert client.project(index.url, "delta").files and sorted(index.requests) == asked
        assert client.requests_made == 5


def test_a_page_is_parsed_without_the_cyclic_collector_and_leaves_it_as_it_was(
    dists: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    import envbuild.index.client as client_module

    seen: list[bool] = []
    real = client_module.parse_json

    def parse(*args: Any) -> Any:
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(client_module, "parse_json", parse)
    with PyIndex(dists) as index:
        client = IndexClient()
        assert gc.isenabled() and client.project(index.url, "alpha").files
        assert seen == [False] and gc.isenabled()
        gc.disable()  # a program that turned it off keeps it off
        try:
            assert client.project(index.url, "beta").files
            assert seen == [False, False] and not gc.isenabled()
        finally:
            gc.enable()


def test_a_download_answered_404_is_refused_and_nothing_is_cached(dists: Path, tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache")
    with PyIndex(dists) as index:
        client = IndexClient()
        wheel = listed(client, index.url)
        index.route(f"/files/{WHEEL}", Route(status=404))
        with pytest.raises(RemoteError) as info:
            cache.fetch(wheel.url, index.sha256(WHEEL), WHEEL, client.download)
    assert one_line(info) == f"{wheel.url}: HTTP 404"
    assert cache.get(index.sha256(WHEEL)) is None and cache.temporary_files() == []


def test_an_announced_metadata_file_that_is_not_there_leaves_the_wheel_unpinned(dists: Path) -> None:
    with PyIndex(dists, metadata=True) as index:
        client = IndexClient()
        wheel = listed(client, index.url)
        index.route(f"/files/{WHEEL}.metadata", Route(status=404))
        said: list[str] = []
        [pinned] = pin_files([wheel], client, index.url, {}, said.append)
    assert pinned == PackageFile(WHEEL, index.sha256(WHEEL), None)
    assert said == [f"warning: {WHEEL}: its METADATA is not pinned: {wheel.url}.metadata: HTTP 404"]


def test_a_metadata_file_past_the_limit_is_refused(dists: Path) -> None:
    with PyIndex(dists, metadata=True) as index:
        client = IndexClient()
        wheel = listed(client, index.url)
        route = index.route(f"/files/{WHEEL}.metadata", Route(body=b"x" * (MAX_METADATA + 1)))
        with pytest.raises(RemoteError) as info:
            client.core_metadata(wheel)
    assert one_line(info) == f"{wheel.url}.metadata: more than {MAX_METADATA} bytes; refused"
    assert route.sent <= MAX_METADATA + 1


def test_a_metadata_file_on_a_host_out_of_reach_says_so(dists: Path) -> None:
    gone = dead_port_url().removesuffix("/simple")
    with PyIndex(dists, metadata=True) as index:
        index.relink(WHEEL, f"{gone}/files/{WHEEL}")
        client = IndexClient(retries=1)
        wheel = listed(client, index.url)
        with pytest.raises(RemoteError) as info:
            client.core_metadata(wheel)
    assert one_line(info) == f"{gone}/files/{WHEEL}.metadata: connection refused"


# --- a file:// index ------------------------------------------------------------------------------


def test_a_file_index_of_html_pages_is_read_and_its_files_copied(dists: Path, tmp_path: Path) -> None:
    root = tmp_path / "simple"
    (root / "alpha").mkdir(parents=True)
    (root / "files").mkdir()
    shutil.copy(dists / WHEEL, root / "files" / WHEEL)
    sha = sha256_of((dists / WHEEL).read_bytes())
    (root / "alpha" / "index.html").write_text(f'<a href="../files/{WHEEL}#sha256={sha}">{WHEEL}</a>\n')
    client = IndexClient()
    wheel = listed(client, root.as_uri())
    out = io.BytesIO()
    client.download(wheel.url, out)
    assert (wheel.url, wheel.sha256) == ((root / "files" / WHEEL).as_uri(), sha)
    assert out.getvalue() == (dists / WHEEL).read_bytes()


def test_a_file_index_page_past_the_page_limit_is_refused(dists: Path, tmp_path: Path) -> None:
    url = write_file_index(tmp_path / "simple", dists)
    with pytest.raises(RemoteError) as info:
        IndexClient(max_page=64).project(url, "alpha")
    page = tmp_path / "simple" / "alpha" / "index.json"
    assert one_line(info) == f"index {url}: the page for alpha ({page}) is larger than 64 bytes; refused"


def test_a_file_index_page_that_cannot_be_read_is_named(dists: Path, tmp_path: Path) -> None:
    url = write_file_index(tmp_path / "simple", dists)
    (tmp_path / "simple" / "gamma").write_text("a file where a project's directory would be\n")
    with pytest.raises(RemoteError) as info:
        IndexClient().project(url, "gamma")
    page = tmp_path / "simple" / "gamma" / "index.json"
    assert one_line(info) == f"index {url}: cannot read {page}: Not a directory"


def spoil(root: Path, how: str) -> None:
    """Make the wheel a file:// index lists something that cannot be taken as it: larger than the size the
    page states, a FIFO, a directory, or gone."""
    target = root / "files" / WHEEL
    if how == "oversized":
        page = root / "alpha" / "index.json"
        data = json.loads(page.read_text())
        data["files"][0]["size"] = 100
        page.write_text(json.dumps(data))
        return
    target.unlink()
    if how == "fifo":
        os.mkfifo(target)
    elif how == "directory":
        target.mkdir()


def within(seconds: float, fifo: Path, call: Callable[[], Any]) -> Any:
    """``call()``'s result (or what it raised), failing the test if it is still running after ``seconds``:
    a read that waits on a FIFO for a writer is released by one, so the test ends either way."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo.is_fifo():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer comes and goes: the open returns
        thread.join(5)
        pytest.fail(f"still reading after {seconds} s: it waited on {fifo} for a writer", pytrace=False)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


FILE_INDEX_DOWNLOAD = {
    "oversized": "{url} passed the size the index states (100 bytes); refused",
    "fifo": "{url}: refusing to read it: not a regular file",
    "directory": "{url}: refusing to read it: not a regular file",
    "missing": "{url}: cannot read: No such file or directory",
}


@pytest.mark.parametrize("how", sorted(FILE_INDEX_DOWNLOAD))
def test_a_file_index_file_that_cannot_be_copied_is_refused_and_nothing_cached(
    dists: Path, tmp_path: Path, how: str
) -> None:
    url = write_file_index(tmp_path / "simple", dists)
    spoil(tmp_path / "simple", how)
    client = IndexClient()
    wheel = listed(client, url)
    cache = FileCache(tmp_path / "cache")
    sha = sha256_of((dists / WHEEL).read_bytes())
    with pytest.raises(RemoteError) as info:
        within(10, tmp_path / "simple" / "files" / WHEEL, lambda: cache.fetch(wheel.url, sha, WHEEL, client.download))
    assert one_line(info) == FILE_INDEX_DOWNLOAD[how].format(url=wheel.url)
    assert cache.get(sha) is None and cache.temporary_files() == []


@pytest.mark.parametrize(
    ("how", "why"),
    [("fifo", "not a regular file (a FIFO)"), ("directory", "not a regular file (a directory)"), ("missing", None)],
)
def test_the_metadata_of_a_file_index_wheel_that_cannot_be_read_is_unknown_and_never_waited_on(
    dists: Path, tmp_path: Path, how: str, why: str | None
) -> None:
    """`lock verify` reads a wheel's METADATA from a file:// index in place: a FIFO there used to block the
    run for ever, waiting for a writer (a plain open()); now it is refused, as a download refuses it."""
    url = write_file_index(tmp_path / "simple", dists)
    sha = sha256_of((dists / WHEEL).read_bytes())
    spoil(tmp_path / "simple", how)
    lock = lock_of(url, Package("alpha", "1.0", (PackageFile(WHEEL, sha),)))
    reader = MetadataReader(tmp_path / "cache", IndexClient())
    found = within(10, tmp_path / "simple" / "files" / WHEEL, lambda: read_metadata(lock, reader))
    file_url = (tmp_path / "simple" / "files" / WHEEL).as_uri()
    assert found["alpha"].requires is None
    assert found["alpha"].detail == f"{WHEEL}: {file_url}: cannot read: {why or 'No such file or directory'}"


# --- the file cache on a filesystem that refuses writes -----------------------------------------------


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    with mounted_tmpfs(tmp_path / "mnt", 1 * MiB, inodes=64) as mounted:
        yield mounted


DATA = b"a package file\n"
SHA = sha256_of(DATA)


def recording(calls: list[str]) -> Callable[[str, Any], None]:
    def download(url: str, out: Any) -> None:
        calls.append(url)
        out.write(DATA)

    return download


def test_a_cache_on_a_read_only_filesystem_is_refused_before_any_download(tmpfs: Tmpfs) -> None:
    tmpfs.remount("ro")
    cache = FileCache(tmpfs.path / "cache")
    calls: list[str] = []
    with pytest.raises(CacheError) as info:
        cache.fetch("https://files.example/a-1.0.tar.gz", SHA, "a-1.0.tar.gz", recording(calls))
    assert one_line(info) == f"{cache.dir}: cannot write to the cache: Read-only file system"
    assert calls == [] and not (tmpfs.path / "cache").exists()


def test_a_cache_out_of_inodes_is_said_as_no_space_and_leaves_nothing(tmpfs: Tmpfs) -> None:
    """The lock file is there (a run before made it), but no file can be made for the download itself."""
    cache = FileCache(tmpfs.path / "cache")
    cache.dir.mkdir(parents=True)
    (cache.dir / f".lock-{SHA}").touch()
    fillers = []
    while True:
        try:
            (filler := tmpfs.path / f"filler-{len(fillers)}").touch()
        except OSError:
            break
        fillers.append(filler)
    calls: list[str] = []
    with pytest.raises(CacheError) as info:
        cache.fetch("https://files.example/a-1.0.tar.gz", SHA, "a-1.0.tar.gz", recording(calls))
    assert one_line(info) == f"no space left in the cache ({cache.dir})"
    assert calls == [] and sorted(p.name for p in cache.dir.iterdir()) == [f".lock-{SHA}"]
    for filler in fillers:
        filler.unlink()
    assert cache.fetch("https://files.example/a-1.0.tar.gz", SHA, "a-1.0.tar.gz", recording(calls)).read_bytes() == DATA


# --- the metadata reader: offline, a file the index dropped, sdists in every broken shape ------------


def test_offline_an_sdist_in_the_file_cache_is_read_and_one_not_there_is_unknown(tmp_path: Path) -> None:
    root = tmp_path / "dists"
    root.mkdir()
    make_sdist(root, "fetched", "1.0", metadata_version="2.2", requires=["six>=1"])
    make_sdist(root, "elsewhere", "1.0", metadata_version="2.2", requires=["six>=1"])
    with PyIndex(root) as index:
        client = IndexClient()
        sdists = {n: PackageFile(f"{n}-1.0.tar.gz", index.sha256(f"{n}-1.0.tar.gz")) for n in ("fetched", "elsewhere")}
        lock = lock_of(index.url, *(Package(n, "1.0", (f,)) for n, f in sdists.items()))
        fetched = listed(client, index.url, "fetched", sdists["fetched"].filename)
        # What `lock fetch` leaves: the sdist in the file cache, nothing read from it yet.
        FileCache(tmp_path / "cache").fetch(fetched.url, sdists["fetched"].sha256, fetched.filename, client.download)
        index.requests.clear()
        found = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient(), offline=True))
        assert index.requests == []
    assert found["fetched"].requires == ("six>=1",)
    assert found["elsewhere"].requires is None
    assert found["elsewhere"].detail == "elsewhere-1.0.tar.gz: offline, and the sdist is not in the file cache"


def test_a_file_the_index_no_longer_lists_is_unknown_naming_the_index(dists: Path, tmp_path: Path) -> None:
    with PyIndex(dists) as index:
        lock = lock_of(index.url, Package("alpha", "1.0", (PackageFile(WHEEL, index.sha256(WHEEL)),)))
        index.hide(WHEEL)
        found = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient()))
    assert (found["alpha"].requires, found["alpha"].detail) == (None, f"{WHEEL}: {index.url} no longer lists it")


def tar_sdist(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def zip_sdist(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    return path


def pkg_info(version: str = "1.0", metadata: str = "2.2", *extra: str) -> bytes:
    return f"Metadata-Version: {metadata}\nName: alpha\nVersion: {version}\n{''.join(extra)}".encode()


def test_an_sdist_without_pkg_info_is_unknown_and_nothing_is_kept_for_it(tmp_path: Path) -> None:
    root = tmp_path / "dists"
    root.mkdir()
    tar_sdist(root / "alpha-1.0.tar.gz", {"alpha-1.0/setup.py": b"from setuptools import setup; setup()\n"})
    with PyIndex(root) as index:
        lock = lock_of(
            index.url, Package("alpha", "1.0", (PackageFile("alpha-1.0.tar.gz", index.sha256("alpha-1.0.tar.gz")),))
        )
        found = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient()))
    assert (found["alpha"].requires, found["alpha"].detail) == (None, "alpha-1.0.tar.gz: the sdist has no PKG-INFO")
    assert not (tmp_path / "cache" / "metadata" / "sdist").exists()  # a refusal is read again, not remembered


@pytest.mark.parametrize(
    ("filename", "members", "requires"),
    [
        # Metadata-Version that is no version: read as 1.0, so setuptools' requires.txt settles it.
        (
            "alpha-1.0.tar.gz",
            {"alpha-1.0/PKG-INFO": pkg_info("1.0", "two"), "alpha-1.0/alpha.egg-info/requires.txt": b"six\n"},
            ["six"],
        ),
        # An old sdist as a zip.
        ("alpha-1.0.zip", {"alpha-1.0/PKG-INFO": pkg_info("1.0", "2.2", "Requires-Dist: six>=1\n")}, ["six>=1"]),
    ],
    ids=["metadata-version-not-a-version", "zip"],
)
def test_sdist_requirements_read(tmp_path: Path, filename: str, members: dict[str, bytes], requires: list[str]) -> None:
    make = zip_sdist if filename.endswith(".zip") else tar_sdist
    path = make(tmp_path / filename, members)
    assert sdist_requirements(path, Package("alpha", "1.0"), filename) == requires


REFUSED = {
    "no-version-in-name": (
        "alpha.tar.gz",
        {"alpha-1.0/PKG-INFO": pkg_info()},
        "Invalid sdist filename: 'alpha.tar.gz'",
    ),
    "undecodable-requires-dist": (
        "alpha-1.0.tar.gz",
        {"alpha-1.0/PKG-INFO": pkg_info() + b"Requires-Dist: caf\xe9\n"},
        "Requires-Dist 'caf\xe9' cannot be read",
    ),
    "metadata-version-not-a-version": (
        "alpha-1.0.tar.gz",
        {"alpha-1.0/PKG-INFO": pkg_info("1.0", "two", "Requires-Dist: six\n")},
        "PKG-INFO (metadata two) does not settle its requirements and it has no *.egg-info: they are decided when "
        "it is built",
    ),
    "pkg-info-too-large": (
        "alpha-1.0.tar.gz",
        {"alpha-1.0/PKG-INFO": pkg_info() + b"Description: " + b"x" * MAX_METADATA + b"\n"},
        f"a metadata member of {len(pkg_info()) + MAX_METADATA + 14} bytes; refused",
    ),
    "version-not-a-version": (
        "alpha-1.0.tar.gz",
        {"alpha-1.0/PKG-INFO": pkg_info("one")},
        "its metadata is for alpha one, not alpha 1.0",
    ),
    "requires-txt-not-pep508": (
        "alpha-1.0.tar.gz",
        {
            "alpha-1.0/PKG-INFO": pkg_info("1.0", "2.1"),
            "alpha-1.0/alpha.egg-info/requires.txt": b"six\n[gpu]\ntorch >>> 2\n",
        },
        "requires.txt: 'torch >>> 2' is not a requirement: Expected semicolon (after name with no version "
        "specifier) or end",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_an_sdist_whose_metadata_cannot_be_believed_says_why(tmp_path: Path, case: str) -> None:
    filename, members, why = REFUSED[case]
    path = tar_sdist(tmp_path / filename, members)
    with pytest.raises(MetadataError) as info:
        sdist_requirements(path, Package("alpha", "1.0"), filename)
    assert str(info.value).split("\n")[0] == why


def test_an_sdist_that_is_no_archive_is_not_readable(tmp_path: Path) -> None:
    path = tmp_path / "alpha-1.0.tar.gz"
    path.write_bytes(b"\x1f\x8b but not gzip after all")
    with pytest.raises(MetadataError) as info:
        sdist_requirements(path, Package("alpha", "1.0"), path.name)
    assert str(info.value).startswith("not a readable sdist: file could not be opened successfully")


def test_a_zip_sdist_whose_metadata_comes_after_too_many_members_is_refused(tmp_path: Path) -> None:
    members = {f"alpha-1.0/empty/{i}": b"" for i in range(20)} | {"alpha-1.0/PKG-INFO": pkg_info()}
    path = zip_sdist(tmp_path / "alpha-1.0.zip", members)
    with pytest.raises(MetadataError) as info:
        _sdist_members(path, path.name, max_members=10)
    assert str(info.value) == "more than 10 members without its metadata settling its requirements; refused"


def test_a_zip_sdist_claiming_a_huge_central_directory_is_refused_unread(tmp_path: Path) -> None:
    path = zip_sdist(tmp_path / "alpha-1.0.zip", {"alpha-1.0/PKG-INFO": pkg_info()})
    claim = 65 << 20
    with open(path, "ab") as handle:
        handle.truncate(path.stat().st_size + claim)  # sparse: as large as its claim, so the read is not short
        at = handle.seek(0, 2)
        # zip64 end record, locator and classic end record: a central directory of `claim` bytes before them
        handle.write(struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, claim, at - claim))
        handle.write(struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1))
        handle.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))
    with pytest.raises(MetadataError) as info:
        sdist_requirements(path, Package("alpha", "1.0"), path.name)
    assert str(info.value) == (
        f"the archive asks for {claim} bytes in one read (its central directory as its end record states it), "
        f"more than the {64 << 20} reading its metadata may take; refused"
    )


# --- the resolver: uv's output, a uv that does not finish, what the indexes list after it ------------


def test_a_line_of_uv_output_that_is_no_requirement_is_refused_quoting_it() -> None:
    with pytest.raises(ResolutionError) as info:
        parse_pins("six==1.0\nthis is not ==\n")
    assert str(info.value).split("\n")[0] == (
        "cannot read uv's output line 'this is not ==': Expected semicolon (after name with no version specifier) or end"
    )


def test_uv_that_does_not_finish_is_stopped_at_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index that answers a byte at a time keeps uv waiting under its own read timeout; the run is cut."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setattr(resolve, "UV_TIMEOUT", 1)
    with Trickle(b"HTTP/1.1 200 OK\r\n" + b"X-Slow: y\r\n" * 1000) as server:
        lock = Lock(
            version=2, name="slow", sources=(), platform=ARM, index=f"{server.url}/simple", requirements=("six",)
        )
        start = time.monotonic()
        with pytest.raises(ResolutionError) as info:
            resolve_packages(lock)
        took = time.monotonic() - start
    assert str(info.value) == f"uv pip compile against {server.url}/simple did not finish in 1 s"
    assert took < 10, took


@pytest.fixture()
def indexes(tmp_path: Path) -> tuple[Path, Path]:
    """The lock's index (app requires special; special 4.0) and special's own index (3.2.2)."""
    main, own = tmp_path / "main", tmp_path / "own"
    main.mkdir()
    own.mkdir()
    make_wheel(main, "app", "1.0", requires=["special"])
    make_wheel(main, "special", "4.0")
    make_wheel(main, "pure", "0.5")
    make_wheel(own, "special", "3.2.2")
    return main, own


def test_uv_wanting_another_version_of_a_package_kept_on_its_own_index_is_said(
    indexes: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    with PyIndex(indexes[0]) as main, PyIndex(indexes[1]) as own:
        kept = Package("special", "3.2.2", index=own.url)
        lock = Lock(
            version=2, name="r", sources=(), platform=ARM, index=main.url, requirements=("app==1.0",), packages=(kept,)
        )
        said: list[str] = []
        packages = resolve_packages(lock, progress=said.append)
    assert f"warning: uv wants special==4.0, the lock keeps special==3.2.2 from {own.url}" in said
    assert [(p.name, p.version, p.index, [f.filename for f in p.files]) for p in packages] == [
        ("app", "1.0", None, ["app-1.0-py3-none-any.whl"]),
        ("special", "3.2.2", own.url, ["special-3.2.2-py3-none-any.whl"]),  # relisted from its own index
    ]


def test_a_version_whose_files_carry_no_sha256_is_locked_without_files_and_said(
    indexes: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel is installable; what is missing is a sha256 to lock it by (the warning said 'installable')."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    with PyIndex(indexes[0]) as index:
        page = '<a href="/files/pure-0.5-py3-none-any.whl">pure-0.5-py3-none-any.whl</a>'  # no #sha256=
        index.answer("pure", page.encode(), content_type="text/html")
        lock = Lock(version=2, name="r", sources=(), platform=ARM, index=index.url, requirements=("pure",))
        said: list[str] = []
        packages = resolve_packages(lock, progress=said.append)
    assert packages == (Package("pure", "0.5"),)
    assert said[-1] == (
        f"warning: {index.url} lists no file of pure 0.5 installable on aarch64-manylinux_2_28 with a sha256 to "
        "lock it by"
    )


@pytest.mark.parametrize("how", ["other-platform", "no-sha256"])
def test_a_package_whose_own_index_lists_nothing_to_lock_is_kept_as_locked(tmp_path: Path, how: str) -> None:
    own = tmp_path / "own"
    own.mkdir()
    wheel = make_wheel(
        own, "special", "3.2.2", tag="cp312-cp312-manylinux_2_28_x86_64" if how == "other-platform" else "py3-none-any"
    )
    with PyIndex(own) as index:
        if how == "no-sha256":
            index.answer(
                "special", f'<a href="/files/{wheel.name}">{wheel.name}</a>'.encode(), content_type="text/html"
            )
        kept = Package("special", "3.2.2", (PackageFile("special-3.2.2-py3-none-any.whl", "e" * 64),), index=index.url)
        said: list[str] = []
        packages = resolve_packages(
            Lock(version=2, name="r", sources=(), platform=ARM, packages=(kept,)), progress=said.append
        )
    assert packages == (kept,)
    assert said == [
        f"warning: keeping special 3.2.2 as locked: {index.url} lists no installable file of it with a sha256 to lock it by"
    ]


def test_a_page_refused_after_uv_resolved_is_one_error_without_the_credentials(
    indexes: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uv takes a file URL with a user part (and sends it); envbuild refuses the page that lists it."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    with PyIndex(indexes[0]) as index:
        host = index.url.removeprefix("http://").removesuffix("/simple")
        index.relink("pure-0.5-py3-none-any.whl", f"http://user:s3cret@{host}/files/pure-0.5-py3-none-any.whl")
        lock = Lock(version=2, name="r", sources=(), platform=ARM, index=index.url, requirements=("pure",))
        with pytest.raises(RemoteError) as info:
            resolve_packages(lock)
    assert one_line(info) == (
        f"cannot list files after resolving: index {index.url} answered a malformed page for pure: files[0]: url "
        f"'http://***@{host}/files/pure-0.5-py3-none-any.whl' carries credentials in its user part; envbuild sends "
        "none it is handed by a page (give the file host's in ~/.netrc)"
    )
    assert "s3cret" not in str(info.value)
