"""A lock's claim on an engine (or a cache's lock file) held by another process, as a running build,
check or bisect of the lock holds it (a real flock), and the work that must wait for it run beside, in a
thread."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Generic, TypeVar

from envbuild.engine.claim import EngineClaim
from envbuild.progress import Progress

T = TypeVar("T")

HOLD = (
    "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
    "print('held', flush=True); sys.stdin.read()"
)


@contextmanager
def held_elsewhere(claim: EngineClaim | Path) -> Iterator[None]:
    """``claim`` (or the lock file at a path) held alone by a child process for the block; its file made
    first, as its holder makes it."""
    if isinstance(claim, EngineClaim):
        with claim.waited(lambda _: None, "nobody"):
            pass
    path = claim.path if isinstance(claim, EngineClaim) else claim
    path.touch()
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        assert process.stdout.readline().strip() == "held"
        yield
    finally:
        process.stdin.close()
        process.wait(timeout=30)


class Beside(Generic[T]):
    """``work(say)`` started in a thread of its own; what it says is kept in ``said``."""

    def __init__(self, work: Callable[[Progress], T]) -> None:
        self.said: list[str] = []
        self._done: list[T] = []
        self._failed: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(work,))
        self.thread.start()

    def _run(self, work: Callable[[Progress], T]) -> None:
        try:
            self._done.append(work(self.said.append))
        except BaseException as exc:  # noqa: BLE001 - raised by result(), in the test's thread
            self._failed.append(exc)

    def waiting(self, timeout: float) -> str:
        """The line the work said it waits with (it must, within ``timeout`` s), once it has waited a
        second more without going on."""
        deadline = time.monotonic() + timeout
        while not (found := [line for line in self.said if line.startswith("waiting:")]):
            assert self.thread.is_alive(), f"it ended without waiting: {self.said[-5:]}"
            assert time.monotonic() < deadline, f"it said no wait in {timeout} s: {self.said[-5:]}"
            self.thread.join(0.05)
        self.thread.join(1.0)
        assert self.thread.is_alive(), "it went on beside the claim's holder"
        return found[0]

    def result(self, timeout: float) -> T:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"still running after {timeout} s"
        if self._failed:
            raise self._failed[0]
        return self._done[0]
