"""Who is using an engine, among envbuild's processes on this machine: a prune of BuildKit's cache never
runs beside another build.

Docker 20.10's BuildKit can keep a step in its cache whose layer's directory is gone; every build that
prepares a step on it then fails (:class:`~envbuild.engine.buildkit.LostLayer`) until that cache is
emptied. It was seen with a prune running beside a step of the same build (why the tidying comes after
the build), and in test runs that build from two workers on one engine, each pruning after its builds
(docs/image.md has the runs). What leaves it is not known for sure; a prune beside other work on the
cache is the one suspect seen. So each build holds its engine's claim *shared* while it uses the engine
(its steps, its in-image check, its removals), and prunes only if it can take the claim *alone* without
waiting. One that cannot leaves the prune to the next build that finds the engine free (it says so): no
build waits for another's end. A build that meets the fault anyway empties the cache, alone, and builds
again (:func:`envbuild.image.cache.retention.empty_build_cache`).

A lock's builds, checks and bisects hold claims of their own alone, on the engine and the lock's name
(:func:`lock_claims`): a build while it uses the engine, since the tags it builds under and tidies are the
lock's (:mod:`envbuild.image.cache.scratch`); ``envbuild check`` for the whole check, since the tags it
compares under are too (:func:`envbuild.check.run.previous_reference`); ``envbuild bisect`` for the whole
bisect, since ``--run`` is handed each candidate by the lock's tag. A second one of the lock waits for the
first, from any cache directory.

The claim is a ``flock`` on a file named by the engine's address (and the lock's name), in a private
directory of this user's (``$TMPDIR/envbuild-<uid>/``): it keeps apart the builds of one user on one
machine. Builds by another user, by another machine through ``tcp://`` or ``ssh://``, or by ``docker
build`` itself are not seen."""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Literal

from envbuild.errors import EnvbuildError
from envbuild.locking import flock_fd
from envbuild.progress import Progress


def claims_dir() -> Path:
    """This user's directory of engine claims, made 0700 if missing; one that is not a directory of this
    user's (a link, another user's) is refused rather than used."""
    directory = Path(tempfile.gettempdir()) / f"envbuild-{os.getuid()}"
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(directory)
    except OSError as exc:
        raise EnvbuildError(f"{directory}: cannot make the directory of engine claims: {exc.strerror}") from None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
        raise EnvbuildError(
            f"{directory}: not a private directory of this user's (mode {stat.filemode(found.st_mode)}, "
            f"owner {found.st_uid}): remove it, or set TMPDIR elsewhere"
        )
    return directory


LockWork = Literal["build", "check", "bisect"]


class EngineClaim:
    """The claim on the engine at ``address`` (its ``DOCKER_HOST``), held shared or alone; with ``of``, the
    claim of one lock's builds, checks or bisects on the engine (``("build", lock name)``, …), held alone
    (:meth:`waited`)."""

    def __init__(self, address: str, directory: Path | None = None, *, of: tuple[LockWork, str] | None = None) -> None:
        named = address if of is None else f"{address}\0{of[1]}"
        key = hashlib.sha256(named.encode()).hexdigest()[:16]
        self.address = address
        self.path = (directory or claims_dir()) / f"{'engine' if of is None else of[0]}-{key}.lock"

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise EnvbuildError(f"{self.path}: cannot open the claim on {self.address}: {exc.strerror}") from None

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Held beside other builds; waits only while one prunes (seconds at most)."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # the lock goes with it

    @contextmanager
    def alone(self) -> Iterator[bool]:
        """True, and held alone, if no other build holds the claim now; False (nothing held) if one does."""
        fd = self._open()
        try:
            yield flock_fd(fd, fcntl.LOCK_EX, blocking=False)
        finally:
            os.close(fd)

    @contextmanager
    def waited(self, say: Progress, holder: str) -> Iterator[None]:
        """Held alone for the block, waiting as long as ``holder`` (what holds it, said while waiting) does."""
        fd = self._open()
        try:
            flock_fd(fd, fcntl.LOCK_EX, waiting=lambda: say(f"waiting: {holder} holds {self.path}"))
            yield
        finally:
            os.close(fd)


@contextmanager
def lock_claims(address: str, work: LockWork, lock_names: Iterable[str], say: Progress, what: str) -> Iterator[None]:
    """The claims of ``work`` (``what``, in words) on each of ``lock_names`` on the engine at ``address``,
    held alone for the block; taken in the names' order, so two holders never wait for each other."""
    with ExitStack() as held:
        for name in sorted(set(lock_names)):
            claim = EngineClaim(address, of=(work, name))
            held.enter_context(claim.waited(say, f"another {what} of {name} on {address}"))
        yield
