"""The ledger of locks built and checked, what a rebuild answers from: the small record of a lock whose
image was built and passed the in-image check, ``<cache_dir>/image/built/<lock sha256>.json``.

A rebuild of the same lock bytes (its sha256), by the same envbuild (:data:`BUILD_VERSION`) and builder,
rendering the same Dockerfile, on the same base digest, whose image the engine still holds under the
recorded ID, makes the same image: so it is answered from here, without assembling a context or sending
anything to the engine. What can still move is re-checked before (the sources' refs, by the caller).

A missing, damaged or older record (another format, another envbuild) is no record: the build runs
whole and writes it. Written atomically, after the image passed the in-image check, never before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild import __version__
from envbuild.data.jsonout import fields_json, json_meta
from envbuild.fileio import write_atomic

FORMAT = 1
# A new envbuild may render, normalise or check differently: its rebuild does not trust an older record.
BUILD_VERSION = f"{__version__}/{FORMAT}"
# The one builder: the engine's own BuildKit (docker >= 20.10), through the Engine API; recorded, so that
# a record another builder made (the legacy builder, since removed) is never taken for this one's.
BUILDER = "buildkit"


@dataclass(frozen=True)
class BuiltImage:
    """A lock built and checked: the image, and what its build record is written from."""

    lock_sha256: str
    builder: str
    base_digest: str | None
    image_id: str
    raw_image_id: str
    epoch: int
    dockerfile_sha256: str
    # (source name, tree SHA), as the context's.
    trees: tuple[tuple[str, str], ...] = field(metadata=json_meta(convert=dict))
    distro_removed: tuple[dict[str, Any], ...] = ()
    build_version: str = BUILD_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **fields_json(self)}  # written with sorted keys

    @classmethod
    def from_json(cls, data: Any) -> BuiltImage | None:
        """The record, or None for anything this envbuild did not write (a damaged or older one)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("build_version") != BUILD_VERSION:
            return None
        try:
            record = cls(
                lock_sha256=str(data["lock_sha256"]),
                builder=str(data["builder"]),
                base_digest=None if data["base_digest"] is None else str(data["base_digest"]),
                image_id=str(data["image_id"]),
                raw_image_id=str(data["raw_image_id"]),
                epoch=int(data["epoch"]),
                dockerfile_sha256=str(data["dockerfile_sha256"]),
                trees=tuple(sorted((str(k), str(v)) for k, v in data["trees"].items())),
                distro_removed=tuple(dict(d) for d in data["distro_removed"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return record if record.image_id.startswith("sha256:") else None


def built_path(cache_dir: Path, lock_sha256: str) -> Path:
    return cache_dir / "image" / "built" / f"{lock_sha256}.json"


def read_built(cache_dir: Path, lock_sha256: str) -> BuiltImage | None:
    try:
        data = json.loads(built_path(cache_dir, lock_sha256).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # no record, or a damaged one: the build runs whole
    record = BuiltImage.from_json(data)
    return record if record is not None and record.lock_sha256 == lock_sha256 else None


def write_built(cache_dir: Path, record: BuiltImage) -> None:
    path = built_path(cache_dir, record.lock_sha256)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(record.to_json(), indent=1, sort_keys=True) + "\n").encode())


def forget_built(cache_dir: Path, lock_sha256: str) -> None:
    """Drop the record (the next build runs whole)."""
    built_path(cache_dir, lock_sha256).unlink(missing_ok=True)
