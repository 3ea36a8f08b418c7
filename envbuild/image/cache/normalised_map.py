"""``<cache_dir>/image/normalized.json``: the raw images that passed the in-image check, and the
normalised image made from each.

``{raw image ID: {"image_id": normalised ID, "lock_sha256": …, "lock_name": …, "meta_sha256": …,
"parents": …}}`` for the newest raw image of each lock name that passed the in-image check, so a rebuild
the engine answers from its layer cache skips normalising and checking, and the next build of the lock
knows the meta layer's parents the check reported (:func:`envbuild.image.checked.last_parents`). Written
under a lock, atomically; a damaged map only costs a normalisation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envbuild.fileio import write_atomic
from envbuild.locking import file_lock


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
