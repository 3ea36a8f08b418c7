"""What a change of pins did to history, as plain values: the commits a moved source's pin passed over
(:class:`Moved`) and how a submodule pairs with a source of the same repository (:class:`Relation`,
:class:`Pairing`, :class:`PairingChange`). Pure: the git layer reads them from the cache
(``GitCache.commit_range``, ``git.upstream.relation_in_cache``), ``lock verify`` and ``lock diff`` say them.

Subjects are a commit's words, from an upstream: kept as git gives them (at most
:data:`SUBJECT_CHARS` characters) and escaped by whoever shows them (:mod:`envbuild.escape`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envbuild.data.jsonout import fields_json, jfield, json_meta

# The longest subject kept (a commit message is any size an upstream likes); longer ones end in '…'.
SUBJECT_CHARS = 200


@dataclass(frozen=True)
class LoggedCommit:
    """One commit as a change report names it."""

    commit: str  # 40 hex
    subject: str  # the first paragraph on one line, at most SUBJECT_CHARS characters; untrusted
    author_date: str  # ISO 8601, as git's %aI gives it

    @property
    def day(self) -> str:
        return self.author_date[:10]


@dataclass(frozen=True)
class Moved:
    """What the cache knows of the commits between a source's old pin and its new one. The cache holds the
    new commit's whole history (commits are never filtered out of it), so an old commit it lacks is no
    ancestor of the new one; then only that, and the new commit, are known."""

    commits: int | None = jfield(None, omit="none")  # in NEW's history and not OLD's (git rev-list --count OLD..NEW)
    # Of those, on NEW's first-parent line: the branch's commits and merges.
    first_parent: int | None = jfield(None, key="first_parent_commits", omit="none")
    # In OLD's history and not NEW's: 0 exactly when OLD is an ancestor of NEW.
    dropped: int | None = jfield(None, key="dropped_commits", omit="none")
    # Is OLD an ancestor of NEW? What `git merge-base --is-ancestor` answers, read from the same count as
    # `dropped` (none of OLD's history missing from NEW's). Not after a force-push or a rewritten branch.
    # Keyword-only: declared after the counts for their JSON order, it is required all the same.
    ancestor: bool = field(kw_only=True)
    first: LoggedCommit | None = None  # the oldest of the first-parent line
    last: LoggedCommit | None = None  # the newest: NEW itself


def commits(count: int) -> str:
    return f"{count} commit{'s' * (count != 1)}"


@dataclass(frozen=True)
class Relation:
    """How a submodule's commit relates to the pin of a source of the same repository."""

    ahead: int = field(metadata=json_meta(omit="empty"))  # commits only the source's pin has
    behind: int = field(metadata=json_meta(omit="empty"))  # commits only the submodule's commit has

    @property
    def kind(self) -> str:
        if self.ahead == self.behind == 0:
            return "same"
        if self.behind == 0:
            return "contained"
        if self.ahead == 0:
            return "behind"
        return "diverged"

    def to_json(self) -> dict[str, Any]:
        """``{"relation": KIND}`` with the counts that say it: ``ahead`` (contained, diverged), ``behind``
        (behind, diverged)."""
        return {"relation": self.kind, **fields_json(self)}

    def words(self, source: str) -> str:
        pin = f"source {source}'s pin"
        kind = self.kind
        if kind == "same":
            return f"the same commit as {pin}"
        if kind == "contained":
            return f"contained in {pin}, {commits(self.ahead)} ahead"
        if kind == "behind":
            return f"{pin} is behind it, by {commits(self.behind)}"
        return (
            f"diverged from {pin}: {commits(self.behind)} of its own, {commits(self.ahead)} only the source has "
            "(upstream tested the parent with this commit, not with the source's)"
        )


def _relation_or_unknown(relation: Relation | None) -> Relation | dict[str, str]:
    return {"relation": "unknown"} if relation is None else relation


@dataclass(frozen=True)
class Pairing:
    """A recorded submodule whose repository is also a source of the lock, with how the two pins relate."""

    source: str  # the source's name
    source_commit: str = field(metadata=json_meta(key="commit"))
    commit: str = field(metadata=json_meta(key="submodule_commit"))  # the submodule's (its parent's gitlink)
    # None: the cache does not hold both commits. Shown as the relation's keys, beside the pins.
    relation: Relation | None = field(metadata=json_meta(inline=True, convert=_relation_or_unknown))

    def words(self) -> str:
        if self.relation is None:
            return f"how it relates to source {self.source}'s pin is not in the cache"
        return self.relation.words(self.source)


@dataclass(frozen=True)
class PairingChange:
    """A pairing the new lock makes differently: ``before`` or ``after`` None where there is none."""

    submodule: str  # SOURCE/PATH[/PATH…]
    before: Pairing | None
    after: Pairing | None

    @property
    def parent(self) -> str:
        """The source the submodule belongs to (at any depth)."""
        return self.submodule.split("/", 1)[0]

    def words(self) -> tuple[str, str]:
        """What it was and what it is, in words."""
        before, after = (("not paired with a source" if p is None else p.words()) for p in (self.before, self.after))
        return before, after
