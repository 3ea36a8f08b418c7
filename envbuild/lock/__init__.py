"""The lockfile: model, strict reading, canonical writing, schema, diff and export. No network, no git."""

from envbuild.lock.io import LockFile, dump_lock, parse_lock, read_lock, write_lock
from envbuild.lock.model import BaseImage, Lock, Package, PackageFile, Platform, Source

__all__ = [
    "BaseImage",
    "Lock",
    "Package",
    "PackageFile",
    "Platform",
    "Source",
    "LockFile",
    "dump_lock",
    "read_lock",
    "parse_lock",
    "write_lock",
]
