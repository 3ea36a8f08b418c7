"""Writing files atomically and hashing them: the two file primitives every writer and reader shares.

``write_atomic`` is the only way envbuild replaces a file that someone else may read at the same time
(a lock, a cache map, a build record, a report, a run's status): the data goes to a temporary file with
a unique name in the same directory, is flushed, and is renamed over the target, so a reader sees the
old file or the new one, never half of one. On any failure (a full disk, an interrupt) the temporary
file is removed and the target is left as it was.
"""

from __future__ import annotations

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
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
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
    """The sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
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
    ``file_ns(path)``; a ``read_only`` file 0444 with its times as they are (a hard link into a cache).
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
                path.chmod(0o444)
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
