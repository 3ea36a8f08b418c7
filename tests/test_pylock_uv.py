"""The real uv installs what `envbuild lock export --format pylock` writes, for this machine's platform.

uv is the one this tool depends on (``uv.find_uv_bin()``); ``uv pip install -r pylock.toml`` takes a PEP 751
file without ``--preview`` (uv 0.13 warns that it is experimental). Each test installs into a venv of its own
made by ``uv venv`` for the running interpreter, with a uv cache of its own (``UV_CACHE_DIR``) and no uv
config, so nothing comes from outside ``tmp_path`` but the loopback index and a ``file://`` repository.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Literal, cast

import tomllib
from packaging.pylock import Pylock
from uv import find_uv_bin

from envbuild.cli import main
from envbuild.lock import Lock, Package, PackageFile, Platform, Source, write_lock
from envbuild.lock.export import export_pylock
from envbuild.lock.model import Install, Provides
from tests.lib.gitrepos import make_repo
from tests.lib.pyindex import PyIndex, make_wheel


def this_machine() -> Platform:
    arch = platform.machine()
    assert arch in ("x86_64", "aarch64"), f"a lock's platform is x86_64 or aarch64, not {arch}"
    return Platform(
        os="linux", arch=cast(Literal["x86_64", "aarch64"], arch), python="{}.{}".format(*sys.version_info[:2])
    )


def uv(tmp_path: Path, *args: str, cache: str = "uv-cache") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / cache), "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"}
    return subprocess.run([find_uv_bin(), *args], env=env, capture_output=True, text=True, timeout=120)


def install(tmp_path: Path, pylock: Path, venv: str, *, cache: str = "uv-cache") -> subprocess.CompletedProcess[str]:
    """``uv pip install -r pylock.toml`` into a new venv ``tmp_path/venv`` of this interpreter."""
    made = uv(tmp_path, "venv", "-q", "--python", sys.executable, str(tmp_path / venv), cache=cache)
    assert made.returncode == 0, made.stderr
    return uv(
        tmp_path, "pip", "install", "-r", str(pylock), "--python", str(tmp_path / venv / "bin" / "python"), cache=cache
    )


def installed(tmp_path: Path, venv: str, code: str) -> str:
    run = subprocess.run([tmp_path / venv / "bin" / "python", "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_uv_installs_the_export_and_refuses_it_after_one_byte_changes(tmp_path: Path) -> None:
    dists = tmp_path / "dists"
    dists.mkdir()
    make_wheel(dists, "alpha", "1.0")
    make_wheel(dists, "alpha", "1.1")  # served, not locked: the file pins 1.0 whatever the index offers
    make_wheel(dists, "beta-pkg", "2.0", requires=["alpha"])
    wheels = {"alpha": "alpha-1.0-py3-none-any.whl", "beta-pkg": "beta_pkg-2.0-py3-none-any.whl"}
    with PyIndex(dists) as index:
        packages = tuple(
            Package(name=name, version=wheel.split("-")[1], files=(PackageFile(wheel, index.sha256(wheel)),))
            for name, wheel in wheels.items()
        )
        lock_path, pylock = tmp_path / "l.lock.yaml", tmp_path / "pylock.toml"
        write_lock(
            lock_path,
            Lock(version=2, name="pylock-uv", index=index.url, platform=this_machine(), sources=(), packages=packages),
        )
        argv = ["lock", "export", str(lock_path), "--format", "pylock", "-o", str(pylock)]
        assert main([*argv, "--cache-dir", str(tmp_path / "c")]) == 0
        data = tomllib.loads(pylock.read_text())
        Pylock.from_dict(data)
        files = {w["name"]: w for p in data["packages"] for w in p["wheels"]}
        base = index.url.removesuffix("/simple")
        assert files == {
            wheel: {
                "name": wheel,
                "url": f"{base}/files/{wheel}",
                "size": (dists / wheel).stat().st_size,  # as the index states it (PEP 700): the cache is empty
                "hashes": {"sha256": index.sha256(wheel)},
            }
            for wheel in wheels.values()
        }

        done = install(tmp_path, pylock, "venv")
        assert done.returncode == 0, done.stderr
        versions = "import importlib.metadata as m; print(m.version('alpha'), m.version('beta-pkg'))"
        assert installed(tmp_path, "venv", versions) == "1.0 2.0"

        # One byte of beta's wheel: the modification time of its first member, in the member's local header.
        # The archive still unzips to the same files with the same CRCs; only the sha256 tells them apart.
        wheel = dists / wheels["beta-pkg"]
        data_bytes = bytearray(wheel.read_bytes())
        data_bytes[10] ^= 1
        wheel.write_bytes(bytes(data_bytes))
        refused = install(tmp_path, pylock, "venv2", cache="uv-cache2")  # a cache of its own: uv must download
    assert refused.returncode != 0
    assert "Hash mismatch for `beta-pkg==2.0`" in refused.stderr, refused.stderr
    assert f"sha256:{packages[1].files[0].sha256}" in refused.stderr
    assert not (tmp_path / "venv2" / "lib" / f"python{this_machine().python}" / "site-packages" / "beta_pkg").exists()


# A PEP 517 backend in the source's own tree (``backend-path``, ``requires = []``): uv's isolated build
# needs nothing from an index, so the source builds here, offline, as a real checkout of the pinned commit.
BACKEND = """
import base64, hashlib, os, tomllib, zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "pyproject.toml"), "rb") as pyproject:
    VERSION = tomllib.load(pyproject)["project"]["version"]


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = f"gamma-{VERSION}.dist-info"
    files = {
        "gamma/__init__.py": open(os.path.join(HERE, "gamma", "__init__.py"), "rb").read(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\\nName: gamma\\nVersion: {VERSION}\\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    def digest(data):
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record = "".join(f"{path},{digest(data)},{len(data)}\\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\\n").encode()
    name = f"gamma-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
    return name
"""
PYPROJECT = """[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "gamma"
version = "{}"
"""


def test_uv_installs_a_source_at_its_commit_id_not_its_ref(tmp_path: Path) -> None:
    """A source is a ``vcs`` entry: uv checks out ``commit-id``, not where ``requested-revision`` (the
    branch) has moved since. A ``file://`` repository: uv takes git URLs over https, ssh and file only
    (it refuses ``git://``, so the suite's git daemons cannot serve this test)."""
    repo = make_repo(tmp_path / "upstream" / "gamma")
    pinned = repo.commit(
        files={
            "pyproject.toml": PYPROJECT.format("0.1"),
            "backend.py": BACKEND,
            "gamma/__init__.py": "AT = 'pinned'\n",
        }
    )
    repo.commit(
        files={"pyproject.toml": PYPROJECT.format("0.2"), "gamma/__init__.py": "AT = 'head'\n"}
    )  # main moves on
    source = Source(
        name="gamma",
        repo=repo.path.as_uri(),
        ref="main",
        ref_type="branch",
        commit=pinned,
        provides=Provides(name="gamma", version="0.1"),  # as `lock update` reads it: a static version
        install=Install(env={"GAMMA_TARGET": "npu"}),  # kept under the entry's tool table, which uv passes over
    )
    pylock = tmp_path / "pylock.toml"
    pylock.write_text(export_pylock(Lock(version=2, name="pylock-vcs", platform=this_machine(), sources=(source,))))
    [entry] = Pylock.from_dict(tomllib.loads(pylock.read_text())).packages
    assert entry.vcs is not None and (entry.vcs.commit_id, entry.vcs.requested_revision) == (pinned, "main")
    assert entry.tool == {"envbuild": {"build-env": {"GAMMA_TARGET": "npu"}}}

    done = install(tmp_path, pylock, "venv")
    assert done.returncode == 0, done.stderr
    code = "import gamma, importlib.metadata as m; print(gamma.AT, m.version('gamma')); print(m.distribution('gamma').read_text('direct_url.json'))"
    at, direct_url = installed(tmp_path, "venv", code).splitlines()
    assert at == "pinned 0.1"
    assert json.loads(direct_url)["vcs_info"] == {"vcs": "git", "commit_id": pinned, "requested_revision": "main"}
