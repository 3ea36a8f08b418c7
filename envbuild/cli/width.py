"""The width human output is laid out to, read here, in the CLI, and handed to the pure renderers."""

from __future__ import annotations

import shutil
import sys
from typing import TextIO


def output_width(stream: TextIO | None = None) -> int | None:
    """The terminal's width when ``stream`` (stdout) is a terminal (``COLUMNS`` first, as
    :func:`shutil.get_terminal_size` reads it; 100 when neither says), else None: output to a pipe or a
    file is not wrapped, a row per line and whole, for grep and scripts (a CI log's viewer wraps it
    itself). ``COLUMNS`` alone does not make a pipe wrap: it is often exported where no one chose a width
    (pytest-xdist's workers run with COLUMNS=80 and LINES=24 set)."""
    stream = stream if stream is not None else sys.stdout
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        terminal = False
    return shutil.get_terminal_size((100, 24)).columns if terminal else None
