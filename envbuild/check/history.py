"""The check history: one JSON line appended per run, read back for comparisons and the status grid.

Appends take an exclusive ``flock`` and end with fsync, so two checks writing one history file interleave
whole lines. A run killed mid-write leaves at most a final line without its newline: after lines of a
history, a tail that is not JSON is that, skipped by readers (who say so) and dropped by the next append;
a last line that is a whole entry is kept, and the next append ends it first. A file whose only content
is such a line is no history (another file named by mistake), refused and left as it is. Every line is
checked when read, its types included: a bad line is reported with ``FILE:LINE`` and skipped, never a
reason to stop the report.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.data.jsonout import to_jsonable
from envbuild.errors import SHOWN_PROBLEMS, InputError
from envbuild.fileio import NotRegularFileError, file_kind, open_regular


@dataclass(frozen=True)
class HistoryEntry:
    time: str  # UTC, RFC 3339, seconds
    lock: str  # the lockfile path as given
    lock_sha256: str
    ok: bool
    reproducible: bool | None  # None: no build was attempted (verify failed)
    image_id: str | None
    pins: dict[str, str] = field(default_factory=dict)  # "kind:name" -> status
    failed_stage: str | None = None  # where the check stopped, when it did (absent in older histories)


# What each key of a line must hold, and that in words: a line is an entry only when every value has its
# type (a value of another type would break the comparison or the grid far from here, every night after).
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "time": ((str,), "a string"),
    "lock": ((str,), "a string"),
    "lock_sha256": ((str,), "a string"),
    "ok": ((bool,), "true or false"),
    "reproducible": ((bool, type(None)), "true, false or null"),
    "image_id": ((str, type(None)), "a string or null"),
    "pins": ((dict,), "an object of strings"),
    "failed_stage": ((str, type(None)), "a string or null"),  # optional: absent in older histories
}
_FIELDS = set(_FIELD_TYPES) - {"failed_stage"}


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    for kinds, name in (((int, float), "a number"), ((str,), "a string"), ((list,), "a list"), ((dict,), "an object")):
        if isinstance(value, kinds):
            return name
    return type(value).__name__


def _type_problem(data: dict[str, Any]) -> str | None:
    """The first key whose value has the wrong type, as ``KEY: expected ..., got ...``; None when none."""
    for key, (kinds, expected) in _FIELD_TYPES.items():
        if key not in data:
            continue
        value = data[key]
        if type(value) not in kinds:  # the exact type: True is an int, and 1 is no bool
            return f"{key}: expected {expected}, got {_json_kind(value)}"
        odd = [v for v in value.values() if not isinstance(v, str)] if isinstance(value, dict) else []
        if odd:
            return f"{key}: expected {expected}, got one holding {_json_kind(odd[0])}"
    return None


class _BadLine(Exception):
    """A line that is no history entry: ``unparsed`` when it is not JSON at all (as a write cut short
    leaves it), ``keys`` when it has every key of an entry and a value of the wrong type."""

    def __init__(self, reason: str, *, unparsed: bool = False, keys: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.unparsed, self.keys = reason, unparsed, keys


def _entry(raw: bytes) -> HistoryEntry:
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _BadLine(f"not UTF-8 (byte 0x{raw[exc.start]:02x})", unparsed=True) from None
    except json.JSONDecodeError as exc:
        raise _BadLine(f"not valid JSON: {exc.msg}", unparsed=True) from None
    except RecursionError:  # arrays or objects nested past the parser's recursion: no entry nests
        raise _BadLine("not valid JSON: nested too deeply", unparsed=True) from None
    except ValueError:  # an integer of more digits than Python converts (4300): no entry holds one
        raise _BadLine("not valid JSON: a number too long to read", unparsed=True) from None
    if not isinstance(data, dict) or not set(data) >= _FIELDS:
        missing = sorted(_FIELDS - set(data)) if isinstance(data, dict) else ["(not an object)"]
        raise _BadLine(f"not a history entry (missing {', '.join(missing)})")
    if (problem := _type_problem(data)) is not None:
        raise _BadLine(problem, keys=True)
    return HistoryEntry(**{k: data[k] for k in _FIELDS}, failed_stage=data.get("failed_stage"))


def read_history(path: Path, warn: Callable[[str], None] | None = None) -> list[HistoryEntry]:
    """Every entry of the history at ``path``, oldest first. A line that is not one (cut short by a killed
    run, not JSON, not UTF-8, a key missing or holding the wrong type) is skipped, and ``warn`` is told
    ``FILE:LINE: why; skipped``: one bad line must not stop every night's report after it. A file none
    of whose lines has the keys of an entry is not a history at all (another file named by mistake): an
    :class:`InputError` naming its first line, so that nothing is appended to it."""
    if not path.exists():
        return []
    try:
        with open_regular(path) as handle:
            data = handle.read()
    except NotRegularFileError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read history: {exc.strerror or exc}") from None
    lines = data.split(b"\n")  # the last is b"" when the file ends with a newline, as a whole write leaves it
    entries: list[HistoryEntry] = []
    skipped: list[str] = []
    recognised = False  # a line with every key of an entry, whatever its types: the file is a history
    incomplete = ""
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            entries.append(_entry(raw))
        except _BadLine as bad:
            if number == len(lines) and bad.unparsed and (entries or recognised):
                # No newline after it, after lines of a history: a write that was cut short.
                incomplete = f"{path}:{number}: an incomplete last line (an interrupted run?); skipped, dropped by the next append"
                continue
            recognised = recognised or bad.keys
            skipped.append(f"{path}:{number}: {bad.reason}")
    if skipped and not entries and not recognised:
        raise InputError(f"{skipped[0]} (no line of it is a history entry: not a check history, left as it is)")
    if warn:
        for line in skipped[:SHOWN_PROBLEMS]:
            warn(f"{line}; skipped")
        if len(skipped) > SHOWN_PROBLEMS:
            warn(f"{path}: and {len(skipped) - SHOWN_PROBLEMS} more lines that are no history entry; skipped")
        if incomplete:
            warn(incomplete)
    return entries


def append_history(path: Path, entry: HistoryEntry) -> None:
    """Append one entry as one line; whole lines only, even with concurrent writers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(to_jsonable(entry), sort_keys=True, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        if not stat.S_ISREG(mode := os.fstat(fd).st_mode):  # read_history refused it; here it was swapped in
            raise InputError(str(NotRegularFileError(path, file_kind(mode))))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "a+b") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        try:
            _end_last_line(out, path)
            out.write(line.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        finally:
            fcntl.flock(out, fcntl.LOCK_UN)


def _end_last_line(out: Any, path: Path) -> None:
    """A last line without its newline: a tail that is not JSON, after other lines, is a write cut short
    and is cut off; any other line gets its newline. As the file's only line, one without the keys of an
    entry says the file is no history: refused, the file left as it is (:func:`read_history` refuses such
    a file first; this holds for one put in place since)."""
    if not out.seek(0, os.SEEK_END):  # empty
        return
    out.seek(-1, os.SEEK_END)
    if out.read(1) == b"\n":
        return
    out.seek(0)
    data = out.read()
    start = data.rfind(b"\n") + 1
    try:
        _entry(data[start:])
    except _BadLine as bad:
        if not start and not bad.keys:
            raise InputError(f"{path}:1: {bad.reason} (not a check history, left as it is)") from None
        if bad.unparsed:
            out.truncate(start)
            out.seek(0, os.SEEK_END)
            return
    out.write(b"\n")


def last_image_id(history: list[HistoryEntry], lock_sha256: str) -> str | None:
    """The image ID of the newest recorded build of exactly this lock, if any."""
    for entry in reversed(history):
        if entry.lock_sha256 == lock_sha256 and entry.image_id:
            return entry.image_id
    return None
