"""Minimal updates: `lock update LOCK --base`, `lock update LOCK NAME…` and `--package NAME` move what they
name and keep every other pin, and the resolver prefers the locked versions (as uv and pip-tools keep the pins
of their last run) unless `--upgrade`. Real repositories on a real git daemon whose branches move on, a real
local index that publishes newer versions, and the local registry, whose tag is pushed to another manifest."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import Lock, Source, read_lock, write_lock
from envbuild.lock.model import BaseImage, Install, Platform
from tests.lib.gitrepos import Repo, Served
from tests.lib.pyindex import PyIndex, make_wheel
from tests.lib.registryapi import MANIFEST, put_blob, put_manifest
from tests.lib.uvwheel import UV_VERSION, serve_uv, uv_wheel

pytestmark = pytest.mark.gitdaemon

CONFIG = "application/vnd.docker.container.image.v1+json"


@dataclass
class World:
    """A lock of two sources (branches ``main`` of alpha and beta) and the closure of ``app`` (app 1.0,
    pure 0.4, other 1.0), pinned by a first `lock update`; then upstream moved on: both branches have a
    new commit and the index publishes pure 0.5 and other 2.0, which app's ``pure>=0.4, other`` allow."""

    lock: Path
    index: PyIndex
    repos: dict[str, Repo]
    cache: list[str]

    def pins(self) -> dict[str, str]:
        """Every pin the lock holds, by what it pins: ``source NAME``, ``package NAME``, ``base``."""
        lock = read_lock(self.lock).lock
        pins = {f"source {s.name}": s.commit for s in lock.sources}
        pins |= {f"package {p.name}": f"{p.version} {[f.sha256 for f in p.files]}" for p in lock.packages}
        if lock.base_image is not None:
            pins["base"] = str(lock.base_image.digest)
        return pins

    def update(self, *args: str) -> int:
        return main(["lock", "update", str(self.lock), *args, *self.cache])


@pytest.fixture()
def world(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    dists = tmp_path / "dists"
    dists.mkdir()
    make_wheel(dists, "app", "1.0", requires=["pure>=0.4", "other"])
    make_wheel(dists, "pure", "0.4")
    make_wheel(dists, "other", "1.0")
    repos, sources = {}, []
    for name in ("alpha", "beta"):
        upstream = f"minimal-{tmp_path.name}-{name}"
        repos[name] = served.repo(upstream)
        sources.append(
            Source(
                name=name,
                repo=served.url(upstream, "daemon-filter"),
                ref="main",
                ref_type="branch",
                commit=repos[name].commit(),
                install=Install(mode="none"),
            )
        )
    lock = tmp_path / "minimal.lock.yaml"
    platform = Platform(os="linux", arch="aarch64", python="3.12")
    with PyIndex(dists) as index:
        write_lock(lock, Lock(version=2, name="minimal", sources=tuple(sources), platform=platform, index=index.url,
                              requirements=("app",)))  # fmt: skip
        world = World(lock, index, repos, ["--cache-dir", str(tmp_path / "cache"), "-q"])
        assert world.update() == 0
        assert {k: v.split()[0] for k, v in world.pins().items() if k.startswith("package")} == {
            "package app": "1.0",
            "package other": "1.0",
            "package pure": "0.4",
        }
        for repo in repos.values():
            repo.commit()
        make_wheel(dists, "pure", "0.5")
        make_wheel(dists, "other", "2.0")
        yield world


def moved(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


def test_a_plain_update_moves_every_source_and_keeps_the_packages_whose_pins_still_satisfy(world: World) -> None:
    before = world.pins()
    world.index.requests.clear()
    assert world.update() == 0
    after = world.pins()
    assert moved(before, after) == {"source alpha", "source beta"}
    assert after["source alpha"] == world.repos["alpha"].rev("main")
    # uv read the pages that list pure 0.5 and other 2.0 (its cache revalidated; then envbuild read them, to
    # list the kept versions' files again), and kept the locked versions all the same.
    asked = world.index.requests
    assert asked.count("/simple/pure/") == asked.count("/simple/other/") == 2, asked

    assert world.update("--upgrade") == 0  # every package may move
    upgraded = world.pins()
    assert moved(after, upgraded) == {"package pure", "package other"}
    assert (upgraded["package pure"].split()[0], upgraded["package other"].split()[0]) == ("0.5", "2.0")


def test_package_moves_that_package_only(world: World) -> None:
    # other 1.0 gains a wheel for the lock's platform: listed again, its files would change.
    make_wheel(world.index.root, "other", "1.0", tag="cp312-cp312-manylinux_2_28_aarch64")
    before = world.pins()
    assert world.update("--package", "Pure") == 0  # named as any spelling of the distribution
    after = world.pins()
    assert moved(before, after) == {"package pure"}  # other 2.0 is published too: other stays as locked
    assert after["package pure"].split()[0] == "0.5"


def test_name_moves_that_source_only(world: World) -> None:
    before = world.pins()
    assert world.update("alpha") == 0
    after = world.pins()
    assert moved(before, after) == {"source alpha"}
    assert world.update("beta", "--packages") == 0  # re-resolved, the locked versions preferred
    assert moved(after, world.pins()) == {"source beta"}


def test_packages_alone_re_resolves_the_closure_and_moves_no_source(world: World) -> None:
    before = world.pins()
    assert world.update("--packages") == 0  # the locked versions still satisfy: nothing moves
    assert moved(before, world.pins()) == set()
    assert world.update("--packages", "--upgrade") == 0
    after = world.pins()
    assert moved(before, after) == {"package pure", "package other"}
    assert (after["package pure"].split()[0], after["package other"].split()[0]) == ("0.5", "2.0")


def test_installer_pins_the_uv_envbuild_runs_for_the_lock_platform_and_moves_nothing_else(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # The fixture's first update ran against an index without uv: it said so and kept pip.
    assert read_lock(world.lock).lock.installer is None
    for arch in ("x86_64", "aarch64"):  # the index serves both; the lock's platform is aarch64
        serve_uv(world.index.root, arch)
    before = world.pins()
    assert world.update("--installer") == 0
    lock = read_lock(world.lock).lock
    assert moved(before, world.pins()) == set()  # no source, package or base moved
    assert lock.installer is not None and (lock.installer.name, lock.installer.version) == ("uv", UV_VERSION)
    wheel = uv_wheel("aarch64")
    assert [(f.filename, f.sha256) for f in lock.installer.files] == [
        (wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest())
    ]
    assert lock.installer.files[0].metadata_sha256 is not None  # its METADATA pinned, as any wheel's
    # A plain update keeps it, and verify checks it against the index like every package file.
    assert world.update() == 0 and read_lock(world.lock).lock.installer == lock.installer
    capsys.readouterr()
    assert main(["lock", "verify", str(world.lock), "--json", *world.cache]) == 0
    uv = [r for r in json.loads(capsys.readouterr().out)["results"] if r["kind"] == "package" and r["name"] == "uv"]
    assert [r["status"] for r in uv] == ["ok"]
    world.index.rehash(wheel.name, "0" * 64)
    assert main(["lock", "verify", str(world.lock), "--json", *world.cache]) == 1
    uv = [r for r in json.loads(capsys.readouterr().out)["results"] if r["kind"] == "package" and r["name"] == "uv"]
    assert [r["status"] for r in uv] == ["hash-mismatch"]


def test_what_cannot_be_moved_is_refused_before_anything_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "start.lock.yaml"
    assert main(["lock", "init", str(lock), "--name", "start", "--arch", "aarch64", "--python", "3.12"]) == 0
    assert f"and its base image: envbuild lock update {lock} --base-image IMAGE[:TAG]" in capsys.readouterr().out
    before = lock.read_bytes()
    # What the build says of a lock without a base names the command that sets one.
    assert main(["image", str(lock), "--dry-run", "--offline", "--cache-dir", str(tmp_path / "c")]) != 0
    assert "`envbuild lock update LOCK --base-image IMAGE[:TAG]` sets and pins one" in capsys.readouterr().err
    refusals = {
        ("--base",): "envbuild: error: --base: lock 'start' has no base image; set one with --base-image IMAGE[:TAG]",
        ("--base-image", "Registry.example/Base:1"): "envbuild: error: --base-image: 'Registry.example/Base:1': path "
        "component 'Base' must be lowercase letters and digits",
        ("--base-image", "x@sha256:" + "0" * 64): "envbuild: error: --base-image: '***@sha256:",
        ("--package", "nosuch"): "envbuild: error: --package nosuch: no such package in lock 'start' (none)",
        ("--upgrade", "--no-packages"): "envbuild: error: --no-packages with --upgrade: moving packages re-resolves",
    }
    for args, said in refusals.items():
        assert main(["lock", "update", str(lock), *args, "--cache-dir", str(tmp_path / "c")]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(said) and err.count("\n") == 1, err
    assert lock.read_bytes() == before


def push_base(registry: str, repository: str, tag: str, label: str) -> str:
    """An arm64 image (no layers, a config labelled ``label``) pushed as ``repository:tag``; its digest."""
    config = json.dumps(
        {
            "architecture": "arm64",
            "os": "linux",
            "config": {"Labels": {"which": label}},
            "rootfs": {"type": "layers", "diff_ids": []},
        }  # fmt: skip
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "size": len(config), "digest": put_blob(registry, repository, config)},
        "layers": [],
    }
    return put_manifest(registry, repository, tag, json.dumps(manifest).encode(), MANIFEST)


@pytest.mark.registry
def test_base_moves_the_digest_and_nothing_else_and_names_combine(
    world: World, registry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))  # no credentials: the local registry asks none
    repository, tag = "envbuild-test/minimal-base", secrets.token_hex(6)
    first = push_base(registry, repository, tag, "first")
    text = world.lock.read_text()
    world.lock.write_text(text.replace("sources:", f"base_image: {{name: '{registry}/{repository}:{tag}'}}\nsources:"))

    # verify's advice for the unpinned base, run as printed, pins it and moves nothing else.
    before = world.pins()
    assert main(["lock", "verify", str(world.lock), "--json", *world.cache]) == 1
    [row] = [r for r in json.loads(capsys.readouterr().out)["results"] if r["kind"] == "base_image"]
    advice = re.search(r"`envbuild ([^`]+)` pins the digest its registry serves", row["detail"])
    assert advice is not None and "--base" in shlex.split(advice.group(1)), row
    assert main(shlex.split(advice.group(1))) == 0
    after = world.pins()
    assert moved(before, after) == {"base"} and after["base"] == first

    second = push_base(registry, repository, tag, "second")  # the tag moves on
    assert world.update("--base") == 0
    assert moved(after, world.pins()) == {"base"} and world.pins()["base"] == second

    # Named together, exactly those move: one source, one package, the base; beta and other stay.
    third = push_base(registry, repository, tag, "third")
    before = world.pins()
    assert world.update("alpha", "--package", "pure", "--base") == 0
    after = world.pins()
    assert moved(before, after) == {"source alpha", "package pure", "base"} and after["base"] == third


@pytest.mark.registry
def test_base_image_sets_the_base_of_a_lock_started_from_nothing(
    registry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    repository, tag = "envbuild-test/minimal-start", secrets.token_hex(6)
    digest = push_base(registry, repository, tag, "start")
    lock = tmp_path / "start.lock.yaml"
    cache = ["--cache-dir", str(tmp_path / "c")]
    assert main(["lock", "init", str(lock), "--name", "start", "--arch", "aarch64", "--python", "3.12"]) == 0
    assert f"and its base image: envbuild lock update {lock} --base-image IMAGE[:TAG]" in capsys.readouterr().out
    before = lock.read_bytes()
    # What the build says of a lock without a base names the command that sets one.
    assert main(["image", str(lock), "--dry-run", "--offline", *cache]) != 0
    assert "`envbuild lock update LOCK --base-image IMAGE[:TAG]` sets and pins one" in capsys.readouterr().err

    # A base no registry answers for is not recorded: a base without a digest cannot be built.
    assert main(["lock", "update", str(lock), "--base-image", "127.0.0.1:1/nothing:1", *cache]) == 1
    assert "envbuild: error: base image 127.0.0.1:1/nothing:1 not pinned: " in capsys.readouterr().err
    assert lock.read_bytes() == before
    # Nor one without an image for the lock's platform (x86_64: the image is arm64 only).
    other = tmp_path / "other.lock.yaml"
    assert main(["lock", "init", str(other), "--name", "other", "--arch", "x86_64", "--python", "3.12"]) == 0
    assert main(["lock", "update", str(other), "--base-image", f"{registry}/{repository}:{tag}", *cache]) == 1
    assert "none for the lock's platform linux/x86_64 (linux/amd64)" in capsys.readouterr().err

    assert main(["lock", "update", str(lock), "--base-image", f"{registry}/{repository}:{tag}", *cache]) == 0
    assert read_lock(lock).lock.base_image == BaseImage(f"{registry}/{repository}:{tag}", digest)
    assert f"    image: (none) -> {registry}/{repository}:{tag}@{digest}\n" in capsys.readouterr().out
    assert main(["lock", "verify", str(lock), "--json", *cache]) == 0
    [row] = json.loads(capsys.readouterr().out)["results"]
    assert (row["kind"], row["status"]) == ("base_image", "ok")
    assert main(["image", str(lock), "--dry-run", "--offline", *cache]) == 0  # buildable without editing YAML
    assert f"FROM {registry}/{repository}@{digest} " in capsys.readouterr().out  # the base by digest
