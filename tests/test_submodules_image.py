"""An image of sources with nested submodules, built by the real engine: online from an empty cache, then
offline from that warm cache, both without the layer cache; one image ID, every level's files inside,
each level's tree checked inside the image, a skipped submodule the empty directory of its gitlink."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import pytest

from envbuild.cli import main
from envbuild.config import SourceOptions
from envbuild.engine.client import Engine
from envbuild.git.mirrors import Mirrors
from envbuild.image.build import BuildResult, ImageOptions, build_image
from envbuild.lock.io import read_lock
from envbuild.verify.pins import VerifyOptions
from tests.lib.gitrepos import Served
from tests.lib.services import PushedImage, remove_lock_images
from tests.lib.submodlock import CATLASS_PATH, GTEST_PATH, MEGATRON_PATH, SubmoduleUpstreams, make_upstreams

pytestmark = [pytest.mark.gitdaemon, pytest.mark.slow, pytest.mark.docker, pytest.mark.registry]
LOCK_NAME = "submodimage"
SRC = "/opt/envbuild/src"


@dataclass
class Built:
    up: SubmoduleUpstreams
    online: BuildResult  # empty cache, --no-cache
    offline: BuildResult  # the same cache, warm, --offline --no-cache


@pytest.fixture(scope="module")
def built(
    served: Served,
    pushed_base_image: PushedImage,
    docker_client: docker.DockerClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Built]:
    up = make_upstreams(served, "smimage")
    work = tmp_path_factory.mktemp("submodule-image")
    base = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    lock = up.write_lock(
        work / "sub.lock.yaml",
        LOCK_NAME,
        base_image=f"{{name: '{base}', digest: '{pushed_base_image.digest}'}}",
        source_date_epoch="1767225600",
    )
    names = ["parent", "bridge", "megatron"]  # named: the base stays pinned as it is, no package resolution
    assert main(["lock", "update", str(lock), *names, "--cache-dir", str(work / "cache"), *up.mirror_args(), "-q"]) == 0
    engine = Engine(docker_client)
    mirrors = Mirrors.parse(up.mirrors())
    cache = work / "build-cache"  # empty: the build fetches every level itself
    online = build_image(
        read_lock(lock),
        ImageOptions(VerifyOptions(SourceOptions(cache_dir=cache, mirrors=mirrors)), no_cache=True),
        engine=engine,
    )
    offline = build_image(
        read_lock(lock),
        ImageOptions(VerifyOptions(SourceOptions(cache_dir=cache, mirrors=mirrors, offline=True)), no_cache=True),
        engine=engine,
    )
    try:
        yield Built(up, online, offline)
    finally:
        remove_lock_images(docker_client, LOCK_NAME)


def test_online_from_empty_and_offline_from_warm_give_one_image_id(built: Built) -> None:
    assert built.online.image_id == built.offline.image_id
    assert not built.offline.reused  # --no-cache: built again, normalised and checked again


def test_the_image_holds_every_level_and_the_manifest_every_tree(
    built: Built, docker_client: docker.DockerClient
) -> None:
    catlass = f"{SRC}/parent/{CATLASS_PATH}"
    script = (
        f"cat {catlass}/include/catlass/catlass.hpp; test -f {catlass}/{GTEST_PATH}/googletest/include/gtest/gtest.h"
        f" && readlink {catlass}/{GTEST_PATH}/include/gtest/latest; ls -A {SRC}/bridge/{MEGATRON_PATH} | wc -l;"
        " cat /opt/envbuild/meta/manifest.json"
    )
    out = docker_client.containers.run(built.online.image_id, ["sh", "-c", script], network_mode="none", remove=True)
    header, link, count, manifest = out.decode().split("\n", 3)
    assert (header, link, count) == ("#pragma once", "../../googletest", "0")
    sources = {s["name"]: s for s in json.loads(manifest)["sources"]}
    up = built.up
    assert sources["parent"]["submodules"] == [
        {"path": CATLASS_PATH, "commit": up.commits["catlass"], "tree": up.tree("catlass"), "skip": None},
        {
            "path": f"{CATLASS_PATH}/{GTEST_PATH}",
            "commit": up.commits["googletest"],
            "tree": up.tree("googletest"),
            "skip": None,
        },
    ]
    (megatron,) = sources["bridge"]["submodules"]
    assert (megatron["commit"], megatron["tree"], megatron["skip"]) == (
        up.commits["megatron-gitlink"],
        None,
        "the megatron source provides Megatron-LM",
    )
    assert "submodules" not in sources["megatron"]  # a source without any: its entry as it always was
