"""Reading the files of a checkpoint as hostile input: which files may be opened, how much of them is
read, and how much JSON may cost before it is parsed.

A checkpoint comes from a training job or from a hub, and whoever wrote it controls every byte and
every directory entry in it: ``config.json`` can be a FIFO (an ``open`` that never returns), a symlink
to ``/dev/zero`` or to a file outside the checkpoint, a sparse file of terabytes, or JSON nested deeper
than the parser's recursion limit. Every file the audit reads goes through this module:

- :func:`locate` admits only a regular file inside the model directory (a symlink may lead elsewhere in
  it, never out of it — except, in the Hugging Face hub cache layout ``models--X/snapshots/<rev>/``,
  into that same repository's ``blobs/``, where the hub keeps every file a snapshot links to);
- :func:`open_regular` opens with ``O_NONBLOCK``, so that not even a FIFO swapped in after the check can
  block the open, and checks the descriptor itself with ``fstat``;
- :func:`read_limited` refuses a file over a stated limit before reading, and never reads more than it;
- :func:`load_json` bounds nesting depth (and optionally the number of objects and arrays) before
  parsing, at C speed: ``json.loads`` recurses once per level, and an object costs ~60 bytes of memory
  for the 2 bytes of ``[]``.

Errors go through the caller's ``fail`` (message -> exception), so each file keeps its own error type.
"""

from __future__ import annotations

import json
import os
import re
import reprlib
import stat
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path

from envbuild.errors import InputError
from envbuild.fileio import file_kind

Fail = Callable[[str], InputError]

MiB = 1 << 20
# Deeper than any config, index or header (a valid header is 3 deep, a GLM-style config 2 or 3), far
# below the ~1000 levels at which json.loads raises RecursionError.
MAX_JSON_DEPTH = 64

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def locate(model_dir: Path, name: str, fail: Fail) -> Path | None:
    """``model_dir / name`` if it is a regular file inside ``model_dir``; None if nothing is there
    (a dangling symlink included: to a loader that is a missing file too)."""
    path = model_dir / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise fail(f"cannot open: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(path)
        if not any(os.path.commonpath([root, target]) == root for root in allowed_roots(model_dir)):
            raise fail(f"a symlink to {brief_path(target)}, outside the model directory")
        try:
            st = os.stat(target)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise fail(f"cannot open: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise fail(f"{file_kind(st.st_mode)}, not a regular file")
    return path


def allowed_roots(model_dir: Path) -> list[str]:
    """Where a symlink of the checkpoint may lead: the model directory, and for a snapshot of the Hugging
    Face hub cache (``<cache>/models--org--name/snapshots/<rev>``) that repository's ``blobs/`` too."""
    root = os.path.realpath(model_dir)
    roots = [root]
    snapshots = os.path.dirname(root)
    if os.path.basename(snapshots) == "snapshots":
        blobs = os.path.join(os.path.dirname(snapshots), "blobs")
        if os.path.isdir(blobs) and not os.path.islink(blobs):
            roots.append(os.path.realpath(blobs))
    return roots


def open_regular(path: Path, fail: Fail) -> tuple[int, int]:
    """Open ``path`` for reading without blocking; return the descriptor and the file's size."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise fail(f"cannot open: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)  # the file actually opened, whatever the name pointed at when it was checked
        if not stat.S_ISREG(st.st_mode):
            raise fail(f"{file_kind(st.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_limited(path: Path, limit: int, what: str, fail: Fail) -> bytes:
    """The whole of ``path``, refused unread if it is larger than ``limit`` bytes."""
    fd, size = open_regular(path, fail)
    try:
        if size > limit:
            raise fail(f"{size:,} bytes, over the {limit // MiB} MiB limit for {what}")
        chunks, total = [], 0
        while total <= limit:  # the file may grow after fstat: read one byte past the limit at most
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise fail(f"cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if total > limit:
        raise fail(f"grew past the {limit // MiB} MiB limit for {what} while being read")
    return b"".join(chunks)


class JSONLimitError(ValueError):
    """JSON that would cost too much to parse; a ValueError like every other unreadable JSON."""


def read_json(path: Path, limit: int, what: str, fail: Fail, *, max_containers: int) -> tuple[bytes, object]:
    """The bytes of ``path`` (:func:`read_limited`) and the JSON they hold (:func:`load_json`)."""
    raw = read_limited(path, limit, what, fail)
    try:
        return raw, load_json(raw, max_containers=max_containers)
    except JSONLimitError as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise fail(f"not readable JSON ({exc})") from None


_DEPTH_AFTER_COUNT = 1_000_000


def load_json(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH, max_containers: int | None = None) -> object:
    """``json.loads`` of UTF-8 ``raw``, after checking that it nests at most ``max_depth`` levels and
    holds at most ``max_containers`` objects and arrays. Raises ValueError for any unreadable JSON."""
    skeleton = _skeleton(raw)  # ~1 ms per MB; a tenth of what json.loads costs
    containers = skeleton.count(b"[")
    too_many = max_containers is not None and containers > max_containers
    # The depth is a Python-level fold over every bracket (~0.1 s per million): where the count alone
    # already refuses millions of them, say that, rather than spend seconds measuring how deep they go.
    if not (too_many and containers > _DEPTH_AFTER_COUNT) and _deeper_than(skeleton, max_depth):
        raise JSONLimitError(f"JSON nested deeper than {max_depth} levels")
    if too_many:
        raise JSONLimitError(f"{containers:,} JSON objects and arrays, more than the {max_containers:,} allowed")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:  # only for malformed JSON the skeleton could not measure
        raise JSONLimitError(f"JSON nested deeper than {max_depth} levels") from None


# The skeleton of a JSON text: its brackets outside strings, ``{}`` folded into ``[]``. Built with
# bytes methods only (no Python loop over the text), so it costs about as much as copying the text.
_KEEP = b'"[]{}'
_DROP = bytes(b for b in range(256) if b not in _KEEP)
_FOLD = bytes.maketrans(b"{}", b"[]")
_STRING = re.compile(rb'"[^"]*"')


def _skeleton(raw: bytes) -> bytes:
    if b"\\" in raw:  # escapes first, so that only the quotes that open and close strings are left
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = raw.translate(_FOLD, _DROP)
    # Strings without brackets are now "" and vanish here (every string of a real header or index);
    # dropping a closing quote with the next opening one only joins two strings, which is harmless.
    skeleton = skeleton.replace(b'""', b"")
    return _STRING.sub(b"", skeleton) if b'"' in skeleton else skeleton


# +1 for an opening bracket, -1 for a closing one: the running sum over a skeleton is the depth.
_STEP = [1 if byte == ord("[") else -1 for byte in range(256)]


def _deeper_than(skeleton: bytes, limit: int) -> bool:
    """Whether the brackets nest more than ``limit`` deep: one pass, at C speed (``map`` and
    ``accumulate`` over the bytes; the skeleton holds brackets only). An unbalanced skeleton is answered
    by its deepest point too; json.loads then says what else is wrong with the text."""
    if b"[" * (limit + 1) in skeleton:  # the usual bomb, found without a pass
        return True
    return max(accumulate(map(_STEP.__getitem__, skeleton)), default=0) > limit


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel = 2


def brief(value: object) -> str:
    """A repr for error messages that stays short whatever the value: a hostile file may hold a
    string of megabytes or a list of a million elements where a number belongs."""
    return _REPR.repr(value)


def brief_path(path: str | Path, limit: int = 200) -> str:
    text = ascii(str(path))[1:-1] if not str(path).isprintable() else str(path)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"
