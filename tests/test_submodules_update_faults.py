"""`lock update` reading submodules when an upstream is down or a tree is hostile, on real repositories
served by ``git daemon``: a submodule that cannot be read keeps what the lock records for that very commit
(or records why it is unknown), never a guess; a mirror rule that turns a submodule's URL into a remote
helper, a nesting deeper than the bound, a tree naming more submodules than the bound and a ``.gitmodules``
git would not read each refuse the update in one line naming the path, with the lock unchanged."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.lock import read_lock
from envbuild.update.read_submodules import MAX_DEPTH, MAX_PER_TREE, read_source_submodules
from tests.lib.gitrepos import Served, commit_malformed, free_port, git
from tests.lib.submodlock import CATLASS_PATH, GTEST_PATH, GTEST_UPSTREAM, SubmoduleUpstreams, make_upstreams
from tests.lib.tinylock import branch_lock

pytestmark = pytest.mark.gitdaemon
_counter = iter(range(10**6))


@pytest.fixture(scope="module")
def up(served: Served) -> SubmoduleUpstreams:
    return make_upstreams(served, f"smf{next(_counter)}")


@pytest.fixture(scope="module")
def recorded(up: SubmoduleUpstreams, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A lock as `lock update` completed it while every upstream answered."""
    work = tmp_path_factory.mktemp("recorded")
    lock = up.write_lock(work / "sub.lock.yaml")
    assert main(["lock", "update", str(lock), "--cache-dir", str(work / "cache"), *up.mirror_args(), "-q"]) == 0
    yield lock


def update(lock: Path, cache: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["lock", "update", str(lock), "--cache-dir", str(cache), *args])
    out, err = capsys.readouterr()
    return code, out, err


def nobody_listens() -> str:
    return f"git://127.0.0.1:{free_port()}/gone.git"


# -- an upstream that does not answer ------------------------------------------------------------------------


def test_a_submodule_upstream_that_does_not_answer_keeps_what_the_lock_records_for_that_commit(
    up: SubmoduleUpstreams, recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "sub.lock.yaml"
    lock.write_bytes(recorded.read_bytes())
    before = lock.read_bytes()
    # googletest's mirror is down and the cache is new: its tree cannot be read, its commit did not move.
    code, out, err = update(lock, tmp_path / "cold", capsys, "--mirror", f"{GTEST_UPSTREAM}={nobody_listens()}")
    assert code == 0, err
    assert out == "no changes\n" and lock.read_bytes() == before
    name = f"parent/{CATLASS_PATH}/{GTEST_PATH}"
    (warning,) = [line for line in err.splitlines() if "warning" in line and name in line]
    assert f"kept as recorded for {up.commits['googletest'][:12]}" in warning and "cannot re-read" in warning


def test_a_submodule_upstream_that_does_not_answer_is_recorded_as_unknown_not_guessed(
    up: SubmoduleUpstreams, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = up.write_lock(tmp_path / "new.lock.yaml")  # nothing recorded yet
    code, _, err = update(lock, tmp_path / "c", capsys, "--mirror", f"{GTEST_UPSTREAM}={nobody_listens()}")
    assert code == 0, err
    parent = read_lock(lock).lock.source("parent")
    (catlass,) = parent.submodules
    (gtest,) = catlass.submodules
    assert (gtest.path, gtest.commit, gtest.tree) == (GTEST_PATH, up.commits["googletest"], None)
    name = f"parent/{CATLASS_PATH}/{GTEST_PATH}"
    assert parent.submodules_unknown is not None and parent.submodules_unknown.startswith(f"{name}: cannot read ")
    assert any(line.startswith("envbuild: warning: parent: ") and name in line for line in err.splitlines()), err


def test_a_source_tree_that_cannot_be_read_keeps_its_records_only_for_the_same_commit(
    up: SubmoduleUpstreams, recorded: Path, tmp_path: Path
) -> None:
    """The source's own tree, unreadable (its upstream is down, the cache new): the records stay for the
    commit they were read from, with a warning; a moved commit gets none, and the reason."""
    previous = read_lock(recorded).lock.source("parent")
    down = Mirrors.parse([f"{up.url('parent')}={nobody_listens()}"])
    said: list[str] = []
    kept = read_source_submodules(
        previous, GitCache(tmp_path / "c1"), mirrors=down, previous=previous, progress=said.append
    )
    assert (kept.submodules, kept.submodules_unknown) == (previous.submodules, previous.submodules_unknown)
    assert kept.submodules
    assert any(line.startswith("warning: parent: submodules kept as recorded for") for line in said), said

    moved = dataclasses.replace(previous, commit=up.repos["parent"].rev("main~1"))
    fresh = read_source_submodules(moved, GitCache(tmp_path / "c2"), mirrors=down, previous=previous)
    assert fresh.submodules == ()
    assert fresh.submodules_unknown is not None and "the pinned tree cannot be read" in fresh.submodules_unknown


# -- what the lock cannot record -----------------------------------------------------------------------------


def refused(lock: Path, cache: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one line a refused `lock update` says; the lock unchanged."""
    before = lock.read_bytes()
    code, out, err = update(lock, cache, capsys, "-q", *args)
    assert (code, out) == (2, ""), err
    assert lock.read_bytes() == before
    (line,) = err.strip().splitlines()
    return line


def test_a_mirror_that_turns_a_submodule_url_into_a_remote_helper_refuses_the_update(
    up: SubmoduleUpstreams, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = up.write_lock(tmp_path / "helper.lock.yaml")
    line = refused(lock, tmp_path / "c", capsys, "--mirror", "https://gitcode.example/=ext::x%20")
    name = f"parent/{CATLASS_PATH}/{GTEST_PATH}"
    assert line.startswith(f"envbuild: error: {name}: repo 'ext::x%20GitHub_Trending/go/googletest.git' names a git")
    assert f"(after mirror rewriting of {GTEST_UPSTREAM!r})" in line


def one_repo_lock(path: Path, name: str, url: str, commit: str) -> Path:
    path.write_text(branch_lock(name, url, commit))
    return path


def test_submodules_nested_deeper_than_the_bound_refuse_the_update(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One repository whose every commit holds the one before it as a submodule, by its own URL."""
    name = f"deep{next(_counter)}"
    repo, url = served.repo(name), served.url(name, "daemon-filter")
    commit = repo.commit("the leaf", files={"leaf.txt": "leaf\n"})
    for level in range(1, MAX_DEPTH + 2):
        commit = repo.commit_gitlinks(f"level {level}", {"sub": commit}, {"sub": ("sub", url)})
    lock = one_repo_lock(tmp_path / "deep.lock.yaml", "deep", url, commit)
    line = refused(lock, tmp_path / "c", capsys)
    assert line == f"envbuild: error: deep{'/sub' * MAX_DEPTH}: submodules nested deeper than {MAX_DEPTH} levels"


def test_a_tree_naming_more_submodules_than_the_bound_refuses_the_update(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"wide{next(_counter)}"
    repo, url = served.repo(name), served.url(name, "daemon-filter")
    leaf = repo.commit("the leaf", files={"leaf.txt": "leaf\n"})
    count = MAX_PER_TREE + 1
    (repo.path / ".gitmodules").write_text(
        "".join(f'[submodule "m{i}"]\n\tpath = m{i}\n\turl = {url}\n' for i in range(count))
    )
    entries = "".join(f"160000 {leaf}\tm{i}\n" for i in range(count))
    git("add", ".gitmodules", cwd=repo.path)
    git("update-index", "--index-info", cwd=repo.path, stdin=entries.encode())
    git("commit", "-q", "-m", "many submodules", cwd=repo.path)
    lock = one_repo_lock(tmp_path / "wide.lock.yaml", "wide", url, repo.rev("HEAD"))
    line = refused(lock, tmp_path / "c", capsys)
    assert line == f"envbuild: error: wide: {count} submodules in one tree, more than {MAX_PER_TREE}"


def tree_commit(repo: Path, entries: list[tuple[bytes, bytes, str]], message: str) -> str:
    """A commit on main of a tree of ``entries`` (mode, name, object), written as git's plumbing writes it,
    without the checks ``git add`` makes (it refuses a symlinked ``.gitmodules``)."""
    data = b"".join(mode + b" " + name + b"\0" + bytes.fromhex(oid) for mode, name, oid in entries)
    tree = git("hash-object", "-t", "tree", "-w", "--literally", "--stdin", cwd=repo, stdin=data)
    commit = git("commit-tree", tree, "-p", "main", "-m", message, cwd=repo)
    git("update-ref", "refs/heads/main", commit, cwd=repo)
    return commit


def gitmodules_commit(
    served: Served, entry: tuple[bytes, bytes, bytes], transport: str = "daemon-filter"
) -> tuple[str, str]:
    """(URL, commit) of a repository whose commit holds a gitlink ``x`` and the ``.gitmodules`` ``entry``
    (mode, name, content), served by ``transport``."""
    name = f"gm{next(_counter)}"
    repo, url = served.repo(name), served.url(name, transport)
    leaf = repo.commit("the leaf", files={"leaf.txt": "leaf\n"})
    mode, path, content = entry
    blob = git("hash-object", "-w", "--stdin", cwd=repo.path, stdin=content)
    return url, tree_commit(repo.path, [(mode, path, blob), (b"160000", b"x", leaf)], "a .gitmodules")


def test_a_gitmodules_git_cannot_parse_refuses_the_update_of_a_tree_with_gitlinks(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, commit = gitmodules_commit(served, (b"100644", b".gitmodules", b'[submodule "x"\n\tpath = x\n'))
    lock = one_repo_lock(tmp_path / "gm.lock.yaml", "gm", url, commit)
    line = refused(lock, tmp_path / "c", capsys)
    assert line.startswith("envbuild: error: gm: .gitmodules is not readable as git config"), line


@pytest.mark.parametrize("transport", ["daemon-filter", "daemon-nofilter"])
def test_a_tree_git_refuses_refuses_the_update_naming_the_source(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str], transport: str
) -> None:
    """A symlinked ``.gitmodules`` is malformed to git's object checks, which refuse the tree at the fetch:
    no later fetch or build would take that commit, so the lock does not pin it (from a server that sends
    trees with the commits too)."""
    url, commit = gitmodules_commit(served, (b"120000", b".gitmodules", b"leaf.txt"), transport)
    lock = one_repo_lock(tmp_path / "gm.lock.yaml", "gm", url, commit)
    line = refused(lock, tmp_path / "c", capsys)
    assert line.startswith(f"envbuild: error: gm: the tree of {commit} cannot be read: "), line
    assert "malformed object refused by git's fsck: gitmodulesSymlink" in line


@pytest.mark.parametrize("kind", ["hasDotgit", "duplicateEntries"])
def test_a_submodule_tree_git_refuses_refuses_the_update_naming_the_path(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    name = f"gmx{next(_counter)}"
    evil, evil_url = served.repo(f"{name}/evil"), served.url(f"{name}/evil", "daemon-filter")
    evil.commit("good")
    bad = commit_malformed(evil.path, kind)
    holder, url = served.repo(f"{name}/holder"), served.url(f"{name}/holder", "daemon-filter")
    holder.commit("holder", files={"README": "holds a submodule git refuses\n"})
    commit = holder.commit_gitlinks("evil", {"lib/evil": bad}, {"evil": ("lib/evil", evil_url)})
    lock = one_repo_lock(tmp_path / "holder.lock.yaml", "holder", url, commit)
    line = refused(lock, tmp_path / "c", capsys)
    assert line.startswith("envbuild: error: holder/lib/evil: "), line
    assert f"malformed object refused by git's fsck: {kind}" in line


def test_the_source_tree_of_an_upstream_that_does_not_answer_is_unknown_with_a_warning(
    up: SubmoduleUpstreams, tmp_path: Path
) -> None:
    source = read_lock(up.write_lock(tmp_path / "new.lock.yaml")).lock.source("parent")
    down = Mirrors.parse([f"{up.url('parent')}={nobody_listens()}"])
    said: list[str] = []
    unknown = read_source_submodules(source, GitCache(tmp_path / "c"), mirrors=down, progress=said.append)
    assert unknown.submodules == () and unknown.submodules_unknown is not None
    assert unknown.submodules_unknown.startswith("the pinned tree cannot be read: ")
    assert said == [f"warning: parent: submodules unknown: {unknown.submodules_unknown}"]
