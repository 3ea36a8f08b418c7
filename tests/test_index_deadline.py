"""Deadlines on every request to an index: a server that trickles bytes (each read under the read
timeout, the request never ending) is cut at the request's deadline, in the headers as in the body,
for a page, a metadata file, a range read and, by its minimum rate, a download; it is reported as
that request's failure in one line, and the rest of a run goes on. Retries after a connection lost
before the first byte cover range reads as they cover pages and downloads."""

from __future__ import annotations

import io
import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.deadline import deadline_from_env, min_rate_from_env
from envbuild.errors import InputError, RemoteError
from envbuild.index.client import IndexClient
from envbuild.verify.metadata import read_wheel_metadata
from tests.lib.httpproxy import Tinyproxy
from tests.lib.pyindex import JSON_TYPE, PyIndex, Route, Trickle, trickled, wheels_at

WHEEL = "alpha-1.0-py3-none-any.whl"


@pytest.fixture()
def dists(tmp_path: Path) -> Path:
    return wheels_at(tmp_path / "dists", "alpha", "beta")


def page_answer(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {JSON_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def test_a_page_whose_headers_trickle_is_cut_at_the_deadline() -> None:
    with Trickle(page_answer(b'{"meta": {"api-version": "1.0"}, "name": "alpha", "files": []}')) as server:
        start = time.monotonic()
        with pytest.raises(RemoteError) as info:
            IndexClient(deadline=1.0).project(server.url, "alpha")
        took = time.monotonic() - start
    assert str(info.value) == (
        f"index {server.url}: the page for alpha: no complete answer within the deadline of 1 s "
        "($ENVBUILD_INDEX_DEADLINE)"
    )
    assert took < 5, took  # not one read timeout per byte
    assert server.served < 60


def test_a_page_whose_body_trickles_is_cut_and_not_read_as_a_short_page(dists: Path) -> None:
    with PyIndex(dists) as index:
        # No Content-Length: a body cut short would otherwise look complete.
        index.route("/simple/alpha/", Route(headers={"Content-Type": JSON_TYPE}, body=trickled(b" ")))
        client = IndexClient(deadline=1.0)
        with pytest.raises(RemoteError, match=r"the page for alpha: no complete answer within the deadline of 1 s"):
            client.project(index.url, "alpha")
        assert client.project(index.url, "beta").files  # the index is not written off for one slow page


def test_a_trickled_metadata_file_is_cut_at_the_deadline(dists: Path) -> None:
    with PyIndex(dists, metadata=True) as index:
        client = IndexClient(deadline=1.0)
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        index.route(f"/files/{WHEEL}.metadata", Route(body=trickled(b"x")))
        with pytest.raises(RemoteError, match=r"\.metadata: no complete answer within the deadline of 1 s"):
            client.core_metadata(listed)


def test_a_trickled_range_read_is_cut_at_the_deadline(dists: Path) -> None:
    with PyIndex(dists) as index:
        client = IndexClient(deadline=1.0)
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        route = Route(status=206, headers={"Content-Range": "bytes 0-99/100"}, body=trickled(b"x", count=100))
        index.route(f"/files/{WHEEL}", route)
        with pytest.raises(RemoteError) as info:
            client.open_ranges(listed.url)
    assert str(info.value) == (
        f"{listed.url}: a range request: no complete answer within the deadline of 1 s ($ENVBUILD_INDEX_DEADLINE)"
    )


@pytest.mark.parametrize("via", ["direct", "proxy"])
def test_a_download_slower_than_the_minimum_rate_is_cut(dists: Path, via: str, request: pytest.FixtureRequest) -> None:
    """Directly, and through a real HTTP proxy (the fixture below), which requests reaches through other
    connection pools: those are cut too (they were not, and the download went on at a trickle)."""
    proxy: Tinyproxy | None = request.getfixturevalue("proxy") if via == "proxy" else None
    with PyIndex(dists) as index:
        client = IndexClient(min_rate=10_000, grace=0.5)
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        index.route(f"/files/{WHEEL}", Route(body=trickled(b"x" * 100)))
        start = time.monotonic()
        with pytest.raises(RemoteError) as info:
            client.download(listed.url, io.BytesIO())
        took = time.monotonic() - start
    assert str(info.value).startswith(f"{listed.url}: download: arriving at ")
    assert str(info.value).endswith("slower than the minimum of 10000 bytes/s ($ENVBUILD_MIN_RATE)")
    assert took < 5, took
    assert proxy is None or f"GET {listed.url} " in proxy.log()


def test_a_range_read_whose_connection_is_lost_before_the_first_byte_is_tried_again(dists: Path) -> None:
    with PyIndex(dists) as index:
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        index.drop(f"/files/{WHEEL}")
        metadata = read_wheel_metadata(client.open_ranges(listed.url), WHEEL)
    assert b"Name: alpha" in metadata
    assert index.requests.count(f"/files/{WHEEL}") >= 2


@pytest.mark.parametrize("name", ["ENVBUILD_INDEX_DEADLINE", "ENVBUILD_MIN_RATE"])
@pytest.mark.parametrize("text", ["0", "-1", "soon", "inf", "nan"])
def test_the_bounds_from_the_environment_must_be_positive(
    monkeypatch: pytest.MonkeyPatch, name: str, text: str
) -> None:
    monkeypatch.setenv(name, text)
    read = deadline_from_env if name == "ENVBUILD_INDEX_DEADLINE" else min_rate_from_env
    with pytest.raises(InputError) as info:
        read()
    assert str(info.value) == f"${name}: expected a positive number, got {text!r}"


def test_lock_verify_reports_the_slow_package_unreachable_and_checks_the_rest(
    dists: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ENVBUILD_INDEX_DEADLINE", "1")
    with PyIndex(dists) as index:
        index.route("/simple/alpha/", Route(headers={"Content-Type": JSON_TYPE}, body=trickled(b" ")))
        lock = tmp_path / "slow.lock.yaml"
        lock.write_text(
            textwrap.dedent(f"""\
                version: 1
                name: slow
                index: {index.url}
                sources: []
                packages:
                  - {{name: alpha, version: "1.0", files: [{{filename: {WHEEL}, sha256: "{index.sha256(WHEEL)}"}}]}}
                  - {{name: beta, version: "1.0", files: [{{filename: beta-1.0-py3-none-any.whl, sha256: "{index.sha256("beta-1.0-py3-none-any.whl")}"}}]}}
                """)
        )
        start = time.monotonic()
        code = main(["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "--json"])
        took = time.monotonic() - start
    out, _ = capsys.readouterr()
    assert code == 1
    results = {r["name"]: r for r in json.loads(out)["results"] if r["kind"] == "package"}
    assert results["alpha"]["status"] == "unreachable"
    assert results["alpha"]["detail"] == (
        f"index {index.url}: the page for alpha: no complete answer within the deadline of 1 s ($ENVBUILD_INDEX_DEADLINE)"
    )
    assert results["beta"]["status"] == "ok"
    assert took < 30, took


# --- through an HTTP proxy ----------------------------------------------------------------------


@pytest.fixture()
def proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tinyproxy]:
    """A real proxy (tinyproxy) in the environment, as a user behind one sets it; nothing bypasses it."""
    with Tinyproxy(tmp_path / "proxy") as running:
        for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
            monkeypatch.setenv(name, running.url)
        for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.delenv(name, raising=False)
        yield running


def test_a_page_trickled_through_a_proxy_is_cut_at_the_deadline(dists: Path, proxy: Tinyproxy) -> None:
    """requests reaches a proxied index through other connection pools than a direct one: the deadline
    must cut those too (it did not: the request went on for as long as the server trickled)."""
    with PyIndex(dists) as index:
        index.route("/simple/alpha/", Route(headers={"Content-Type": JSON_TYPE}, body=trickled(b" ", interval=0.05)))
        client = IndexClient(deadline=1.0)
        start = time.monotonic()
        with pytest.raises(RemoteError, match=r"the page for alpha: no complete answer within the deadline of 1 s"):
            client.project(index.url, "alpha")
        assert time.monotonic() - start < 10
        assert client.project(index.url, "beta").files  # through the proxy too
    assert f"GET {index.url}/alpha/ " in proxy.log() and f"GET {index.url}/beta/ " in proxy.log(), proxy.log()
