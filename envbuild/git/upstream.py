"""One upstream repository seen through the cache of bare repositories, for verify and update alike.

:class:`Upstream` lists its refs once (offline: the listing the cache kept) and fetches objects only when
asked, then only commits (``--filter=tree:0``) of the refs concerned; :func:`check_inputs` refuses, all
at once, anything that could reach git as an option or a revision expression before git is started.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from envbuild.errors import InputError
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError, RefListing
from envbuild.lock.model import HEX40, REF_NAME, Source, check_repo_url
from envbuild.lock.moves import Moved, Relation
from envbuild.progress import Progress

ALL_REFS = ("+refs/heads/*:refs/upstream/heads/*", "+refs/tags/*:refs/upstream/tags/*")


class Offline(Exception):
    """The cache cannot answer without the network."""


class Upstream:
    """One repository seen through the cache: its ref listing (fetched once) and fetches on demand."""

    def __init__(self, cache: GitCache, url: str, *, offline: bool, progress: Progress) -> None:
        self.cache, self.url, self.offline, self.progress = cache, url, offline, progress
        self._listing: RefListing | None = None
        self._failure: GitError | None = None
        self._fetch_failure: GitError | None = None
        self._on_ref: dict[str, str | None] = {}  # commit → its tree when on a ref: asked once per commit

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
        if self._fetch_failure is not None:
            raise self._fetch_failure.with_traceback(None)  # one failed fetch answers for every pin too
        if not self.offline:
            try:
                self._fetch(name, ALL_REFS, prune=True, fresh=dict(listing.refs))
            except GitError as exc:
                self._fetch_failure = exc
                raise
        return self.cache.commit_trees(self.url, listing.tips())

    def on_any_ref(self, commit: str, name: str) -> str | None:
        """The commit's tree when it is on some upstream branch or tag (the commits of every ref fetched,
        vanished refs pruned, so a commit force-pushed away is not taken for one that exists), else None.
        Asked once per commit: many submodule paths may pin one commit."""
        if commit in self._on_ref:
            return self._on_ref[commit]
        tips = self.all_refs(name)
        present = self.cache.commit_trees(self.url, [commit])
        on_ref = commit in present and self.cache.reachable_from_any(self.url, commit, set(tips))
        if not on_ref and self.offline and not self.listing().tips() <= set(tips):
            raise Offline()  # some tip we never fetched might hold it
        self._on_ref[commit] = present[commit] if on_ref else None
        return self._on_ref[commit]

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
        self.progress(f"fetching {what}{name} from {self.url}")
        start = time.perf_counter()
        try:
            filtered = self.cache.fetch(self.url, refspecs, wanted=wanted, prune=prune, fresh=fresh)
        except GitError as exc:
            self.progress(f"fetch of {name} failed: {exc.reason}")
            raise
        if filtered is None:
            self.progress(f"{name}: another verify fetched it meanwhile")
            return
        note = "" if filtered else " (the server does not allow partial clone: full fetch)"
        self.progress(f"fetched {name} in {time.perf_counter() - start:.1f} s{note}")


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


def read_move(source_url: str, old: str, new: str, cache: GitCache, *, mirrors: Mirrors = Mirrors()) -> Moved | None:
    """What ``new`` brings over ``old`` (:meth:`GitCache.commit_range`), from the cache alone; None when the
    cache does not hold both."""
    return cache.commit_range(mirrors.rewrite(source_url), old, new)


def relation_in_cache(cache: GitCache, url: str, commit: str, source_commit: str) -> Relation | None:
    """How a submodule's ``commit`` relates to a source's pin of the same repository (``url``, after mirrors),
    from the cache alone: one ``rev-list --left-right --count``; None when the cache does not hold both."""
    if not {commit, source_commit} <= set(cache.commit_trees(url, [commit, source_commit])):
        return None
    behind, ahead = cache.left_right(url, commit, source_commit)
    return Relation(ahead=ahead, behind=behind)
