"""A standard output whose reader has gone: ``envrun … | head -1`` once head has its line, a ``| tee`` that
was stopped. What follows is dropped, as a shell's tools drop it, rather than raised as an error. And one
whose encoding cannot hold every character (a latin-1 or ASCII locale): what it cannot hold is escaped."""

from __future__ import annotations

import codecs
import os
import select
import sys

_ESCAPE = "envbuild-json-escape"


def _json_escape(error: UnicodeError) -> tuple[bytes, int]:
    """What an encoding cannot hold, as JSON's ``\\uXXXX`` (a UTF-16 pair past U+FFFF): valid inside a JSON
    string (the only place ``json.dumps(ensure_ascii=False)`` leaves such a character) and readable in text.
    A byte that an undecodable argument or file name was read as (surrogateescape) is written back as it was."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    out = bytearray()
    for char in error.object[error.start : error.end]:
        if 0xDC80 <= ord(char) <= 0xDCFF:
            out.append(ord(char) - 0xDC00)
            continue
        units = char.encode("utf-16-be", "surrogatepass")
        out += b"".join(b"\\u%04x" % int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2))
    return bytes(out), error.end


codecs.register_error(_ESCAPE, _json_escape)


def escape_what_stdout_cannot_encode() -> None:
    """Where stdout's encoding is not UTF-8 (``PYTHONUTF8=0 LC_ALL=C``, a latin-1 or GBK locale), a character it
    cannot hold (a commit subject's, an env value's) is escaped instead of ending the command in a
    traceback, and ``--json`` stays valid JSON."""
    stream = sys.stdout
    encoding = getattr(stream, "encoding", None)
    if encoding is None or codecs.lookup(encoding).name == "utf-8" or not hasattr(stream, "reconfigure"):
        return
    stream.reconfigure(errors=_ESCAPE)


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
