"""The one way envbuild serialises writers to a cache: an ``fcntl.flock`` on a lock file.

The kernel releases a flock when its holder dies, however it dies, so a killed process never leaves a
cache locked; what it half-wrote is for the next holder to clear up.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from envbuild.errors import CacheError


@contextmanager
def file_lock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if absent). Yields True when held; with
    ``blocking=False`` yields False at once when another process holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise CacheError(f"{path}: cannot open the cache lock: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock
