"""Smoke tests of the test infrastructure itself: the engine runs the base image, the registry stores it."""

from __future__ import annotations

import hashlib

import docker
import pytest
import requests

from tests.lib.baseimage import BaseImage
from tests.lib.services import PUSHED_REPOSITORY, PushedImage

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


@pytest.mark.docker
def test_base_image_runs_python_and_has_cann(docker_client: docker.DockerClient, base_image: BaseImage) -> None:
    script = (
        "python3 --version; "
        f". {base_image.cann_home}/set_env.sh; "
        'echo "home=$ASCEND_TOOLKIT_HOME"; '
        'echo "latest=$(readlink "$ASCEND_TOOLKIT_HOME")"; '
        'grep "^toolkit_running_version=" "$ASCEND_TOOLKIT_HOME/version.cfg"; '
        'grep "^version=" "$ASCEND_TOOLKIT_HOME/$(uname -m)-linux/ascend_toolkit_install.info"; '
        'echo "net=$(ls /sys/class/net | tr "\\n" " ")"'
    )
    output = docker_client.containers.run(
        base_image.tag, ["/bin/sh", "-c", script], network_mode="none", remove=True
    ).decode()
    lines = output.splitlines()
    assert lines[0].startswith("Python 3."), output
    assert f"home={base_image.cann_home}/latest" in lines
    assert f"latest={base_image.cann_version}" in lines
    assert any(
        line.startswith("toolkit_running_version=[") and line.endswith(f":{base_image.cann_version}]") for line in lines
    ), output
    assert f"version={base_image.cann_version}" in lines
    # --network none: the container has loopback only.
    assert "net=lo " in lines


@pytest.mark.docker
def test_base_image_id_is_the_cached_archive_config(base_image: BaseImage) -> None:
    assert base_image.image_id.startswith("sha256:") and len(base_image.image_id) == 71
    assert base_image.archive.is_file()


@pytest.mark.docker
@pytest.mark.registry
def test_pushed_base_image_manifest_digest_read_back_over_http(
    registry: str, base_image: BaseImage, pushed_base_image: PushedImage
) -> None:
    name = PUSHED_REPOSITORY
    url = f"http://{registry}/v2/{name}/manifests/{pushed_base_image.tag}"
    response = requests.get(url, headers={"Accept": MANIFEST_V2}, timeout=30)
    response.raise_for_status()
    body = response.content
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    assert response.headers["Docker-Content-Digest"] == digest
    assert digest == pushed_base_image.digest

    manifest = response.json()
    assert manifest["mediaType"] == MANIFEST_V2
    # The config blob the registry holds is the engine's image config: its digest is the image ID.
    assert manifest["config"]["digest"] == base_image.image_id
    assert len(manifest["layers"]) == 1

    by_digest = requests.get(
        f"http://{registry}/v2/{name}/manifests/{digest}", headers={"Accept": MANIFEST_V2}, timeout=30
    )
    assert by_digest.status_code == 200
    assert by_digest.content == body
    config = requests.get(f"http://{registry}/v2/{name}/blobs/{base_image.image_id}", timeout=30)
    assert "sha256:" + hashlib.sha256(config.content).hexdigest() == base_image.image_id


@pytest.mark.docker
@pytest.mark.registry
def test_engine_pulls_base_image_by_digest(docker_client: docker.DockerClient, pushed_base_image: PushedImage) -> None:
    image = docker_client.images.pull(pushed_base_image.by_digest)
    assert pushed_base_image.by_digest in image.attrs["RepoDigests"]
    output = docker_client.containers.run(
        pushed_base_image.by_digest, ["python3", "-c", "print('ok')"], network_mode="none", remove=True
    )
    assert output == b"ok\n"
