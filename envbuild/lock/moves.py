"""What a change of pins did to history, as plain values: the commits a moved source's pin passed over
(:class:`Moved`) and how a submodule pairs with a source of the same repository (:class:`Relation`,
:class:`Pairing`, :class:`PairingChange`). Pure: the git layer reads them from the cache
(``GitCache.commit_range``, ``git.upstream.relation_in_cache``), ``lock verify`` and ``lock diff`` say them.

Subjects are a commit's words, from an upstream: kept as git gives them (at most
:data:`SUBJECT_CHARS` characters) and escaped by whoever shows them (:mod:`envbuild.escape`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    def to_json(self) -> dict[str, str]:
        return {"commit": self.commit, "subject": self.subject, "author_date": self.author_date}


@dataclass(frozen=True)
class Moved:
    """What the cache knows of the commits between a source's old pin and its new one. The cache holds the
    new commit's whole history (commits are never filtered out of it), so an old commit it lacks is no
    ancestor of the new one; then only that, and the new commit, are known."""

    # Is OLD an ancestor of NEW? What `git merge-base --is-ancestor` answers, read from the same count as
    # `dropped` (none of OLD's history missing from NEW's). Not after a force-push or a rewritten branch.
    ancestor: bool
    commits: int | None = None  # in NEW's history and not OLD's (git rev-list --count OLD..NEW)
    first_parent: int | None = None  # of those, on NEW's first-parent line: the branch's commits and merges
    dropped: int | None = None  # in OLD's history and not NEW's: 0 exactly when OLD is an ancestor of NEW
    first: LoggedCommit | None = None  # the oldest of the first-parent line
    last: LoggedCommit | None = None  # the newest: NEW itself

    def to_json(self) -> dict[str, Any]:
        counts = {"commits": self.commits, "first_parent_commits": self.first_parent, "dropped_commits": self.dropped}
        return {
            **{key: count for key, count in counts.items() if count is not None},
            "ancestor": self.ancestor,
            "first": None if self.first is None else self.first.to_json(),
            "last": None if self.last is None else self.last.to_json(),
        }


def commits(count: int) -> str:
    return f"{count} commit{'s' * (count != 1)}"


@dataclass(frozen=True)
class Relation:
    """How a submodule's commit relates to the pin of a source of the same repository."""

    ahead: int  # commits only the source's pin has
    behind: int  # commits only the submodule's commit has

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
        data: dict[str, Any] = {"relation": self.kind}
        if self.ahead:
            data["ahead"] = self.ahead
        if self.behind:
            data["behind"] = self.behind
        return data

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


@dataclass(frozen=True)
class Pairing:
    """A recorded submodule whose repository is also a source of the lock, with how the two pins relate."""

    source: str  # the source's name
    source_commit: str
    commit: str  # the submodule's (its parent's gitlink)
    relation: Relation | None  # None: the cache does not hold both commits

    def words(self) -> str:
        if self.relation is None:
            return f"how it relates to source {self.source}'s pin is not in the cache"
        return self.relation.words(self.source)

    def to_json(self) -> dict[str, Any]:
        relation = {"relation": "unknown"} if self.relation is None else self.relation.to_json()
        return {"source": self.source, "commit": self.source_commit, "submodule_commit": self.commit, **relation}


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

    def to_json(self) -> dict[str, Any]:
        return {
            "submodule": self.submodule,
            "before": None if self.before is None else self.before.to_json(),
            "after": None if self.after is None else self.after.to_json(),
        }
