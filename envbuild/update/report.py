"""The change report of ``lock update`` and ``lock diff``, read from the cache alone (no network): for each
source whose pin moved, the commits it passed over (:meth:`~envbuild.git.cache.GitCache.commit_range`), and
for each submodule that pairs with a source of the lock, how the two pins relate in the old lock and in the
new one (the relation ``lock verify`` reports, from ``git/upstream.py``). ``lock/diff.py`` says it, to a
terminal and in Markdown.

A ``lock update`` has just fetched every commit it pins, so its report is whole; a ``lock diff`` of locks
whose commits the cache never saw says what it cannot tell instead of asking a server.
"""

from __future__ import annotations

from collections.abc import Callable

from envbuild.git.cache import GitCache
from envbuild.git.gitmodules import repository_key
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError
from envbuild.git.upstream import read_move, relation_in_cache
from envbuild.lock.diff import Change, diff_locks
from envbuild.lock.model import Lock, Source, walk_submodules
from envbuild.lock.moves import Moved, Pairing, PairingChange, Relation

RelationReader = Callable[[str, Source], "Relation | None"]


def change_report(old: Lock, new: Lock, cache: GitCache, *, mirrors: Mirrors = Mirrors()) -> list[Change]:
    """The changes from ``old`` to ``new`` with what the cache knows of the commits behind them."""

    def moved(before: Source, after: Source) -> Moved | None:
        return read_move(after.repo, before.commit, after.commit, cache, mirrors=mirrors)

    relations: dict[tuple[str, str, str], Relation | None] = {}

    def relation(commit: str, source: Source) -> Relation | None:
        # Once per (repository, commit, pin): a tree may pin one commit at many paths.
        url = mirrors.rewrite(source.repo)
        key = (url, commit, source.commit)
        if key not in relations:
            try:
                relations[key] = relation_in_cache(cache, url, commit, source.commit)
            except GitError:
                relations[key] = None
        return relations[key]

    return diff_locks(old, new, read_move=moved, pairings=pairing_changes(old, new, relation))


def paired_submodules(lock: Lock) -> dict[str, tuple[str, Source]]:
    """{``SOURCE/PATH[/PATH…]``: (the submodule's commit, the source it pairs with)} for every recorded
    submodule, at every level, whose repository is also a source's of ``lock`` (same host and path, whatever
    the transport, as ``lock verify`` pairs them)."""
    by_repo = {repository_key(s.repo): s for s in lock.sources}
    found: dict[str, tuple[str, Source]] = {}
    for source in lock.sources:
        for name, record in walk_submodules(source.submodules, f"{source.name}/"):
            paired = by_repo.get(repository_key(record.repo)) if record.repo is not None else None
            if paired is not None and record.commit is not None:
                found[name] = (record.commit, paired)
    return found


def pairing_changes(old: Lock, new: Lock, relation: RelationReader) -> list[PairingChange]:
    """The pairings ``new`` makes differently from ``old``, by submodule: one appears or goes, or either pin
    moved and the two now relate otherwise (both moved in step: nothing to say). ``relation`` is asked only
    of pins that moved."""
    before, after = paired_submodules(old), paired_submodules(new)
    changes = []
    for name in sorted(before.keys() | after.keys()):
        was, now = before.get(name), after.get(name)
        if was is not None and now is not None and _pins(was) == _pins(now):
            continue
        first, second = (None if p is None else Pairing(p[1].name, p[1].commit, p[0], relation(*p)) for p in (was, now))
        if not _relate_alike(first, second):
            changes.append(PairingChange(name, first, second))
    return changes


def _relate_alike(first: Pairing | None, second: Pairing | None) -> bool:
    """Both pins moved and still relate as they did (what the cache cannot tell is never alike)."""
    if first is None or second is None or first.relation is None:
        return False
    return (first.source, first.relation) == (second.source, second.relation)


def _pins(pairing: tuple[str, Source]) -> tuple[str, str, str]:
    commit, source = pairing
    return commit, source.name, source.commit
