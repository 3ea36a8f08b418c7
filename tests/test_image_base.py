"""The base image for the lock's platform: pulled for it from a multi-platform index, refused when the engine
can only have another platform's image — before a package is installed. Real registry (a manifest list
written over its API), a fresh engine with no images, and the CLI on a served lock."""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from envbuild.cli import main
from envbuild.engine.client import Engine
from envbuild.image.base import PlatformError, ensure_base
from envbuild.image.plan import ContextPlan, plan_context
from envbuild.lock.model import BaseImage, Platform
from envbuild.lock.platform import OCI_ARCH
from tests.lib.engines import ExtraEngine
from tests.lib.gitrepos import Served
from tests.lib.imagelock import served_env
from tests.lib.registryapi import manifest_of, platform_variant, put_index
from tests.lib.services import PUSHED_REPOSITORY, PushedImage
from tests.lib.tinylock import LOCK_SHA, tiny_lock
from tests.lib.uvwheel import serve_uv

pytestmark = [pytest.mark.docker, pytest.mark.registry]

NATIVE = platform.machine()
OTHER = {"x86_64": "aarch64", "aarch64": "x86_64"}[NATIVE]


def _plan(name: str, digest: str, arch: str) -> ContextPlan:
    lock = tiny_lock(
        base_image=BaseImage(name=name, digest=digest),
        platform=Platform(os="linux", arch=arch, python="3.11", cann="9.1.0"),  # type: ignore[arg-type]
    )
    return plan_context(lock, lock_sha256=LOCK_SHA, epoch=1700000000)


@pytest.fixture(scope="module")
def index(registry: str, pushed_base_image: PushedImage) -> str:
    """``<registry>/envbuild-test/base:multi``: an index over the base image and its OTHER-platform twin."""
    native = manifest_of(registry, PUSHED_REPOSITORY, pushed_base_image.digest)
    other = platform_variant(registry, PUSHED_REPOSITORY, pushed_base_image.digest, OCI_ARCH[OTHER])
    return put_index(registry, PUSHED_REPOSITORY, "multi", [native, other])


@pytest.fixture
def engine(fresh_engine: ExtraEngine) -> Iterator[Engine]:
    with Engine(fresh_engine.client(), fresh_engine.host) as connected:
        yield connected


def test_an_index_is_pulled_for_the_locks_platform_and_pulled_again_for_another(
    engine: Engine, registry: str, index: str
) -> None:
    name = f"{registry}/{PUSHED_REPOSITORY}:multi"
    said: list[str] = []
    base = ensure_base(engine, _plan(name, index, OTHER), said.append)
    assert base.pulled and base.platform == f"linux/{OCI_ARCH[OTHER]}"
    assert (engine.inspect(base.reference) or {})["Architecture"] == OCI_ARCH[OTHER]
    # an engine of another machine builds only with emulation: said before the first step
    assert any("under emulation" in line and "exec format error" in line for line in said), said

    # The engine now holds the other platform's image under this reference; a native lock pulls its own.
    said.clear()
    native = ensure_base(engine, _plan(name, index, NATIVE), said.append)
    assert native.pulled and native.platform == f"linux/{OCI_ARCH[NATIVE]}"
    assert native.image_id != base.image_id
    assert not any("emulation" in line for line in said)
    again = ensure_base(engine, _plan(name, index, NATIVE), said.append)
    assert not again.pulled and again.image_id == native.image_id


def test_a_single_platform_base_of_another_platform_is_refused_in_one_line(
    engine: Engine, pushed_base_image: PushedImage
) -> None:
    name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    plan = _plan(name, pushed_base_image.digest, OTHER)
    with pytest.raises(PlatformError) as raised:
        ensure_base(engine, plan, lambda line: None)
    message = str(raised.value)
    assert "\n" not in message
    assert f"is linux/{OCI_ARCH[NATIVE]}" in message
    assert f"the lock's platform is linux/{OTHER} (linux/{OCI_ARCH[OTHER]})" in message
    assert "platform.arch" in message


@pytest.mark.gitdaemon
@pytest.mark.engine_wide  # no image added anywhere in the engine
def test_envbuild_image_refuses_a_base_of_another_platform_before_installing_anything(
    served: Served,
    pushed_base_image: PushedImage,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base_name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    with served_env(served, "platform", base_name, pushed_base_image.digest, tmp_path / "wheels") as env:
        env = dataclasses.replace(env, arch=OTHER)
        serve_uv(env.index.root, OTHER)  # the lock's installer is for its own platform, as `lock update` pins it
        lock = env.write(tmp_path / "other.lock.yaml", dataclasses.replace(env.lock(), name="otherplatform"))
        before = {image.id for image in docker_client.images.list(all=True)}
        code = main(["image", str(lock), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 1, err
    errors = [line for line in err.splitlines() if line.startswith("envbuild: error:")]
    assert len(errors) == 1, err
    assert f"is linux/{OCI_ARCH[NATIVE]}" in errors[0] and f"lock's platform is linux/{OTHER}" in errors[0]
    assert "packages:" not in err  # refused before the packages step
    assert {image.id for image in docker_client.images.list(all=True)} <= before
    assert not docker_client.images.list(name="envbuild/otherplatform")
