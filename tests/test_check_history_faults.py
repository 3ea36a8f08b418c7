"""The check history when it is not what a check wrote: values of the wrong JSON kind, more bad lines than
a warning lists, a path that is no regular file or cannot be opened, and a file swapped in before an append.

Every case is a real file (or FIFO, socket, device link) made in ``tmp_path`` and read or appended through
:func:`read_history` and :func:`append_history` in this process, so what each says is asserted exactly.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from envbuild.check.history import HistoryEntry, append_history, read_history
from envbuild.errors import SHOWN_PROBLEMS, InputError
from tests.lib.historylines import line


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("lock_sha256", None, "lock_sha256: expected a string, got null"),
        ("lock", False, "lock: expected a string, got false"),
        ("image_id", True, "image_id: expected a string or null, got true"),
        ("time", 20261102.5, "time: expected a string, got a number"),
        ("pins", {"source:lib": None}, "pins: expected an object of strings, got one holding null"),
        ("pins", {"source:lib": True}, "pins: expected an object of strings, got one holding true"),
    ],
    ids=["null", "false", "true", "number", "pin-null", "pin-true"],
)
def test_a_value_of_the_wrong_kind_is_named_as_json_says_it(
    tmp_path: Path, key: str, value: object, reason: str
) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(line() + line(**{key: value}) + line(time="2026-11-03T02:00:00Z"))
    warnings: list[str] = []
    entries = read_history(path, warnings.append)
    assert [e.time for e in entries] == ["2026-11-01T02:00:00Z", "2026-11-03T02:00:00Z"]
    assert warnings == [f"{path}:2: {reason}; skipped"]


def test_bad_lines_past_those_listed_are_counted_in_one_warning(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    more = 5
    path.write_text(line() + "garbage\n" * (SHOWN_PROBLEMS + more) + '{"time": "2026-11-0')
    warnings: list[str] = []
    assert [e.time for e in read_history(path, warnings.append)] == ["2026-11-01T02:00:00Z"]
    last = SHOWN_PROBLEMS + more + 2  # the good line, the bad ones, and one cut short
    assert warnings == [
        *(f"{path}:{n}: not valid JSON: Expecting value; skipped" for n in range(2, SHOWN_PROBLEMS + 2)),
        f"{path}: and {more} more lines that are no history entry; skipped",
        f"{path}:{last}: an incomplete last line (an interrupted run?); skipped, dropped by the next append",
    ]


@pytest.mark.parametrize("text", ["build log of the nightly: all good", '{"time": "2026-11-0'], ids=["notes", "cut"])
def test_a_file_of_one_line_without_newline_that_is_no_entry_is_refused_and_left_as_it_is(
    tmp_path: Path, text: str
) -> None:
    """Not an interrupted write (no history line before it): another file, named by mistake. Reading it
    and appending to it are both refused, and it keeps every byte."""
    path = tmp_path / "notes.txt"
    path.write_text(text)
    with pytest.raises(InputError, match=r"notes.txt:1: not valid JSON: .* not a check history, left as it is"):
        read_history(path)
    with pytest.raises(InputError, match=r"notes.txt:1: not valid JSON: .*\(not a check history, left as it is\)"):
        append_history(path, HistoryEntry("2026-11-02T02:00:00Z", "m.lock.yaml", "a" * 64, True, True, None))
    assert path.read_text() == text


def test_a_whole_last_entry_without_its_newline_is_kept_and_the_next_append_follows_it(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(line() + line(time="2026-11-02T02:00:00Z").rstrip("\n"))  # its newline lost
    warnings: list[str] = []
    assert len(read_history(path, warnings.append)) == 2 and warnings == []
    append_history(path, HistoryEntry("2026-11-03T02:00:00Z", "m.lock.yaml", "a" * 64, True, True, None))
    assert [e.time for e in read_history(path)] == [f"2026-11-0{n}T02:00:00Z" for n in (1, 2, 3)]


def test_lines_the_json_parser_cannot_take_are_reported_and_skipped(tmp_path: Path) -> None:
    """Nesting past the parser's recursion and a number past Python's digit limit are bad lines like any
    other, named by FILE:LINE, not a traceback that loses the night's report and history line."""
    path = tmp_path / "history.jsonl"
    path.write_text(line() + "[" * 200_000 + "]" * 200_000 + "\n" + '{"time": ' + "1" * 5000 + "}\n")
    warnings: list[str] = []
    assert [e.time for e in read_history(path, warnings.append)] == ["2026-11-01T02:00:00Z"]
    assert warnings == [
        f"{path}:2: not valid JSON: nested too deeply; skipped",
        f"{path}:3: not valid JSON: a number too long to read; skipped",
    ]
    append_history(path, HistoryEntry("2026-11-02T02:00:00Z", "m.lock.yaml", "a" * 64, True, True, None))
    assert len(read_history(path)) == 2


def test_a_directory_as_the_history_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.mkdir()
    with pytest.raises(InputError) as raised:
        read_history(path)
    assert str(raised.value) == f"{path}: not a regular file (a directory)"


def test_a_history_that_cannot_be_opened_names_the_file_and_the_reason(tmp_path: Path) -> None:
    """A socket cannot be opened as a file at all (ENXIO): the open's own reason, in one line."""
    path = tmp_path / "history.jsonl"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        with pytest.raises(InputError) as raised:
            read_history(path)
    assert str(raised.value) == f"{path}: cannot read history: {os.strerror(errno.ENXIO)}"


@pytest.mark.parametrize("kind", ["a FIFO", "a character device"])
def test_a_file_swapped_in_before_an_append_is_refused_and_let_go(tmp_path: Path, kind: str) -> None:
    """What read_history refused may be put in place afterwards: the append refuses it too, without
    waiting for a reader and without keeping the descriptor it opened to look."""
    path = tmp_path / "history.jsonl"
    if kind == "a FIFO":
        os.mkfifo(path)
    else:
        path.symlink_to(os.devnull)
    entry = HistoryEntry("2026-11-01T02:00:00Z", "m.lock.yaml", "a" * 64, False, None, None)
    open_before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(InputError) as raised:
        append_history(path, entry)
    assert str(raised.value) == f"{path}: not a regular file ({kind})"
    assert sorted(os.listdir("/proc/self/fd")) == open_before
