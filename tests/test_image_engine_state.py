"""What `envbuild image` leaves in the engine and does to the base, built for real: repeated builds of a
lock leave the engine's disk where the first left it, and a base that already holds a distribution the
lock pins at another version gets it replaced (its files removed by a layer envbuild writes), still
reproducibly."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from envbuild.config import SourceOptions
from envbuild.engine.buildkit import LOST_LAYER_HINT, LostLayer
from envbuild.engine.claim import EngineClaim
from envbuild.engine.client import Engine
from envbuild.image import build as build_module
from envbuild.image.build import ImageOptions, build_image
from envbuild.image.cache.ledger import forget_built
from envbuild.image.cache.retention import BUILD_CACHE_FLOOR, bound_build_cache, build_cache_bound
from envbuild.lock.io import read_lock
from envbuild.verify.pins import VerifyOptions
from tests.lib.baseimage import DISTRO_PYTHON
from tests.lib.gitrepos import Served
from tests.lib.imagelock import ImageLockEnv, old_tinyone_wheel, served_env, served_packages
from tests.lib.services import PushedImage, push_as, remove_lock_images

pytestmark = [pytest.mark.gitdaemon, pytest.mark.slow, pytest.mark.docker, pytest.mark.registry]
NAMES = ("enginestate", "replaced", "distro")


@pytest.fixture(scope="module")
def engine(docker_client: docker.DockerClient) -> Iterator[Engine]:
    yield Engine(docker_client)
    remove_lock_images(docker_client, *NAMES, all_images=True)


@pytest.fixture(scope="module")
def env(
    served: Served, pushed_base_image: PushedImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ImageLockEnv]:
    base = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    with served_env(served, "enginestate", base, pushed_base_image.digest, tmp_path_factory.mktemp("wheels")) as env:
        yield env


def engine_state(client: docker.DockerClient) -> tuple[int, int, int]:
    """The engine's layers' bytes, its images (intermediate ones too) and its containers."""
    usage = client.api.df()
    return usage["LayersSize"], len(client.api.images(all=True)), len(client.api.containers(all=True))


@pytest.mark.engine_wide  # the engine's disk, every image and container; BuildKit's cache emptied
def test_repeated_builds_of_a_lock_leave_the_engine_as_the_first_build_left_it(
    env: ImageLockEnv, engine: Engine, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """Every kind of rebuild, twice (what one build leaks, each leaks again): with --no-cache; answered by
    the engine's cache (the cache's record of the build forgotten, as an older envbuild's cache has none);
    and answered from that record, which touches nothing in the engine but tags."""
    lock = env.write(tmp_path / "enginestate.lock.yaml", env.lock(name="enginestate"))
    options = ImageOptions(VerifyOptions(SourceOptions(tmp_path / "cache")))
    first = build_image(read_lock(lock), options, engine=engine)
    after_one = engine_state(docker_client)
    for kind in ("no-cache", "engine-cache", "record", "no-cache", "engine-cache", "record"):
        if kind == "engine-cache":
            forget_built(options.cache_dir, first.lock_sha256)
        again = build_image(read_lock(lock), ImageOptions(options.verify, no_cache=kind == "no-cache"), engine=engine)
        assert again.image_id == first.image_id and again.noop == (kind == "record"), kind
        assert engine_state(docker_client) == after_one, kind
    # BuildKit's cache is bounded too: pruned to the bound after each build (here: the floor).
    base = engine.inspect(env.base_name)
    image = engine.inspect(first.image_id)
    assert base is not None and image is not None
    assert engine.build_cache_size() <= build_cache_bound(image["Size"], base["Size"]) == BUILD_CACHE_FLOOR
    assert bound_build_cache(engine, 0, lambda _: None) >= 0 and engine.build_cache_size() < BUILD_CACHE_FLOOR
    forget_built(options.cache_dir, first.lock_sha256)  # else answered from the record, the engine untouched
    again = build_image(read_lock(lock), options, engine=engine)  # an emptied cache: built again, the same image
    assert again.image_id == first.image_id and not again.noop
    raw = engine.images(name="envbuild-raw/enginestate")
    packages = engine.images(name="envbuild-pkg/enginestate")
    assert [len(i["RepoTags"]) for i in raw + packages] == [1, 1]  # the cache: one raw image, one packages image
    # The size is the one BuildKit prunes by: one byte less to keep reclaims something (counting the
    # records shared with images too, it reclaimed nothing, and the bound held only on paper).
    assert engine.prune_build_cache(engine.build_cache_size() - 1) > 0


@pytest.mark.engine_wide  # whether another build holds the engine is what it asserts
def test_a_build_beside_another_leaves_the_prune_of_buildkits_cache_to_it(
    env: ImageLockEnv, engine: Engine, tmp_path: Path
) -> None:
    """A build that ends while another holds the engine does not prune BuildKit's cache (docker 20.10's
    prune broke the other's next steps: envbuild.engine.claim), but still tidies its lock's images."""
    lock = env.write(tmp_path / "enginestate.lock.yaml", env.lock(name="enginestate"))
    options = ImageOptions(VerifyOptions(SourceOptions(tmp_path / "cache")), no_cache=True)
    said: list[str] = []
    with EngineClaim(engine.address).shared():  # another build, using the engine
        build_image(read_lock(lock), options, engine=engine, progress=said.append)
        build_image(read_lock(lock), options, engine=engine, progress=said.append)
    left = [line for line in said if line.startswith("BuildKit's cache left as it is: another build")]
    assert len(left) == 2
    # tidied all the same: the first build's raw image, superseded by the second's, went
    assert engine.images(filters={"dangling": True, "label": "io.envbuild.lock.name=enginestate"}) == []
    said.clear()
    build_image(read_lock(lock), options, engine=engine, progress=said.append)
    assert not [line for line in said if line.startswith("BuildKit's cache left")]


@pytest.mark.engine_wide  # BuildKit's cache is emptied
def test_a_build_that_meets_a_lost_layer_empties_buildkits_cache_and_builds_once_more(
    env: ImageLockEnv, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's fault met by a build (test_engine_buildkit makes it for real, through each transport):
    the build says so, empties BuildKit's cache and builds again, to the image a build without it gives."""
    lock = env.write(tmp_path / "enginestate.lock.yaml", env.lock(name="enginestate"))
    options = ImageOptions(VerifyOptions(SourceOptions(tmp_path / "cache")))
    reference = build_image(read_lock(lock), options, engine=engine)
    forget_built(options.cache_dir, reference.lock_sha256)
    real, calls = build_module._build, []

    def meets_the_fault_once(assembled: object) -> object:
        calls.append(engine.build_cache_size(in_use=False))
        if len(calls) == 1:
            raise LostLayer(f"build failed at step [stage-2 1/3] RUN …: failed to prepare x: … ({LOST_LAYER_HINT})")
        return real(assembled)  # type: ignore[arg-type]

    monkeypatch.setattr(build_module, "_build", meets_the_fault_once)
    said: list[str] = []
    again = build_image(read_lock(lock), options, engine=engine, progress=said.append)
    assert again.image_id == reference.image_id and len(calls) == 2
    assert calls[0] > 0 and calls[1] == 0  # emptied in between, of all a prune can take
    assert any(
        line.startswith("warning: build failed at step [stage-2 1/3] RUN …: failed to prepare x") for line in said
    )
    assert any(line.startswith("emptied BuildKit's cache (") for line in said)


def test_a_container_running_the_locks_image_survives_a_rebuild(
    env: ImageLockEnv, engine: Engine, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """The tidying after a build removes the packages container of a killed build, not a job: a container
    of the lock's image carries the lock's name label too."""
    lock = env.write(tmp_path / "enginestate.lock.yaml", env.lock(name="enginestate"))
    options = ImageOptions(VerifyOptions(SourceOptions(tmp_path / "cache")))
    built = build_image(read_lock(lock), options, engine=engine)
    job = docker_client.containers.run(built.image_id, ["sleep", "300"], network_mode="none", detach=True)
    try:
        assert job.labels["io.envbuild.lock.name"] == "enginestate"
        build_image(read_lock(lock), ImageOptions(options.verify, no_cache=True), engine=engine)
        job.reload()
        assert job.status == "running"
    finally:
        job.remove(force=True)


def test_an_image_pulled_by_digest_survives_the_tidying(
    env: ImageLockEnv, engine: Engine, docker_client: docker.DockerClient, registry: str, tmp_path: Path
) -> None:
    """An untagged image of the lock that came from a registry (a node's copy, pulled by digest) is not a
    leftover of a build: a build of another version of the lock leaves it."""
    repository = f"{registry}/envbuild-test/enginestate"
    lock = env.write(tmp_path / "pulled.lock.yaml", env.lock(name="enginestate"))
    options = ImageOptions(VerifyOptions(SourceOptions(tmp_path / "cache")), tags=(f"{repository}:pulled",), push=True)
    built = build_image(read_lock(lock), options, engine=engine)
    ((_, digest),) = built.pushed
    docker_client.images.remove(built.image_id, force=True)
    docker_client.api.pull(repository, digest)
    pulled = docker_client.api.inspect_image(f"{repository}@{digest}")
    assert pulled["Id"] == built.image_id and pulled["RepoTags"] == []
    other = dataclasses.replace(env.lock(name="enginestate"), source_date_epoch=1_600_000_000)
    moved = build_image(
        read_lock(env.write(tmp_path / "other.lock.yaml", other)), ImageOptions(options.verify), engine=engine
    )
    assert moved.image_id != built.image_id
    assert engine.inspect(built.image_id) is not None


def base_with_old_tinyone(
    client: docker.DockerClient, engine: Engine, pushed: PushedImage, registry: str, tmp_path: Path
) -> tuple[str, str]:
    """The test base with tinyone 0.9 pip-installed (with bytecode, as pip does by default), pushed."""
    wheel = old_tinyone_wheel(tmp_path / "old")
    context = io.BytesIO()
    dockerfile = (
        f"FROM {pushed.by_digest}\nCOPY {wheel.name} /tmp/\n"
        f"RUN python3 -m pip install --break-system-packages --no-index --no-deps /tmp/{wheel.name} && rm /tmp/*.whl\n"
    ).encode()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile), (wheel.name, wheel.read_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image = None
    for event in client.api.build(fileobj=context, custom_context=True, rm=True, network_mode="none", decode=True):
        assert "error" not in event, event
        image = (event.get("aux") or {}).get("ID", image)
    assert image is not None
    repository = f"{registry}/envbuild-test/base-old-tinyone"
    client.images.get(image).tag(repository, "1")
    return f"{repository}:1", push_as(client, image, repository, "1")


def test_a_distribution_the_base_holds_is_replaced_reproducibly(
    served: Served,
    pushed_base_image: PushedImage,
    registry: str,
    engine: Engine,
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    base, digest = base_with_old_tinyone(docker_client, engine, pushed_base_image, registry, tmp_path)
    try:
        _replaced(served, engine, base, digest, tmp_path)
    finally:
        engine.remove(base, force=True)


def _replaced(served: Served, engine: Engine, base: str, digest: str, tmp_path: Path) -> None:
    site = "/usr/local/lib/python3.11/dist-packages"
    before = engine.run(base, ["sh", "-c", f"ls {site} {site}/tinyone /usr/local/bin"]).stdout.split()
    assert {"tinyone-0.9.dist-info", "old_only.py", "__pycache__", "tinyone-old"} <= set(before)
    with served_env(served, "replaced", base, digest, tmp_path / "wheels") as env:
        lock = env.write(tmp_path / "replaced.lock.yaml", env.lock(name="replaced"))
        first = build_image(
            read_lock(lock),
            ImageOptions(VerifyOptions(SourceOptions(tmp_path / "cache")), no_cache=True),
            engine=engine,
        )
        second = build_image(
            read_lock(lock),
            ImageOptions(VerifyOptions(SourceOptions(tmp_path / "cache")), no_cache=True),
            engine=engine,
        )
    assert first.image_id == second.image_id  # the removals are written at fixed times, not the engine's clock
    assert first.packages is not None and first.packages.replaced == ("tinyone 0.9",)
    out = engine.run(first.image_id, ["sh", "-c", f"ls {site} {site}/tinyone; ls /usr/local/bin; stat -c %a {site}"])
    listing = out.stdout.split()
    assert "tinyone-1.0.dist-info" in listing and "tinyone-0.9.dist-info" not in listing
    assert "old_only.py" not in listing and "__pycache__" not in listing and "tinyone-old" not in listing
    versions = engine.run(first.image_id, ["python3", "-c", "import tinyone; print(tinyone.__version__)"])
    assert versions.stdout.strip() == "1.0"


DISTRO_SITE = "/usr/lib/python3/dist-packages"
# Real upstream wheels of the machine's package mirror (scripts/install-test-deps installs from it).
UPSTREAM_WHEELS = Path("/opt/pypi/files")
NEWER = ("setuptools-84.0.0-py3-none-any.whl", "wheel-0.48.0-py3-none-any.whl", "packaging-26.3-py3-none-any.whl")


def test_the_distro_setuptools_and_wheel_a_lock_pins_are_removed_and_recorded(
    served: Served, pushed_base_image: PushedImage, engine: Engine, tmp_path: Path
) -> None:
    """The test base is Debian's: python3-setuptools and python3-wheel in /usr/lib/python3/dist-packages
    (.egg-info, files listed by dpkg only). A lock pinning other versions gets exactly one copy of each."""
    base = pushed_base_image.by_digest
    distro = {f"{name}-{version}.egg-info" for name, version in DISTRO_PYTHON.items()}
    assert distro | {"setuptools", "wheel", "pkg_resources", "_distutils_hack"} <= set(
        engine.run(base, ["ls", DISTRO_SITE]).stdout.split()
    )
    name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    with served_env(served, "distro", name, pushed_base_image.digest, tmp_path / "wheels") as env:
        for wheel in NEWER:
            shutil.copy(UPSTREAM_WHEELS / wheel, env.index.root / wheel)
        lock = env.write(tmp_path / "distro.lock.yaml", env.lock(name="distro", packages=served_packages(env.index)))
        result = build_image(
            read_lock(lock),
            ImageOptions(VerifyOptions(SourceOptions(tmp_path / "cache")), no_cache=True),
            engine=engine,
        )
    assert result.packages is not None
    removed = {(d["name"], d["version"], d["owner"]) for d in result.packages.distro_removed}
    assert removed == {("setuptools", "66.1.1", "python3-setuptools"), ("wheel", "0.38.4", "python3-wheel")}
    recorded = json.loads((result.record_dir / "build.json").read_text())["base_distributions_removed"]
    assert {(d["name"], d["path"]) for d in recorded} == {
        (n, f"{DISTRO_SITE}/{n}-{v}.egg-info") for n, v in DISTRO_PYTHON.items()
    }
    # Every copy Python finds (before importing setuptools, which puts its vendored wheel on sys.path).
    script = (
        "import importlib.metadata as m; "
        "print(sorted(d.version for d in m.distributions() if d.metadata['Name'] in ('setuptools', 'wheel'))); "
        "import setuptools, wheel; print(setuptools.__version__, wheel.__version__)"
    )
    out = engine.run(result.image_id, ["python3", "-c", script])
    assert out.stdout.splitlines() == ["['0.48.0', '84.0.0']", "84.0.0 0.48.0"], out.stderr
    left = set(engine.run(result.image_id, ["ls", DISTRO_SITE]).stdout.split())
    assert not left & (distro | {"setuptools", "wheel", "_distutils_hack", "distutils-precedence.pth"})
    # What the lock does not pin stays: pip, and pkg_resources (Debian's python3-pkg-resources: a
    # package of its own, with no distribution metadata; setuptools 84 no longer ships one).
    assert {"pip", "pip-23.0.1.dist-info", "pkg_resources"} <= left
