"""Every shared fixture of the suite, in one place, and the rule that ties service fixtures to markers.

- ``docker_client``: a docker SDK client for the engine at ``DOCKER_HOST`` (``version="auto"``);
- ``registry``: ``"host:port"`` of the local registry (``ENVBUILD_TEST_REGISTRY``), checked with ``GET /v2/``;
- ``base_image``: the cached test base image (:class:`tests.lib.baseimage.BaseImage`), built on first use;
- ``pushed_base_image``: that image pushed once per session to the local registry
  (:class:`tests.lib.services.PushedImage`), for tests that need a base image pinned by digest;
- ``fresh_engine``: a dockerd of its own (:mod:`tests.lib.engines`), empty: no image, no layer cache,
  for tests that start where a new user starts (module-scoped; stopped and removed after);
- ``tiny``: a tiny recipe, Hydra config, checkpoint and data for runner tests (:mod:`tests.lib.tinyrun`);
- ``tiny_index``: a PEP 691 index on 127.0.0.1 serving one tiny wheel, ``tinyone`` 1.0 (module-scoped);
- ``served``: git daemons on 127.0.0.1 over one directory, with and without ``uploadpack.allowFilter``.

Tests that use a service fixture carry the matching marker (``docker``, ``registry``); a test that uses
one without its marker fails, because the marker is what lets ``-m "not docker"`` deselect it. Helpers
(repositories, indexes, images, checkpoints) are plain modules under ``tests/lib/``.

Under pytest-xdist (``scripts/test`` runs two workers, ``--dist loadgroup``), every test marked ``docker``,
``registry`` or ``ray`` is in one group, :data:`SERVICES_GROUP`, and so runs on one worker, one test at a
time: they share one dockerd, one registry and the base image, and some assert what the engine holds
after them (``test_image_engine_state``), which a build running beside them would change. Every other
test is independent (its own ``tmp_path``, git daemons and indexes on free ports, caches with file locks)
and runs on whichever worker is free.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from tests.lib.baseimage import BaseImage, ensure_base_image
from tests.lib.engines import ExtraEngine, start_engine
from tests.lib.gitrepos import GitDaemon, Served
from tests.lib.pyindex import PyIndex, make_wheel
from tests.lib.services import (
    FIXTURE_MARKERS,
    PROBES,
    PUSHED_REPOSITORY,
    Probe,
    PushedImage,
    ServiceState,
    in_ci,
    push_as,
)
from tests.lib.tinyrun import Tiny, tiny_setup

_STATE_KEY = pytest.StashKey[ServiceState]()
SERVICES_GROUP = "services"
SERVICE_MARKERS = ("docker", "registry", "ray")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STATE_KEY] = ServiceState()


def _require(config: pytest.Config, service: str) -> Probe:
    probe = config.stash[_STATE_KEY].probe(service)
    if not probe.ok:
        if in_ci():
            pytest.fail(f"{service} service missing in CI: {probe.detail}", pytrace=False)
        pytest.skip(f"{service} service not running: {probe.detail}")
    return probe


def pytest_itemcollected(item: pytest.Item) -> None:
    # At collection, before any pytest_collection_modifyitems: xdist's reads the groups into the test IDs.
    if any(item.get_closest_marker(marker) is not None for marker in SERVICE_MARKERS):
        item.add_marker(pytest.mark.xdist_group(SERVICES_GROUP))


@pytest.hookimpl(trylast=True)  # after xdist's hook
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # xdist 3.8 groups tests by the "@group" it appends to item._nodeid, but pytest 9.2 reads a node's ID
    # from item._id: without this the groups never reach the scheduler and service tests run side by
    # side. Carried over only where the two differ, so a pytest or xdist that agree is left alone.
    for item in items:
        written = getattr(item, "_nodeid", None)
        if isinstance(written, str) and written != item.nodeid and hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(written)  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    used = set(getattr(item, "fixturenames", ()))
    for fixture, markers in sorted(FIXTURE_MARKERS.items()):
        for marker in markers:
            if fixture in used and item.get_closest_marker(marker) is None:
                pytest.fail(
                    f"{item.nodeid} uses the {fixture} fixture but is not marked @pytest.mark.{marker}; add the marker",
                    pytrace=False,
                )
    for service in PROBES:
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


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("upstream")
    filtering = GitDaemon(base, allow_filter=True).start()
    try:
        plain = GitDaemon(base, allow_filter=False).start()
    except BaseException:
        filtering.stop()
        raise
    try:
        yield Served(base, filtering, plain)
    finally:
        filtering.stop()
        plain.stop()


@pytest.fixture()
def tiny(tmp_path: Path) -> Tiny:
    return tiny_setup(tmp_path)


@pytest.fixture(scope="module")
def fresh_engine(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtraEngine]:
    _require(pytestconfig, "docker")  # the machine can run dockerd at all
    engine = start_engine(tmp_path_factory.mktemp("engine"))
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PyIndex]:
    root = tmp_path_factory.mktemp("tiny-index")
    make_wheel(root, "tinyone", "1.0")
    with PyIndex(root) as index:
        yield index
