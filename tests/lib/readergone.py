"""A command whose stdout's reader has gone before its first byte (``| head -1`` that has its line)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from tests.lib.tinyrun import REPO


def run_reader_gone(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``argv`` run from the repository with stdout a pipe nobody reads: its status and its stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(list(argv), cwd=REPO, stdout=write, stderr=subprocess.PIPE, text=True, timeout=timeout)
    finally:
        os.close(write)
