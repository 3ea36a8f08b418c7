"""A rebuild of a lock built and checked before: answered from the cache's record, after the refs are
re-checked upstream; nothing is sent to the engine and the index is not asked (real engine, real git daemon,
a loopback index that counts its requests)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from envbuild.config import SourceOptions
from envbuild.engine.client import Engine
from envbuild.image.build import BuildRefused, BuildResult, ImageOptions, build_image
from envbuild.image.cache.ledger import BUILD_VERSION, BuiltImage, built_path, read_built
from envbuild.lock.io import read_lock
from envbuild.verify.pins import VerifyOptions
from tests.lib.gitrepos import Served, git
from tests.lib.imagelock import ImageLockEnv, served_env
from tests.lib.services import PushedImage, remove_lock_images

pytestmark = [pytest.mark.gitdaemon, pytest.mark.slow]

LOCK_NAME = "nooptest"


def needs_engine(test: Any) -> Any:
    return pytest.mark.docker(pytest.mark.registry(test))


class Reached(Exception):
    """The build reached the engine's builder."""


class NoBuilds(Engine):
    """The real engine, except that building or running anything raises: a no-op must not need either."""

    def build(self, *args: Any, **kwargs: Any) -> Any:
        raise Reached("build")

    def buildkit_build(self, *args: Any, **kwargs: Any) -> Any:
        raise Reached("buildkit_build")

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise Reached("run")

    def run_step(self, *args: Any, **kwargs: Any) -> Any:
        raise Reached("run_step")

    def load(self, *args: Any, **kwargs: Any) -> Any:
        raise Reached("load")


@pytest.fixture(scope="module")
def env(
    served: Served, pushed_base_image: PushedImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ImageLockEnv]:
    name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    wheels = tmp_path_factory.mktemp("noop-wheels")
    with served_env(served, "noop", name, pushed_base_image.digest, wheels) as made:
        yield made


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("noop")


@pytest.fixture(scope="module")
def engine(docker_client: docker.DockerClient) -> Iterator[Engine]:
    yield Engine(docker_client)
    remove_lock_images(docker_client, LOCK_NAME)


@pytest.fixture(scope="module")
def lock_path(env: ImageLockEnv, work: Path) -> Path:
    return env.write(work / "locks" / f"{LOCK_NAME}.lock.yaml", env.lock(name=LOCK_NAME))


def options(work: Path, **changes: Any) -> ImageOptions:
    strict = changes.pop("strict", False)
    offline = changes.pop("offline", False)
    return ImageOptions(
        VerifyOptions(SourceOptions(cache_dir=work / "cache", offline=offline), strict=strict), **changes
    )


@pytest.fixture(scope="module")
def built(lock_path: Path, env: ImageLockEnv, work: Path, engine: Engine) -> BuildResult:
    """The first build of the lock, from an empty cache: it writes the record."""
    result = build_image(read_lock(lock_path), options(work), engine=engine)
    assert not result.noop
    assert env.index.requests  # the index is asked about the files the cache lacked (and counts requests)
    return result


def no_builds(engine: Engine) -> NoBuilds:
    return NoBuilds(engine.client, engine.address)


@needs_engine
def test_the_first_build_writes_the_record_of_the_checked_image(built: BuildResult, work: Path) -> None:
    record = read_built(work / "cache", built.lock_sha256)
    assert record is not None
    assert (record.image_id, record.raw_image_id) == (built.image_id, built.raw_image_id)
    assert record.builder == "buildkit" and record.build_version == BUILD_VERSION
    assert dict(record.trees).keys() == {"alpha", "beta", "gamma"}


@needs_engine
def test_a_rebuild_sends_nothing_and_asks_the_index_nothing(
    built: BuildResult, lock_path: Path, env: ImageLockEnv, work: Path, engine: Engine
) -> None:
    records = {p.name: p.read_bytes() for p in built.record_dir.iterdir()}
    for name in records:
        (built.record_dir / name).unlink()
    engine.tag(built.image_id, f"envbuild-test/{LOCK_NAME}-kept:1")  # so that untagging keeps the image
    engine.api.remove_image(f"envbuild/{LOCK_NAME}:{built.lock_sha256[:12]}")  # the tag is applied again
    env.index.requests.clear()
    again = build_image(read_lock(lock_path), options(work), engine=no_builds(engine))
    assert again.noop and again.reused and again.sent == 0 and again.steps == ()
    assert again.image_id == built.image_id and again.diff_ids == built.diff_ids
    assert env.index.requests == []
    image = engine.inspect(built.image_id)
    assert image is not None and f"envbuild/{LOCK_NAME}:{built.lock_sha256[:12]}" in image["RepoTags"]
    # The record is written again, byte for byte the full build's.
    assert {p.name: p.read_bytes() for p in again.record_dir.iterdir()} == records


@needs_engine
def test_offline_a_rebuild_is_answered_from_the_cached_listing(
    built: BuildResult, lock_path: Path, env: ImageLockEnv, work: Path, engine: Engine
) -> None:
    env.index.requests.clear()
    again = build_image(read_lock(lock_path), options(work, offline=True), engine=no_builds(engine))
    assert again.noop and again.image_id == built.image_id
    assert env.index.requests == []


@needs_engine
def test_a_moved_tag_refuses_the_rebuild(
    built: BuildResult, lock_path: Path, env: ImageLockEnv, work: Path, engine: Engine
) -> None:
    alpha = env.repos["alpha"]
    pinned = alpha.rev("v1.0^{commit}")
    moved = alpha.commit("alpha 1.0, retagged", files={"README.md": "# alpha, again\n"})
    git("tag", "-f", "v1.0", moved, cwd=alpha.path)
    try:
        with pytest.raises(BuildRefused, match=r"refusing to build, the lock fails verify: source alpha: tag-moved"):
            build_image(read_lock(lock_path), options(work), engine=no_builds(engine))
    finally:
        git("tag", "-f", "v1.0", pinned, cwd=alpha.path)


@needs_engine
def test_a_branch_moved_on_is_answered_and_refused_only_with_strict(
    built: BuildResult, lock_path: Path, env: ImageLockEnv, work: Path, engine: Engine
) -> None:
    beta = env.repos["beta"]
    pinned = beta.rev("main")
    beta.commit("beta moves on", files={"NEWS": "more\n"})
    try:
        said: list[str] = []
        again = build_image(read_lock(lock_path), options(work), engine=no_builds(engine), progress=said.append)
        assert again.noop and again.image_id == built.image_id
        with pytest.raises(BuildRefused, match=r"source beta: behind"):
            build_image(read_lock(lock_path), options(work, strict=True), engine=no_builds(engine))
    finally:
        beta.force_branch("main", pinned)


@needs_engine
def test_no_cache_always_builds(built: BuildResult, lock_path: Path, work: Path, engine: Engine) -> None:
    with pytest.raises(Reached):
        build_image(read_lock(lock_path), options(work, no_cache=True), engine=no_builds(engine))


@needs_engine
def test_a_record_this_envbuild_did_not_write_is_no_record(
    built: BuildResult, lock_path: Path, work: Path, engine: Engine
) -> None:
    path = built_path(work / "cache", built.lock_sha256)
    kept = path.read_bytes()
    try:
        for damaged in (b"{", json.dumps({**json.loads(kept), "build_version": "0.0.1/1"}).encode()):
            path.write_bytes(damaged)
            with pytest.raises(Reached):  # built (the engine's layer cache answers it), not answered
                build_image(read_lock(lock_path), options(work), engine=no_builds(engine))
    finally:
        path.write_bytes(kept)


@needs_engine
def test_a_removed_image_is_built_again_with_the_same_id(
    built: BuildResult, lock_path: Path, work: Path, engine: Engine
) -> None:
    engine.remove(built.image_id, force=True)
    assert engine.inspect(built.image_id) is None
    said: list[str] = []
    again = build_image(read_lock(lock_path), options(work), engine=engine, progress=said.append)
    assert not again.noop and again.image_id == built.image_id
    assert any("is no longer in the engine: building it again" in line for line in said), said
    assert build_image(read_lock(lock_path), options(work), engine=no_builds(engine)).noop


def test_the_record_round_trips_and_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    record = BuiltImage(
        lock_sha256="a" * 64,
        builder="buildkit",
        base_digest="sha256:" + "b" * 64,
        image_id="sha256:" + "c" * 64,
        raw_image_id="sha256:" + "d" * 64,
        epoch=1767225600,
        dockerfile_sha256="e" * 64,
        trees=(("alpha", "f" * 40),),
    )
    assert BuiltImage.from_json(record.to_json()) == record
    assert BuiltImage.from_json({**record.to_json(), "format": 0}) is None
    assert BuiltImage.from_json({**record.to_json(), "image_id": "c" * 64}) is None
    assert BuiltImage.from_json({**record.to_json(), "trees": ["alpha"]}) is None
    assert BuiltImage.from_json([]) is None
