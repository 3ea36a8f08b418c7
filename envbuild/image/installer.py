"""The lock's installer in the packages step: the ``uv`` binary, read from the lock's uv wheel.

The wheel is the file the lock pins by sha256 (checked when it entered the file cache); the binary is
the one member ``uv-<version>.data/scripts/uv``, whose bytes are checked against the wheel's own RECORD as
they are read. It goes into the packages step's bind mount and nowhere else: in no layer.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

from envbuild.errors import InputError
from envbuild.image.plan import FilePlan

MAX_BINARY = 512 * 2**20  # uv's binary is ~40 MB; a member claiming more is not uv's


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
