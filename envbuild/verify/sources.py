"""Verify git source pins against their upstream, through the local cache of bare repositories.

Each repository costs one ``git ls-remote``; objects are fetched only when a check needs them, and
then only commits (``--filter=tree:0``) of the one ref concerned:

- a tag without a recorded tree is settled by the ref listing alone;
- a tag with a tree, or a branch whose head is not the pin, needs the commit graph of that ref;
  for a build (``whole``), a tree pin is read instead from the pinned commit fetched whole into the
  export cache, which the build's export reads next: one fetch of a moved commit, not two, and made
  while the refs are listed (the listing says whether the pin holds; the commit is what a build of it
  exports);
- only a commit that is not on its branch needs every upstream ref (fetched with ``--prune`` so a
  commit that was force-pushed away is not mistaken for one that still exists).

A warm cache that already holds the advertised tips does no fetch at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from envbuild.data.urls import redact_url
from envbuild.git.cache import GitCache
from envbuild.git.files import OFFLINE_MISS
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError, ref_refspec
from envbuild.git.treeexport import ExportError
from envbuild.git.upstream import Offline, Upstream, check_inputs
from envbuild.lock.model import Source
from envbuild.progress import Progress, silent
from envbuild.verify.results import PinResult, SourceStatus

# {commit: tree} of a source's pinned commit from the export cache, where online it is fetched whole (for
# the build's export) when absent; offline {} when absent.
WholeCommit = Callable[[Source], dict[str, str]]


def verify_sources(
    sources: Sequence[Source],
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    offline: bool = False,
    jobs: int = 8,
    progress: Progress = silent,
    whole: WholeCommit | None = None,
) -> list[PinResult]:
    """Verify every source, in parallel across repositories; results in input order. ``whole``: how a
    build gets a pinned commit whose tree it must check (see the module docstring; offline, the export
    cache is looked in, and nothing fetched).

    Sources sharing a URL share one ref listing and run one after the other. ``progress`` is called
    from worker threads."""
    check_inputs(sources, mirrors)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(sources)))) as early:
        whole = _started(whole, sources, early) if whole is not None else None

        def group(indexes: list[int]) -> list[PinResult]:
            url = mirrors.rewrite(sources[indexes[0]].repo)
            return _verify_group([sources[i] for i in indexes], cache, url, offline, progress, whole)

        return grouped([source.repo for source in sources], group, jobs)


def grouped(keys: Sequence[str], check: Callable[[list[int]], list[PinResult]], jobs: int) -> list[PinResult]:
    """``check`` of the indexes of each group of equal ``keys``: the groups in parallel (``jobs`` at most),
    each one's in order; the results in the order of ``keys``."""
    groups: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    results: list[PinResult | None] = [None] * len(keys)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(groups)))) as pool:
        futures = {key: pool.submit(check, indexes) for key, indexes in groups.items()}
        for key, future in futures.items():
            for index, result in zip(groups[key], future.result()):
                results[index] = result
    return [r for r in results if r is not None]


def _started(whole: WholeCommit, sources: Sequence[Source], pool: ThreadPoolExecutor) -> WholeCommit:
    """``whole`` of every source with a tree pin, begun at once in ``pool`` (beside the ref listings): the
    same answers, each waited for where it is asked."""
    begun = {(s.repo, s.commit): pool.submit(whole, s) for s in sources if s.tree is not None}

    def settled(source: Source) -> dict[str, str]:
        future = begun.get((source.repo, source.commit))
        return future.result() if future is not None else whole(source)

    return settled


def verify_source(
    source: Source,
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    offline: bool = False,
    progress: Progress = silent,
) -> PinResult:
    check_inputs([source], mirrors)
    return _verify_group([source], cache, mirrors.rewrite(source.repo), offline, progress)[0]


def _verify_group(
    sources: Sequence[Source],
    cache: GitCache,
    url: str,
    offline: bool,
    progress: Progress,
    whole: WholeCommit | None = None,
) -> list[PinResult]:
    upstream = Upstream(cache, url, offline=offline, progress=progress)
    results = []
    for source in sources:
        try:
            results.append(_verify(source, upstream, whole))
        except Offline:
            results.append(_result(source, url, "unreachable", OFFLINE_MISS))
        except GitError as exc:
            results.append(_result(source, url, "unreachable", exc.reason))
        except ExportError as exc:  # a build's whole commit: the server would not send its files
            results.append(_result(source, url, "unreachable", str(exc).removeprefix(f"source {source.name}: ")))
    return results


def _verify(source: Source, up: Upstream, whole: WholeCommit | None = None) -> PinResult:
    def result(status: SourceStatus, detail: str, **facts: object) -> PinResult:
        return _result(source, up.url, status, detail, **facts)

    listing = up.listing()
    ref, kind = source.ref, source.ref_type
    same, other = (listing.heads, listing.tags) if kind == "branch" else (listing.tags, listing.heads)
    if ref not in same:
        if ref in other:
            actual = "tag" if kind == "branch" else "branch"
            detail = f"recorded as a {kind}, but upstream {ref} is a {actual}"
            return result("ref-type-changed", detail, upstream_ref_type=actual)
        return result("missing-ref", f"upstream has no {kind} named {ref}")
    head = same[ref]
    if kind == "tag":
        if head != source.commit and listing.refs.get(f"tags/{ref}") == source.commit:
            # `git ls-remote` prints an annotated tag's own object first: copied as the pin, the tag has not moved.
            detail = (
                f"the lock pins the object of annotated tag {ref} itself, not the commit it points at ({head}); "
                "pin the commit (`envbuild lock update` does)"
            )
            return result("tag-moved", detail, upstream=head)
        if head != source.commit:
            return result("tag-moved", f"tag {ref} now points at {head}, not at the pinned commit", upstream=head)
        if source.tree is None:
            return result("ok", f"tag {ref} points at the pinned commit")
        trees = _pinned_tree(source, up, ref_refspec("tag", ref), whole)
        return _tree_verdict(source, up.url, trees) or result(
            "ok", f"tag {ref} points at the pinned commit; tree matches"
        )

    refspec = ref_refspec("branch", ref)
    if head == source.commit:
        ahead = 0
        trees = _pinned_tree(source, up, refspec, whole) if source.tree else {}
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
        detail = (
            f"branch {ref} has moved {ahead} commit{'s' * (ahead != 1)} past the pinned commit, which is still on it"
        )
        return result("behind", detail, ahead=ahead, upstream=head)
    return result("ok", f"the pinned commit is the head of branch {ref}")


def _pinned_tree(source: Source, up: Upstream, refspec: str, whole: WholeCommit | None) -> dict[str, str]:
    """{commit: tree} of the pinned commit, which the ref listing showed on its ref: first (``whole``)
    from the export cache, where a build fetches it whole (its export needs it whole anyway); else from
    the verify cache, fetching the commit alone there (offline: :class:`Offline`). A commit's tree is the
    same wherever its object lies, so an offline rebuild finds what an online build fetched."""
    if whole is not None and source.commit in (trees := whole(source)):
        return trees
    return up.commits([], need=[source.commit], refspecs=[refspec], name=source.name)


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
    detail = f"the pinned commit's tree is {actual}, the lock records {source.tree}"
    return _result(source, url, "tree-mismatch", detail, tree=actual)


# What a source's refs decide: through a mirror, its refs were asked, and one not yet synced lacks what is new.
_READ_FROM_REFS = frozenset({"missing-ref", "ref-type-changed", "tag-moved", "not-on-ref", "missing-commit"})


def _result(source: Source, url: str, status: SourceStatus, detail: str, **facts: object) -> PinResult:
    return PinResult(
        "source", source.name, status, detail + mirror_note(url, status), {"url": url, "commit": source.commit, **facts}
    )


def mirror_note(url: str, status: str) -> str:
    """For a verdict read from the refs of a mirror (``url``, rewritten from the lock's URL): which mirror
    answered, so that a mirror not yet synced is not taken for its upstream ("" for any other)."""
    pinned = getattr(url, "pinned", url)
    if status not in _READ_FROM_REFS or pinned == str(url):
        return ""
    return f" (asked the mirror {redact_url(url)}; a mirror not yet synced with {redact_url(pinned)} lacks what is new)"
