"""Pytest plugin for tests that need the real services ``scripts/services`` starts.

Listed in ``tests/conftest.py`` as ``pytest_plugins = ["tests.services"]``. It gives:

- ``docker_client``: a docker SDK client for the engine at ``DOCKER_HOST`` (``version="auto"``);
- ``registry``: ``"host:port"`` of the local registry (``ENVBUILD_TEST_REGISTRY``), checked with
  ``GET /v2/``;
- ``base_image``: the cached test base image (``tests.baseimage.BaseImage``: ``tag``, ``image_id``,
  ``cann_version``, ``cann_home``), built on first use;
- ``pushed_base_image``: that image pushed once per session to the local registry
  (``PushedImage``: ``repository``, ``tag``, ``digest``, ``by_digest`` = ``"repo@sha256:..."``), for
  tests that need a base image pinned by digest. Needs both markers, ``docker`` and ``registry``.

Tests that use them carry the matching marker, ``docker`` or ``registry``. When a service is missing,
such a test FAILS if ``CI`` is set (a missing service in CI is a broken CI, never a skip) and is skipped
with the reason otherwise. A test that uses one of these fixtures without its marker fails: the marker
is what lets ``-m "not docker"`` deselect it.

The engine runs with ``--bridge=none``: containers need ``network_mode="none"`` (or ``"host"``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import docker.errors
import pytest
import requests

from tests.baseimage import BaseImage, ensure_base_image

PUSHED_REPOSITORY = "envbuild-test/base"

_HOW_TO_START = "run the tests with scripts/test, or `scripts/services start` and source /run/envbuild-test/env"
_FIXTURE_MARKERS = {
    "docker_client": ("docker",),
    "base_image": ("docker",),
    "registry": ("registry",),
    "pushed_base_image": ("docker", "registry"),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@dataclass(frozen=True)
class _Probe:
    ok: bool
    detail: str  # where the service is, or why it is not usable


def _probe_docker() -> _Probe:
    host = os.environ.get("DOCKER_HOST")
    if not host:
        return _Probe(False, f"DOCKER_HOST is not set; {_HOW_TO_START}")
    try:
        client = docker.DockerClient(base_url=host, version="auto", timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        return _Probe(False, f"no docker engine answers at DOCKER_HOST={host}: {exc}; {_HOW_TO_START}")
    return _Probe(True, host)


def _probe_registry() -> _Probe:
    address = os.environ.get("ENVBUILD_TEST_REGISTRY")
    if not address:
        return _Probe(False, f"ENVBUILD_TEST_REGISTRY is not set; {_HOW_TO_START}")
    url = f"http://{address}/v2/"
    try:
        response = requests.get(url, timeout=5)
    except requests.RequestException as exc:
        return _Probe(False, f"no registry answers at {url}: {exc}; {_HOW_TO_START}")
    if response.status_code != 200:
        return _Probe(False, f"GET {url} answered {response.status_code}, not 200; {_HOW_TO_START}")
    return _Probe(True, address)


_PROBES = {"docker": _probe_docker, "registry": _probe_registry}


class _ServiceState:
    """Probes each service once per session."""

    def __init__(self) -> None:
        self._results: dict[str, _Probe] = {}

    def probe(self, service: str) -> _Probe:
        if service not in self._results:
            self._results[service] = _PROBES[service]()
        return self._results[service]


_STATE_KEY = pytest.StashKey[_ServiceState]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STATE_KEY] = _ServiceState()


def _require(config: pytest.Config, service: str) -> _Probe:
    probe = config.stash[_STATE_KEY].probe(service)
    if not probe.ok:
        if in_ci():
            pytest.fail(f"{service} service missing in CI: {probe.detail}", pytrace=False)
        pytest.skip(f"{service} service not running: {probe.detail}")
    return probe


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    used = set(getattr(item, "fixturenames", ()))
    for fixture, markers in sorted(_FIXTURE_MARKERS.items()):
        for marker in markers:
            if fixture in used and item.get_closest_marker(marker) is None:
                pytest.fail(
                    f"{item.nodeid} uses the {fixture} fixture but is not marked "
                    f"@pytest.mark.{marker}; add the marker",
                    pytrace=False,
                )
    for service in _PROBES:
        if item.get_closest_marker(service) is not None:
            _require(item.config, service)


@pytest.fixture(scope="session")
def docker_client(pytestconfig: pytest.Config) -> Iterator[docker.DockerClient]:
    probe = _require(pytestconfig, "docker")
    client = docker.DockerClient(base_url=probe.detail, version="auto", timeout=600)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def registry(pytestconfig: pytest.Config) -> str:
    return _require(pytestconfig, "registry").detail


@pytest.fixture(scope="session")
def base_image(docker_client: docker.DockerClient) -> BaseImage:
    return ensure_base_image(docker_client)


@dataclass(frozen=True)
class PushedImage:
    """The base image as the local registry holds it."""

    repository: str  # "127.0.0.1:5000/envbuild-test/base"
    tag: str
    digest: str  # manifest digest, "sha256:<64 hex>", as the engine reported it after the push

    @property
    def by_digest(self) -> str:
        return f"{self.repository}@{self.digest}"


def push_as(client: docker.DockerClient, source: str, repository: str, tag: str) -> str:
    """Tag ``source`` as ``repository:tag`` and push it through envbuild's engine; the manifest digest."""
    from envbuild.engine import Engine

    client.images.get(source).tag(repository, tag)
    return Engine(client).push(f"{repository}:{tag}")


@pytest.fixture(scope="session")
def pushed_base_image(
    docker_client: docker.DockerClient, registry: str, base_image: BaseImage
) -> Iterator[PushedImage]:
    repository = f"{registry}/{PUSHED_REPOSITORY}"
    tag = base_image.tag.rsplit(":", 1)[1]
    digest = push_as(docker_client, base_image.tag, repository, tag)
    try:
        yield PushedImage(repository, tag, digest)
    finally:
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(f"{repository}:{tag}")
