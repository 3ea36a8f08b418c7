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

Under pytest-xdist (``scripts/test`` runs three workers, ``--dist loadgroup``), a test marked ``docker``,
``registry`` or ``ray`` runs in its module's *lane* (an xdist group, :func:`lane_of`): a lane's tests run on
one worker, one at a time, so a module's fixtures are set up once and its tests, which reuse their lock names
and images, never meet; lanes run side by side, one on each worker. A module whose module-scoped fixtures are
costly (:data:`TOGETHER`) has all its tests in its lane, service-backed or not, so each fixture is made once.
Lanes share one dockerd and one registry, so what keeps them apart is in the names: envbuild tidies the engine
per lock name (``keep_only``, ``prune_dangling``), and modules that build under one lock name, or start Ray
clusters on the machine's ports, share a lane (:data:`LANES`). A test that asserts what the *whole* engine
holds (its disk, every image, every container, BuildKit's cache pruned to nothing) is marked ``engine_wide``
and runs alone: it takes the engine's claim exclusively (:func:`engine_claim`) and every other service test
takes it shared, so it waits for the running one to end and no other starts until it has. A module whose
tests run their containers on engines of their own (the ssh hosts' dockerds) and use the shared engine only
in module fixtures that build on it names those fixtures (``engine_only_in``): its tests take the claim until
those fixtures are set up, then none, so an ``engine_wide`` test does not wait on a cluster's start-up or
its jobs. Every other test is independent (its own ``tmp_path``, git daemons and indexes on free ports,
caches with file locks) and runs on whichever worker is free.

Before any test, the run's controller stops what an earlier run cut short left running (its dockerd, sshd,
git daemon, Ray head), by the PIDs that run wrote down (:mod:`tests.lib.leftovers`), and says what it stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from tests.lib.baseimage import BaseImage, ensure_base_image
from tests.lib.engines import ExtraEngine, start_engine
from tests.lib.gitrepos import GitDaemon, Served
from tests.lib.leftovers import reap
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
SERVICES_GROUP = "services"  # the lanes' prefix: "services-<lane>"
SERVICE_MARKERS = ("docker", "registry", "ray")
ENGINE_WIDE = "engine_wide"
ENGINE_ONLY_IN = "engine_only_in"
# Modules whose service tests must not meet share a lane. test_image_build counts the dangling images
# of "imagetest" (tests/lib/imagelock.py's default lock name), which test_image_base builds too; the Ray
# heads and clusters pick blocks of the machine's ports (tests/lib/raycluster.py), and contend for its
# two cores. Every other module builds under lock names of its own.
LANES = {
    "test_image_build": "image",
    "test_image_base": "image",
    "test_cluster_ray": "ray",
    "test_launch_ray": "ray",
    "test_slurm_run": "ray",
}


# Modules whose module-scoped fixtures cost seconds each (a probe of verl, a model built and saved by the
# real transformers): every test of theirs runs on one worker, in the module's lane if it has one, so each
# fixture is made once per run — spread over two workers, xdist made each on both (measured: the probe
# test's ``saving`` 13 + 16 s, the architectures' ``answers`` 10.6 + 10.8 s; the README's quick start in a
# fresh clone, 17 s, which its every-command test runs after).
TOGETHER = ("test_probe", "test_auditnames", "test_checkpoint_architectures", "test_checkpoint_real", "test_readme")


def lane_of(item: pytest.Item) -> str:
    """The xdist group of a service test: its module's lane."""
    module = Path(str(item.fspath)).stem
    return f"{SERVICES_GROUP}-{LANES.get(module, module)}"


def group_of(item: pytest.Item) -> str | None:
    """The xdist group of any test: a service test's lane, every test of a :data:`TOGETHER` module in its
    module's lane too; None for the rest, which xdist spreads."""
    if _is_service_test(item) or Path(str(item.fspath)).stem in TOGETHER:
        return lane_of(item)
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STATE_KEY] = ServiceState()
    config.addinivalue_line(
        "markers", f"{ENGINE_WIDE}: asserts what the whole engine holds; runs while no other service test does"
    )
    config.addinivalue_line(
        "markers",
        f"{ENGINE_ONLY_IN}(*fixtures): the module uses the shared engine only in these module fixtures; its tests "
        "hold the engine's claim until they are set up, then run without it",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """What an interrupted run left running (a dockerd, an sshd, a git daemon, a Ray head), stopped by the
    PIDs it wrote down (:mod:`tests.lib.leftovers`): once, by the run's controller, before any test starts."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller has done it
        return
    for line in reap():
        print(f"conftest: stopped what an interrupted run left: {line}", file=sys.stderr)


def _require(config: pytest.Config, service: str) -> Probe:
    probe = config.stash[_STATE_KEY].probe(service)
    if not probe.ok:
        if in_ci():
            pytest.fail(f"{service} service missing in CI: {probe.detail}", pytrace=False)
        pytest.skip(f"{service} service not running: {probe.detail}")
    return probe


def _is_service_test(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(marker) is not None for marker in SERVICE_MARKERS)


def pytest_itemcollected(item: pytest.Item) -> None:
    # At collection, before any pytest_collection_modifyitems: xdist's reads the groups into the test IDs.
    group = group_of(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


_CLAIMED = "ENVBUILD_TEST_ENGINE_CLAIMED"


def _engine_file() -> str:
    """Where the workers' locks on the engine at ``DOCKER_HOST`` live (a prefix; the lock's kind follows)."""
    key = hashlib.sha256(os.environ.get("DOCKER_HOST", "").encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"envbuild-test-engine-{key}")


@contextlib.contextmanager
def engine_claim(exclusive: bool) -> Iterator[None]:
    """Hold the engine shared (a service test) or alone (an ``engine_wide`` one), across the workers.

    Two flocks keyed by ``DOCKER_HOST``: the claim, and a gate in front of it that a test holds only while
    it queues. A test that wants the engine alone keeps the gate while it waits for the shared holders to
    finish, so no new one slips in before it (a plain shared/exclusive flock would let the other worker's
    tests take turns holding it shared for as long as they last)."""
    if os.environ.get(_CLAIMED):  # a pytest run by a test (a fresh clone's scripts/test): under its claim
        yield
        return
    with open(f"{_engine_file()}.gate", "a") as gate, open(f"{_engine_file()}.claim", "a") as claim:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(claim, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        os.environ[_CLAIMED] = "exclusive" if exclusive else "shared"
        try:
            yield
        finally:
            del os.environ[_CLAIMED]
            fcntl.flock(claim, fcntl.LOCK_UN)


_ENGINE_DONE: set[str] = set()  # modules (engine_only_in) whose engine fixtures this worker has set up


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    # Setup, call and teardown: a module's fixtures build and tidy under the claim of its first and last test.
    if not _is_service_test(item):
        return (yield)
    only_in = item.get_closest_marker(ENGINE_ONLY_IN)
    module = item.nodeid.split("::", 1)[0]
    if only_in is not None and module in _ENGINE_DONE and nextitem is not None:  # the last one tears down the
        return (yield)  # session's fixtures, the pushed base among them: under the claim
    with engine_claim(exclusive=item.get_closest_marker(ENGINE_WIDE) is not None):
        result = yield
    if only_in is not None and set(only_in.args) <= set(getattr(item, "fixturenames", ())):
        _ENGINE_DONE.add(module)  # module-scoped: set up by this test (or failed, and never made again)
    return result


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
    if item.get_closest_marker(ENGINE_WIDE) is not None and not _is_service_test(item):
        pytest.fail(f"{item.nodeid} is marked {ENGINE_WIDE} but needs no engine: mark it docker", pytrace=False)
    if (only_in := item.get_closest_marker(ENGINE_ONLY_IN)) is not None:
        manager = item.session._fixturemanager
        defs = [(manager.getfixturedefs(name, item) or [None])[-1] for name in only_in.args]
        if not defs or any(d is None or d.scope not in ("module", "session") for d in defs):
            pytest.fail(f"{item.nodeid}: {ENGINE_ONLY_IN} names no fixture, or one not module-scoped", pytrace=False)
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
    # Each xdist worker pushes it (the same image, the same digest) and holds it shared while its session
    # lasts; the last one to end removes the tag, not the first, under the other's running tests.
    with open(f"{_engine_file()}.pushed", "a") as users:
        fcntl.flock(users, fcntl.LOCK_SH)
        digest = push_as(docker_client, base_image.tag, repository, tag)
        try:
            yield PushedImage(repository, tag, digest)
        finally:
            fcntl.flock(users, fcntl.LOCK_UN)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # another worker still uses it, and removes it when it ends
            else:
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
