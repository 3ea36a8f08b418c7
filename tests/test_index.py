"""envbuild.index.client against a real local index (HTTP JSON, HTTP HTML, file://) and a dead port."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import requests
from urllib3.exceptions import MaxRetryError, NameResolutionError, NewConnectionError

from envbuild.errors import RemoteError
from envbuild.index.client import IndexClient
from envbuild.index.http import retrying
from tests.lib.pyindex import PyIndex, dead_port_url, make_sdist, make_wheel, write_file_index


@pytest.fixture()
def dists(tmp_path: Path) -> Path:
    root = tmp_path / "dists"
    root.mkdir()
    make_wheel(root, "alpha", "1.0")
    make_sdist(root, "alpha", "1.0")
    make_wheel(root, "beta", "2.0", tag="cp312-cp312-manylinux_2_28_aarch64")
    return root


@pytest.mark.parametrize("html_only", [False, True], ids=["json", "html"])
def test_lists_files_with_sha256_and_yanked(dists: Path, html_only: bool) -> None:
    with PyIndex(dists, html_only=html_only) as index:
        index.yank("alpha-1.0.tar.gz", "broken metadata")
        page = IndexClient().project(index.url, "Alpha")
    assert page.found
    assert sorted(f.filename for f in page.files) == ["alpha-1.0-py3-none-any.whl", "alpha-1.0.tar.gz"]
    wheel = page.file("alpha-1.0-py3-none-any.whl")
    assert wheel is not None and wheel.sha256 == index.sha256(wheel.filename) and not wheel.yanked
    assert wheel.url.startswith("http://127.0.0.1:") and wheel.url.endswith("/files/alpha-1.0-py3-none-any.whl")
    sdist = page.file("alpha-1.0.tar.gz")
    assert sdist is not None and sdist.yanked and sdist.yanked_reason == "broken metadata"


def test_one_request_per_project_even_from_many_threads(dists: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with PyIndex(dists) as index:
        client = IndexClient()
        with ThreadPoolExecutor(8) as pool:
            pages = list(pool.map(lambda _: client.project(index.url, "beta"), range(16)))
    assert len({id(p) for p in pages}) == 1
    assert index.requests == ["/simple/beta/"]


def test_unknown_project_is_not_found(dists: Path) -> None:
    with PyIndex(dists) as index:
        page = IndexClient().project(index.url, "gamma")
    assert not page.found and page.files == ()


def test_file_index(dists: Path, tmp_path: Path) -> None:
    url = write_file_index(tmp_path / "simple", dists)
    client = IndexClient()
    page = client.project(url, "beta")
    assert [f.filename for f in page.files] == ["beta-2.0-cp312-cp312-manylinux_2_28_aarch64.whl"]
    assert not client.project(url, "nothing-here").found
    with pytest.raises(RemoteError, match="out of reach: no such directory"):
        IndexClient().project((tmp_path / "absent").as_uri(), "beta")


@pytest.mark.parametrize(
    ("body", "ctype", "why"),
    [
        (b"{not json", "application/vnd.pypi.simple.v1+json", "malformed page for alpha: not JSON"),
        (b'{"meta": {}, "name": "alpha"}', "application/vnd.pypi.simple.v1+json", "no 'files' list"),
        (b'{"files": [{"filename": 3}]}', "application/vnd.pypi.simple.v1+json", r"files\[0\] lacks"),
        (b"%PDF", "application/pdf", "unexpected content type 'application/pdf'"),
    ],
)
def test_malformed_answer_is_a_clear_remote_error(dists: Path, body: bytes, ctype: str, why: str) -> None:
    with PyIndex(dists) as index:
        index.answer("alpha", body, content_type=ctype)
        with pytest.raises(RemoteError, match=why) as info:
            IndexClient().project(index.url, "alpha")
    assert index.url in str(info.value)


def test_server_errors_are_retried_then_reported(dists: Path) -> None:
    with PyIndex(dists) as index:
        index.answer("alpha", b"oops", status=503, content_type="text/plain")
        with pytest.raises(RemoteError, match=r"out of reach: HTTP 503 \(while fetching alpha\)"):
            IndexClient(retries=2).project(index.url, "alpha")
    assert index.requests == ["/simple/alpha/", "/simple/alpha/"]


def test_client_errors_name_the_status(dists: Path) -> None:
    with PyIndex(dists) as index:
        index.answer("alpha", b"no", status=403, content_type="text/plain")
        with pytest.raises(RemoteError, match="answered HTTP 403 for alpha"):
            IndexClient().project(index.url, "alpha")


def test_connection_refused_names_index_and_reason() -> None:
    url = dead_port_url()
    client = IndexClient(retries=2)
    with pytest.raises(RemoteError) as info:
        client.project(url, "alpha")
    assert str(info.value) == f"index {url} out of reach: connection refused (while fetching alpha)"
    before = client.requests_made
    with pytest.raises(RemoteError, match="connection refused"):
        client.project(url, "beta")
    assert client.requests_made == before  # a dead index is not asked again in the same run


def test_a_download_whose_connection_is_lost_before_the_first_byte_is_tried_again(dists: Path) -> None:
    """A file host that drops the connection before answering (``RemoteDisconnected``, seen from the
    tests' own index under load) costs one more request, not the download."""
    with PyIndex(dists) as index:
        client = IndexClient()
        listed = client.project(index.url, "alpha").files[0]
        path = "/files/" + listed.filename
        index.drop(path)
        out = io.BytesIO()
        client.download(listed.url, out)
    assert out.getvalue() == (dists / listed.filename).read_bytes()
    assert index.requests.count(path) == 2


def test_a_page_whose_connection_is_lost_is_tried_again_up_to_the_limit(dists: Path) -> None:
    with PyIndex(dists) as index:
        index.drop("/simple/alpha/", times=5)
        with pytest.raises(RemoteError, match=r"out of reach: .*\(while fetching alpha\)"):
            IndexClient(retries=3).project(index.url, "alpha")
    assert index.requests == ["/simple/alpha/"] * 3


def test_a_host_name_that_does_not_resolve_is_not_asked_again() -> None:
    """The one failure retrying cannot mend: refused at once, where a refused connection is retried."""
    retry = retrying(requests.Session(), retries=3).get_adapter("https://x/").max_retries  # type: ignore[attr-defined]
    refused = NewConnectionError(None, "connection refused")  # type: ignore[arg-type]
    assert retry.increment("GET", "/simple/alpha/", error=refused).total == 1
    with pytest.raises(MaxRetryError):
        retry.increment("GET", "/simple/alpha/", error=NameResolutionError("nowhere.example", None, "no such host"))  # type: ignore[arg-type]
