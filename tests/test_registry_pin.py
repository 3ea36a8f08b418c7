"""`lock update` pins the base image over the registry's HTTP API, with no container engine: a real
docker-registry that asks for token authentication (tests/lib/tokenregistry.py), the credentials taken
from a docker config as `docker login` writes it, a multi-platform index read for the lock's platform."""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import Lock, read_lock, write_lock
from envbuild.lock.model import BaseImage, Platform
from envbuild.registry.client import OCI_INDEX, OCI_MANIFEST, served_manifest
from tests.lib.tokenregistry import TokenRegistry

pytestmark = pytest.mark.registry  # Debian's docker-registry, started here with token auth

REPOSITORY = "base/debian"


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TokenRegistry, dict[str, str]]]:
    """The registry, holding ``base/debian:multi`` (an index: linux/amd64 and linux/arm64) and
    ``base/debian:single`` (linux/arm64 alone); with the digests of both."""
    registry = TokenRegistry(tmp_path_factory.mktemp("token-registry")).start()
    try:
        manifests = []
        for arch in ("amd64", "arm64"):
            config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
            config_digest = registry.put(REPOSITORY, "blobs", config.encode(), "")
            body = json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": OCI_MANIFEST,
                    "config": {
                        "mediaType": "application/vnd.oci.image.config.v1+json",
                        "size": len(config),
                        "digest": config_digest,
                    },
                    "layers": [],
                }  # fmt: skip
            ).encode()
            digest = registry.put(REPOSITORY, f"manifests/{arch}", body, OCI_MANIFEST)
            manifests.append({"mediaType": OCI_MANIFEST, "size": len(body), "digest": digest,
                              "platform": {"os": "linux", "architecture": arch}})  # fmt: skip
        single = registry.put(REPOSITORY, "manifests/single", body, OCI_MANIFEST)  # the arm64 one, alone
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}).encode()
        digests = {"multi": registry.put(REPOSITORY, "manifests/multi", index, OCI_INDEX), "single": single}
        # What names no platform: an index without manifests, an image whose config has no os/architecture.
        empty = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}).encode()
        digests["empty"] = registry.put(REPOSITORY, "manifests/empty", empty, OCI_INDEX)
        bare = json.dumps({"rootfs": {"type": "layers", "diff_ids": []}}).encode()
        bare_body = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "size": len(bare),
                    "digest": registry.put(REPOSITORY, "blobs", bare, ""),
                },
                "layers": [],
            }
        ).encode()
        digests["bare"] = registry.put(REPOSITORY, "manifests/bare", bare_body, OCI_MANIFEST)
        yield registry, digests
    finally:
        registry.stop()


def docker_config(path: Path, content: dict[str, object]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(content))
    return path


def logged_in(registry: TokenRegistry, tmp_path: Path) -> Path:
    """A docker config as `docker login 127.0.0.1:PORT` writes it (no credential helper)."""
    auth = base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
    return docker_config(tmp_path / "docker", {"auths": {registry.host: {"auth": auth}}})


def base_lock(path: Path, name: str) -> Path:
    platform = Platform(os="linux", arch="aarch64", python="3.11")
    write_lock(path, Lock(version=2, name="pin", sources=(), platform=platform, base_image=BaseImage(name=name)))
    return path


def test_update_pins_the_index_digest_with_the_docker_configs_credentials_and_verify_accepts_it(
    token_registry: tuple[TokenRegistry, dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry, digests = token_registry
    monkeypatch.setenv("DOCKER_CONFIG", str(logged_in(registry, tmp_path)))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # no engine is asked
    lock = base_lock(tmp_path / "pin.lock.yaml", f"{registry.host}/{REPOSITORY}:multi")
    cache = ["--cache-dir", str(tmp_path / "cache")]
    asked = len(registry.requests)

    assert main(["lock", "verify", str(lock), "--json", *cache]) == 1
    [row] = json.loads(capsys.readouterr().out)["results"]
    assert row["status"] == "unpinned"
    advice = re.search(r"`envbuild ([^`]+)` pins the digest its registry serves", row["detail"])
    assert advice is not None, row
    assert advice.group(1) == shlex.join(["lock", "update", str(lock), "--base", *cache])
    assert main(shlex.split(advice.group(1))) == 0  # the advice, as printed
    assert f"base image {registry.host}/{REPOSITORY}:multi is {digests['multi']}" in capsys.readouterr().err
    assert read_lock(lock).lock.base_image == BaseImage(f"{registry.host}/{REPOSITORY}:multi", digests["multi"])
    [token_request] = registry.requests[asked:]
    assert token_request["query"]["scope"] == f"repository:{REPOSITORY}:pull"
    assert token_request["authorization"].startswith("Basic ")  # from the docker config's auths

    assert main(["lock", "verify", str(lock), "--json", *cache]) == 0
    [row] = json.loads(capsys.readouterr().out)["results"]
    assert (row["kind"], row["status"], row["digest"]) == ("base_image", "ok", digests["multi"])


def test_the_platforms_of_a_single_manifest_come_from_its_config(
    token_registry: tuple[TokenRegistry, dict[str, str]], tmp_path: Path
) -> None:
    registry, digests = token_registry
    config = logged_in(registry, tmp_path) / "config.json"
    served = served_manifest(f"{registry.host}/{REPOSITORY}:single", docker_config=config)
    assert (served.digest, served.platforms) == (digests["single"], ("linux/arm64",))  # from its config
    served = served_manifest(f"{registry.host}/{REPOSITORY}:multi", docker_config=config)
    assert (served.digest, served.platforms) == (digests["multi"], ("linux/amd64", "linux/arm64"))


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({}, "log in with `docker login {host}` (envbuild reads the docker config's `auths`)"),
        ({"credsStore": "desktop"}, "names credential helper 'desktop' for it, which envbuild does not run"),
        ({"auths": {"{host}": {"auth": base64.b64encode(b"pinner:wrong").decode()}}}, "token service answered 401"),
    ],
)
def test_without_usable_credentials_the_pin_stays_and_the_warning_says_what_to_do(
    config: dict[str, object],
    said: str,
    token_registry: tuple[TokenRegistry, dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry, _ = token_registry
    content = json.loads(json.dumps(config).replace("{host}", registry.host))
    monkeypatch.setenv("DOCKER_CONFIG", str(docker_config(tmp_path / "docker", content)))
    lock = base_lock(tmp_path / "pin.lock.yaml", f"{registry.host}/{REPOSITORY}:multi")
    before = lock.read_bytes()
    assert main(["lock", "update", str(lock), "--cache-dir", str(tmp_path / "cache")]) == 0
    err = capsys.readouterr().err
    assert f"warning: base image {registry.host}/{REPOSITORY}:multi not re-pinned: " in err
    assert said.replace("{host}", registry.host) in err, err
    assert lock.read_bytes() == before


@pytest.mark.parametrize("tag", ["empty", "bare"])
def test_what_names_no_platform_keeps_the_old_pin_with_a_warning(
    token_registry: tuple[TokenRegistry, dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tag: str,
) -> None:
    """An index without manifests, or an image config without os and architecture: a build would refuse
    it, so the lock keeps the digest it had (here the multi-platform index's) and the warning says why."""
    registry, digests = token_registry
    monkeypatch.setenv("DOCKER_CONFIG", str(logged_in(registry, tmp_path)))
    name = f"{registry.host}/{REPOSITORY}:{tag}"
    lock = tmp_path / "pin.lock.yaml"
    platform = Platform(os="linux", arch="aarch64", python="3.11")
    write_lock(lock, Lock(version=2, name="pin", sources=(), platform=platform,
                          base_image=BaseImage(name=name, digest=digests["multi"])))  # fmt: skip
    assert main(["lock", "update", str(lock), "--cache-dir", str(tmp_path / "cache")]) == 0
    err = capsys.readouterr().err
    assert (
        f"warning: base image {name} not re-pinned: its registry serves {digests[tag]}, which names no platform" in err
    )
    assert read_lock(lock).lock.base_image == BaseImage(name, digests["multi"])
