"""What ``envbuild image`` keeps between builds under ``<cache_dir>/image``: scratch directories, the map
from raw built images to the normalised, checked images made from them, and one lock per lock name.

- ``work/build-*``: one scratch directory per running build (the context; an archive kept for
  ``envbuild check``), held by an ``flock`` on ``work/build-*.lock``; removed when the build ends,
  however it ends (an exception or Ctrl-C unwinds through it); the ones a killed build left behind
  (their lock no longer held) are removed by the next build on its way in.
- ``normalized.json``: ``{raw image ID: {"image_id": normalised ID, "lock_sha256": …, "lock_name": …,
  "parents": …}}`` for the newest raw image of each lock name that passed the in-image check, so a rebuild
  the engine answers from its layer cache skips normalising and checking, and the next build of the lock
  knows the meta layer's parents the check reported (:func:`envbuild.image.checked.last_parents`). Written under a
  lock, atomically; a damaged map only costs a normalisation.
- ``built/<lock sha256>.json``: the record of a lock built and checked, a rebuild's answer
  (:mod:`envbuild.image.cache.ledger`).
- ``locks/<lock name>.lock``: held while a build of that lock uses the engine, so that two builds of one
  lock do not remove each other's images when they tidy the engine (:mod:`.retention`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from envbuild.fileio import write_atomic
from envbuild.locking import file_lock


@contextmanager
def context_dir(cache_dir: Path) -> Iterator[Path]:
    """A scratch directory under ``<cache_dir>/image/work``, held by an flock while in use; the ones a
    killed build left behind (their lock no longer held) are removed on the way in."""
    root = cache_dir / "image" / "work"
    root.mkdir(parents=True, exist_ok=True)
    remove_abandoned(cache_dir)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    lock_file = work.with_name(work.name + ".lock")
    try:
        with file_lock(lock_file, blocking=True):
            yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        lock_file.unlink(missing_ok=True)


def remove_abandoned(cache_dir: Path) -> None:
    """The scratch directories killed builds left behind (their lock no longer held)."""
    for lock_file in (cache_dir / "image" / "work").glob("*.lock"):
        with file_lock(lock_file, blocking=False) as held:
            if held:
                shutil.rmtree(lock_file.with_suffix(""), ignore_errors=True)
                lock_file.unlink(missing_ok=True)


def _map_path(cache_dir: Path) -> Path:
    return cache_dir / "image" / "normalized.json"


def read_map(cache_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(_map_path(cache_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # a missing or damaged map only costs a normalisation
    return data if isinstance(data, dict) else {}


def kept_parents(known: dict[str, dict[str, Any]], lock_name: str) -> object:
    """What the map (:func:`read_map`) keeps of the meta layer's parents for ``lock_name``'s newest raw
    image (as written: the caller reads it), or None."""
    for entry in known.values():
        if isinstance(entry, dict) and entry.get("lock_name") == lock_name:
            return entry.get("parents")
    return None


def remember(cache_dir: Path, raw_id: str, entry: dict[str, Any]) -> None:
    """Map ``raw_id`` to ``entry``; the entries of older raw images of the same lock name go (the engine
    no longer keeps those images, :mod:`.retention`)."""
    path = _map_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_suffix(".lock"), blocking=True):
        data = {
            raw: known
            for raw, known in read_map(cache_dir).items()
            if not isinstance(known, dict) or known.get("lock_name") != entry.get("lock_name")
        }
        data[raw_id] = entry
        write_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


@contextmanager
def lock_name_held(cache_dir: Path, lock_name: str) -> Iterator[None]:
    """Hold ``<cache_dir>/image/locks/<lock name>.lock`` (waiting for another build of the lock)."""
    directory = cache_dir / "image" / "locks"
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / f"{lock_name}.lock", blocking=True):
        yield
