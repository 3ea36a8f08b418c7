"""A small, real lock to build images from: three git sources served by a real ``git daemon``, two tiny
wheels on a local PEP 691 index, and the test base image pinned by digest in the local registry.

- ``alpha``: a setuptools project (pyproject.toml), pinned by the tag ``v1.0``, installed editable;
- ``beta``: a setuptools project on branch ``main``, installed as a wheel built in the image;
- ``gamma``: plain files on branch ``main``, copied only (``install: none``);
- packages ``tinyone`` 1.0 and ``tinytwo`` 2.0 (wheels built by :func:`tests.lib.pyindex.make_wheel`),
  installed by the real uv wheel (the lock's ``installer``, :mod:`tests.lib.uvwheel`).

Everything builds offline: the base image has python3-setuptools, wheel and pip, the Dockerfile runs
the lock's uv with ``--no-index --no-build-isolation``. Used by ``tests/test_image_build.py`` (through
fixtures) and by ``benchmarks/bench_image.py`` (directly).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import platform
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.lock import Lock, Package, PackageFile, Source, write_lock
from envbuild.lock.model import BaseImage, Install, Platform
from tests.lib.gitrepos import Repo, Served, make_repo
from tests.lib.pyindex import PyIndex, make_wheel
from tests.lib.uvwheel import serve_uv, uv_installer

LOCK_NAME = "imagetest"
# Fixed by the lock, so a moved pin changes only its own layers (the default epoch, the newest
# pinned commit's date, would move with it).
EPOCH = 1767225600  # 2026-01-01
SOURCE_NAMES = ("alpha", "beta", "gamma")
WHEELS = (("tinyone", "1.0"), ("tinytwo", "2.0"))


def _project(name: str, version: str) -> dict[str, str]:
    return {
        "pyproject.toml": f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n\n'
        f'[tool.setuptools]\npackages = ["{name}"]\n',
        f"{name}/__init__.py": f'"""The {name} test project."""\nVERSION = "{version}"\n',
        "README.md": f"# {name}\n",
    }


def make_sources(base: Path) -> dict[str, Repo]:
    """The three upstream repositories under ``base`` (the directory a git daemon serves)."""
    repos = {name: make_repo(base / name) for name in SOURCE_NAMES}
    repos["alpha"].commit("alpha 1.0", files=_project("alpha", "1.0"))
    repos["alpha"].tag("v1.0", "HEAD")
    repos["beta"].commit("beta 0.1", files=_project("beta", "0.1"))
    repos["gamma"].commit("gamma data", files={"data/table.csv": "a,b\n1,2\n", "run.sh": "#!/bin/sh\necho gamma\n"})
    return repos


def make_wheels(directory: Path, owner: str) -> list[Path]:
    """The two tiny wheels, their METADATA naming ``owner`` (the test module), and the real uv wheel beside
    them (:mod:`tests.lib.uvwheel`): each module's packages
    layer is its own. BuildKit runs a step once for every build that has the identical step in flight,
    ``--no-cache`` or not; two modules building one packages step at once would share one run, which
    then proves nothing about reproducing it, and one of them would see none of its steps."""
    directory.mkdir(parents=True, exist_ok=True)
    serve_uv(directory)  # the lock's installer (ImageLockEnv.lock), served beside them
    return [make_wheel(directory, name, version, summary=f"a tiny wheel of {owner}") for name, version in WHEELS]


@dataclass
class ImageLockEnv:
    """Upstreams for one lock: ``url(name)`` maps a source name to its served URL."""

    repos: dict[str, Repo]
    urls: dict[str, str]
    index: PyIndex
    base_name: str  # "127.0.0.1:5000/envbuild-test/base:tag"
    base_digest: str
    arch: str = field(default_factory=platform.machine)
    python: str = "3.11"  # Debian bookworm's, in the test base image
    # Each source's recorded build requirements, by name (unrecorded by default, as a lock written before
    # `lock update` read them): a locked one is compiled in the packages step.
    build_requires: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def pins(self) -> dict[str, str]:
        return {
            "alpha": self.repos["alpha"].rev("v1.0^{commit}"),
            "beta": self.repos["beta"].rev("main"),
            "gamma": self.repos["gamma"].rev("main"),
        }

    def lock(
        self,
        *,
        name: str = LOCK_NAME,
        pins: dict[str, str] | None = None,
        packages: tuple[Package, ...] | None = None,
        installer: bool = True,
    ) -> Lock:
        """The lock of these upstreams; ``packages`` replaces the two tiny wheels (see :func:`served_packages`).
        Its installer is the real uv wheel for its arch where the index serves one (:func:`make_wheels` serves
        this machine's), unless
        ``installer=False``: then the base's pip installs."""
        pins = {**self.pins(), **(pins or {})}
        refs = {
            "alpha": ("v1.0", "tag", "editable"),
            "beta": ("main", "branch", "wheel"),
            "gamma": ("main", "branch", "none"),
        }
        sources = tuple(
            Source(
                name=n,
                repo=self.urls[n],
                ref=refs[n][0],
                ref_type=refs[n][1],
                commit=pins[n],  # type: ignore[arg-type]
                tree=self.repos[n].tree(pins[n]),
                install=Install(mode=refs[n][2]),
                build_requires=self.build_requires.get(n),
            )  # type: ignore[arg-type]
            for n in SOURCE_NAMES
        )
        if packages is None:
            packages = tuple(
                Package(name=n, version=v, files=(PackageFile(f.name, self.index.sha256(f.name)),))
                for n, v in WHEELS
                for f in [next(self.index.root.glob(f"{n}-{v}-*.whl"))]
            )
        wheels = sorted(self.index.root.glob(f"uv-*_{self.arch}*.whl")) if installer else []
        uv = uv_installer(wheels[0]) if wheels else None
        return Lock(
            version=1 if uv is None else 2,  # installer: a version 2 field
            name=name,
            sources=sources,
            platform=Platform(os="linux", arch=self.arch, python=self.python, cann="9.1.0"),  # type: ignore[arg-type]
            base_image=BaseImage(name=self.base_name, digest=self.base_digest),
            index=self.index.url,
            source_date_epoch=EPOCH,
            requirements=tuple(f"{p.name}=={p.version}" for p in packages),
            packages=packages,
            installer=uv,
        )

    def write(self, path: Path, lock: Lock | None = None) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_lock(path, lock or self.lock())
        return path


def served_packages(index: PyIndex) -> tuple[Package, ...]:
    """One package per wheel the index serves (its name and version from the file name), with the
    wheel's sha256 as the index lists it."""
    from packaging.utils import parse_wheel_filename

    packages = []
    for path in sorted(index.root.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        if name == "uv":
            continue  # the installer (ImageLockEnv.lock), not a package
        sha256 = index.hashes.get(path.name) or index.sha256(path.name)
        packages.append(Package(name=str(name), version=str(version), files=(PackageFile(path.name, sha256),)))
    return tuple(packages)


def with_source(lock: Lock, name: str, **changes: object) -> Lock:
    """The lock with one source's fields changed."""
    return dataclasses.replace(
        lock, sources=tuple(dataclasses.replace(s, **changes) if s.name == name else s for s in lock.sources)
    )


def with_file_hash(lock: Lock, package: str, sha256: str) -> Lock:
    return dataclasses.replace(
        lock,
        packages=tuple(
            dataclasses.replace(p, files=tuple(dataclasses.replace(f, sha256=sha256) for f in p.files))
            if p.name == package
            else p
            for p in lock.packages
        ),
    )


@contextmanager
def lock_env(
    base: Path, url: Callable[[str], str], wheels: Path, owner: str, base_name: str, base_digest: str
) -> Iterator[ImageLockEnv]:
    """The three sources made under ``base`` (a directory a git daemon serves; ``url`` names a source's URL
    there), the two tiny wheels of ``owner`` (and uv) made in ``wheels`` and served by a local index, on the
    given base image."""
    repos = make_sources(base)
    make_wheels(wheels, owner)
    with PyIndex(wheels) as index:
        yield ImageLockEnv(repos, {name: url(name) for name in repos}, index, base_name, base_digest)


@contextmanager
def served_env(served: Served, under: str, base_name: str, base_digest: str, wheels: Path) -> Iterator[ImageLockEnv]:
    """:func:`lock_env` under ``<served.base>/<under>``, served by the session's git daemon."""
    url = lambda name: served.url(f"{under}/{name}", "daemon-filter")  # noqa: E731
    with lock_env(served.base / under, url, wheels, under, base_name, base_digest) as env:
        yield env


def old_tinyone_wheel(directory: Path) -> Path:
    """tinyone 0.9: a module 1.0 no longer has and a console script, to install into a base that a lock
    with tinyone 1.0 then replaces."""
    info = "tinyone-0.9.dist-info"
    files = {
        "tinyone/__init__.py": b"__version__ = '0.9'\n",
        "tinyone/old_only.py": b"GONE_IN = '1.0'\n",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: tinyone\nVersion: 0.9\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: imagelock\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": b"[console_scripts]\ntinyone-old = tinyone.old_only:main\n",
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()
    )
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tinyone-0.9-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path
