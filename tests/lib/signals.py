"""The SIGINT disposition the Ctrl-C tests test, set by them rather than inherited.

A shell starts a background job (``scripts/test &`` from a script, ``nohup``) with SIGINT ignored, and
Python then never installs its KeyboardInterrupt handler: a test that sends SIGINT to itself or to a
child would test the shell's choice, not the code. In this process, :func:`default_sigint` puts Python's
own handler in place for a block; a child started with ``preexec_fn=restore_sigint`` starts with SIGINT
at its default, so its Python installs that handler itself, as under a terminal.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def default_sigint() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def restore_sigint() -> None:
    """For ``subprocess.Popen(preexec_fn=...)``: SIGINT at its default in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
