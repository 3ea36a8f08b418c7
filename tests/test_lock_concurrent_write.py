"""Two commands writing one lock at once lose neither's change without a word: `lock update` (and `lock
add`) refuses to write over a lock that changed since it read it, exit 1, the other's change kept. Real
repositories on a real git daemon, a real second `envbuild` process, a real flock held by another
process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.git.cache import GitCache
from envbuild.lock import read_lock
from envbuild.lock.io import LockWriteRefused, replace_lock_file
from envbuild.update.rewrite import update_lock_file
from envbuild.update.update import Moves
from tests.lib.gitrepos import Served

ENVBUILD = "import sys; from envbuild.cli import main; sys.exit(main(sys.argv[1:]))"
TWO_SOURCES = """\
version: 2
name: two
sources:
  - name: fast   # moved by the other process
    repo: {fast}
    ref: main
    ref_type: branch
    commit: '{fast_old}'
    install: {{mode: none}}
  - name: slow
    repo: {slow}
    ref: main
    ref_type: branch
    commit: '{slow_old}'
    install: {{mode: none}}
"""


@pytest.mark.gitdaemon
def test_an_update_that_another_update_overtook_is_refused_and_the_other_kept(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = {}, {}
    for name in ("cw-fast", "cw-slow"):
        repo = served.repo(name)
        old[name] = repo.commit(files={"a.txt": "1\n"})
        new[name] = repo.commit(files={"a.txt": "2\n"})
    lock = tmp_path / "two.lock.yaml"
    url = {n: served.url(n, "daemon-filter") for n in old}
    lock.write_text(
        TWO_SOURCES.format(fast=url["cw-fast"], slow=url["cw-slow"], fast_old=old["cw-fast"], slow_old=old["cw-slow"])
    )
    cache = tmp_path / "cache"
    read = read_lock(lock)
    overtaken: list[str] = []

    def meanwhile(message: str) -> None:
        """While this update runs, a real second `envbuild lock update` moves the other source."""
        if not overtaken:
            overtaken.append(message)
            other = subprocess.run(
                [sys.executable, "-c", ENVBUILD, "lock", "update", str(lock), "fast", "--cache-dir", str(cache), "-q"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert other.returncode == 0, other.stderr

    with pytest.raises(LockWriteRefused) as info:
        update_lock_file(read, Moves(names=("slow",)), GitCache(cache / "git"), progress=meanwhile)
    assert overtaken, "the update said nothing while it ran"
    assert str(info.value) == (
        f"{lock}: not written, the old lock is unchanged: it changed since this command read it (another "
        "`lock update` or an edit, meanwhile); run it again"
    )
    after = read_lock(lock).lock
    assert [s.commit for s in after.sources] == [new["cw-fast"], old["cw-slow"]]  # the other's move kept
    assert "# moved by the other process" in lock.read_text()

    # Run again, it moves its own source over the other's change.
    assert main(["lock", "update", str(lock), "slow", "--cache-dir", str(cache), "-q"]) == 0
    assert [s.commit for s in read_lock(lock).lock.sources] == [new["cw-fast"], new["cw-slow"]]


SMALL = textwrap.dedent("""\
    version: 2
    name: small
    sources: []
    """)


def test_a_writer_waits_for_the_one_holding_the_lock_then_refuses_what_it_overtook(tmp_path: Path) -> None:
    """The other writer holds the file's flock, replaces the file and goes: the waiting one locks the file
    now at the path, sees it is not what it read, and writes nothing."""
    lock = tmp_path / "small.lock.yaml"
    lock.write_text(SMALL)
    read = read_lock(lock)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""\
                import fcntl, os, sys
                fd = os.open(sys.argv[1], os.O_RDONLY)
                fcntl.flock(fd, fcntl.LOCK_EX)
                print("held", flush=True)
                sys.stdin.readline()
                tmp = sys.argv[1] + ".new"
                with open(tmp, "w") as f:
                    f.write(sys.argv[2])
                os.replace(tmp, sys.argv[1])
                """),
            str(lock),
            SMALL.replace("small", "theirs"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            replace_lock_file(read, SMALL.replace("small", "mine"))
            outcome.append(None)
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    writer = threading.Thread(target=write)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        writer.start()
        _wait_until_blocked_on(lock)  # this writer holds the old file open, waiting for its flock
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
    finally:
        holder.wait(timeout=30)
        writer.join(timeout=30)
    assert holder.returncode == 0
    (refused,) = outcome
    assert isinstance(refused, LockWriteRefused) and "it changed since this command read it" in str(refused)
    assert read_lock(lock).lock.name == "theirs"


def _wait_until_blocked_on(path: Path) -> None:
    """Until /proc/locks shows a process waiting (``->``) for the flock of ``path``'s file."""
    st = path.stat()
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any("->" in line and f" {inode} " in line for line in Path("/proc/locks").read_text().splitlines()):
            return
        time.sleep(0.01)
    raise AssertionError(f"nobody waited for the flock of {path}")


def test_an_unchanged_lock_is_replaced_through_a_symlink_too(tmp_path: Path) -> None:
    target = tmp_path / "real.lock.yaml"
    target.write_text(SMALL)
    link = tmp_path / "link.lock.yaml"
    link.symlink_to(target)
    replace_lock_file(read_lock(link), SMALL.replace("small", "mine"))
    assert read_lock(link).lock.name == "mine"
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_lock_removed_since_it_was_read_is_not_written_again(tmp_path: Path) -> None:
    lock = tmp_path / "small.lock.yaml"
    lock.write_text(SMALL)
    read = read_lock(lock)
    lock.unlink()
    with pytest.raises(LockWriteRefused, match="cannot open it again: No such file or directory"):
        replace_lock_file(read, SMALL)
    assert not lock.exists()
