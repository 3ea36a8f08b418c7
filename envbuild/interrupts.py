"""Ctrl-C and SIGTERM where a half-done step would leave something behind.

- :func:`sigterm_interrupts`: while a build runs, SIGTERM (a CI job cancelled, ``kill``) unwinds like
  Ctrl-C, so scratch directories and the engine's half-made containers are removed on the way out.
- :func:`stop_signals`: while a job runs, SIGINT and SIGTERM (a scheduler, ``timeout``, ``docker stop``)
  both unwind as :class:`KeyboardInterrupt`, and the caller learns which one came, for its record.
- :func:`while_stopping`: once a stop is under way, SIGINT and SIGTERM call the stopper's own answer
  (a job's process group killed) instead of raising, so a second Ctrl-C cannot cut the stop short.
- :func:`deferred_interrupts`: a signal that arrives inside the block is delivered when it ends. For a
  call whose result must not be lost: an interrupt while the engine creates a container would leave
  the container there with its ID never learnt, so never removed. The caller puts the block inside
  the ``try`` whose ``finally`` removes what it made.

All act in the main thread only (Python runs signal handlers there); elsewhere they do nothing.

- :func:`forget_caught_interrupts`: at a command's end, so that an interrupt it caught and answered (exit
  130, its record written) is not taken by the interpreter for one it never caught.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _handled(handler: Callable[[int, object], None], signals: tuple[int, ...] = _SIGNALS) -> Iterator[None]:
    """``handler`` in place for ``signals`` inside the block, the previous handlers restored after it; in
    the main thread only (elsewhere, the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, handler) for number in signals}
    try:
        yield
    finally:
        for number, before in previous.items():
            signal.signal(number, before)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises :class:`KeyboardInterrupt` inside the block, as Ctrl-C does."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    with _handled(interrupt, (signal.SIGTERM,)):
        yield


@contextmanager
def stop_signals(seen: list[str]) -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`KeyboardInterrupt` inside the block; each one's name ("Ctrl-C",
    "SIGTERM") is appended to ``seen``."""
    names = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

    def interrupt(signum: int, frame: object) -> None:
        seen.append(names.get(signal.Signals(signum), signal.Signals(signum).name))
        raise KeyboardInterrupt

    with _handled(interrupt):
        yield


@contextmanager
def while_stopping(again: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM inside the block call ``again`` (no exception): a second Ctrl-C while a job is
    being stopped hurries the stop, never abandons it halfway with the job running and its record unwritten.
    ``again`` runs as a signal handler, between two steps of the block: it must not write to a file or
    stream the block may be writing to."""
    with _handled(lambda signum, frame: again()):
        yield


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside the block are delivered, to the handlers that were in place,
    as it ends (however it ends): Ctrl-C becomes :class:`KeyboardInterrupt` there, not halfway through."""
    caught: list[int] = []
    try:
        with _handled(lambda signum, frame: caught.append(signum)):
            yield
    finally:
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def forget_caught_interrupts() -> None:
    """CPython (3.11 here, Debian's and pyenv's) marks a :class:`KeyboardInterrupt` as unhandled when it
    passes through code that ``exec`` or ``eval`` runs from a string (a dataclass or a namedtuple being made,
    as a module is imported: Ray's, on a cluster's first call to it), even when the command catches it
    further out. Under ``python -m`` the interpreter then ends the process by SIGINT at exit, instead of
    with the status the command returned: ``envrun cluster up`` stopped by a SIGTERM during that import
    removed its nodes, said "interrupted", and was seen to die by SIGINT, not to exit 130. Each run of a
    string starts by clearing that mark; an interrupt that really is not caught marks it again on its way
    out."""
    exec("")
