"""verl's Hydra config tree (``verl/trainer/config``) for the verl wheel a lock pins.

The wheel comes through envbuild's index client and file cache (fetched once, checked against the
lock's sha256), and only ``verl/trainer/config/**`` is kept, in
``<cache_dir>/verl-config/<sha256>/``: keyed by content, so two locks pinning the same wheel share it.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.utils import canonicalize_name

from envbuild.errors import CacheError, InputError, RemoteError
from envbuild.index.client import IndexClient
from envbuild.index.filecache import FileCache
from envbuild.lock.model import Lock
from envbuild.progress import Progress, silent

CONFIG_PREFIX = "verl/trainer/config/"


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
                raise InputError(
                    f"{lock_file}: packages: {pkg.name} {pkg.version} lists no wheel; "
                    "add its py3-none-any wheel with its sha256 (`envbuild lock`)"
                )
            # A pure-Python wheel first: its config tree is the same on every platform.
            wheel = sorted(wheels, key=lambda f: (not f.filename.endswith("-none-any.whl"), f.filename))[0]
            return VerlWheel(pkg.name, pkg.version, wheel.filename, wheel.sha256, lock.index_for(pkg))
    raise InputError(
        f"{lock_file}: packages: no {package} entry; the recipe's overrides are validated "
        f"against the {package} wheel the lock pins (re-lock with `envbuild lock`, or pass --verl-config DIR)"
    )


def verl_config_dir(
    wheel: VerlWheel,
    cache_dir: Path,
    *,
    offline: bool = False,
    progress: Progress = silent,
    client: IndexClient | None = None,
) -> Path:
    """``.../verl/trainer/config`` extracted from ``wheel``, downloading it into the cache when needed.
    The wheel goes through the same content-addressed file cache as the image builder's package files,
    so it is downloaded once and checked against the lock's sha256 before anything reads it."""
    root = Path(cache_dir) / "verl-config" / wheel.sha256
    config_dir = root / CONFIG_PREFIX
    if (root / ".complete").is_file():
        return config_dir
    files = FileCache(Path(cache_dir))
    wheel_path = files.get(wheel.sha256)
    if wheel_path is None:
        if offline:
            raise InputError(
                f"{wheel.filename}: not in the cache ({root}) and --offline was given; "
                "run once online or pass --verl-config DIR"
            )
        client = client or IndexClient()
        listed = client.project(wheel.index, wheel.name).file(wheel.filename)
        if listed is None:
            raise RemoteError(f"{wheel.index}: the index does not serve {wheel.filename}")
        if listed.sha256 and listed.sha256 != wheel.sha256:
            raise RemoteError(
                f"{wheel.index}: {wheel.filename} has sha256 {listed.sha256}, the lock pins {wheel.sha256}"
            )
        progress(f"downloading {wheel.filename} for its config schema")
        wheel_path = files.fetch(listed.url, wheel.sha256, wheel.filename, client.download)
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent, prefix=".tmp-") as tmp:
            staging = Path(tmp) / "tree"
            _extract_config(wheel_path, staging, wheel.filename)
            (staging / ".complete").write_text(f"{wheel.filename}\n", encoding="utf-8")
            if root.exists():  # a half-written tree from an interrupted run
                shutil.rmtree(root)
            staging.replace(root)
    except OSError as exc:
        raise CacheError(f"{root}: cannot write the verl config cache: {exc.strerror or exc}") from None
    return config_dir


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
