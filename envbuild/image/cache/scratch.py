"""What a running ``envbuild image`` holds under ``<cache_dir>/image``, and what a killed one left there.

- ``work/build-*``: one scratch directory per running build (the context; an archive kept for
  ``envbuild check``), held by an ``flock`` on ``work/build-*.lock``; removed when the build ends,
  however it ends (an exception or Ctrl-C unwinds through it); the ones a killed build left behind
  (their lock no longer held) are removed by the next build on its way in. ``work/check-*``: the same
  for a running ``envbuild check`` (its build records, the two images it saves to explain a mismatch).
- ``locks/<lock name>.lock``: held while a build of that lock uses the engine and this cache (its sync
  directories, :func:`envbuild.image.stream.sync_dir`), with the lock's build claim on the engine
  (:func:`~envbuild.engine.claim.lock_claims`): the tags a build reads from and tidies are the lock's on
  that engine (:mod:`.retention`), so two builds of one lock, from one cache or two, take turns.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from envbuild.engine.claim import lock_claims
from envbuild.locking import file_lock
from envbuild.progress import Progress


@contextmanager
def context_dir(cache_dir: Path, *, prefix: str = "build-") -> Iterator[Path]:
    """A scratch directory under ``<cache_dir>/image/work``, held by an flock while in use; the ones a
    killed build or check left behind (their lock no longer held) are removed on the way in."""
    root = cache_dir / "image" / "work"
    root.mkdir(parents=True, exist_ok=True)
    remove_abandoned(cache_dir)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    lock_file = work.with_name(work.name + ".lock")
    try:
        with file_lock(lock_file, blocking=True):
            yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        lock_file.unlink(missing_ok=True)


def remove_abandoned(cache_dir: Path) -> None:
    """The scratch directories killed builds and checks left behind (their lock no longer held)."""
    for lock_file in (cache_dir / "image" / "work").glob("*.lock"):
        with file_lock(lock_file, blocking=False) as held:
            if held:
                shutil.rmtree(lock_file.with_suffix(""), ignore_errors=True)
                lock_file.unlink(missing_ok=True)


@contextmanager
def lock_name_held(cache_dir: Path, lock_name: str, engine_address: str, say: Progress) -> Iterator[None]:
    """Hold ``<cache_dir>/image/locks/<lock name>.lock`` and the lock's build claim on the engine at
    ``engine_address``, waiting for another build of the lock (and saying so)."""
    directory = cache_dir / "image" / "locks"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{lock_name}.lock"
    waiting = lambda: say(f"waiting: another build of {lock_name} from this cache holds {path}")  # noqa: E731
    with file_lock(path, waiting=waiting), lock_claims(engine_address, "build", [lock_name], say, "build"):
        yield
