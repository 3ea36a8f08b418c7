"""The lockfile: model, strict reading, canonical writing, schema, diff and export. No network, no git."""

from envbuild.lock.io import (
    LockFile,
    LockWriteRefused,
    checked_lock_text,
    dump_lock,
    parse_lock,
    read_lock,
    write_lock,
)
from envbuild.lock.model import (
    LOCK_VERSION,
    PYPI_SIMPLE,
    BaseImage,
    Install,
    Lock,
    Package,
    PackageFile,
    Platform,
    Source,
)

__all__ = [
    "LOCK_VERSION",
    "PYPI_SIMPLE",
    "BaseImage",
    "Install",
    "Lock",
    "Package",
    "PackageFile",
    "Platform",
    "Source",
    "LockFile",
    "LockWriteRefused",
    "checked_lock_text",
    "dump_lock",
    "read_lock",
    "parse_lock",
    "write_lock",
]
