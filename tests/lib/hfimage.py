"""An image that really has transformers: the test base image plus the packages of the cached
:data:`tests.lib.pyenvs.HF_STACK` environment (CPU torch, transformers 5.10.4, safetensors).

Building a lock of transformers and torch into an image the way ``envbuild image`` does costs a
download and an install of torch (about 200 MB of wheel, 1.1 GB installed) every time the engine is
empty. The packages are the same files as the cached environment's, so the image is made from them
instead: a container of the base image copies the environment's site-packages (mounted read-only), with
its bytecode, into its own ``dist-packages``, and is committed under a tag keyed by the environment. One
image per engine, shared by every test that reads it (measured on this machine: ~25 s the first time on
an empty engine, nothing afterwards). The environment and the base share Python 3.11 (the wheels are cp311, and
manylinux wheels load on Debian bookworm's glibc).

``hf_image(client, base, labels)`` returns the tag of that image with ``labels`` added (a label is a
configuration change: a commit of no files, made in a second).
"""

from __future__ import annotations

import hashlib
import json

import docker

from tests.lib.baseimage import BaseImage
from tests.lib.hfckpt import hf_venv

DIST_PACKAGES = "/usr/local/lib/python3.11/dist-packages"  # on Debian's sys.path, outside dpkg's
_COPY = (
    "import shutil,sys; shutil.copytree('/src', sys.argv[1], dirs_exist_ok=True, symlinks=True, "
    "ignore=shutil.ignore_patterns('pip', 'pip-*', 'setuptools*', '_distutils_hack', 'distutils-precedence.pth'))"
)
# Bump when what the image holds changes in a way its key (the environment, the base) does not show.
# 2: with the environment's bytecode (pip compiled it when it installed the stack): without it, every python3
# started in a container compiles torch and transformers from source again, ~33 s instead of ~14 here.
REVISION = 2


def _tag(key: str) -> str:
    return f"envbuild-test/hf:{key}"


def hf_image(client: docker.DockerClient, base: BaseImage, labels: dict[str, str] | None = None) -> str:
    """The tag of the base image with the HF stack installed, and ``labels``."""
    venv = hf_venv()
    key = hashlib.sha256(f"{venv.root.name} {base.image_id} {REVISION}".encode()).hexdigest()[:16]
    plain = _tag(key)
    try:
        client.images.get(plain)
    except docker.errors.ImageNotFound:
        container = client.containers.run(
            base.tag,
            ["python3", "-c", _COPY, DIST_PACKAGES],
            volumes={str(venv.site_packages): {"bind": "/src", "mode": "ro"}},
            network_mode="none",
            detach=True,
        )
        try:
            status = container.wait(timeout=600)
            if status.get("StatusCode") != 0:
                raise RuntimeError(f"copying the HF stack into {base.tag} failed: {container.logs()[-2000:]!r}")
            container.commit(repository="envbuild-test/hf", tag=key)
        finally:
            container.remove(force=True)
    if not labels:
        return plain
    labelled = f"{plain}-{hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:12]}"
    try:
        client.images.get(labelled)
    except docker.errors.ImageNotFound:
        container = client.containers.create(plain, ["true"], network_mode="none")
        try:
            changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items())]
            repository, tag = labelled.split(":", 1)
            container.commit(repository=repository, tag=tag, changes=changes)
        finally:
            container.remove(force=True)
    return labelled
