"""What no other test reached in exporting a pinned tree (envbuild/git/treeexport.py, treewriter.py): names
longer than a file system holds, an archive cut short, a server that will not send a commit by its ID, a
commit gone upstream, another build that fetched the commit while this one waited, a tree git's object checks
refuse (their pack left behind by git), a disk that fills while the commit is fetched or archived, and a lock
recording a gitlink the tree does not hold. Real repositories served by ``git daemon`` on 127.0.0.1, real
caches in tmp_path, and for a full disk a tmpfs mounted by the test itself (root needed: in CI a missing root
fails)."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import pytest

from envbuild.errors import CacheError, EnvbuildError
from envbuild.git.treeexport import (
    EXPORT_NS,
    ExportError,
    TreeExporter,
    export_tree,
    fetch_commit,
    gitlink_problems,
    has_commit,
    source_pin,
)
from envbuild.git.treewriter import TreeWriteError, write_tar_tree
from envbuild.lock.model import Source, Submodule
from tests.lib.claims import Beside, held_elsewhere
from tests.lib.gitrepos import Repo, Served, git, make_repo
from tests.lib.tmpfs import KiB, MiB, leftovers, mounted_tmpfs

_counter = iter(range(10**6))


def served_repo(served: Served, prefix: str) -> tuple[Repo, str]:
    """A new served repository and its URL (the daemon allowing partial clone)."""
    name = f"{prefix}{next(_counter)}"
    return served.repo(name), served.url(name, "daemon-filter")


def source_of(url: str, commit: str) -> Source:
    return Source(name="src", repo=url, ref="main", ref_type="branch", commit=commit)


def export_into(dest: Path, source: Source, exporter: TreeExporter) -> str:
    dest.mkdir()
    return export_tree(source, dest, exporter)


def everything_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def commit_tree(repo: Repo, lines: str, message: str) -> str:
    """A commit on main whose tree ``git mktree`` makes of ``lines`` (``MODE TYPE OID\\tNAME``, one a line),
    with none of the checks ``git add`` makes of the names."""
    tree = git("mktree", cwd=repo.path, stdin=lines.encode())
    commit = git("commit-tree", tree, "-p", "main", "-m", message, cwd=repo.path)
    git("update-ref", "refs/heads/main", commit, cwd=repo.path)
    return commit


# -- treewriter.py: what a file system cannot hold, and an archive cut short ------------------------------------

LONG = "n" * 300  # past NAME_MAX (255 bytes) of every Linux file system; git holds it and its fsck passes it


@pytest.mark.gitdaemon
@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_name_longer_than_a_file_system_holds_is_refused_naming_it(served: Served, tmp_path: Path, kind: str) -> None:
    repo, url = served_repo(served, "longname")
    repo.commit("base")
    blob = git("hash-object", "-w", "--stdin", cwd=repo.path, stdin=b"x\n")
    inner = LONG if kind == "file" else "f"  # a/LONG, or LONG/f
    tree = git("mktree", cwd=repo.path, stdin=f"100644 blob {blob}\t{inner}\n".encode())
    entry = f"040000 tree {tree}\t{'a' if kind == 'file' else LONG}"
    commit = commit_tree(repo, f"{entry}\n100644 blob {blob}\tok.txt\n", f"a {kind} name of 300 bytes")
    with pytest.raises(ExportError) as refused:
        export_into(tmp_path / "dest", source_of(url, commit), TreeExporter(tmp_path / "cache"))
    where = f"{LONG}: cannot create directory {LONG}" if kind == "directory" else f"a/{LONG}: cannot create"
    assert str(refused.value) == (
        f"source src: the tree of {commit} cannot be written safely: {where}: File name too long"
    )
    assert everything_under(tmp_path / "dest") == ([] if kind == "directory" else ["a"])


def test_an_archive_cut_short_is_refused_and_what_came_before_stays_below(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "up")
    repo.commit("files", files={"a.txt": "a\n", "b/c.txt": "c\n"})
    (repo.path / "z.bin").write_bytes(os.urandom(64 * KiB))
    repo.commit("a large file last")
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=repo.path, capture_output=True, check=True)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(TreeWriteError) as refused:
        write_tar_tree(io.BytesIO(archive.stdout[: len(archive.stdout) // 2]), dest)
    assert str(refused.value) == "(archive): not a readable tar stream: unexpected end of data"
    assert everything_under(dest) == ["a.txt", "b", "b/c.txt", "file2.txt", "z.bin"]  # below dest, nowhere else
    assert sorted(os.listdir(tmp_path)) == ["dest", "up"]


# -- treeexport.py: fetching the commit whole ---------------------------------------------------------------------


@pytest.mark.gitdaemon
def test_a_server_that_will_not_send_a_commit_by_id_is_asked_for_the_branch(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over protocol version 0 a server sends only what it advertises: a commit behind the branch's head is
    refused by ID, so the branch's history is fetched, and the commit kept under the export's ref."""
    repo, url = served_repo(served, "protov0")
    pinned = repo.commit("pinned", files={"a.txt": "pinned\n"})
    repo.commit("after", files={"a.txt": "after\n"})
    config = tmp_path / "gitconfig"
    config.write_text("[protocol]\n\tversion = 0\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    exporter = TreeExporter(tmp_path / "cache")
    assert export_into(tmp_path / "dest", source_of(url, pinned), exporter) == repo.tree(pinned)
    assert (tmp_path / "dest" / "a.txt").read_text() == "pinned\n"
    export_repo = exporter.cache.repo(url).path
    refs = git("for-each-ref", "--format=%(refname) %(objectname)", cwd=export_repo).splitlines()
    assert f"{EXPORT_NS}{pinned} {pinned}" in refs and f"refs/envbuild/ref/heads/main {repo.rev('main')}" in refs


@pytest.mark.gitdaemon
def test_a_commit_gone_from_the_upstream_is_refused_naming_it(served: Served, tmp_path: Path) -> None:
    """Force-pushed away and collected: the commit is not sent by ID, and the branch no longer holds it."""
    repo, url = served_repo(served, "forcepushed")
    base = repo.commit("base")
    gone = repo.commit("gone")
    repo.force_branch("main", base)
    repo.commit("instead")
    with pytest.raises(ExportError) as refused:
        export_into(tmp_path / "dest", source_of(url, gone), TreeExporter(tmp_path / "cache"))
    assert str(refused.value) == f"source src: {url} did not send the files of {gone}"
    assert everything_under(tmp_path / "dest") == []


@pytest.mark.gitdaemon
def test_a_commit_another_build_fetched_while_this_one_waited_is_not_fetched_again(
    served: Served, tmp_path: Path
) -> None:
    """Another build holds the export repository's lock and fetches the commit; this one, waiting for the lock,
    finds it whole once it has the lock, and asks the upstream nothing (it has gone meanwhile)."""
    repo, url = served_repo(served, "waited")
    commit = repo.commit("one", files={"a.txt": "a\n"})
    exporter = TreeExporter(tmp_path / "cache")
    pin = source_pin(source_of(url, commit))
    cached = exporter.cache.ensure(url)
    away = repo.path.with_name(f"{repo.path.name}.away")
    with held_elsewhere(cached.lock_path):
        waiting = Beside(lambda say: fetch_commit(exporter, pin, absent=True))
        _blocked_on(cached.lock_path, waiting)
        git("fetch", "-q", "--depth=1", url, f"+{commit}:{EXPORT_NS}{commit}", cwd=cached.path)  # the other build
        repo.path.rename(away)
    try:
        assert waiting.result(60) == cached
        assert has_commit(exporter, pin)
    finally:
        away.rename(repo.path)


def _blocked_on(lock: Path, work: Beside[object], timeout: float = 30) -> None:
    """Wait until ``work``'s thread is blocked on ``lock``'s flock (a waiter in /proc/locks, ``->``)."""
    inode = f":{lock.stat().st_ino} "
    deadline = time.monotonic() + timeout
    while not any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines()):
        assert work.thread.is_alive(), "it ended without waiting for the lock"
        assert time.monotonic() < deadline, f"not waiting for {lock} after {timeout} s"
        time.sleep(0.02)


@pytest.mark.gitdaemon
def test_a_tree_git_refuses_is_never_exported_however_often_asked(served: Served, tmp_path: Path) -> None:
    """``.gitmodules`` a directory: git's object checks find it once the pack is written (gitmodulesBlob), fail
    the fetch and leave the pack. Neither the fetch of the branch that follows nor the next export takes it."""
    repo, url = served_repo(served, "gmexport")
    repo.commit("base")
    commit = repo.commit("a .gitmodules directory", files={".gitmodules/README": "not a file\n"})
    exporter = TreeExporter(tmp_path / "cache")
    for attempt in ("first", "second"):
        with pytest.raises(ExportError) as refused:
            export_into(tmp_path / attempt, source_of(url, commit), exporter)
        message = str(refused.value)
        assert message.startswith(f"source src: cannot fetch the files of {commit} from {url}: "), message
        assert message.count("malformed object refused by git's fsck: gitmodulesBlob") == 2, message
        assert everything_under(tmp_path / attempt) == []
    assert not has_commit(exporter, source_pin(source_of(url, commit)))


# -- a full disk ------------------------------------------------------------------------------------------------


@pytest.mark.gitdaemon
def test_an_export_fetch_that_fills_the_disk_is_the_caches_fault_and_leaves_nothing(
    served: Served, tmp_path: Path
) -> None:
    repo, url = served_repo(served, "exportfull")
    (repo.path / "big.bin").write_bytes(os.urandom(3 * MiB))
    commit = repo.commit("three MiB of random bytes")
    with mounted_tmpfs(tmp_path / "cache", 1 * MiB) as mounted:
        disk = mounted.path
        with pytest.raises(CacheError) as full:
            export_into(tmp_path / "dest", source_of(url, commit), TreeExporter(disk))
        assert str(full.value) == f"no space left in the cache ({disk / 'git-export'})"
        assert leftovers(disk) == []
        free = os.statvfs(disk)
        assert free.f_bavail * free.f_frsize > 512 * KiB  # the half-received pack is gone


@pytest.mark.gitdaemon
def test_an_archive_that_fills_the_disk_is_said_and_removed(served: Served, tmp_path: Path) -> None:
    """The commit is whole in the export cache; the disk of the build's directory fills as git writes the
    commit's archive beside it: git's words, and the partial archive removed."""
    repo, url = served_repo(served, "archivefull")
    (repo.path / "big.bin").write_bytes(os.urandom(2 * MiB))
    commit = repo.commit("two MiB of random bytes")
    exporter = TreeExporter(tmp_path / "cache")
    with mounted_tmpfs(tmp_path / "build", 1 * MiB) as mounted:
        disk = mounted.fill(leave=256 * KiB).parent
        with pytest.raises(EnvbuildError) as full:
            export_into(disk / "dest", source_of(url, commit), exporter)
        assert str(full.value) == "git archive: write error: No space left on device"
        assert sorted(os.listdir(disk)) == ["dest", "filler"] and os.listdir(disk / "dest") == []
    assert has_commit(exporter, source_pin(source_of(url, commit)))  # fetched whole: the next build reuses it


# -- a lock's record of a gitlink the tree does not hold --------------------------------------------------------


def test_a_recorded_submodule_the_tree_has_no_gitlink_for_is_a_problem_naming_the_path() -> None:
    commit = "c" * 40
    recorded = (
        Submodule(path="lib/gone", repo="https://example.invalid/gone.git", commit=commit),
        Submodule(path="lib/skipped", skip="provided by a source"),
    )
    assert gitlink_problems({}, recorded) == [f"the tree has no gitlink at lib/gone, the lock records {commit}"]
