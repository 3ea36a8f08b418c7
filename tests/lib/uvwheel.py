"""The real uv wheel from PyPI, the version this envbuild runs, for the test locks' ``installer``.

Downloaded once per machine into the test cache (``/var/cache/envbuild-test/wheels``), checked against
the sha256 PyPI lists for it; a test's index serves a hard link of it (:func:`serve_uv`).
"""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
from importlib.metadata import version
from pathlib import Path

import requests

from envbuild.lock.model import Package, PackageFile
from tests.lib.baseimage import CACHE_DIR

UV_VERSION = version("uv")  # what `lock update --installer` pins: the uv envbuild itself runs
PYPI_SIMPLE = "https://pypi.org/simple/uv/"


def _pypi_wheel(arch: str) -> dict[str, str]:
    """PyPI's PEP 691 entry of uv's manylinux wheel for ``arch`` (the name, URL and sha256)."""
    response = requests.get(PYPI_SIMPLE, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60)
    response.raise_for_status()
    for entry in response.json()["files"]:
        name = entry["filename"]
        if name.startswith(f"uv-{UV_VERSION}-") and f"manylinux2014_{arch}" in name and name.endswith(".whl"):
            return {"filename": name, "url": entry["url"], "sha256": entry["hashes"]["sha256"]}
    raise RuntimeError(f"PyPI lists no manylinux2014 {arch} wheel of uv {UV_VERSION}")


def uv_wheel(arch: str = platform.machine()) -> Path:
    """The cached uv wheel of :data:`UV_VERSION` for ``arch``, downloaded (and hash-checked) when absent."""
    directory = CACHE_DIR / "wheels"
    found = sorted(directory.glob(f"uv-{UV_VERSION}-*manylinux2014_{arch}*.whl"))
    if found:
        return found[0]
    wanted = _pypi_wheel(arch)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".uv-", delete=False) as out:
        digest = hashlib.sha256()
        with requests.get(wanted["url"], stream=True, timeout=120) as response:
            response.raise_for_status()
            for chunk in response.iter_content(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    if digest.hexdigest() != wanted["sha256"]:
        Path(out.name).unlink()
        raise RuntimeError(f"{wanted['url']}: sha256 {digest.hexdigest()}, PyPI lists {wanted['sha256']}")
    path = directory / wanted["filename"]
    os.replace(out.name, path)
    return path


def serve_uv(wheels: Path, arch: str = platform.machine()) -> Path:
    """A hard link (else a copy) of the uv wheel in ``wheels``, the directory a test index serves."""
    source = uv_wheel(arch)
    dest = wheels / source.name
    if not dest.exists():
        try:
            os.link(source, dest)
        except OSError:
            dest.write_bytes(source.read_bytes())
    return dest


def uv_installer(wheel: Path) -> Package:
    """The lock's ``installer`` entry for ``wheel``."""
    sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return Package(name="uv", version=UV_VERSION, files=(PackageFile(wheel.name, sha256),))
