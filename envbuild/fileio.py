"""Writing files atomically, opening a file someone named, and hashing files: the file primitives every
writer and reader shares.

``write_atomic`` is the only way envbuild replaces a file that someone else may read at the same time
(a lock, a cache map, a build record, a report, a run's status): the data goes to a temporary file with
a unique name in the same directory, is flushed, and is renamed over the target, so a reader sees the
old file or the new one, never half of one. On any failure (a full disk, an interrupt) the temporary
file is removed and the target is left as it was.

``open_regular`` is the only way envbuild and envrun open a file a user named (a lock, the config file,
a recipe, a cluster file, a check history, a training file): a FIFO with no writer would block a plain
``open`` forever, and a device never ends or waits for input, so the path is opened with ``O_NONBLOCK``
(which no open of a FIFO or device waits through) and what was opened is judged by ``fstat``: anything
but a regular file is refused before one byte is read.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_CHUNK = 1 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


class NotRegularFileError(OSError):
    """A path named a FIFO, a device, a socket or a directory where a file was to be read. An
    ``OSError``, so a caller that reports ``cannot read`` problems reports this one too; its text is
    ``FILE: not a regular file (a FIFO)``."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        self.reason = f"not a regular file ({kind})"
        super().__init__(errno.EINVAL, self.reason)
        self.filename = os.fspath(path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.reason}"


def file_kind(mode: int) -> str:
    """What a non-regular file is, for a message: ``a FIFO``, ``a character device``, ..."""
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "an unknown kind of file"


@contextmanager
def open_regular(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """``path`` opened for binary reading if it is a regular file (a symlink to one included);
    :class:`NotRegularFileError` otherwise, before anything is read, and never a wait: the open itself
    cannot block. The null device is the one exception, read as the empty file it is: naming it is how a
    user says "no config" (as ``PIP_CONFIG_FILE=/dev/null`` does for pip)."""
    fd = os.open(path, _READ_FLAGS)
    try:
        info = os.fstat(fd)  # the file actually opened, whatever the name pointed at a moment before
        if not stat.S_ISREG(info.st_mode) and not _is_null_device(info):
            raise NotRegularFileError(path, file_kind(info.st_mode))
        os.set_blocking(fd, True)  # a regular file never waits; reads go on as for any file
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def _is_null_device(info: os.stat_result) -> bool:
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(info.st_mode) and stat.S_ISCHR(null.st_mode) and info.st_rdev == null.st_rdev


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` (``str`` is written as UTF-8) in one rename; ``mode`` sets the
    permission bits (default: what ``mkstemp`` gives, 0600, widened to 0644 as ``open`` would under the
    usual umask)."""
    with atomic_output(path, mode=mode) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextmanager
def atomic_output(path: str | os.PathLike[str], *, mode: int | None = None, durable: bool = True) -> Iterator[BinaryIO]:
    """A binary file to stream into; it replaces ``path`` when the block ends normally, and is removed
    (``path`` untouched) when the block raises. ``durable=False`` skips the fsync, for scratch files
    of many GB that nobody reads after a crash."""
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:  # a directory missing or unwritable: said of the file asked for, not of our temporary
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode if mode is not None else 0o644 & ~_UMASK)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a regular file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open_regular(path) as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def content_mtime_ns(digest: bytes) -> int:
    """An mtime (nanoseconds, between 2001 and 2033) that differs whenever the content (``digest``) does:
    what the docker CLI compares to send only changed files (with the size and mode)."""
    return 10**18 + int.from_bytes(digest[:8], "big") % 10**18


def settle_tree(
    root: Path,
    *,
    dir_ns: int,
    file_ns: Callable[[Path], int],
    read_only: Callable[[Path], bool] = lambda path: False,
) -> None:
    """Fixed modes and mtimes for everything below ``root`` and ``root`` itself: directories 0755 at
    ``dir_ns``, links at ``dir_ns`` (never followed), files 0755 when executable and 0644 otherwise at
    ``file_ns(path)``; a ``read_only`` file 0444 (0555 when executable) with its times as they are (a hard
    link into a cache).
    Children first: writing into a directory moves its mtime."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames + dirnames:
            path = Path(dirpath, name)
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                os.utime(path, ns=(dir_ns, dir_ns), follow_symlinks=False)
            elif stat.S_ISDIR(info.st_mode):
                path.chmod(0o755)
                os.utime(path, ns=(dir_ns, dir_ns))
            elif read_only(path):
                path.chmod(0o555 if info.st_mode & stat.S_IXUSR else 0o444)
            else:
                path.chmod(0o755 if info.st_mode & stat.S_IXUSR else 0o644)
                stamp = file_ns(path)
                os.utime(path, ns=(stamp, stamp))
    root.chmod(0o755)
    os.utime(root, ns=(dir_ns, dir_ns))


def link_or_copy(source: Path, target: Path) -> None:
    """Hard-link ``source`` at ``target`` (cheap for multi-GB wheels); across file systems, a copy that
    keeps its mode and times, as the link would."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _read_umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


# Read once, at import (single-threaded then): os.umask can only be read by setting it.
_UMASK = _read_umask()
