"""The suite's extra engines (tests/lib/engines.py) leave nothing in the machine's temporary directory.

dockerd, stopping, asks a containerd that does not stop in time for a stack dump (SIGUSR1) before it kills
it, and containerd writes the dump to ``$TMPDIR``: CI runs left ``/tmp/containerd.<pid>.stacks.log``
behind. An extra engine's containerd is started with ``$TMPDIR`` in the engine's own directory.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import closing
from pathlib import Path

import pytest

from tests.lib.engines import ExtraEngine

pytestmark = [pytest.mark.docker]


def test_a_stack_dump_of_an_engines_containerd_lands_in_the_engines_directory(fresh_engine: ExtraEngine) -> None:
    pid = fresh_engine.containerd_pid()
    assert pid is not None
    name = f"containerd.{pid}.stacks.log"
    os.kill(pid, signal.SIGUSR1)  # what dockerd sends before it kills a containerd that does not stop
    dump = fresh_engine.root / name
    deadline = time.monotonic() + 10
    while not (dump.exists() and "goroutine" in dump.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the dump is there and written
    assert dump.exists(), sorted(p.name for p in fresh_engine.root.iterdir())
    assert "goroutine" in dump.read_text()
    assert not (Path(os.environ.get("TMPDIR") or "/tmp") / name).exists()
    with closing(fresh_engine.client()) as client:
        assert client.ping()  # the engine goes on answering after it
