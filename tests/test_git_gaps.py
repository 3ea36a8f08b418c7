"""What no other test reached in envbuild/git/'s cache, reads, upstreams and git runner: a cache on a disk that
is read-only or full, a cache entry that is not a repository, a tree git's object checks refuse (asked for a
second time), reads offline, files the tree holds as links, submodules or large blobs, an upstream that went
away, whose fetch fails or whose refs are all gone, a machine without git, and a git that writes without end
on stderr. Real repositories served by ``git daemon`` on 127.0.0.1, real caches in tmp_path, and for a disk
that is full or read-only a tmpfs mounted by the test itself (root needed: in CI a missing root fails)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.errors import CacheError
from envbuild.git.cache import GitCache
from envbuild.git.files import MAX_FILE, NotCached, PinnedTree
from envbuild.git.process import STDERR_TAIL
from envbuild.git.remote import GitError, GitRunner, last_error_line, ref_refspec
from envbuild.git.upstream import Offline, Upstream, relation_in_cache
from envbuild.lock.moves import Relation
from tests.lib.gitrepos import Served, commit_malformed, git
from tests.lib.tinylock import branch_lock
from tests.lib.tmpfs import KiB, MiB, leftovers, mounted_tmpfs

_counter = iter(range(10**6))
# A .gitmodules git reads, of 2 MiB: comments after its one record (it packs to a few kilobytes).
BIG_GITMODULES = '[submodule "sub"]\n\tpath = sub\n\turl = ../sub\n' + "# padding\n" * (2 * MiB // 10)


# -- helpers: a disk of the test's own, a lock, the CLI ------------------------------------------------------


def envbuild(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "-q"])
    out, err = capsys.readouterr()
    return code, out, err


def upstream(served: Served, prefix: str) -> tuple[str, str]:
    """(name, URL) of a new served repository, the daemon allowing partial clone."""
    name = f"{prefix}{next(_counter)}"
    return name, served.url(name, "daemon-filter")


# -- cache.py: the disk under the cache -----------------------------------------------------------------------


@pytest.mark.gitdaemon
def test_a_cache_on_a_read_only_disk_is_one_line_and_offline_still_answers(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache shared read-only (a mount another machine fills): verify cannot make the cache's directory
    (cold) or keep the ref listing it read (warm), and says so in one line naming the cache; ``--offline``
    answers from it, writing nothing."""
    name, url = upstream(served, "rocache")
    commit = served.repo(name).commit()
    lock = tmp_path / "ro.lock.yaml"
    lock.write_text(branch_lock("ro", url, commit))
    with mounted_tmpfs(tmp_path / "cache", 16 * MiB) as disk:
        cache = disk.path
        disk.remount("ro")
        code, out, err = envbuild(capsys, "lock", "verify", str(lock), "--cache-dir", str(cache))
        assert (code, out, err) == (
            1,
            "",
            f"envbuild: error: {cache / 'git'}: cannot write to the cache: Read-only file system\n",
        )

        disk.remount("rw")
        assert envbuild(capsys, "lock", "verify", str(lock), "--cache-dir", str(cache))[0] == 0
        disk.remount("ro")
        code, out, err = envbuild(capsys, "lock", "verify", str(lock), "--cache-dir", str(cache))
        assert (code, out, err) == (
            1,
            "",
            f"envbuild: error: {cache / 'git'}: cannot write to the cache: Read-only file system\n",
        )
        code, out, err = envbuild(capsys, "lock", "verify", str(lock), "--cache-dir", str(cache), "--offline")
        assert (code, err) == (0, "") and "sources 1 ok" in out, out
        disk.remount("rw")
        assert leftovers(cache) == []


@pytest.mark.gitdaemon
def test_a_listing_that_does_not_fit_even_once_a_dead_fetchs_pack_is_cleared(served: Served, tmp_path: Path) -> None:
    """The listing does not fit; the pack a killed fetch left is cleared to make room, and it is still not
    enough: one line, the cache's fault, and neither that pack nor the listing's temporary file is left."""
    name, url = upstream(served, "fullrefs")
    repo = served.repo(name)
    head = repo.commit()
    refs = "".join(f"create refs/tags/release-{n:05d} {head}\n" for n in range(3000))  # a listing of ~170 KB
    git("update-ref", "--stdin", cwd=repo.path, stdin=refs.encode())
    with mounted_tmpfs(tmp_path / "cache", 1 * MiB) as mounted:
        disk = mounted.path
        cache = GitCache(disk / "git")
        pack = cache.ensure(url).path / "objects" / "pack" / "tmp_pack_dead"
        pack.write_bytes(os.urandom(16 * KiB))  # what a killed fetch left: it frees too little
        mounted.fill(leave=0)
        with pytest.raises(CacheError) as full:
            cache.list_refs(url)
        assert str(full.value) == f"no space left in the cache ({disk / 'git'})"
        assert not pack.exists() and leftovers(disk) == []
        assert cache.cached_listing(url) is None


@pytest.mark.gitdaemon
def test_a_cache_entry_that_is_not_a_repository_is_refused_naming_it(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the cache keeps a URL's repository, a directory that is not one (no ``config``: a half-removed
    entry): it is named, left as it is, and no temporary repository stays beside it."""
    name, url = upstream(served, "notarepo")
    commit = served.repo(name).commit()
    lock = tmp_path / "entry.lock.yaml"
    lock.write_text(branch_lock("entry", url, commit))
    cache = tmp_path / "cache"
    entry = GitCache(cache / "git").repo(url).path
    entry.mkdir(parents=True)
    (entry / "objects").mkdir()
    code, out, err = envbuild(capsys, "lock", "verify", str(lock), "--cache-dir", str(cache))
    assert (code, out, err) == (1, "", f"envbuild: error: {entry}: cannot create the cache repository\n")
    assert os.listdir(entry) == ["objects"] and leftovers(cache) == []


def test_temporary_repositories_a_killed_run_left_go_once_an_hour_old(tmp_path: Path) -> None:
    cache = GitCache(tmp_path / "git")
    cache.root.mkdir()
    dead, live = cache.root / ".tmp-x-dead", cache.root / ".tmp-x-live"
    for path in (dead, live):
        (path / "objects").mkdir(parents=True)
    os.utime(dead, (time.time() - 2 * 3600, time.time() - 2 * 3600))
    repo = cache.ensure("https://example.invalid/x.git")
    assert sorted(p.name for p in cache.root.iterdir()) == sorted([live.name, repo.path.name])


# -- a tree git's object checks refuse, asked for twice -------------------------------------------------------


@pytest.mark.gitdaemon
def test_a_tree_git_refuses_is_refused_again_by_the_next_update(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``.gitmodules`` a directory: git's object checks find it only once the pack is written (gitmodulesBlob),
    fail the fetch and leave the pack. The next `lock update` must not take the tree from that pack."""
    name, url = upstream(served, "gmdir")
    repo = served.repo(name)
    repo.commit("base")
    commit = repo.commit("a .gitmodules directory", files={".gitmodules/README": "not a file\n"})
    lock = tmp_path / "gm.lock.yaml"
    lock.write_text(branch_lock("gm", url, commit))
    before = lock.read_bytes()
    for _ in range(2):
        code, out, err = envbuild(capsys, "lock", "update", str(lock), "--cache-dir", str(tmp_path / "cache"))
        assert (code, out) == (2, ""), err
        (line,) = err.splitlines()
        assert line.startswith(f"envbuild: error: gm: the tree of {commit} cannot be read: "), line
        assert "malformed object refused by git's fsck: gitmodulesBlob" in line, line
        assert lock.read_bytes() == before


# -- files.py: reading a pinned tree --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def odd_tree(served: Served) -> tuple[str, str, str]:
    """(URL, commit, side commit) of a tree holding a symlink, a gitlink, a file of 2 MiB that packs small,
    a file of 16 MiB of random bytes, and a ``.gitmodules`` of 2 MiB; a branch ``side``
    holds one commit of its own."""
    name, url = upstream(served, "oddtree")
    repo = served.repo(name)
    leaf = repo.commit("leaf", files={"a.txt": "a\n"})
    (repo.path / "link.txt").symlink_to("a.txt")
    (repo.path / "random.bin").write_bytes(os.urandom(16 * MiB))  # its fetch outlasts a look at its size
    repo.commit_gitlinks("odd", {"sub": leaf}, None, **{"big.txt": "x" * (2 * MiB), ".gitmodules": BIG_GITMODULES})
    commit = repo.rev("HEAD")
    repo.checkout("side", create_at=leaf)
    side = repo.commit("off main", files={"side.txt": "side\n"})
    repo.checkout("main")
    return url, commit, side


@pytest.mark.gitdaemon
def test_a_read_names_links_submodules_and_paths_through_a_file(odd_tree: tuple[str, str, str], tmp_path: Path) -> None:
    url, commit, _ = odd_tree
    tree = PinnedTree(GitCache(tmp_path / "git"), url, commit)
    files = tree.read(["link.txt", "sub", "a.txt/x", "a.txt"])
    assert {path: (f.data, f.problem) for path, f in files.items()} == {
        "link.txt": (None, "a symbolic link"),
        "sub": (None, "a submodule"),
        "a.txt/x": (None, "absent"),
        "a.txt": (b"a\n", None),
    }
    assert tree.entry("a.txt/x") is None  # a file on the way is no directory
    sub = tree.entry("sub")
    assert sub is not None and sub.kind == "commit"


@pytest.mark.gitdaemon
def test_files_larger_than_a_read_are_named_whether_they_pack_small_or_not(
    odd_tree: tuple[str, str, str], tmp_path: Path
) -> None:
    """A file of 2 MiB that packs to kilobytes passes the bound on what the server sends and is caught by its
    size; one of random bytes read alone is stopped in its fetch; a ``.gitmodules`` of 2 MiB is not read."""
    url, commit, _ = odd_tree
    cache = GitCache(tmp_path / "git")
    tree = PinnedTree(cache, url, commit)
    big = tree.read(["big.txt"])["big.txt"]
    assert (big.data, big.problem) == (None, f"{2 * MiB} bytes, more than the {MAX_FILE} read")
    alone = tree.read(["random.bin"])["random.bin"]
    assert (alone.data, alone.problem) == (None, f"more than the {MAX_FILE} bytes read (its fetch was stopped there)")
    assert tree.gitmodules() == f"is {len(BIG_GITMODULES)} bytes, more than the {MAX_FILE} read"
    assert leftovers(cache.root) == []


@pytest.mark.gitdaemon
def test_offline_a_read_says_what_the_cache_lacks_and_never_fetches(
    odd_tree: tuple[str, str, str], tmp_path: Path
) -> None:
    """Offline, a read needs the commit (cold cache) and then its trees and blobs (a cache that verify filled
    with commits only): each lack is ``offline and not in cache``, and nothing is fetched; once read online,
    it is read offline."""
    url, commit, _ = odd_tree
    network: list[str] = []
    cache = GitCache(tmp_path / "git", git=GitRunner(observer=lambda command, where: network.append(command)))

    def offline_read() -> bytes | None:
        return PinnedTree(cache, url, commit, offline=True).read(["a.txt"])["a.txt"].data

    with pytest.raises(NotCached) as cold:
        offline_read()
    assert str(cold.value) == "git fetch: offline and not in cache" and network == []
    cache.fetch(url, [ref_refspec("branch", "main")], wanted=[commit])  # what verify fetches: commits only
    network.clear()
    with pytest.raises(NotCached):
        offline_read()
    with pytest.raises(NotCached):
        PinnedTree(cache, url, commit, offline=True).gitlinks()
    assert network == []
    assert PinnedTree(cache, url, commit).read(["a.txt"])["a.txt"].data == b"a\n"
    network.clear()
    assert offline_read() == b"a\n" and network == []


@pytest.mark.gitdaemon
def test_a_read_whose_upstream_went_away_says_why_and_leaves_nothing(served: Served, tmp_path: Path) -> None:
    """The commit is in the cache, its files are not, and the upstream is gone: git's reason, and nothing the
    failed fetch began is left; once the upstream is back the read works, and asking again for what the cache
    holds fetches nothing."""
    name, url = upstream(served, "gone")
    repo = served.repo(name)
    commit = repo.commit(files={"pyproject.toml": "[project]\nname = 'gone'\n"})
    cache = GitCache(tmp_path / "git")
    tree = PinnedTree(cache, url, commit)
    root = tree.root()  # the commit alone
    moved = served.base / f"{name}.away"
    (served.base / name).rename(moved)
    try:
        with pytest.raises(GitError) as gone:
            tree.read(["pyproject.toml"])
        assert gone.value.reason == f"remote error: no such repository: /{name}"
        assert leftovers(cache.root) == []
    finally:
        moved.rename(served.base / name)
    assert tree.read(["pyproject.toml"])["pyproject.toml"].data == b"[project]\nname = 'gone'\n"
    assert cache.fetch_objects(url, commit, [root]) is False


# -- upstream.py and remote.py: an upstream's refs --------------------------------------------------------------


@pytest.mark.gitdaemon
def test_offline_a_commit_no_fetched_ref_holds_is_not_taken_for_missing(
    odd_tree: tuple[str, str, str], tmp_path: Path
) -> None:
    """The cache kept the listing (main and side) but fetched main only: offline, a commit on main is on a
    ref; one that is not may be on side, which was never fetched, so it cannot be answered offline."""
    url, commit, side = odd_tree
    cache = GitCache(tmp_path / "git")
    cache.list_refs(url)
    cache.fetch(url, [ref_refspec("branch", "main")])
    up = Upstream(cache, url, offline=True, progress=lambda _: None)
    assert up.on_any_ref(commit, "odd") == cache.commit_trees(url, [commit])[commit]
    with pytest.raises(Offline):
        up.on_any_ref(side, "odd")


@pytest.mark.gitdaemon
def test_a_failed_fetch_of_every_ref_answers_for_every_commit_of_that_upstream(served: Served, tmp_path: Path) -> None:
    """A branch git's object checks refuse (a commit with an impossible time zone) fails the fetch of every
    ref: two commits of that upstream get the same reason, from one fetch."""
    name, url = upstream(served, "badzone")
    repo = served.repo(name)
    first, second = repo.commit(), repo.commit()
    repo.checkout("evil", create_at=second)
    commit_malformed(repo.path, "badTimezone", branch="evil")
    repo.checkout("main")
    network: list[str] = []
    said: list[str] = []
    cache = GitCache(tmp_path / "git", git=GitRunner(observer=lambda command, where: network.append(command)))
    up = Upstream(cache, url, offline=False, progress=said.append)
    reasons = []
    for commit in (first, second):
        with pytest.raises(GitError) as refused:
            up.on_any_ref(commit, f"{name}/m")
        reasons.append(refused.value.reason)
    assert reasons[0] == reasons[1] and reasons[0].startswith("malformed object refused by git's fsck: badTimezone")
    assert network == ["ls-remote", "fetch"]
    assert said == [f"fetching all refs of {name}/m from {url}", f"fetch of {name}/m failed: {reasons[0]}"]


@pytest.mark.gitdaemon
def test_a_commit_of_an_upstream_whose_refs_are_all_gone_is_on_no_ref(served: Served, tmp_path: Path) -> None:
    name, url = upstream(served, "norefs")
    repo = served.repo(name)
    commit = repo.commit()
    cache = GitCache(tmp_path / "git")
    assert Upstream(cache, url, offline=False, progress=lambda _: None).on_any_ref(commit, "x") == repo.tree(commit)
    git("update-ref", "-d", "refs/heads/main", cwd=repo.path)  # every branch deleted upstream
    assert Upstream(cache, url, offline=False, progress=lambda _: None).on_any_ref(commit, "x") is None
    assert cache.namespace_refs(url) == {}


@pytest.mark.gitdaemon
def test_how_two_commits_relate_is_answered_only_when_the_cache_holds_both(served: Served, tmp_path: Path) -> None:
    name, url = upstream(served, "relation")
    repo = served.repo(name)
    old, new = repo.commit(), repo.commit()
    cache = GitCache(tmp_path / "git")
    assert relation_in_cache(cache, url, old, new) is None  # a cold cache
    cache.fetch(url, [ref_refspec("branch", "main")])
    assert relation_in_cache(cache, url, old, "0" * 40) is None
    assert relation_in_cache(cache, url, old, new) == Relation(ahead=1, behind=0)


# -- process.py: starting git, and what it writes -------------------------------------------------------------


@pytest.mark.gitdaemon
def test_a_machine_without_git_is_said_in_the_pins_result(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name, url = upstream(served, "nogit")
    commit = served.repo(name).commit()
    lock = tmp_path / "nogit.lock.yaml"
    lock.write_text(branch_lock("nogit", url, commit))
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    code, out, err = envbuild(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "--json")
    assert code == 1, err
    (result,) = json.loads(out)["results"]
    assert (result["status"], result["detail"]) == ("unreachable", "cannot run git: No such file or directory")


def test_a_git_that_writes_without_end_on_stderr_is_kept_to_its_tail(tmp_path: Path) -> None:
    """What a server makes git print (``remote:`` lines) is kept to the last lines, not held whole."""
    line = "error: noise\n"
    count = 8 * STDERR_TAIL // len(line)
    noisy = {"alias.noisy": f"!yes '{line.strip()}' | head -n {count} >&2; exit 3"}
    with pytest.raises(GitError) as failed:
        GitRunner().run(["noisy"], repo=tmp_path, config=noisy)
    assert failed.value.reason == "noise" and failed.value.returncode == 3
    assert STDERR_TAIL <= len(failed.value.stderr) <= 2 * STDERR_TAIL
    assert failed.value.stderr.endswith(line)


def test_git_words_without_a_fatal_or_error_line_give_the_last_line_cut_to_one_screen() -> None:
    """A git that dies of a closed connection or a helper's own words says no ``fatal:``: its last line is the
    reason; a server's line of any length is cut at 300 characters."""
    assert last_error_line("remote: Counting objects: 3\nConnection closed by 127.0.0.1 port 22\n") == (
        "Connection closed by 127.0.0.1 port 22"
    )
    assert last_error_line("fatal: remote error: " + "x" * 400) == "remote error: " + "x" * 286 + "…"
