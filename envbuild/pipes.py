"""A standard output whose reader has gone: ``envrun … | head -1`` once head has its line, a ``| tee`` that
was stopped. What follows is dropped, as a shell's tools drop it, rather than raised as an error."""

from __future__ import annotations

import os
import select
import sys


def stdout_reader_gone() -> bool:
    """True when stdout is a pipe its reader closed; its fd then writes to /dev/null, so that what is
    still buffered (and flushed at exit) is dropped, not raised again. False for anything else, a broken
    pipe of another kind (a child process written to) included: that is an error like any other."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced (a test's capture) or closed
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    if not any(events & select.POLLERR for _, events in poller.poll(0)):
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    return True
