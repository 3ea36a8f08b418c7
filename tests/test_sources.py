"""Source verification against real upstream repositories served on loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from envbuild.errors import InputError
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitRunner
from envbuild.git.upstream import read_move
from envbuild.lock.model import Source
from envbuild.update.update import MissingRefError, ResolvedRef, resolve_ref
from envbuild.verify.sources import verify_source, verify_sources
from tests.lib.gitrepos import Repo, Served, free_port

TRANSPORTS = ("daemon-filter", "daemon-nofilter", "file")


@dataclass
class Project:
    """An upstream with every situation a pin can be in."""

    repo: Repo
    main: list[str]  # commits on main, oldest first
    feature: str  # a commit only on branch `feature`
    name: str

    def source(self, url: str, **changes: object) -> Source:
        base = Source(name="proj", repo=url, ref="main", ref_type="branch", commit=self.main[-1])
        return replace(base, **changes)  # type: ignore[arg-type]


_counter = iter(range(10**6))


def build_project(served: Served) -> Project:
    name = f"proj{next(_counter)}"
    repo = served.repo(name)
    main = [repo.commit() for _ in range(5)]
    repo.tag("v1", main[1], annotated=True)
    repo.tag("light", main[0])
    repo.checkout("feature", create_at=main[1])
    feature = repo.commit()
    repo.checkout("main")
    return Project(repo, main, feature, name)


class Calls:
    """Counts git's network commands through GitRunner's observer hook."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, command: str, url: str) -> None:
        with self._lock:
            self.log.append((command, url))

    def commands(self) -> list[str]:
        return sorted(c for c, _ in self.log)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def cache(tmp_path: Path, calls: Calls) -> GitCache:
    return GitCache(tmp_path / "cache" / "git", git=GitRunner(observer=calls))


def status_table(project: Project, url: str) -> list[tuple[Source, str, dict[str, object]]]:
    p, m = project, project.main
    tree = p.repo.tree
    return [
        (p.source(url), "ok", {}),
        (p.source(url, commit=m[2]), "behind", {"ahead": 2, "upstream": m[4]}),
        (p.source(url, ref="v1", ref_type="tag", commit=m[1]), "ok", {}),  # annotated: peeled
        (p.source(url, ref="v1", ref_type="tag", commit=m[1], tree=tree(m[1])), "ok", {}),
        (p.source(url, ref="light", ref_type="tag", commit=m[0], tree=tree(m[0])), "ok", {}),
        (p.source(url, ref="v1", ref_type="tag", commit=m[1], tree=tree(m[0])), "tree-mismatch", {"tree": tree(m[1])}),
        (p.source(url, commit=m[2], tree=tree(m[3])), "tree-mismatch", {"tree": tree(m[2])}),
        (p.source(url, ref="v1", ref_type="tag", commit=m[2]), "tag-moved", {"upstream": m[1]}),
        (p.source(url, ref="light", ref_type="tag", commit=m[1]), "tag-moved", {"upstream": m[0]}),
        (p.source(url, commit=p.feature), "not-on-ref", {}),
        (p.source(url, ref="gone"), "missing-ref", {}),
        (p.source(url, ref="v1"), "ref-type-changed", {"upstream_ref_type": "tag"}),
        (p.source(url, ref="feature", ref_type="tag"), "ref-type-changed", {"upstream_ref_type": "branch"}),
        (p.source(url, commit="ab" * 20), "missing-commit", {}),
    ]


@pytest.mark.gitdaemon
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_status(served: Served, cache: GitCache, calls: Calls, transport: str) -> None:
    project = build_project(served)
    url = served.url(project.name, transport)
    table = status_table(project, url)
    messages: list[str] = []
    results = verify_sources([s for s, _, _ in table], cache, progress=messages.append, jobs=4)

    assert [(r.name, r.status) for r in results] == [("proj", status) for _, status, _ in table]
    for result, (source, _, facts) in zip(results, table):
        assert result.kind == "source" and result.detail
        assert result.facts["url"] == url and result.facts["commit"] == source.commit
        for key, value in facts.items():
            assert result.facts[key] == value, (result, key)
    # One listing for the repository however many pins it has; a fetch of main, then one of all refs.
    assert calls.commands() == ["fetch", "fetch", "ls-remote"]
    assert any(m.startswith(f"fetching proj from {url}") for m in messages)
    full = [m for m in messages if "does not allow partial clone" in m]
    assert bool(full) == (transport != "daemon-filter")


@pytest.mark.gitdaemon
def test_warm_cache_costs_one_listing_and_no_fetch(served: Served, tmp_path: Path, calls: Calls) -> None:
    project = build_project(served)
    url = served.url(project.name, "daemon-filter")
    sources = [s for s, _, _ in status_table(project, url)]
    root = tmp_path / "git"
    cold = verify_sources(sources, GitCache(root, git=GitRunner(observer=calls)))
    packs = sorted(p.name for p in root.glob("*.git/objects/pack/*"))

    calls.log.clear()
    warm = verify_sources(sources, GitCache(root, git=GitRunner(observer=calls)))
    assert [r.status for r in warm] == [r.status for r in cold]
    assert calls.log == [("ls-remote", url)]
    assert sorted(p.name for p in root.glob("*.git/objects/pack/*")) == packs


@pytest.mark.gitdaemon
def test_tag_without_tree_needs_only_the_listing(served: Served, cache: GitCache, calls: Calls) -> None:
    project = build_project(served)
    source = project.source(served.url(project.name, "daemon-filter"), ref="v1", ref_type="tag", commit=project.main[1])
    assert verify_source(source, cache).status == "ok"
    assert calls.commands() == ["ls-remote"]


@pytest.mark.gitdaemon
def test_behind_counts_commits_and_follows_the_branch(served: Served, cache: GitCache) -> None:
    project = build_project(served)
    source = project.source(served.url(project.name, "daemon-filter"), commit=project.main[0])
    first = verify_source(source, cache)
    assert (first.status, first.facts["ahead"]) == ("behind", 4)
    for _ in range(3):
        project.repo.commit()
    second = verify_source(source, cache)
    assert (second.status, second.facts["ahead"], second.facts["upstream"]) == ("behind", 7, project.repo.rev("main"))


@pytest.mark.gitdaemon
def test_mirror_rewrites_the_url(served: Served, cache: GitCache, calls: Calls) -> None:
    project = build_project(served)
    source = project.source(f"https://example.invalid/{project.name}", commit=project.main[3])
    mirrors = Mirrors.parse([f"https://example.invalid/={served.filtering.url('')}"])
    result = verify_sources([source], cache, mirrors=mirrors)[0]
    effective = served.filtering.url(project.name)
    assert (result.status, result.facts["url"], result.facts["ahead"]) == ("behind", effective, 1)
    assert {url for _, url in calls.log} == {effective}
    # Fetched from the mirror, kept under the URL the lock names: what is pinned, offline with or without mirrors.
    assert (
        cache.repo(source.repo).exists()
        and cache.repo(source.repo).path == cache.repo(mirrors.rewrite(source.repo)).path
    )
    assert (cache.repo(source.repo).path / "envbuild-url").read_text() == source.repo + "\n"
    assert not cache.repo(effective).exists()  # the mirror's own URL, not rewritten, has no entry


@pytest.mark.gitdaemon
def test_force_push_and_gc_upstream_makes_the_commit_missing(served: Served, cache: GitCache) -> None:
    project = build_project(served)
    url = served.url(project.name, "daemon-filter")
    pinned = project.source(url, commit=project.main[4])
    assert verify_source(pinned, cache).status == "ok"
    # Cache the commit's history through the feature branch as well, then drop it upstream.
    assert verify_source(project.source(url, commit=project.feature), cache).status == "not-on-ref"
    project.repo.force_branch("main", project.main[2])
    assert cache.commit_trees(url, [project.main[4]])  # still in the cache...
    result = verify_source(pinned, cache)
    assert result.status == "missing-commit"  # ...but on no upstream ref any more
    assert cache.namespace_refs(url)["heads/main"] == project.main[2]


@pytest.mark.gitdaemon
def test_offline_answers_from_the_cache_only(served: Served, cache: GitCache, calls: Calls, tmp_path: Path) -> None:
    project = build_project(served)
    url = served.url(project.name, "daemon-filter")
    sources = [s for s, _, _ in status_table(project, url)]
    online = verify_sources(sources, cache)
    calls.log.clear()
    offline = verify_sources(sources, cache, offline=True)
    assert [r.status for r in offline] == [r.status for r in online]
    assert calls.log == []

    empty = GitCache(tmp_path / "empty", git=GitRunner(observer=calls))
    result = verify_source(sources[0], empty, offline=True)
    assert (result.status, result.detail) == ("unreachable", "offline and not in cache")
    # Listed but never fetched: a branch pin behind its head cannot be answered offline.
    fresh = GitCache(tmp_path / "listed", git=GitRunner(observer=calls))
    assert verify_source(sources[2], fresh).status == "ok"  # a tag: listing only
    result = verify_source(sources[1], fresh, offline=True)
    assert (result.status, result.detail) == ("unreachable", "offline and not in cache")
    assert [c for c, _ in calls.log] == ["ls-remote"]


@pytest.mark.gitdaemon
def test_unreachable_names_the_reason(served: Served, cache: GitCache, calls: Calls) -> None:
    project = build_project(served)
    dead = f"git://127.0.0.1:{free_port()}/{project.name}"
    sources = [
        project.source(dead),
        project.source(served.url(project.name, "daemon-filter")),
        project.source(dead, ref="v1", ref_type="tag"),
    ]
    results = verify_sources(sources, cache)
    assert [r.status for r in results] == ["unreachable", "ok", "unreachable"]
    assert "Connection refused" in results[0].detail and "\n" not in results[0].detail
    assert results[2].detail == results[0].detail
    assert calls.commands().count("ls-remote") == 2  # one per repository, even when it fails
    missing = verify_source(project.source(served.url("no-such-repo", "daemon-filter")), cache)
    assert missing.status == "unreachable" and missing.detail


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts connections and never answers: a hung remote."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: _accept_forever(server, held), daemon=True).start()
    yield int(server.getsockname()[1])
    server.close()
    for sock in held:
        sock.close()


def _accept_forever(server: socket.socket, held: list[socket.socket]) -> None:
    while True:
        try:
            held.append(server.accept()[0])
        except OSError:
            return


def test_a_hung_remote_times_out(silent_server: int, tmp_path: Path) -> None:
    cache = GitCache(tmp_path / "git", git=GitRunner(network_timeout=1.0))
    source = Source(
        name="hung", repo=f"git://127.0.0.1:{silent_server}/x.git", ref="main", ref_type="branch", commit="ab" * 20
    )
    result = verify_source(source, cache)
    assert (result.status, result.detail) == ("unreachable", "timed out after 1 s")


def counted(url: str, old: str, new: str, cache: GitCache, mirrors: Mirrors = Mirrors()) -> int | None:
    """How many commits ``new`` brings over ``old``, as the change report reads them from the cache."""
    moved = read_move(url, old, new, cache, mirrors=mirrors)
    return None if moved is None else moved.commits


@pytest.mark.gitdaemon
def test_resolve_ref_and_count_commits(served: Served, cache: GitCache) -> None:
    project = build_project(served)
    url = served.url(project.name, "daemon-filter")
    m = project.main
    assert resolve_ref(project.source(url, commit=m[0]), cache) == ResolvedRef("branch", m[4], project.repo.tree(m[4]))
    assert resolve_ref(project.source(url, ref="v1", ref_type="tag"), cache) == ResolvedRef(
        "tag", m[1], project.repo.tree(m[1])
    )
    # Recorded as a branch, upstream a tag: the caller sees the type change.
    assert resolve_ref(project.source(url, ref="light"), cache).ref_type == "tag"
    with pytest.raises(MissingRefError, match="gone"):
        resolve_ref(project.source(url, ref="gone"), cache)

    assert counted(url, m[1], m[4], cache) == 3
    assert counted(url, m[4], m[1], cache) == 0
    assert read_move(url, m[1], "cd" * 20, cache) is None
    assert read_move("git://127.0.0.1:1/never-cached", m[1], m[4], cache) is None
    mirrored = Mirrors.parse([f"https://example.invalid/={served.filtering.url('')}"])
    invalid = project.source(f"https://example.invalid/{project.name}", commit=m[0])
    assert read_move(invalid.repo, m[0], m[4], cache, mirrors=mirrored) is None  # its own entry: empty yet
    resolve_ref(invalid, cache, mirrors=mirrored)
    assert counted(invalid.repo, m[0], m[4], cache, mirrored) == 4
    assert counted(invalid.repo, m[0], m[4], cache) == 4  # the cache is keyed by the lock's URL


def test_hostile_inputs_are_refused_before_git_runs(tmp_path: Path, calls: Calls) -> None:
    cache = GitCache(tmp_path / "git", git=GitRunner(observer=calls))
    good = Source(name="x", repo="https://example.invalid/x.git", ref="main", ref_type="branch", commit="ab" * 20)
    bad = [
        replace(good, ref="--upload-pack=touch /tmp/pwned"),
        replace(good, ref="main..HEAD"),
        replace(good, commit="abc"),
        replace(good, repo="ext::sh -c touch% /tmp/pwned"),
    ]
    with pytest.raises(InputError) as caught:
        verify_sources(bad, cache)
    assert len(str(caught.value).splitlines()) == 4
    with pytest.raises(InputError, match="after mirror rewriting"):
        verify_source(good, cache, mirrors=Mirrors.parse(["https://example.invalid/=-oProxyCommand=x/"]))
    assert calls.log == [] and not cache.root.exists()


@pytest.mark.gitdaemon
def test_a_commit_whose_files_the_server_cannot_send_is_a_failing_pin_and_a_no_op_does_not_ask(
    served: Served, tmp_path: Path
) -> None:
    """A build's check fetches a tree-pinned commit whole (its export needs it): a server that cannot send
    the files (a blob gone from its objects, as the real snapshots leave out files of 4 MiB or more) makes
    that pin `unreachable`, with git's reason, and every other pin is still reported. A lock built before
    (``inputs=False``: its image is answered from the record) checks the tree on the commit alone."""
    from envbuild.config import SourceOptions
    from envbuild.lock.model import Lock
    from envbuild.verify.pins import VerifyOptions, verify_for_build

    broken, whole = build_project(served), build_project(served)
    pinned = broken.main[-1]
    blob = broken.repo.rev(f"{pinned}:file5.txt")
    (broken.repo.path / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    sources = (
        broken.source(served.url(broken.name, "daemon-filter"), tree=broken.repo.tree(pinned)),
        replace(whole.source(served.url(whole.name, "daemon-filter"), tree=whole.repo.tree(whole.main[-1])), name="ok"),
    )
    lock = Lock(version=1, name="unsendable", sources=sources)
    options = VerifyOptions(SourceOptions(cache_dir=tmp_path / "cache"))
    built = [r for r in verify_for_build(lock, "unsendable.lock.yaml", options).results if r.kind == "source"]
    assert [(r.name, r.status) for r in built] == [("proj", "unreachable"), ("ok", "ok")]
    assert f"cannot fetch the files of {pinned}" in built[0].detail
    no_op = verify_for_build(lock, "unsendable.lock.yaml", options, inputs=False).results
    assert [(r.name, r.status) for r in no_op if r.kind == "source"] == [("proj", "ok"), ("ok", "ok")]


@pytest.mark.gitdaemon
def test_a_pin_of_an_annotated_tags_own_object_is_not_called_a_moved_tag(served: Served, cache: GitCache) -> None:
    """``git ls-remote`` prints an annotated tag's own object on its first line; copied into the lock as the
    commit, verify once said ``tag v1 now points at <commit>, not at the pinned commit``: a release tag moved,
    when nothing upstream had. The detail now says what the pin is, and how to pin the commit."""
    project = build_project(served)
    url = served.url(project.name, "daemon-filter")
    tag_object = project.repo.rev("refs/tags/v1")
    assert tag_object != project.main[1]  # annotated: its own object, peeled to main[1]
    result = verify_source(project.source(url, ref="v1", ref_type="tag", commit=tag_object), cache)
    assert (result.status, result.facts["upstream"]) == ("tag-moved", project.main[1])
    assert result.detail == (
        f"the lock pins the object of annotated tag v1 itself, not the commit it points at ({project.main[1]}); "
        "pin the commit (`envbuild lock update` does)"
    )
