"""Verify git source pins against their upstream, through the local cache of bare repositories.

Each repository costs one ``git ls-remote``; objects are fetched only when a check needs them, and
then only commits (``--filter=tree:0``) of the one ref concerned:

- a tag without a recorded tree is settled by the ref listing alone;
- a tag with a tree, or a branch whose head is not the pin, needs the commit graph of that ref;
- only a commit that is not on its branch needs every upstream ref (fetched with ``--prune`` so a
  commit that was force-pushed away is not mistaken for one that still exists).

A warm cache that already holds the advertised tips does no fetch at all.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from envbuild.errors import InputError, RemoteError
from envbuild.git.cache import GitCache
from envbuild.git.files import OFFLINE_MISS
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError, RefListing
from envbuild.lock.model import HEX40, REF_NAME, Source, check_repo_url
from envbuild.progress import Progress
from envbuild.verify.results import PinResult, SourceStatus

ALL_REFS = ("+refs/heads/*:refs/upstream/heads/*", "+refs/tags/*:refs/upstream/tags/*")


@dataclass(frozen=True)
class ResolvedRef:
    """Where a ref points upstream now: for ``lock update``."""

    ref_type: Literal["branch", "tag"]
    commit: str
    tree: str


class MissingRefError(RemoteError):
    """The ref is neither a branch nor a tag upstream."""


class Offline(Exception):
    """The cache cannot answer without the network."""


class Upstream:
    """One repository seen through the cache: its ref listing (fetched once) and fetches on demand (also
    the submodules' verify, :mod:`envbuild.verify.submodules`)."""

    def __init__(self, cache: GitCache, url: str, *, offline: bool, progress: Progress | None) -> None:
        self.cache, self.url, self.offline, self.progress = cache, url, offline, progress
        self._listing: RefListing | None = None
        self._failure: GitError | None = None

    def listing(self) -> RefListing:
        if self._failure is not None:
            raise self._failure  # one failed listing answers for every pin of the repository
        if self._listing is None:
            if self.offline:
                cached = self.cache.cached_listing(self.url)
                if cached is None:
                    raise Offline()
                self._listing = cached
            else:
                try:
                    self._listing = self.cache.list_refs(self.url)
                except GitError as exc:
                    self._failure = exc
                    raise
        return self._listing

    def commits(
        self, lookup: Sequence[str], *, need: Sequence[str] = (), refspecs: Sequence[str] = (), name: str = ""
    ) -> dict[str, str]:
        """{commit: tree} for ``lookup`` + ``need``, fetching ``refspecs`` first when any of ``need``
        is absent. Offline, a missing ``need`` raises :class:`Offline`."""
        trees = self.cache.commit_trees(self.url, [*lookup, *need])
        if all(sha in trees for sha in need):
            return trees
        if self.offline:
            raise Offline()
        self._fetch(name, refspecs, wanted=need)
        return self.cache.commit_trees(self.url, [*lookup, *need])

    def all_refs(self, name: str) -> dict[str, str]:
        """Make the cache hold every advertised ref (pruning vanished ones); {commit: tree} of the tips."""
        listing = self.listing()
        if not self.offline:
            self._fetch(name, ALL_REFS, prune=True, fresh=dict(listing.refs))
        return self.cache.commit_trees(self.url, listing.tips())

    def on_any_ref(self, commit: str, name: str) -> str | None:
        """The commit's tree when it is on some upstream branch or tag (the commits of every ref fetched,
        vanished refs pruned, so a commit force-pushed away is not taken for one that exists), else None."""
        tips = self.all_refs(name)
        present = self.cache.commit_trees(self.url, [commit])
        if commit in present and self.cache.reachable_from_any(self.url, commit, set(tips)):
            return present[commit]
        if self.offline and not self.listing().tips() <= set(tips):
            raise Offline()  # some tip we never fetched might hold it
        return None

    def _fetch(
        self,
        name: str,
        refspecs: Sequence[str],
        *,
        wanted: Sequence[str] = (),
        prune: bool = False,
        fresh: dict[str, str] | None = None,
    ) -> None:
        if fresh is not None and self.cache.namespace_refs(self.url) == fresh:
            return  # the cache already mirrors every advertised ref
        what = "all refs of " if prune else ""
        self._say(f"fetching {what}{name} from {self.url}")
        start = time.perf_counter()
        try:
            filtered = self.cache.fetch(self.url, refspecs, wanted=wanted, prune=prune, fresh=fresh)
        except GitError as exc:
            self._say(f"fetch of {name} failed: {exc.reason}")
            raise
        if filtered is None:
            self._say(f"{name}: another verify fetched it meanwhile")
            return
        note = "" if filtered else " (the server does not allow partial clone: full fetch)"
        self._say(f"fetched {name} in {time.perf_counter() - start:.1f} s{note}")

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)


def verify_sources(
    sources: Sequence[Source],
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    offline: bool = False,
    jobs: int = 8,
    progress: Progress | None = None,
) -> list[PinResult]:
    """Verify every source, in parallel across repositories; results in input order.

    Sources sharing an effective URL share one ref listing and run one after the other. ``progress``
    is called from worker threads."""
    groups: dict[str, list[int]] = {}
    for index, source in enumerate(sources):
        groups.setdefault(mirrors.rewrite(source.repo), []).append(index)
    check_inputs(sources, mirrors)
    results: list[PinResult | None] = [None] * len(sources)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(groups)))) as pool:
        futures = {
            url: pool.submit(_verify_group, [sources[i] for i in indexes], cache, url, offline, progress)
            for url, indexes in groups.items()
        }
        for url, future in futures.items():
            for index, result in zip(groups[url], future.result()):
                results[index] = result
    return [r for r in results if r is not None]


def verify_source(
    source: Source,
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    offline: bool = False,
    progress: Progress | None = None,
) -> PinResult:
    check_inputs([source], mirrors)
    return _verify_group([source], cache, mirrors.rewrite(source.repo), offline, progress)[0]


def check_inputs(sources: Sequence[Source], mirrors: Mirrors) -> None:
    """Refuse, all at once, anything that could reach git as an option or a revision expression. The
    lock model validates what it parses; this also covers URLs produced by mirror rules and sources
    built in code."""
    problems = []
    for source in sources:
        url = mirrors.rewrite(source.repo)
        if (problem := check_repo_url(url)) is not None:
            via = f" (after mirror rewriting of {source.repo!r})" if url != source.repo else ""
            problems.append(f"source {source.name}: repo {problem}{via}")
        if not re.fullmatch(REF_NAME, source.ref):
            problems.append(f"source {source.name}: ref {source.ref!r} is not a branch or tag short name")
        for what, sha in (("commit", source.commit), ("tree", source.tree)):
            if sha is not None and not re.fullmatch(HEX40, sha):
                problems.append(f"source {source.name}: {what} {sha!r} is not a full 40-hex SHA")
    if problems:
        raise InputError("\n".join(problems))


def _verify_group(
    sources: Sequence[Source], cache: GitCache, url: str, offline: bool, progress: Progress | None
) -> list[PinResult]:
    upstream = Upstream(cache, url, offline=offline, progress=progress)
    results = []
    for source in sources:
        try:
            results.append(_verify(source, upstream))
        except Offline:
            results.append(_result(source, url, "unreachable", OFFLINE_MISS))
        except GitError as exc:
            results.append(_result(source, url, "unreachable", exc.reason))
    return results


def _verify(source: Source, up: Upstream) -> PinResult:
    listing = up.listing()
    ref, kind = source.ref, source.ref_type
    same, other = (listing.heads, listing.tags) if kind == "branch" else (listing.tags, listing.heads)
    if ref not in same:
        if ref in other:
            actual = "tag" if kind == "branch" else "branch"
            return _result(
                source,
                up.url,
                "ref-type-changed",
                f"recorded as a {kind}, but upstream {ref} is a {actual}",
                upstream_ref_type=actual,
            )
        return _result(source, up.url, "missing-ref", f"upstream has no {kind} named {ref}")
    head = same[ref]
    if kind == "tag":
        if head != source.commit:
            return _result(
                source, up.url, "tag-moved", f"tag {ref} now points at {head}, not at the pinned commit", upstream=head
            )
        if source.tree is None:
            return _result(source, up.url, "ok", f"tag {ref} points at the pinned commit")
        trees = up.commits(
            [], need=[source.commit], refspecs=[f"+refs/tags/{ref}:refs/upstream/tags/{ref}"], name=source.name
        )
        return _tree_verdict(source, up.url, trees) or _result(
            source, up.url, "ok", f"tag {ref} points at the pinned commit; tree matches"
        )

    refspec = f"+refs/heads/{ref}:refs/upstream/heads/{ref}"
    if head == source.commit:
        ahead = 0
        trees = up.commits([], need=[source.commit] if source.tree else [], refspecs=[refspec], name=source.name)
    else:
        trees = up.commits([source.commit], need=[head], refspecs=[refspec], name=source.name)
        if head not in trees:  # the branch moved between listing and fetch: use what was fetched
            head = up.cache.namespace_refs(up.url).get(f"heads/{ref}", head)
            trees = up.commits([source.commit, head])
            if head not in trees:
                raise GitError("fetch", f"branch {ref} moved while fetching; try again")
        left = 1
        if source.commit in trees:
            left, ahead = up.cache.left_right(up.url, source.commit, head)
        if left:
            return _not_on_ref(source, up)
    mismatch = _tree_verdict(source, up.url, trees)
    if mismatch:
        return mismatch
    if ahead:
        return _result(
            source,
            up.url,
            "behind",
            f"branch {ref} has moved {ahead} commit{'s' * (ahead != 1)} past the pinned commit, which is still on it",
            ahead=ahead,
            upstream=head,
        )
    return _result(source, up.url, "ok", f"the pinned commit is the head of branch {ref}")


def _not_on_ref(source: Source, up: Upstream) -> PinResult:
    """The commit is not on its branch: tell a commit that exists elsewhere from one that is gone."""
    if up.on_any_ref(source.commit, source.name) is not None:
        return _result(
            source, up.url, "not-on-ref", f"the pinned commit exists upstream but is not on branch {source.ref}"
        )
    return _result(source, up.url, "missing-commit", "the pinned commit is on no upstream branch or tag")


def _tree_verdict(source: Source, url: str, trees: dict[str, str]) -> PinResult | None:
    if source.tree is None:
        return None
    actual = trees.get(source.commit)
    if actual is None:
        raise GitError("fetch", "the pinned commit was not fetched")
    if actual == source.tree:
        return None
    return _result(
        source,
        url,
        "tree-mismatch",
        f"the pinned commit's tree is {actual}, the lock records {source.tree}",
        tree=actual,
    )


def _result(source: Source, url: str, status: SourceStatus, detail: str, **facts: object) -> PinResult:
    return PinResult("source", source.name, status, detail, {"url": url, "commit": source.commit, **facts})


def resolve_ref(
    source: Source, cache: GitCache, *, mirrors: Mirrors = Mirrors(), progress: Progress | None = None
) -> ResolvedRef:
    """Where ``source.ref`` points upstream now (the recorded type first, else the other one).

    Raises :class:`MissingRefError` when it is neither, :class:`GitError` (a RemoteError) when the
    remote cannot be read."""
    check_inputs([source], mirrors)
    url = mirrors.rewrite(source.repo)
    up = Upstream(cache, url, offline=False, progress=progress)
    listing = up.listing()
    order: tuple[Literal["branch", "tag"], ...] = (
        ("branch", "tag") if source.ref_type == "branch" else ("tag", "branch")
    )
    for kind in order:
        refs = listing.heads if kind == "branch" else listing.tags
        if source.ref in refs:
            commit = refs[source.ref]
            space = "heads" if kind == "branch" else "tags"
            trees = up.commits(
                [],
                need=[commit],
                refspecs=[f"+refs/{space}/{source.ref}:refs/upstream/{space}/{source.ref}"],
                name=source.name,
            )
            if commit not in trees:
                raise GitError("fetch", f"{source.ref} moved while fetching; try again")
            return ResolvedRef(kind, commit, trees[commit])
    raise MissingRefError(f"{url}: no branch or tag named {source.ref!r} upstream ({source.name})")


def count_commits(source_url: str, old: str, new: str, cache: GitCache, *, mirrors: Mirrors = Mirrors()) -> int | None:
    """Commits in ``new``'s history that are not in ``old``'s (``git rev-list --count old..new``), from
    the cache alone; None when the cache does not hold both."""
    try:
        return cache.count_range(mirrors.rewrite(source_url), old, new)
    except GitError:
        return None
