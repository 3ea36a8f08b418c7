"""What an interrupted test run leaves running, stopped at the next run's start.

The suite's long-lived processes (an extra dockerd, an sshd, a git daemon, a token registry, a Ray head) each
run in a session of their own, so that a test stops exactly what it started, by its PID. That also keeps
Ctrl-C at the terminal from reaching them, and an interrupted run skips its fixtures' teardown (xdist ends its
workers without it): a dockerd, its containerd and its data root's mounts stayed behind, and pytest warned
about those mounts at every run after.

So each such process is written down here when it starts (:func:`register`), beside the process that started
it, its *owner*, and crossed out when it is stopped (:meth:`Entry.forget`). At a run's start (the controller's
``pytest_sessionstart``), :func:`reap` stops what every entry whose owner has gone names:

- the process itself, only while it is the same process (its start time, and the boot, are recorded): TERM,
  then KILL after a grace (a dockerd stops its containers on TERM);
- every process still in its session (the kernel gives no new process that ID while one is), and every
  process whose command line names one of the entry's ``markers`` (Ray's daemons, which leave the session);
- the PIDs its ``pidfiles`` name, each only while its command line names a marker (a dockerd's containerd);
- then every mount at or below ``unmount`` (deepest first), and ``remove``, files or directories.

An entry whose owner lives is another run's (or this one's), and is left alone. Nothing is matched by a
program's name: only the recorded PIDs, their sessions, and command lines naming the entry's own paths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envbuild.locking import file_lock

LEDGER = Path(os.environ.get("ENVBUILD_TEST_LEFTOVERS", "/run/envbuild-test-leftovers"))
GRACE = 30.0  # seconds a process has to end after TERM


def _boot() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields after the command name (state, ppid, pgrp, session, …; the start time is
    index 19), or None for a process that is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when it is gone: with the PID, a process's name."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None


def names(pid: int, markers: Sequence[str]) -> bool:
    """Whether an argument of ``pid``'s command line is one of ``markers`` or a path below one (a marker is
    a path: ``/tmp/ray-1`` is not named by ``/tmp/ray-10``)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    for arg in args:
        for marker in markers:
            at = arg.find(marker)
            while at >= 0:
                if arg[at + len(marker) : at + len(marker) + 1] in ("", "/"):
                    return True
                at = arg.find(marker, at + 1)
    return False


@dataclass(frozen=True)
class Record:
    """An entry's ledger file: the process, its owner, and what stopping it takes (:func:`register`)."""

    what: str
    boot: str
    pid: int
    start: int | None
    owner: int
    owner_start: int | None
    markers: tuple[str, ...]
    pidfiles: tuple[str, ...]
    unmount: tuple[str, ...]
    remove: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> Record:
        """The record at ``path``; ValueError or OSError where it does not read as one."""
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or set(data) != {f.name for f in dataclasses.fields(cls)}:
            raise ValueError(f"{path}: not a ledger entry")

        def number(key: str) -> int | None:
            value = data[key]
            if value is None or isinstance(value, int):
                return value
            raise ValueError(f"{path}: {key} is not a number")

        def names(key: str) -> tuple[str, ...]:
            return tuple(str(v) for v in data[key])

        pid, owner = number("pid"), number("owner")
        if pid is None or owner is None:
            raise ValueError(f"{path}: no pid or owner")
        return cls(
            str(data["what"]), str(data["boot"]), pid, number("start"), owner, number("owner_start"),
            names("markers"), names("pidfiles"), names("unmount"), names("remove"),
        )  # fmt: skip

    def owner_runs(self, boot: str) -> bool:
        return self.boot == boot and self.owner_start is not None and start_time(self.owner) == self.owner_start


@dataclass(frozen=True)
class Entry:
    """One process written down while it runs (:func:`register`): its ledger file."""

    path: Path

    def forget(self) -> None:
        """The process was stopped by its owner: nothing for a later run to do."""
        self.path.unlink(missing_ok=True)


def register(
    pid: int,
    what: str,
    *,
    markers: Sequence[str] = (),
    pidfiles: Sequence[Path] = (),
    unmount: Sequence[Path] = (),
    remove: Sequence[Path] = (),
) -> Entry:
    """Write down ``pid`` (just started, in a session of its own), owned by this process; ``what`` names it
    in :func:`reap`'s report. See the module's text for ``markers``, ``pidfiles``, ``unmount``, ``remove``."""
    owner = os.getpid()
    record = Record(
        what, _boot(), pid, start_time(pid), owner, start_time(owner),
        tuple(markers), tuple(map(str, pidfiles)), tuple(map(str, unmount)), tuple(map(str, remove)),
    )  # fmt: skip
    LEDGER.mkdir(parents=True, exist_ok=True)
    path = LEDGER / f"{pid}-{secrets.token_hex(4)}.json"
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps(dataclasses.asdict(record)))
    scratch.replace(path)
    return Entry(path)


def reap() -> list[str]:
    """Stop what every entry whose owner has gone names (the module's text); one line for each entry whose
    process or session was still running, saying what was stopped."""
    if not LEDGER.is_dir():
        return []
    said = []
    with file_lock(LEDGER / ".lock"):  # one reaper at a time (two runs starting together)
        boot = _boot()
        for path in sorted(LEDGER.glob("*.json")):
            try:
                record = Record.read(path)
            except (OSError, ValueError, TypeError):
                path.unlink(missing_ok=True)  # a write cut short: it names nothing we can act on
                continue
            if record.owner_runs(boot):
                continue  # a live run's
            stopped = _stop(record) if record.boot == boot else []  # another boot's processes are gone
            _tidy(record)
            path.unlink(missing_ok=True)
            if stopped:
                said.append(f"{record.what} (pid {', '.join(map(str, stopped))})")
    return said


def _stop(record: Record) -> list[int]:
    """The entry's processes, stopped; the PIDs that were running."""
    stopped = []
    if record.start is not None and start_time(record.pid) == record.start:
        stopped.append(record.pid)
        terminate(record.pid, record.start)
    for pidfile in record.pidfiles:
        with contextlib.suppress(OSError, ValueError):
            other = int(Path(pidfile).read_text().strip())
            started = start_time(other)
            if started is not None and names(other, record.markers):
                stopped.append(other)
                terminate(other, started)
    # The session's members: while any lives, the kernel gives no new process the session's ID; a process
    # that has the PID now and started at another time means the session ended, and its ID is another's.
    session = record.pid if start_time(record.pid) in (None, record.start) else None
    for member in _members(session, record.markers):
        stopped.append(member)
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    return stopped


def _members(session: int | None, markers: Sequence[str]) -> list[int]:
    """Every live process in ``session`` (None: none), or naming one of ``markers`` on its command line (not
    this one)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        fields = _stat(int(entry.name))
        if fields is None:
            continue
        if (session is not None and int(fields[3]) == session) or names(int(entry.name), markers):
            found.append(int(entry.name))
    return found


def terminate(pid: int, started: int | None) -> None:
    """TERM, then KILL after :data:`GRACE`; each only while ``pid`` is still the process that started at
    ``started`` (:func:`start_time`; None: gone already). Returns once it is gone (a child of this
    process's a zombie, for its ``wait()``)."""
    if started is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    while start_time(pid) == started and time.monotonic() < deadline:
        time.sleep(0.1)
    if start_time(pid) == started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while start_time(pid) == started:
            time.sleep(0.05)


def _tidy(record: Record) -> None:
    for root in record.unmount:
        unmount_below(Path(root))
    for name in record.remove:
        path = Path(name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def mounts_below(root: Path) -> list[str]:
    """Every mount point at or below ``root``, deepest first."""
    prefix = str(root.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # octal escapes such as \040
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def unmount_below(root: Path) -> None:
    """Unmount every mount point at or under ``root``, deepest first (only ours: the paths are ours)."""
    for point in mounts_below(root):
        subprocess.run(["umount", point], capture_output=True, check=False)
