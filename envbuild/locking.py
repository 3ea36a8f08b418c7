"""The one way envbuild serialises writers to a cache (an ``fcntl.flock`` on a lock file; shared by
readers that only keep a writer such as a pruner away), and the one way a failed cache write is
reported.

The kernel releases a flock when the last descriptor of its open file is closed, so a killed process
never leaves a cache locked; what it half-wrote is for the next holder to clear up. A child that
inherits the descriptor (a ``git fetch`` writing into the cache) keeps the lock held until it, too,
is gone, so nobody clears up under a writer that outlived its parent.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from envbuild.errors import CacheError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@contextmanager
def file_lock(
    path: Path, *, blocking: bool = True, shared: bool = False, waiting: Callable[[], None] | None = None
) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if absent), or with ``shared=True`` one that other
    shared holders may hold too (an exclusive one waits for them all). Yields True when held; with
    ``blocking=False`` yields False at once when another process holds it. ``waiting`` is called once,
    before the wait, when another process holds it (to say so)."""
    with held_lock(path, blocking=blocking, shared=shared, waiting=waiting) as fd:
        yield fd is not None


@contextmanager
def held_lock(
    path: Path,
    *,
    blocking: bool = True,
    shared: bool = False,
    waiting: Callable[[], None] | None = None,
) -> Iterator[int | None]:
    """Like :func:`file_lock`, yielding the locked descriptor (None when not held), for a child
    process that must hold the lock as long as it lives (``pass_fds``). ``waiting``: as :func:`file_lock`
    says (called when another process held the lock first, and this one waits for it)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if is_no_space(exc):
            raise cache_fault(path.parent, exc) from None
        raise CacheError(f"{path}: cannot open the cache lock: {exc.strerror}") from None
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        yield fd if flock_fd(fd, mode, blocking=blocking, waiting=waiting) else None
    finally:
        os.close(fd)  # closing releases the lock, unless a child still holds the descriptor


def flock_fd(fd: int, mode: int, *, blocking: bool = True, waiting: Callable[[], None] | None = None) -> bool:
    """``flock`` the open file ``fd`` in ``mode`` (``LOCK_SH`` or ``LOCK_EX``); True once held. When another
    process holds it: False at once unless ``blocking``, else ``waiting`` is called once and it is waited
    for."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if not blocking:
            return False
    if waiting is not None:
        waiting()
    fcntl.flock(fd, mode)
    return True


def is_no_space(exc: OSError) -> bool:
    return exc.errno in _NO_SPACE


def cache_fault(directory: Path, exc: OSError) -> CacheError:
    """The one-line error for a failed write into the cache at ``directory``."""
    if is_no_space(exc):
        return CacheError(f"no space left in the cache ({directory})")
    return CacheError(f"{directory}: cannot write to the cache: {exc.strerror or exc}")
