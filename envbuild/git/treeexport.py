"""Write the exact tree of a pinned commit into a directory, for the image build context.

The verify cache (:mod:`envbuild.git.cache`) holds commits only (``--filter=tree:0``), so exports come
from a second cache of bare repositories beside it, ``<cache_dir>/git-export/``, keyed like the first
and guarded by the same locks and atomic creation (:class:`~envbuild.git.cache.GitCache`). Into it each
pinned commit is fetched once, whole but without history (``--depth=1`` of the commit itself; protocol
v2 servers such as GitHub and ``git daemon`` accept a want by SHA), under a ref
``refs/envbuild/export/<commit>`` so it stays. A server that refuses wants by SHA gets a fetch of the
ref's full history instead.

Fetches run with ``fetch.fsckObjects``: a tree git itself calls malformed (duplicate entries, ``.git``
names) is refused before it reaches the cache. The export is ``git archive`` with every content-changing
attribute neutralised (``export-subst``, ``export-ignore``, eol conversion, filters, ``ident``) through
the repository's ``info/attributes``, written by :mod:`envbuild.git.treewriter` (which never follows a
link, so a hostile tree cannot write outside the destination), and the result is checked: the git tree SHA of the written files must equal the commit's tree (and the
lock's ``tree`` where recorded).

Submodules are pins of their own (:class:`TreePin`): each one the lock records and does not skip is
fetched the same way into the export cache of its own (mirrored) URL and written, by the same tree
writer, into the empty directory its parent's tree leaves for the gitlink (reached without following a
link, :func:`~envbuild.git.treewriter.open_below`), level by level. Before anything is written, every
gitlink of each tree must be one the lock records at that path with that commit (a version 1 lock
records none: its gitlinks are refused, naming the path, as they always were). The check after writing
counts each gitlink as git does (mode 160000, the commit), so the source's tree and every submodule's
tree are checked against their commits.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from envbuild.begun import Begun
from envbuild.errors import EnvbuildError
from envbuild.git import treehash
from envbuild.git.cache import CachedRepo, GitCache, refused_packs_removed, remove_stale_files
from envbuild.git.gitmodules import too_many_records
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError, fetch_args, fetch_config, ref_refspec
from envbuild.git.treewriter import TreeWriteError, write_tar_tree
from envbuild.lock.model import Source, Submodule, walk_submodules
from envbuild.progress import Progress

EXPORT_NS = "refs/envbuild/export/"
# Highest-precedence attributes: git archive then writes blobs byte for byte.
NEUTRAL_ATTRIBUTES = "* -export-subst -export-ignore -text -eol -filter -ident -crlf\n"


class ExportError(EnvbuildError):
    """A source's pinned commit cannot be exported as its exact tree."""


@dataclass(frozen=True)
class TreePin:
    """A commit whose whole tree a build writes: a source's, or a submodule's."""

    kind: Literal["source", "submodule"]
    name: str  # the source's, or SOURCE/PATH for a submodule (vllm-ascend/csrc/third_party/catlass)
    repo: str  # the lock's URL; mirrors apply
    commit: str
    tree: str | None  # the lock's tree pin
    fallback: tuple[str, ...]  # refspecs holding the commit, for a server that will not send it by ID
    submodules: tuple[Submodule, ...]  # what the lock records of the tree's gitlinks

    @property
    def what(self) -> str:
        """How messages name it: ``source vllm-ascend``, ``submodule vllm-ascend/csrc/third_party/catlass``."""
        return f"{self.kind} {self.name}"


def source_pin(source: Source) -> TreePin:
    refspec = ref_refspec(source.ref_type, source.ref, "refs/envbuild/ref/")
    return TreePin("source", source.name, source.repo, source.commit, source.tree, (refspec,), source.submodules)


def submodule_pins(source: Source) -> Iterator[tuple[str, TreePin]]:
    """Every submodule of ``source`` the image gets, parents first, with its path from the source's root."""
    for path, sub in walk_submodules(source.submodules):
        if sub.skipped:
            continue
        assert sub.repo is not None and sub.commit is not None  # the lock's reader makes sure
        every = ("+refs/heads/*:refs/envbuild/ref/heads/*", "+refs/tags/*:refs/envbuild/ref/tags/*")
        yield path, TreePin("submodule", f"{source.name}/{path}", sub.repo, sub.commit, sub.tree, every, sub.submodules)


class TreeExporter:
    """Exports pinned commits from ``<cache_dir>/git-export``; safe to share between threads and processes.
    It remembers each commit it found whole in the cache (a commit's objects do not change): the stages of
    one build (verify, fetch, export) ask about a commit once, not once each."""

    def __init__(self, cache_dir: Path, *, mirrors: Mirrors = Mirrors(), offline: bool = False) -> None:
        self.cache_dir = Path(cache_dir)
        self.cache = GitCache(Path(cache_dir) / "git-export")
        self.verify_cache = GitCache(Path(cache_dir) / "git")
        self.mirrors, self.offline = mirrors, offline
        # (export repository, commit) → (tree, committer date), found complete
        self._whole: dict[tuple[Path, str], tuple[str, int]] = {}
        self._whole_lock = threading.Lock()
        self._begun: Begun[tuple[str, str], tuple[str, bool]] = Begun("envbuild-whole")  # (URL, commit)

    def __call__(self, source: Source, dest: Path) -> None:
        export_tree(source, dest, self)

    def begin_whole(self, pins: Iterable[TreePin], say: Progress, jobs: int) -> None:
        """:func:`whole_fetched` of each of ``pins`` begun now, ``jobs`` at a time (:class:`.Begun`, as
        :meth:`GitCache.begin_listings`): the next :func:`whole_fetched` of a pin answers with it (or its
        error), once."""
        self._begun.begin(
            {(pin.repo, pin.commit): functools.partial(_whole_fetched, self, pin, say) for pin in pins}, jobs
        )


def _complete(exporter: TreeExporter, repo: CachedRepo, commit: str) -> str | None:
    """The commit's tree when the export repository holds the commit with every object of its tree."""
    key = (repo.path, commit)
    with exporter._whole_lock:
        if key in exporter._whole:
            return exporter._whole[key][0]
    found = complete_tree(exporter.cache.git.run(_COMPLETE + [commit, "--"], repo=repo.path), commit)
    if found is not None:
        with exporter._whole_lock:
            exporter._whole[key] = found
    return found[0] if found is not None else None


def known_date(exporter: TreeExporter, url: str, commit: str) -> int | None:
    """The committer date of a commit this exporter found whole (:func:`whole_tree`), else None."""
    with exporter._whole_lock:
        found = exporter._whole.get((exporter.cache.repo(url).path, commit))
    return found[1] if found is not None else None


# One git for "is the commit here, with every object of its tree": the commit ("commit SHA", then "SHA
# DATE"), its root tree (the first object after it, with an empty path), every object below; a missing
# commit prints nothing, a missing object "?SHA" (and git fetches nothing it lacks).
_COMPLETE = ["rev-list", "--objects", "--no-walk", "--missing=print", "--ignore-missing", "--format=%H %ct"]


def complete_tree(listing: str, commit: str) -> tuple[str, int] | None:
    """The root tree and committer date of ``commit`` in ``git rev-list --objects`` output
    (:data:`_COMPLETE`) when every object listed is present, else None."""
    lines = listing.splitlines()
    if len(lines) < 3 or lines[0] != f"commit {commit}" or any(line.startswith("?") for line in lines):
        return None
    listed, _, date = lines[1].partition(" ")
    tree, space, path = lines[2].partition(" ")
    if listed != commit or not date.isdigit() or not space or path or len(tree) != len(commit):
        return None
    return tree, int(date)


def has_commit(exporter: TreeExporter, pin: TreePin) -> bool:
    """Does the export cache hold the commit with every object of its tree (no network)?"""
    return whole_tree(exporter, pin) is not None


def whole_tree(exporter: TreeExporter, pin: TreePin) -> str | None:
    """The commit's tree, when the export cache holds the commit with every object of its tree (no network)."""
    repo = exporter.cache.repo(exporter.mirrors.rewrite(pin.repo))
    return _complete(exporter, repo, pin.commit) if repo.exists() else None


def whole_fetched(exporter: TreeExporter, pin: TreePin, say: Progress) -> tuple[str, bool]:
    """The commit's tree, and whether it was fetched: whole in the export cache already, else fetched
    whole now (said through ``say``), or as :meth:`TreeExporter.begin_whole` began it."""
    begun = exporter._begun.take((pin.repo, pin.commit))
    return begun.result() if begun is not None else _whole_fetched(exporter, pin, say)


def _whole_fetched(exporter: TreeExporter, pin: TreePin, say: Progress) -> tuple[str, bool]:
    tree = whole_tree(exporter, pin)
    if tree is not None:
        return tree, False
    say(f"fetching the files of {pin.what} ({pin.commit[:12]})")
    repo = fetch_commit(exporter, pin, absent=True)
    tree = _complete(exporter, repo, pin.commit)
    assert tree is not None  # fetch_commit found it whole, and the exporter remembers it
    return tree, True


def fetch_commit(exporter: TreeExporter, pin: TreePin, *, absent: bool = False) -> CachedRepo:
    """Make the export repository for ``pin`` hold its commit and the whole tree of it. ``absent``: the
    caller has just found it incomplete (:func:`whole_tree`): it is looked for again only under the lock."""
    url = exporter.mirrors.rewrite(pin.repo)
    repo = exporter.cache.repo(url)
    if not absent and repo.exists() and _complete(exporter, repo, pin.commit):
        return repo
    if exporter.offline:
        raise ExportError(
            f"{pin.what}: the files of {pin.commit} are not in the cache ({exporter.cache.root}) and --offline "
            "forbids fetching them; run `envbuild lock fetch LOCKFILE` where the upstream is reachable"
        )
    git = exporter.cache.git
    waited: list[bool] = []
    with exporter.cache.held(url, waiting=lambda: waited.append(True)) as (repo, lock_fd):
        # Another build may have fetched it while we waited for the lock. Found absent a moment ago and the
        # lock free: not asked again (at worst, a fetch that finished in between is repeated, and sends
        # nothing new).
        if (waited or not absent) and _complete(exporter, repo, pin.commit):
            return repo

        def fetch(*args: str) -> None:
            with refused_packs_removed(repo.path):  # objects git's checks refused: never taken by the next fetch
                git.run(
                    fetch_args(*args, filter=None),
                    repo=repo.path,
                    config=fetch_config(url),
                    timeout=git.network_timeout,
                    network=True,
                    hold=(lock_fd,),
                )

        for attempt in (1, 2):
            try:
                _fetch_whole(pin, repo, fetch, exporter.cache)
                if not _complete(exporter, repo, pin.commit):
                    raise ExportError(f"{pin.what}: {url} did not send the files of {pin.commit}")
            except ExportError:
                if attempt == 2:
                    raise
                # A damaged repository (a pack cut short) refuses every fetch: fetch into a new one, once, with
                # every commit the old one held (this build may have found them whole already).
                held = git.run(["for-each-ref", "--format=%(refname)", "--", EXPORT_NS], repo=repo.path).split()
                if exporter.cache.renewed_if_damaged(repo):
                    refill = [f"+{ref[len(EXPORT_NS) :]}:{ref}" for ref in held if ref != f"{EXPORT_NS}{pin.commit}"]
                    if refill:
                        with contextlib.suppress(GitError):  # a commit gone upstream: fetched by its pin, if asked
                            fetch("--depth=1", "origin", "--", *refill)
                    continue
                raise
            break
        attributes = repo.path / "info" / "attributes"
        attributes.parent.mkdir(exist_ok=True)
        if not attributes.exists() or attributes.read_text(encoding="utf-8") != NEUTRAL_ATTRIBUTES:
            attributes.write_text(NEUTRAL_ATTRIBUTES, encoding="utf-8")
    return repo


def _fetch_whole(pin: TreePin, repo: CachedRepo, fetch: Callable[..., None], cache: GitCache) -> None:
    """Fetch ``pin``'s commit whole into ``repo`` (under its lock): by its ID, else the history of the refs
    that hold it; ExportError when neither is sent (CacheError for a full disk)."""
    try:
        fetch("--depth=1", "origin", "--", f"+{pin.commit}:{EXPORT_NS}{pin.commit}")
    except GitError as first:
        # The server refuses wants by SHA: fetch the history of the refs that hold the commit.
        unshallow = ["--unshallow"] if (repo.path / "shallow").exists() else []
        try:
            fetch(*unshallow, "origin", "--", *pin.fallback)
        except GitError as second:
            if first.no_space or second.no_space:  # a full disk: say so, and leave no half-written pack
                remove_stale_files(repo.path)
                raise cache.cache_error(second if second.no_space else first) from None
            raise ExportError(
                f"{pin.what}: cannot fetch the files of {pin.commit} from {repo.url}: {first.reason}; {second.reason}"
            ) from None
        if pin.commit in cache.git.commit_trees(repo.path, [pin.commit]):
            cache.git.run(["update-ref", f"{EXPORT_NS}{pin.commit}", pin.commit], repo=repo.path)


def export_tree(source: Source, dest: Path, exporter: TreeExporter) -> str:
    """Write the exact tree of ``source.commit`` into ``dest`` (an existing, empty directory), with every
    submodule the lock records and does not skip written at its path, and return the source's tree SHA,
    after checking it and every submodule's against their commits, the verify cache and the lock's ``tree``.
    A commit that many paths pin is read and archived once, and written at each path."""
    records = sum(1 for _ in walk_submodules(source.submodules))
    if (problem := too_many_records(records, f"source {source.name}")) is not None:
        raise ExportError(problem)  # verify refuses such a lock first; this walk keeps the bound of its own
    read: dict[tuple[Path, str], _Commit] = {}
    try:
        tree = _write(exporter, source_pin(source), dest, "", read)
        trees = {"": tree}
        for path, pin in submodule_pins(source):
            trees[path] = _write(exporter, pin, dest, path, read)
    finally:
        for commit in read.values():
            Path(commit.archive).unlink(missing_ok=True)
    files = treehash.list_files(str(dest))
    gitlinks = {path: sub.commit for path, sub in walk_submodules(source.submodules) if sub.commit is not None}
    written, unreadable = treehash.git_trees(str(dest), files, gitlinks, set(trees) - {""})
    for path, expected in sorted(trees.items()):
        if written.get(path) != expected or unreadable:
            what = f"source {source.name}" if not path else f"submodule {source.name}/{path}"
            raise ExportError(
                f"{what}: the exported files have tree {written.get(path)}, the commit has tree {expected}"
                + (f" (unreadable: {', '.join(unreadable[:5])})" if unreadable else "")
            )
    return tree


@dataclass(frozen=True)
class _Commit:
    """One commit of one export repository as :func:`export_tree` read it: its tree, what the verify cache
    says its tree is, its gitlinks, and its files as a tar archive beside the destination."""

    tree: str
    verified: str | None
    gitlinks: dict[str, str]
    archive: str


def _read(exporter: TreeExporter, pin: TreePin, repo: CachedRepo, dest: Path) -> _Commit:
    git = exporter.cache.git
    tree = _complete(exporter, repo, pin.commit)
    assert tree is not None  # fetch_commit found it whole, and the exporter remembers it
    verified = exporter.verify_cache.commit_trees(exporter.mirrors.rewrite(pin.repo), [pin.commit])
    gitlinks = git.gitlinks(repo.path, tree)
    fd, archive = tempfile.mkstemp(prefix=".envbuild-export-", suffix=".tar", dir=dest.parent)
    os.close(fd)
    try:
        git.run(["archive", "--format=tar", f"--output={archive}", pin.commit], repo=repo.path)
    except BaseException:
        Path(archive).unlink()
        raise
    return _Commit(tree, verified.get(pin.commit), gitlinks, archive)


def _write(exporter: TreeExporter, pin: TreePin, dest: Path, at: str, read: dict[tuple[Path, str], _Commit]) -> str:
    """Check ``pin``'s tree and gitlinks against the lock, then write its files at ``at`` below ``dest``;
    ``read``: the commits read so far, by (export repository, commit)."""
    repo = fetch_commit(exporter, pin)
    key = (repo.path, pin.commit)
    if key not in read:
        read[key] = _read(exporter, pin, repo, dest)
    commit = read[key]
    problems = []
    if pin.tree is not None and commit.tree != pin.tree:
        problems.append(f"the commit's tree is {commit.tree}, the lock pins tree {pin.tree}")
    if commit.verified is not None and commit.verified != commit.tree:
        problems.append(f"the verify cache records tree {commit.verified} for the commit")
    problems += gitlink_problems(commit.gitlinks, pin.submodules)
    if problems:
        raise ExportError(f"{pin.what}: {'; '.join(problems)}")
    try:
        with open(commit.archive, "rb") as stream:
            write_tar_tree(stream, dest, at=at)
    except TreeWriteError as exc:
        raise ExportError(f"{pin.what}: the tree of {pin.commit} cannot be written safely: {exc}") from None
    return commit.tree


def gitlink_problems(gitlinks: dict[str, str], recorded: tuple[Submodule, ...]) -> list[str]:
    """What differs between a tree's gitlinks ({path: commit}) and the lock's records of that level."""
    problems = []
    records = {sub.path: sub for sub in recorded}
    for path, commit in sorted(gitlinks.items()):
        sub = records.get(path)
        if sub is None:
            problems.append(
                f"gitlink {path} (commit {commit}) is not recorded in the lock; `envbuild lock update` records it "
                "(a version 1 lock records no submodules), or skip it by path with a reason"
            )
        elif sub.commit != commit and not (sub.skipped and sub.commit is None):  # a skip not yet completed
            problems.append(f"the tree pins {commit} at {path}, the lock records {sub.commit}")
    for path, sub in sorted(records.items()):
        if path not in gitlinks and sub.commit is not None:
            problems.append(f"the tree has no gitlink at {path}, the lock records {sub.commit}")
    return problems


def commit_dates(cache: GitCache, url: str, commits: Iterable[str]) -> dict[str, int]:
    """{commit: committer date (Unix seconds)} for the commits the verify cache holds (no network)."""
    repo = cache.repo(url)
    found = cache.git.commit_fields(repo.path, commits, "%ct") if repo.exists() else {}
    return {commit: int(date) for commit, date in found.items() if date.isdigit()}
