"""The lock's installer: the ``uv`` binary, read from the lock's uv wheel, for the packages step and each
source's step.

The wheel is the file the lock pins by sha256 (checked when it entered the file cache); the binary is
the one member ``uv-<version>.data/scripts/uv``, whose bytes are checked against the wheel's own RECORD as
they are read. It goes into the steps' bind mounts and nowhere else: in no layer. Read once per wheel
(0.2 s for uv's 38 MB) and kept in the cache by the wheel's sha256 (:func:`uv_binary_file`), so a build
links it into its context, and the docker CLI, which syncs by size, mode and mtime, sends it once.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

from envbuild.errors import InputError
from envbuild.fileio import write_atomic
from envbuild.image.plan import FilePlan

MAX_BINARY = 512 * 2**20  # uv's binary is ~40 MB; a member claiming more is not uv's
BINARY_NAME = "uv"


def binaries_dir(cache_dir: Path) -> Path:
    """Where the installers' binaries are kept: ``<cache>/image/installer/<wheel sha256>/uv``."""
    return cache_dir / "image" / "installer"


def uv_binary_file(wheel: Path, installer: FilePlan, directory: Path) -> Path:
    """The ``uv`` of ``wheel`` as a file under ``directory`` (:func:`binaries_dir`), named by the wheel's
    sha256: made once, by one rename of the checked bytes (a build interrupted mid-write leaves no file),
    read-only and executable."""
    path = directory / installer.sha256 / BINARY_NAME
    if not path.is_file():
        data = uv_binary(wheel, installer)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data, mode=0o555)
    return path


def uv_binary(wheel: Path, installer: FilePlan) -> bytes:
    """The ``uv`` executable inside ``wheel`` (the lock's ``installer`` file), checked against RECORD."""
    member = f"uv-{installer.version}.data/scripts/uv"
    where = f"installer {installer.package} {installer.version}: {installer.filename}"
    record_name = f"uv-{installer.version}.dist-info/RECORD"
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
            missing = [name for name in (member, record_name) if name not in names]
            if missing:
                raise InputError(f"{where}: the wheel has no {missing[0]}: not a uv wheel envbuild can run")
            record = archive.read(record_name).decode("utf-8", "replace")
            expected = next((row for row in csv.reader(io.StringIO(record)) if row and row[0] == member), None)
            info = archive.getinfo(member)
            if info.file_size > MAX_BINARY:
                raise InputError(f"{where}: {member} claims {info.file_size} bytes")
            data = archive.read(member)
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise InputError(f"{where}: cannot read the wheel: {exc}") from None
    if expected is None or len(expected) < 2 or not expected[1].startswith("sha256="):
        raise InputError(f"{where}: its RECORD gives no sha256 for {member}")
    actual = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if expected[1] != f"sha256={actual}":
        raise InputError(f"{where}: {member} does not match the wheel's RECORD")
    return data
