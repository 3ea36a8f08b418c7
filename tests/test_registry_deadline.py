"""A registry that trickles its answer (each read under the socket timeout, the answer never ending) is
cut at the request's deadline, directly and through a real HTTP proxy, and `lock update` keeps the
recorded base pin with a warning naming the deadline, as for any registry that does not answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.lock.model import BaseImage
from envbuild.registry.client import RegistryError, served_manifest
from envbuild.update.update import pin_base_image
from tests.lib.httpproxy import Tinyproxy
from tests.lib.pyindex import Trickle

MANIFEST = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.index.v1+json\r\n"
    + f"Content-Length: {len(MANIFEST)}\r\n\r\n".encode()
    + MANIFEST
)


@pytest.fixture()
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVBUILD_INDEX_DEADLINE", "1")


@pytest.fixture(params=["direct", "proxy"])
def route(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Tinyproxy | None]:
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    if request.param == "direct":
        yield None
        return
    with Tinyproxy(tmp_path / "proxy") as proxy:
        monkeypatch.setenv("http_proxy", proxy.url)
        yield proxy


def test_a_trickling_registry_is_cut_at_the_deadline(short_deadline: None, route: Tinyproxy | None) -> None:
    with Trickle(ANSWER) as server:
        reference = f"{server.url.removeprefix('http://')}/base:1"
        start = time.monotonic()
        with pytest.raises(RegistryError) as info:
            served_manifest(reference)
        took = time.monotonic() - start
    assert str(info.value) == (
        f"{reference}: {server.url.removeprefix('http://')} /manifests/1: no complete answer within the "
        "deadline of 1 s ($ENVBUILD_INDEX_DEADLINE)"
    )
    assert took < 5, took
    assert server.served < len(ANSWER)  # cut, not read to its end
    assert route is None or f"GET {server.url}/v2/base/manifests/1 " in route.log()


def test_update_keeps_the_recorded_pin_and_says_why(short_deadline: None) -> None:
    said: list[str] = []
    with Trickle(ANSWER) as server:
        image = BaseImage(name=f"{server.url.removeprefix('http://')}/base:1", digest="sha256:" + "a" * 64)
        assert pin_base_image(image, "x86_64", said.append) == image
    assert said == [
        f"warning: base image {image.name} not re-pinned: {image.name}: "
        f"{server.url.removeprefix('http://')} /manifests/1: no complete answer within the deadline "
        "of 1 s ($ENVBUILD_INDEX_DEADLINE)"
    ]
