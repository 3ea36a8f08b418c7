"""The data check: each training file exists and is parquet (its magic at both ends). Standard library and
envbuild's file primitives only, so a Ray node runs the same check on the path the job will read there
(:mod:`envrun.cluster.onnode`)."""

from __future__ import annotations

import os
from pathlib import Path

from envbuild.fileio import NotRegularFileError, open_regular

PARQUET_MAGIC = b"PAR1"


def parquet_problem(path: Path) -> str | None:
    """Why ``path`` is not a readable parquet file, or None. Only a regular file is opened for reading: a
    FIFO (which would block the open until a writer came) or a device is refused unread."""
    try:
        with open_regular(path) as f:
            head = f.read(4)
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - 4, 0))
            tail = f.read(4)
    except FileNotFoundError:
        return f"{path}: no such file"
    except NotRegularFileError as exc:
        return f"{path}: {exc.reason}"
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    if size < 12 or head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        return f"{path}: not a parquet file (no PAR1 magic at start and end)"
    return None
