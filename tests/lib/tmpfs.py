"""A small disk of a test's own: a tmpfs it mounts (root needed: outside CI the test skips without it, in CI
it fails) and unmounts after, to make a cache full or read-only for real; and what a failed write into a
cache may leave behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lib.services import in_ci

KiB, MiB = 1 << 10, 1 << 20


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise OSError(proc.stderr.strip() or f"mount exited {proc.returncode}")


@dataclass
class Tmpfs:
    """A tmpfs mounted at ``path`` by this test, and only by it."""

    path: Path

    def remount(self, options: str) -> None:
        """``ro``, ``rw``, ``size=N``: the same disk, now so."""
        _mount("-o", f"remount,{options}", str(self.path))

    def resize(self, size: int) -> None:
        self.remount(f"size={size}")

    def free(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int) -> Path:
        """Fill the disk with one file until ``leave`` bytes (rounded to pages) stay free."""
        filler = self.path / "filler"
        with open(filler, "wb") as out, contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * 64 * KiB)
                out.flush()
        with open(filler, "r+b") as out:
            out.truncate(max(0, filler.stat().st_size - leave))
        return filler


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: int, inodes: int | None = None) -> Iterator[Tmpfs]:
    """A tmpfs of ``size`` bytes (and ``inodes`` files, when given) at ``path``, made here, for the block."""
    path.mkdir()
    options = f"size={size},mode=0755" + (f",nr_inodes={inodes}" if inodes else "")
    try:
        _mount("-t", "tmpfs", "-o", options, "tmpfs", str(path))
    except OSError as exc:
        reason = f"cannot mount a tmpfs (root needed): {exc}"
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    try:
        yield Tmpfs(path)
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def leftovers(root: Path) -> list[str]:
    """What a failed write into a cache may leave: temporary packs, quarantines, lock files, temporary files."""
    names = ("tmp_*", "incoming-*", "tmp_objdir-*", "*.lock", ".tmp-*", ".*.tmp", "pack-*.keep")
    return sorted(str(p.relative_to(root)) for pattern in names for p in root.rglob(pattern))
