"""verl's Hydra config tree (``verl/trainer/config``) for the verl wheel a lock pins.

The only module of envrun that talks to a package index. The wheel is fetched once, checked
against the lock's sha256, and only ``verl/trainer/config/**`` is kept, in
``<cache_dir>/verl-config/<sha256>/``: keyed by content, so two locks pinning the same wheel share it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

import requests
from packaging.utils import canonicalize_name

from envbuild.errors import CacheError, InputError, RemoteError
from envbuild.lock.model import Lock

CONFIG_PREFIX = "verl/trainer/config/"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class VerlWheel:
    """The verl wheel whose config the run validates against."""

    name: str
    version: str
    filename: str
    sha256: str
    index: str  # PEP 691 index serving it


def verl_wheel_from_lock(lock: Lock, lock_file: str, package: str = "verl") -> VerlWheel:
    """The lock's pinned wheel of ``package``; an error naming the fix when the lock has none."""
    wanted = canonicalize_name(package)
    for pkg in lock.packages:
        if canonicalize_name(pkg.name) == wanted:
            wheels = [f for f in pkg.files if f.filename.endswith(".whl")]
            if not wheels:
                raise InputError(f"{lock_file}: packages: {pkg.name} {pkg.version} lists no wheel; "
                                 "add its py3-none-any wheel with its sha256 (`envbuild lock`)")
            # A pure-Python wheel first: its config tree is the same on every platform.
            wheel = sorted(wheels, key=lambda f: (not f.filename.endswith("-none-any.whl"), f.filename))[0]
            return VerlWheel(pkg.name, pkg.version, wheel.filename, wheel.sha256, lock.index_for(pkg))
    raise InputError(f"{lock_file}: packages: no {package} entry; the recipe's overrides are validated "
                     f"against the {package} wheel the lock pins (re-lock with `envbuild lock`, or pass --verl-config DIR)")


def verl_config_dir(wheel: VerlWheel, cache_dir: Path, *, offline: bool = False,
                    progress: Callable[[str], None] = lambda _m: None,
                    session: requests.Session | None = None) -> Path:
    """``.../verl/trainer/config`` extracted from ``wheel``, downloading it into the cache when needed."""
    root = Path(cache_dir) / "verl-config" / wheel.sha256
    config_dir = root / CONFIG_PREFIX
    if (root / ".complete").is_file():
        return config_dir
    if offline:
        raise InputError(f"{wheel.filename}: not in the cache ({root}) and --offline was given; "
                         "run once online or pass --verl-config DIR")
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent, prefix=".tmp-") as tmp:
            wheel_path = Path(tmp) / wheel.filename
            url = _wheel_url(wheel, session or requests.Session())
            progress(f"downloading {wheel.filename} for its config schema")
            _download(url, wheel_path, wheel.sha256, session or requests.Session())
            staging = Path(tmp) / "tree"
            _extract_config(wheel_path, staging, wheel.filename)
            (staging / ".complete").write_text(f"{wheel.filename}\n", encoding="utf-8")
            if root.exists():  # a half-written tree from an interrupted run
                shutil.rmtree(root)
            os.replace(staging, root)
    except OSError as exc:
        raise CacheError(f"{root}: cannot write the verl config cache: {exc.strerror or exc}") from None
    return config_dir


def _wheel_url(wheel: VerlWheel, session: requests.Session) -> str:
    page = f"{wheel.index.rstrip('/')}/{canonicalize_name(wheel.name)}/"
    try:
        response = session.get(page, headers={"Accept": _SIMPLE_JSON}, timeout=60)
        response.raise_for_status()
        files = response.json()["files"]
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        raise RemoteError(f"{page}: cannot list {wheel.name}'s files: {exc}") from None
    for entry in files:
        if entry.get("filename") == wheel.filename:
            listed = (entry.get("hashes") or {}).get("sha256")
            if listed and listed != wheel.sha256:
                raise RemoteError(f"{page}: {wheel.filename} has sha256 {listed}, the lock pins {wheel.sha256}")
            return requests.compat.urljoin(page, entry["url"])
    raise RemoteError(f"{page}: the index does not serve {wheel.filename}")


def _download(url: str, dest: Path, sha256: str, session: requests.Session) -> None:
    digest = hashlib.sha256()
    try:
        with session.get(url, stream=True, timeout=60) as response:
            response.raise_for_status()
            with dest.open("wb") as out:
                for chunk in response.iter_content(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    except requests.RequestException as exc:
        raise RemoteError(f"{url}: download failed: {exc}") from None
    if digest.hexdigest() != sha256:
        raise RemoteError(f"{url}: sha256 {digest.hexdigest()} does not match the lock's {sha256}")


def _extract_config(wheel_path: Path, dest: Path, name: str) -> None:
    """Extract only the config tree, refusing any member that would land outside ``dest``."""
    try:
        with zipfile.ZipFile(wheel_path) as archive:
            members = [m for m in archive.infolist() if m.filename.startswith(CONFIG_PREFIX) and not m.is_dir()]
            if not members:
                raise InputError(f"{name}: holds no {CONFIG_PREFIX}; is it a verl wheel?")
            for member in members:
                parts = PurePosixPath(member.filename).parts
                if ".." in parts or member.filename.startswith("/") or "\\" in member.filename:
                    raise RemoteError(f"{name}: refusing member {member.filename!r} (path escape)")
                target = dest.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
    except zipfile.BadZipFile as exc:
        raise RemoteError(f"{name}: not a valid wheel: {exc}") from None
