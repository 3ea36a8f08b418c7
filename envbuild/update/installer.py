"""`lock update --installer`: pin the uv that installs the lock's packages into the image.

The version is the uv this envbuild runs (its own dependency, the one that resolved the closure), its
wheel for the lock's platform taken from the lock's index and pinned by sha256, as every package file.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from envbuild.errors import InputError, RemoteError
from envbuild.index.client import IndexClient
from envbuild.lock.model import Lock, Package
from envbuild.progress import Progress, silent
from envbuild.update.resolve import pin_files, select_files

INSTALLER = "uv"


def pin_installer(lock: Lock, *, client: IndexClient | None = None, progress: Progress = silent) -> Package:
    """uv at the version envbuild runs, its wheel(s) for ``lock.platform`` from the lock's index; the pins
    of a file the lock already records are kept as they are."""
    if lock.platform is None:
        raise InputError(f"lock {lock.name!r} has no platform: the installer's wheel is chosen for one")
    try:
        wanted = version(INSTALLER)
    except PackageNotFoundError:
        raise InputError("uv is not installed beside envbuild (it is a dependency: reinstall envbuild)") from None
    package = Package(name=INSTALLER, version=wanted)
    index = lock.index_for(package)
    client = client or IndexClient()
    page = client.project(index, INSTALLER)
    wheels = [f for f in select_files(page.files, INSTALLER, wanted, lock.platform) if f.filename.endswith(".whl")]
    if not wheels:
        raise RemoteError(
            f"{index} serves no wheel of uv {wanted} for {lock.platform.arch} (the image's installer is run "
            "from its wheel)"
        )
    pinned = lock.installer.files if lock.installer else ()
    known = {(f.filename, f.sha256): f.metadata_sha256 for f in pinned if f.metadata_sha256}
    files = pin_files(wheels, client, index, known, progress)
    progress(f"installer: uv {wanted} ({', '.join(f.filename for f in files)})")
    return Package(name=INSTALLER, version=wanted, files=files)
