"""A wheel's own core metadata, ``<name>-<version>.dist-info/METADATA``, read from its zip.

Used wherever a wheel's metadata is read: by verify's closure check (from the file cache or by range
requests), by ``lock update`` (which pins its sha256) and by fetch (which compares a downloaded wheel's
METADATA with that pin). Every read of the archive is bounded (:mod:`envbuild.index.boundedzip`).
"""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from typing import BinaryIO

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from envbuild.errors import EnvbuildError
from envbuild.index.boundedzip import MAX_READ, ZipBoundError, open_zip

MAX_METADATA = 4 << 20  # a wheel's METADATA is kilobytes; a description may make it larger, not this


class MetadataError(EnvbuildError):
    """A file's core metadata cannot be read or is not the package's."""


def metadata_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_wheel_metadata(handle: BinaryIO, filename: str, *, max_read: int = MAX_READ) -> bytes:
    """``<name>-<version>.dist-info/METADATA`` of a wheel (a seekable file; remote reads stay small). No
    read of the archive may ask for more than ``max_read`` bytes (:mod:`envbuild.verify.boundedzip`)."""
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise MetadataError(str(exc)) from None
    try:
        with handle, open_zip(handle, filename, max_read) as wheel:
            members = [i for i in wheel.infolist() if _is_metadata(i.filename)]
            chosen = [i for i in members if _dist_info_matches(i.filename, name)] or members
            if len(chosen) != 1:
                raise MetadataError(f"{len(chosen)} *.dist-info/METADATA members, expected one")
            info = chosen[0]
            if info.file_size > MAX_METADATA:
                raise MetadataError(f"{info.filename} is {info.file_size} bytes; refused")
            with wheel.open(info) as member:
                return member.read(MAX_METADATA + 1)[:MAX_METADATA]
    except ZipBoundError as exc:
        raise MetadataError(str(exc).removeprefix(f"{filename}: ")) from None
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, ValueError, OverflowError) as exc:
        raise MetadataError(f"not a readable wheel: {exc}") from None
    except OSError as exc:
        raise MetadataError(f"cannot read the wheel: {exc}") from None


def _is_metadata(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "METADATA"


def _dist_info_matches(name: str, project: str) -> bool:
    stem = name.split("/")[0][: -len(".dist-info")]
    return canonicalize_name(stem.rsplit("-", 1)[0]) == project
