"""The git cache: layout, partial clones that never fetch lazily, and consistency under concurrency
and killed fetches."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.git.cache import GitCache, cache_key, remove_stale_files
from envbuild.git.remote import (
    NO_LAZY_FETCH_URL,
    RefListing,
    last_error_line,
)
from envbuild.git.upstream import ALL_REFS
from envbuild.lock.model import Source
from envbuild.locking import file_lock
from envbuild.verify.sources import verify_source
from tests.lib.gitrepos import (
    Served,
    ThrottlingProxy,
    child_pids,
    descendants,
    fast_import_repo,
    git,
    is_running,
    open_files,
    stop_process_group,
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# A verify in a separate process: prints its statuses and progress as JSON.
VERIFY_SCRIPT = """
import json, sys
from pathlib import Path
from envbuild.git.cache import GitCache
from envbuild.lock.model import Source
from envbuild.locking import file_lock
from envbuild.verify.sources import verify_sources
root, url, *commits = sys.argv[1:]
messages = []
sources = [Source(name="big", repo=url, ref="main", ref_type="branch", commit=c) for c in commits]
results = verify_sources(sources, GitCache(Path(root)), progress=messages.append)
print(json.dumps({"statuses": [r.status for r in results], "messages": messages}))
"""


# `envbuild` itself, as a user runs it (the console script is this, installed).
ENVBUILD = "import sys; from envbuild.cli import main; sys.exit(main())"


def test_cache_key_is_a_safe_name_per_url() -> None:
    a = cache_key("https://github.com/NVIDIA/Megatron-LM.git")
    assert a.startswith("megatron-lm-") and len(a) == len("megatron-lm-") + 24
    assert cache_key("https://github.com/NVIDIA/Megatron-LM.git") == a
    assert cache_key("https://mirror.example/NVIDIA/Megatron-LM.git") != a
    for url in ("git@host:../../etc/passwd", "file:///", "https://h/a%2F..%2Fb/-x", "https://h/.."):
        key = cache_key(url)
        assert "/" not in key and not key.startswith((".", "-")), key


def test_ref_listing_peels_annotated_tags() -> None:
    text = "\n".join(
        [
            f"{'1' * 40}\tHEAD",
            f"{'2' * 40}\trefs/heads/main",
            f"{'3' * 40}\trefs/tags/light",
            f"{'4' * 40}\trefs/tags/v1",
            f"{'5' * 40}\trefs/tags/v1^{{}}",
            f"{'6' * 40}\trefs/pull/1/head",
        ]
    )
    listing = RefListing.parse(text)
    assert listing.heads == {"main": "2" * 40}
    assert listing.tags == {"light": "3" * 40, "v1": "5" * 40}
    assert listing.refs == {"heads/main": "2" * 40, "tags/light": "3" * 40, "tags/v1": "4" * 40}
    assert listing.tips() == {"2" * 40, "3" * 40, "5" * 40}


def test_last_error_line() -> None:
    refused = "fatal: unable to connect to 127.0.0.1:\n127.0.0.1[0: 127.0.0.1]: errno=Connection refused\n"
    assert (
        last_error_line(refused) == "unable to connect to 127.0.0.1: 127.0.0.1[0: 127.0.0.1]: errno=Connection refused"
    )
    assert last_error_line("warning: x\nfatal: repository 'x' not found\n") == "repository 'x' not found"
    assert last_error_line("") == "failed without a message"
    fsck = (
        f"error: object {'ab' * 20}: duplicateEntries: contains duplicate file entries\n"
        "fatal: fsck error in packed object\nfatal: index-pack failed\n"
    )
    assert last_error_line(fsck) == (
        f"malformed object refused by git's fsck: duplicateEntries: contains duplicate file entries (object {'ab' * 20})"
    )
    hostile = "remote: \x1b[2J\x1b[31mall good\r\nfatal: \x1b]0;title\x07gone\n"
    assert last_error_line(hostile) == "\\x1b]0;title\\x07gone"  # escaped, not sent to the terminal


def test_concurrent_creation_yields_one_repository(tmp_path: Path) -> None:
    cache = GitCache(tmp_path / "git")
    url = "https://example.invalid/x.git"
    barrier = threading.Barrier(6)

    def create() -> Path:
        barrier.wait()
        return cache.ensure(url).path

    threads_out: list[Path] = []
    threads = [threading.Thread(target=lambda: threads_out.append(create())) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(threads_out) == {cache.repo(url).path}
    assert sorted(p.name for p in cache.root.iterdir()) == [cache.repo(url).path.name]
    config = (cache.repo(url).path / "config").read_text()
    assert NO_LAZY_FETCH_URL in config and url not in config


def test_remove_stale_files(tmp_path: Path) -> None:
    repo = GitCache(tmp_path).ensure("https://example.invalid/x.git").path
    stale = [
        repo / "packed-refs.lock",
        repo / "refs/upstream/heads/main.lock",
        repo / "objects/pack/tmp_pack_abc",
        repo / "objects/pack/pack-1.keep",
    ]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    (repo / "objects/incoming-123/pack").mkdir(parents=True)
    # Listings are written without the lock: only a temporary file old enough to be a dead writer's goes.
    dead, live = repo / ".envbuild-ls-remote.dead.tmp", repo / ".envbuild-ls-remote.live.tmp"
    dead.write_text("x")
    live.write_text("x")
    os.utime(dead, (time.time() - 2 * 3600, time.time() - 2 * 3600))
    removed = remove_stale_files(repo)
    assert set(stale) | {dead} <= set(removed) and not any(p.exists() for p in [*stale, dead])
    assert not (repo / "objects/incoming-123").exists() and (repo / "config").exists() and live.exists()


@pytest.fixture(scope="module")
def big(served: Served) -> str:
    """A repository with enough history that a fetch of it can be caught halfway."""
    fast_import_repo(served.base / "big.git", commits=800, files=100, touch=2, tag_every=400)
    return "big.git"


@pytest.mark.gitdaemon
def test_partial_cache_never_fetches_lazily(served: Served, big: str, tmp_path: Path) -> None:
    cache = GitCache(tmp_path / "git")
    url = served.filtering.url(big)
    upstream = served.base / big
    head = git("rev-parse", "main", cwd=upstream)
    tree = git("rev-parse", "main^{tree}", cwd=upstream)
    source = Source(name="big", repo=url, ref="v800", ref_type="tag", commit=head, tree=tree)
    assert verify_source(source, cache).status == "ok"
    repo = cache.repo(url).path
    # Commits only: the tree was read from the commit object, never fetched...
    missing = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", tree], capture_output=True, text=True)
    assert missing.returncode != 0
    # ...and an ordinary git command in the cache cannot reach the network to fetch it.
    assert "envbuild-no-lazy-fetch" in missing.stderr
    assert cache.commit_trees(url, [head, "ab" * 20, tree]) == {head: tree}


@pytest.mark.gitdaemon
def test_stale_locks_from_a_killed_git_are_cleared(served: Served, big: str, tmp_path: Path) -> None:
    cache = GitCache(tmp_path / "git")
    url = served.filtering.url(big)
    repo = cache.ensure(url).path
    for name in ("packed-refs.lock", "refs/upstream/heads/main.lock", "shallow.lock"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("")
    first = git("rev-list", "--max-parents=0", "main", cwd=served.base / big)
    source = Source(name="big", repo=url, ref="main", ref_type="branch", commit=first)
    result = verify_source(source, cache)
    assert (result.status, result.facts["ahead"]) == ("behind", 799)
    assert not list(repo.rglob("*.lock"))


@pytest.mark.gitdaemon
def test_fetches_into_one_repository_are_serialised(served: Served, big: str, tmp_path: Path) -> None:
    cache = GitCache(tmp_path / "git")
    url = served.filtering.url(big)
    first = git("rev-list", "--max-parents=0", "main", cwd=served.base / big)
    source = Source(name="big", repo=url, ref="main", ref_type="branch", commit=first)
    done = threading.Event()
    with cache.locked(url):
        worker = threading.Thread(target=lambda: (verify_source(source, cache), done.set()))
        worker.start()
        assert not done.wait(0.5)  # listed, then waiting for the lock to fetch
    worker.join(30)
    assert done.is_set()


def _verify_process(root: Path, url: str, *commits: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", VERIFY_SCRIPT, str(root), url, *commits],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.fixture
def proxy(served: Served) -> Iterator[ThrottlingProxy]:
    p = ThrottlingProxy(served.plain.port).start()
    yield p
    p.close()


@pytest.mark.gitdaemon
def test_two_processes_verify_on_one_cold_cache(
    served: Served, big: str, tmp_path: Path, proxy: ThrottlingProxy
) -> None:
    url = f"git://127.0.0.1:{proxy.port}/{big}"
    upstream = served.base / big
    old, side = git("rev-parse", "main~5", cwd=upstream), git("rev-parse", "side", cwd=upstream)
    proxy.delay = 0.01  # long enough for the two to overlap
    procs = [_verify_process(tmp_path / "git", url, old, side) for _ in range(2)]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            outputs.append(json.loads(out))
    finally:
        for proc in procs:
            stop_process_group(proc)  # type: ignore[arg-type]
    assert [o["statuses"] for o in outputs] == [["behind", "not-on-ref"]] * 2
    # Each fetch happened once: the second process found the objects there once it held the lock.
    fetched = [m for o in outputs for m in o["messages"] if m.startswith("fetched ")]
    assert len(fetched) == 2, outputs  # main, then all refs
    assert [p.name for p in (tmp_path / "git").iterdir() if p.name.startswith(".tmp")] == []


@pytest.mark.gitdaemon
def test_a_fetch_killed_halfway_leaves_the_cache_usable(
    served: Served, big: str, tmp_path: Path, proxy: ThrottlingProxy
) -> None:
    url = f"git://127.0.0.1:{proxy.port}/{big}"  # the daemon without partial clone: a full pack
    upstream = served.base / big
    old = git("rev-parse", "main~3", cwd=upstream)
    cache = GitCache(tmp_path / "git")
    repo = cache.repo(url).path
    proc = _verify_process(cache.root, url, old)
    killed: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list(repo.glob("objects/pack/tmp_pack_*")):
            time.sleep(0.01)
        assert list(repo.glob("objects/pack/tmp_pack_*")), "the fetch never started receiving"
        gits = child_pids(proc.pid)  # the git fetch, in its own process group
        os.kill(proc.pid, signal.SIGKILL)  # the verify first: a verify that outlives its git cleans up
        proc.wait(10)
        for pid in gits:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            killed.append(pid)
    finally:
        stop_process_group(proc)  # type: ignore[arg-type]
    assert killed
    assert list(repo.glob("objects/pack/tmp_pack_*"))  # the half-received pack is still there
    proxy.delay = 0
    result = verify_source(Source(name="big", repo=url, ref="main", ref_type="branch", commit=old), cache)
    assert (result.status, result.facts["ahead"]) == ("behind", 3)
    assert not list(repo.glob("objects/pack/tmp_*")) and not list(repo.rglob("*.lock"))
    fsck = subprocess.run(
        ["git", "-C", str(repo), "fsck", "--connectivity-only", "--no-progress"],
        capture_output=True,
        text=True,
        env={**os.environ, "GIT_ALLOW_PROTOCOL": "file"},
    )
    assert fsck.returncode == 0, fsck.stderr


@pytest.mark.gitdaemon
def test_kill_9_of_envbuild_in_mid_fetch_leaves_no_git_writing_into_the_cache(
    served: Served, big: str, tmp_path: Path, proxy: ThrottlingProxy
) -> None:
    url = f"git://127.0.0.1:{proxy.port}/{big}"  # a full pack, slowed down: the fetch is caught halfway
    old = git("rev-parse", "main~3", cwd=served.base / big)
    lock = tmp_path / "big.lock.yaml"
    lock.write_text(
        f"version: 1\nname: big\nsources:\n  - {{name: big, repo: '{url}', ref: main, ref_type: branch, commit: {old}}}\n"
    )
    cache = GitCache(tmp_path / "cache" / "git")
    repo = cache.repo(url)
    proc = subprocess.Popen(
        [sys.executable, "-c", ENVBUILD, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache")],
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ours: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list(repo.path.glob("objects/pack/tmp_pack_*")):
            time.sleep(0.01)
        assert list(repo.path.glob("objects/pack/tmp_pack_*")), "the fetch never started receiving"
        ours = descendants(proc.pid)  # git fetch and the index-pack writing the pack
        assert len(ours) >= 2, ours
        # Every one of them holds the cache lock while it lives, not only envbuild.
        assert all(str(repo.lock_path) in open_files(pid) for pid in ours), [open_files(p) for p in ours]

        os.kill(proc.pid, signal.SIGKILL)  # envbuild alone, as the OOM killer or a CI timeout would
        proc.wait(10)
        deadline = time.monotonic() + 10
        while (survivors := [pid for pid in ours if is_running(pid)]) and time.monotonic() < deadline:
            with file_lock(repo.lock_path, blocking=False) as free:
                if free:  # then no git of ours may still write; the last may be exiting, give it a moment
                    time.sleep(0.5)
                    writing = [pid for pid in survivors if is_running(pid)]
                    assert not writing, f"git {writing} outlived envbuild without holding the cache lock"
            time.sleep(0.02)
        assert survivors == [], "git outlived envbuild by more than 10 s"
    finally:
        for pid in ours:
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)
        stop_process_group(proc)  # type: ignore[arg-type]

    proxy.delay = 0
    result = verify_source(Source(name="big", repo=url, ref="main", ref_type="branch", commit=old), cache)
    assert (result.status, result.facts["ahead"]) == ("behind", 3)
    assert not list(repo.path.glob("objects/pack/tmp_*")) and not list(repo.path.rglob("*.lock"))


@pytest.mark.gitdaemon
def test_upstream_branches_named_like_gits_temporary_files_survive_the_lock(served: Served, tmp_path: Path) -> None:
    """Taking a repository's lock clears what a killed git left; it once took upstream branches named tmp_ci
    or incoming-fix/x for that too and deleted their refs, so the cache no longer mirrored the upstream's refs
    and the next verify that needs every ref (a submodule's, a commit not on its branch) fetched them again,
    every time a fetch had come between."""
    upstream = served.repo("tmpnames")
    upstream.commit()
    for branch in ("tmp_ci", "incoming-fix/x", "tmp_objdir-y", "pack-1.keep"):
        git("branch", branch, cwd=upstream.path)
    url = served.url("tmpnames", "daemon-filter")
    cache = GitCache(tmp_path / "git")
    listing = cache.list_refs(url)
    cache.fetch(url, ALL_REFS, prune=True)
    assert cache.namespace_refs(url) == dict(listing.refs)
    with cache.locked(url):
        pass
    assert cache.namespace_refs(url) == dict(listing.refs)
    assert cache.fetch(url, ALL_REFS, prune=True, fresh=dict(listing.refs)) is None  # nothing to fetch again
