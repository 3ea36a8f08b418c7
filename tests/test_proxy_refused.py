"""A proxy the environment names (``$HTTP_PROXY``) that does not answer: the index's and the registry's one
line say it is the proxy, name it without its user part, and say where it comes from, instead of
"connection refused", which sent the user to a host that was never asked. Real servers on loopback: the
index and the registry answer; only the proxy's port is dead."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.errors import RemoteError
from envbuild.index.client import IndexClient
from envbuild.registry.client import RegistryError, served_manifest
from tests.lib.pyindex import PyIndex, dead_port_url, one_line, wheels_at
from tests.test_registry_gaps import Registry

ADVICE = "it comes from $HTTPS_PROXY/$HTTP_PROXY, and $NO_PROXY names hosts reached directly"


@pytest.fixture()
def dead_proxy(monkeypatch: pytest.MonkeyPatch) -> str:
    """``$HTTP_PROXY`` set to a loopback port with nothing listening, with credentials in it; nothing bypassed."""
    port = dead_port_url().split(":")[2].split("/")[0]
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://me:s3cret@127.0.0.1:{port}")
    return f"http://***@127.0.0.1:{port}"


def test_an_index_behind_a_proxy_that_refuses_names_the_proxy(tmp_path: Path, dead_proxy: str) -> None:
    with PyIndex(wheels_at(tmp_path / "dists", "alpha")) as index, pytest.raises(RemoteError) as info:
        IndexClient(retries=1).project(index.url, "alpha")
    assert one_line(info) == (
        f"index {index.url} out of reach: the proxy {dead_proxy} failed the request (connection refused); "
        f"{ADVICE} (while fetching alpha)"
    )
    assert "s3cret" not in one_line(info)


def test_a_registry_behind_a_proxy_that_refuses_names_the_proxy(tmp_path: Path, dead_proxy: str) -> None:
    with Registry() as registry:
        registry.serve_image()
        with pytest.raises(RegistryError) as info:
            served_manifest(registry.reference, docker_config=tmp_path / "none.json")
    assert str(info.value) == (
        f"{registry.reference}: cannot reach {registry.host}: the proxy {dead_proxy} failed the request "
        f"(connection refused); {ADVICE}"
    )
