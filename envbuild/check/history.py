"""The check history: one JSON line appended per run, read back for comparisons and the status grid.

Appends take an exclusive ``flock`` and end with fsync, so two checks writing one history file interleave
whole lines. A run killed mid-write leaves at most a final line without its newline; readers skip it
(and say so) instead of refusing the whole history.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envbuild.errors import InputError


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_FIELDS = {"time", "lock", "lock_sha256", "ok", "reproducible", "image_id", "pins"}


def _entry(data: Any, where: str) -> HistoryEntry:
    if not isinstance(data, dict) or not set(data) >= _FIELDS:
        missing = sorted(_FIELDS - set(data)) if isinstance(data, dict) else ["(not an object)"]
        raise InputError(f"{where}: not a history entry (missing {', '.join(missing)})")
    return HistoryEntry(**{k: data[k] for k in _FIELDS}, failed_stage=data.get("failed_stage"))


def read_history(path: Path, warn: Callable[[str], None] | None = None) -> list[HistoryEntry]:
    if not path.exists():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read history: {exc}") from None
    lines = text.split("\n")
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # an unterminated last line: a write that was cut short
                if warn:
                    warn(f"{path}:{number}: skipping an incomplete last line (an interrupted run?)")
                continue
            raise InputError(f"{path}:{number}: not valid JSON: {exc.msg}") from None
        entries.append(_entry(data, f"{path}:{number}"))
    return entries


def append_history(path: Path, entry: HistoryEntry) -> None:
    """Append one entry as one line; whole lines only, even with concurrent writers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":")) + "\n"
    with open(path, "a+b") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        try:
            _drop_partial_last_line(out)
            out.write(line.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        finally:
            fcntl.flock(out, fcntl.LOCK_UN)


def _drop_partial_last_line(out: Any) -> None:
    """A writer killed mid-line left bytes without a newline: cut them off (they are no entry)."""
    size = out.seek(0, os.SEEK_END)
    if not size:
        return
    out.seek(-1, os.SEEK_END)
    if out.read(1) == b"\n":
        return
    out.seek(0)
    data = out.read()
    out.truncate(data.rfind(b"\n") + 1)
    out.seek(0, os.SEEK_END)


def last_image_id(history: list[HistoryEntry], lock_sha256: str) -> str | None:
    """The image ID of the newest recorded build of exactly this lock, if any."""
    for entry in reversed(history):
        if entry.lock_sha256 == lock_sha256 and entry.image_id:
            return entry.image_id
    return None
