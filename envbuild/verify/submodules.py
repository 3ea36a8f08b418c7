"""`lock verify` of every submodule the lock records, at every level, as one result each (kind ``submodule``,
named ``SOURCE/PATH``, nested ones ``SOURCE/PATH/PATH``).

For each record, through the verify cache and the mirrors, as a source's pin is checked:

1. **the parent's gitlink**: the entry at ``path`` in the parent's pinned tree (the trees on the way are
   fetched, no blob) is a gitlink to the recorded commit (``gitlink-mismatch`` otherwise). The parent's
   commit fixes its tree, so this checks the lock against itself; where the parent also pins its
   ``tree``, the detail says the gitlink is held by that tree pin too;
2. **its upstream** (not for a skipped one, which the image does without): the commit is on some branch or
   tag of its repository (the commits of every ref fetched, vanished refs pruned; ``missing-commit``
   otherwise), and its tree is the recorded ``tree`` (``tree-mismatch``);
3. **the pairing**: where the lock also has a source of the same repository (same host and path, whatever
   the transport), how the two pins relate — the same commit, the source's pin ahead of the submodule's
   (it contains it, n commits ahead), behind it, or diverged (a warning, ``diverged``: upstream tested the
   parent with the submodule's commit, and the lock pairs it with another line of history). Reported on
   every verify, for skipped submodules too: a skipped submodule is usually one a source provides.

A warm cache answers with one ref listing per submodule repository. ``--offline`` answers from the cache
alone; what it cannot settle is ``unreachable``, as for sources.

Each fact is read once per (repository, commit), however many paths pin it: a parent's tree, whether a
commit is on an upstream ref, how it relates to a source's pin. A lock whose records pass
:data:`~envbuild.git.gitmodules.MAX_SUBMODULE_RECORDS` (every level, every source) is refused before any
is checked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from envbuild.errors import InputError
from envbuild.git.cache import GitCache
from envbuild.git.files import OFFLINE_MISS, READ_NS, PinnedTree
from envbuild.git.gitmodules import repository_key, too_many_records
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError, TreeEntry, ref_refspec
from envbuild.git.upstream import Offline, Upstream, relation_in_cache
from envbuild.lock.model import Lock, Source, Submodule, check_repo_url
from envbuild.progress import Progress, silent
from envbuild.verify.results import PinResult, SubmoduleStatus
from envbuild.verify.sources import grouped


@dataclass(frozen=True)
class Parent:
    """The tree a submodule's gitlink is read from: a source's pinned commit, or a submodule's."""

    url: str  # after mirrors
    commit: str
    refspec: str | None  # fetched when the server will not send the commit by ID (a source's ref)
    tree: str | None  # the tree the lock pins for it, if any


@dataclass(frozen=True)
class RecordedSubmodule:
    """One recorded submodule with where it sits: ``name`` is ``SOURCE/PATH[/PATH…]``."""

    name: str
    record: Submodule
    parent: Parent


def recorded_submodules(source: Source, mirrors: Mirrors) -> Iterator[RecordedSubmodule]:
    """Every submodule ``source`` records, parents before their submodules."""
    root = Parent(mirrors.rewrite(source.repo), source.commit, ref_refspec(source.ref_type, source.ref), source.tree)

    def walk(records: tuple[Submodule, ...], parent: Parent, prefix: str) -> Iterator[RecordedSubmodule]:
        for record in records:
            name = f"{prefix}/{record.path}"
            yield RecordedSubmodule(name, record, parent)
            if record.repo is not None and record.commit is not None:
                yield from walk(
                    record.submodules, Parent(mirrors.rewrite(record.repo), record.commit, None, record.tree), name
                )

    yield from walk(source.submodules, root, source.name)


def check_submodule_urls(lock: Lock, mirrors: Mirrors) -> None:
    """No more records than a walk reads; what a mirror rule makes of a submodule's URL follows the lock's
    URL rules, as for sources."""
    count = sum(1 for source in lock.sources for _ in recorded_submodules(source, mirrors))
    if (problem := too_many_records(count, f"lock {lock.name!r}")) is not None:
        raise InputError(problem)
    problems = []
    for source in lock.sources:
        for pin in recorded_submodules(source, mirrors):
            if pin.record.repo is None:
                continue
            url = mirrors.rewrite(pin.record.repo)
            if url != pin.record.repo and (problem := check_repo_url(url)) is not None:
                problems.append(f"submodule {pin.name}: repo {problem} (after mirror rewriting of {pin.record.repo!r})")
    if problems:
        raise InputError("\n".join(problems))


def verify_submodules(
    lock: Lock,
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    offline: bool = False,
    jobs: int = 8,
    progress: Progress = silent,
) -> list[PinResult]:
    """One result per recorded submodule (and per source whose submodules are unknown), in lock order;
    repositories in parallel, the submodules of one repository one after the other."""
    check_submodule_urls(lock, mirrors)
    results: list[PinResult] = []
    pins: list[RecordedSubmodule] = []
    for source in lock.sources:
        if source.submodules_unknown is not None:
            results.append(PinResult("submodule", source.name, "unknown", source.submodules_unknown))
        pins += recorded_submodules(source, mirrors)
    by_repo = {repository_key(s.repo): s for s in lock.sources}
    keys = [mirrors.rewrite(p.record.repo) if p.record.repo and not p.record.skipped else p.parent.url for p in pins]
    checker = _Checker(cache, mirrors, offline, progress, by_repo)
    return results + grouped(keys, lambda indexes: checker.group([pins[i] for i in indexes]), jobs)


@dataclass
class _ParentTree:
    tree: PinnedTree
    lock: threading.Lock = field(default_factory=threading.Lock)
    error: GitError | Offline | None = None  # its commit cannot be read


class _Checker:
    """Checks pins, groups of them in parallel; what it reads of a (repository, commit) it reads once."""

    def __init__(
        self, cache: GitCache, mirrors: Mirrors, offline: bool, progress: Progress, by_repo: dict[Any, Source]
    ) -> None:
        self.cache, self.mirrors, self.offline, self.progress, self.by_repo = cache, mirrors, offline, progress, by_repo
        self._parents: dict[tuple[str, str, str], _ParentTree] = {}
        self._parents_lock = threading.Lock()
        self._relations: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}

    def parent_entry(self, parent: Parent, path: str) -> tuple[TreeEntry | None, str]:
        """The entry at ``path`` of the parent's tree, and the parent's root tree: one PinnedTree per parent
        commit, which remembers the trees it listed, whichever group of pins asks; a commit that cannot be
        read answers every pin below it with the same error, asked once."""
        with self._parents_lock:
            found = self._parents.setdefault(
                (parent.url, parent.commit, parent.refspec or ""),
                _ParentTree(
                    PinnedTree(self.cache, parent.url, parent.commit, refspec=parent.refspec, offline=self.offline)
                ),
            )
        with found.lock:
            if found.error is not None:
                raise found.error.with_traceback(None)
            try:
                root = found.tree.root()
            except (GitError, Offline) as exc:
                found.error = exc
                raise
            return found.tree.entry(path), root

    def group(self, pins: Sequence[RecordedSubmodule]) -> list[PinResult]:
        upstreams: dict[str, Upstream] = {}
        results = []
        for pin in pins:
            try:
                results.append(self.one(pin, upstreams))
            except Offline:
                results.append(_result(pin, "unreachable", OFFLINE_MISS))
            except GitError as exc:
                results.append(_result(pin, "unreachable", exc.reason))
        return results

    def one(self, pin: RecordedSubmodule, upstreams: dict[str, Upstream]) -> PinResult:
        record, path = pin.record, pin.record.path
        entry, parent_root = self.parent_entry(pin.parent, path)
        found = entry.oid if entry is not None and entry.kind == "commit" else None
        if record.skipped and record.commit is None and found is not None:
            # Written by hand as docs/lockfile.md shows ({path, skip}), not yet completed by `lock update`:
            # the image does without it whatever the parent pins there, so the skip stands, and says so.
            return _result(
                pin,
                "skipped",
                f"skipped: {record.skip}; the parent pins {found} at {path}, which the lock does not record yet "
                "(`envbuild lock update` records it)",
            )
        if found != record.commit:
            return _result(pin, "gitlink-mismatch", _gitlink_mismatch(path, found, record.commit))
        if pin.parent.tree is None:
            held = "it is the parent's gitlink (the parent pins no tree)"
        elif parent_root == pin.parent.tree:
            held = "it is the parent's gitlink, held by the parent's tree pin too"
        else:  # the parent's own result says its tree pin is wrong; this gitlink is its commit's
            held = "it is the parent's gitlink (the parent's tree pin is not its commit's tree)"
        if record.skipped:
            status: SubmoduleStatus = "skipped"
            parts = [f"skipped: {record.skip}"]
            if record.commit is None:
                held = "the parent has no gitlink there"
        else:
            assert record.repo is not None and record.commit is not None
            url = self.mirrors.rewrite(record.repo)
            up = upstreams.setdefault(url, Upstream(self.cache, url, offline=self.offline, progress=self.progress))
            tree = up.on_any_ref(record.commit, pin.name)
            if tree is None:
                return _result(pin, "missing-commit", f"the pinned commit is on no upstream branch or tag of {url}")
            if record.tree is not None and tree != record.tree:
                return _result(
                    pin, "tree-mismatch", f"the commit's tree is {tree}, the lock records {record.tree}", tree=tree
                )
            status = "ok"
            parts = ["on an upstream ref" + ("; tree matches" if record.tree is not None else "")]
        facts: dict[str, Any] = {}
        source = self.by_repo.get(repository_key(record.repo)) if record.repo and record.commit else None
        if source is not None and record.commit is not None:
            relation, words = self.relation(record.commit, source)
            facts["pairs_with"] = {"source": source.name, "commit": source.commit, **relation}
            parts.insert(0, words)  # first: what a reader of the table most needs
            if relation["relation"] == "diverged":
                status = "diverged"
        return _result(pin, status, "; ".join([*parts, held]), **facts)

    def relation(self, commit: str, source: Source) -> tuple[dict[str, Any], str]:
        """How ``commit`` relates to ``source``'s pin (once per commit and source: two groups that ask at
        once both compute it, and agree)."""
        key = (commit, source.name)
        if key not in self._relations:
            self._relations[key] = self._relation(commit, source)
        return self._relations[key]

    def _relation(self, commit: str, source: Source) -> tuple[dict[str, Any], str]:
        """How ``commit`` relates to ``source``'s pin, computed in the source's verify cache (either commit
        is fetched by ID, commits only, when it is not there yet)."""
        url = self.mirrors.rewrite(source.repo)
        wanted = [commit, source.commit]
        held = self.cache.commit_trees(url, wanted)
        for sha in (c for c in wanted if c not in held):
            if self.offline:
                return {"relation": "unknown"}, f"how it relates to source {source.name}'s pin: {OFFLINE_MISS}"
            try:
                self.cache.fetch(url, [f"+{sha}:{READ_NS}{sha}"], wanted=[sha])
            except GitError as exc:
                return {"relation": "unknown"}, f"how it relates to source {source.name}'s pin is unknown: {exc.reason}"
        relation = relation_in_cache(self.cache, url, commit, source.commit)  # the words `lock diff` says too
        if relation is None:
            return {"relation": "unknown"}, f"how it relates to source {source.name}'s pin is unknown: not fetched"
        return relation.to_json(), relation.words(source.name)


def _gitlink_mismatch(path: str, found: str | None, recorded: str | None) -> str:
    if found is None:
        return f"the parent's tree has no gitlink at {path}; the lock records {recorded}"
    if recorded is None:
        return f"the parent's tree has a gitlink at {path} (commit {found}); the lock records none"
    return f"the parent's tree pins {found} at {path}; the lock records {recorded}"


def _result(pin: RecordedSubmodule, status: SubmoduleStatus, detail: str, **facts: object) -> PinResult:
    record = pin.record
    base = {"path": record.path, "commit": record.commit, "repo": record.repo, "skip": record.skip}
    return PinResult("submodule", pin.name, status, detail, {**base, **facts})
