"""The data check: each training file exists and is parquet (its magic at both ends). Standard library only,
so a Ray node runs the same check on the path the job will read there (:mod:`envrun.cluster.onnode`)."""

from __future__ import annotations

from pathlib import Path

PARQUET_MAGIC = b"PAR1"


def parquet_problem(path: Path) -> str | None:
    """Why ``path`` is not a readable parquet file, or None."""
    try:
        with Path(path).open("rb") as f:
            head = f.read(4)
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(size - 4, 0))
            tail = f.read(4)
    except FileNotFoundError:
        return f"{path}: no such file"
    except IsADirectoryError:
        return f"{path}: a directory, not a parquet file"
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    if size < 12 or head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        return f"{path}: not a parquet file (no PAR1 magic at start and end)"
    return None
