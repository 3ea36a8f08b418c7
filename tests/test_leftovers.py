"""What an interrupted test run leaves running is stopped at the next run's start (tests/lib/leftovers.py):
only what a run whose process has gone wrote down, by the PIDs it wrote, and what they name removed.

The real case: a process that started an extra dockerd and a git daemon is killed (as xdist ends a worker
on Ctrl-C, without its fixtures' teardown); the engine, its containerd and the daemon keep running, until
:func:`reap`. The rules under it (a live owner's entry, a PID another process has now, a process that
names the entry's marker, an entry cut short) on plain processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lib import leftovers
from tests.lib.leftovers import mounts_below, reap, register, start_time

PROJECT_ROOT = Path(__file__).resolve().parent.parent

OWNER = """
import json, sys, time
from pathlib import Path
from tests.lib.engines import start_engine
from tests.lib.gitrepos import GitDaemon
engine = start_engine(Path(sys.argv[1]))
daemon = GitDaemon(Path(sys.argv[2]), allow_filter=True).start()
print(json.dumps({"dockerd": engine.process.pid, "containerd": engine.containerd_pid(), "git": daemon.proc.pid,
                  "socket": str(engine.socket)}), flush=True)
time.sleep(600)
"""


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ledger of the test's own: the run's own entries are not this test's to reap."""
    path = tmp_path / "ledger"
    monkeypatch.setattr(leftovers, "LEDGER", path)
    monkeypatch.setenv("ENVBUILD_TEST_LEFTOVERS", str(path))
    yield path


def _alive(pid: int) -> bool:
    return start_time(pid) is not None


def _sleeper(*args: str) -> subprocess.Popen[bytes]:
    """A process of five minutes in a session of its own, ``args`` on its command line."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", *args], start_new_session=True)


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait()


@pytest.mark.docker
def test_an_engine_and_a_daemon_whose_owner_was_killed_are_stopped_and_their_files_removed(
    ledger: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root, served = tmp_path_factory.mktemp("reap") / "e", tmp_path / "served"  # short: containerd's socket
    served.mkdir()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(root), str(served)],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    try:
        assert owner.stdout is not None
        started = json.loads(owner.stdout.readline() or "{}")
        assert started, "the owner did not start its engine and daemon"
        pids = [started["dockerd"], started["containerd"], started["git"]]
        assert len(list(ledger.glob("*.json"))) == 2
        # While the owner runs, its entries are its own: a run starting now leaves them.
        assert reap() == [] and all(map(_alive, pids))
    finally:
        owner.send_signal(signal.SIGKILL)  # no teardown, as xdist's end of a worker
        owner.wait()

    assert all(map(_alive, pids)), "killing the owner stopped its engine: nothing to reap"
    assert mounts_below(root), "dockerd mounts nothing under its data root"
    said = reap()
    assert not [pid for pid in pids if _alive(pid)]
    assert sorted(line.split()[0] for line in said) == ["dockerd", "git"]
    assert str(started["dockerd"]) in next(line for line in said if line.startswith("dockerd"))
    assert mounts_below(root) == [] and not root.exists() and not Path(started["socket"]).exists()
    assert list(ledger.glob("*.json")) == []
    assert reap() == []  # once


def test_only_entries_whose_owner_has_gone_are_reaped(ledger: Path, tmp_path: Path) -> None:
    mine = _sleeper()
    orphan = _sleeper()
    kept = tmp_path / "kept"
    kept.mkdir()
    try:
        entry = register(mine.pid, "sleep of a live owner", remove=[kept])
        gone = subprocess.Popen(["true"])  # an owner that has ended
        gone.wait()
        _rewrite(register(orphan.pid, "sleep of a gone owner").path, owner=gone.pid)
        said = reap()
        assert said == [f"sleep of a gone owner (pid {orphan.pid})"]
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert _alive(mine.pid) and kept.is_dir() and entry.path.exists()
        entry.forget()
        assert reap() == [] and _alive(mine.pid)
    finally:
        _kill(mine)
        _kill(orphan)


def test_a_pid_another_process_has_now_is_left_alone_and_its_entry_dropped(ledger: Path) -> None:
    other = _sleeper()
    try:
        path = register(other.pid, "a process long gone").path
        started = start_time(other.pid)
        assert started is not None
        _rewrite(path, owner=_gone_pid(), start=started - 1)  # the PID's process then was another
        assert reap() == []
        assert _alive(other.pid) and not path.exists()
    finally:
        _kill(other)


def test_a_process_naming_the_marker_goes_with_its_entry_even_in_another_session(ledger: Path, tmp_path: Path) -> None:
    marker = str(tmp_path / "ray-temp")
    leader = _sleeper()
    daemon = _sleeper(marker)  # a session of its own, as Ray's daemons leave the head's
    bystander = _sleeper(str(tmp_path / "ray-temp-other"))  # names another path, not the marker
    # A PID file's process goes only where its command line names the marker (a dockerd's containerd)
    named, unnamed = _sleeper(f"--config={marker}/containerd.toml"), _sleeper()
    (tmp_path / "named.pid").write_text(f"{named.pid}\n")
    (tmp_path / "unnamed.pid").write_text(f"{unnamed.pid}\n")
    try:
        entry = register(
            leader.pid, "ray head", markers=[marker], pidfiles=[tmp_path / "named.pid", tmp_path / "unnamed.pid"]
        )
        _rewrite(entry.path, owner=_gone_pid())
        said = reap()
        assert len(said) == 1 and said[0].startswith("ray head (pid ")
        stopped = {int(pid) for pid in said[0].split("(pid ")[1].rstrip(")").split(", ")}
        assert stopped == {leader.pid, daemon.pid, named.pid}
        for process in (leader, daemon, named):
            process.wait(timeout=10)
        assert _alive(bystander.pid) and _alive(unnamed.pid)
    finally:
        for process in (leader, daemon, bystander, named, unnamed):
            _kill(process)


def test_an_entry_cut_short_is_dropped(ledger: Path) -> None:
    ledger.mkdir()
    (ledger / "123-abcd.json").write_text('{"what": "dockerd", "pid": 12')
    (ledger / "124-abcd.json").write_text(json.dumps({"what": "x", "pid": "not a number"}))
    assert reap() == [] and list(ledger.glob("*.json")) == []


def _rewrite(path: Path, **fields: int) -> None:
    record = json.loads(path.read_text())
    record.update(fields)
    if "owner" in fields:
        record["owner_start"] = start_time(fields["owner"])
    path.write_text(json.dumps(record))


def _gone_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    deadline = time.monotonic() + 5
    while _alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return process.pid
