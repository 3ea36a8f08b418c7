"""What a bisect hands back: every build's result, the change found, and the lock that goes forward."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from envbuild.bisect.steps import Fields, Unit, Verdict, describe
from envbuild.data.jsonout import jfield, json_meta, to_jsonable
from envbuild.lock.model import Lock, Source
from envbuild.lock.moves import LoggedCommit

# found: one first bad state; ambiguous: skips leave several; bad-passes: BAD built and passed;
# bad-unbuildable: BAD cannot be built; good-fails: GOOD (or what stands for it) does not pass;
# deadline, stopped: the search ended before it was done (the deadline; an error of the engine, the
# network, the cache).
Outcome = Literal["found", "ambiguous", "bad-passes", "bad-unbuildable", "good-fails", "deadline", "stopped"]


def _milliseconds(seconds: float) -> float:
    return round(seconds, 3)


@dataclass(frozen=True)
class Step:
    """One build of the search, in the order run."""

    number: int
    state: int
    what: str  # the candidate in words: GOOD, BAD, "source beta at <commit> (23 of 40)", "packages"
    verdict: Verdict
    reason: str  # one line: what failed, or why it could not be built; "" for good
    seconds: float = field(metadata=json_meta(convert=_milliseconds))
    lock_sha256: str
    image_id: str | None = None
    # Answered from the record of this lock built and checked before: nothing built.
    answered: bool = jfield(False, key="answered_from_record")
    commit: LoggedCommit | None = None  # for a commit of a source: its subject and author date


@dataclass(frozen=True)
class Culprit:
    """The change that breaks: a unit, and for a source bisected by commit, the first bad commit."""

    unit: Unit
    reason: str  # the failing check's one line
    commit: LoggedCommit | None = None  # the first bad commit
    position: int = 0  # its place among the unit's commits, 1-based
    last_good: str | None = None  # the source's last good commit

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.unit.kind,
            "name": self.unit.name,
            "reason": self.reason,
            "commit": to_jsonable(self.commit),
            "position": self.position or None,
            "commits": len(self.unit.commits) or None,
            "last_good_commit": self.last_good,
        }


@dataclass(frozen=True)
class BisectResult:
    good: str  # the lockfiles, as given
    bad: str
    units: tuple[Unit, ...]
    states: int  # the last state's index: BAD
    planned: int  # builds at most, logged before the first (skips add to it)
    first_parent: bool
    steps: tuple[Step, ...]
    outcome: Outcome
    seconds: float
    culprit: Culprit | None = None
    candidates: tuple[str, ...] = ()  # ambiguous: the states the first bad may be, in words
    forward: Lock | None = None  # BAD with the culprit at its last good value
    forward_step: int | None = None  # the step that built exactly the forward lock, when one did
    stopped: str = ""  # why the search ended without an answer (deadline, stopped, the endpoints)
    interrupted: bool = False  # stopped by Ctrl-C or SIGTERM

    @property
    def exit_code(self) -> int:
        """0: the change and (for a source bisected by commit) the commit found; 1: nothing conclusive; 130:
        interrupted, as any envbuild command is."""
        return 130 if self.interrupted else 0 if self.outcome == "found" else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.outcome == "found",
            "outcome": self.outcome,
            "good": self.good,
            "bad": self.bad,
            "first_parent": self.first_parent,
            "changes": to_jsonable(self.units),
            "states": self.states,
            "planned_builds": self.planned,
            "builds": len(self.steps),
            "seconds": _milliseconds(self.seconds),
            "culprit": to_jsonable(self.culprit),
            "candidates": list(self.candidates),
            "forward_lock": {"differs_from_bad": forward_difference(self), "built_in_step": self.forward_step}
            if self.forward is not None
            else None,
            "stopped": self.stopped or None,
            "steps": to_jsonable(self.steps),
        }


def differing(before: Source | Fields | None, after: Source | Fields | None) -> list[str]:
    """The fields that differ between a unit's two values: what a change is when its one-line description
    is the same on both sides (a lock update that records a source's requirements, a file's metadata pin)."""
    if before is None or after is None:
        return []
    if isinstance(before, Source) and isinstance(after, Source):
        return [f.name for f in dataclasses.fields(Source) if getattr(before, f.name) != getattr(after, f.name)]
    if isinstance(before, Source) or isinstance(after, Source):
        return []
    old, new = dict(before), dict(after)
    return [name for name in dict.fromkeys([*old, *new]) if old.get(name) != new.get(name)]


def forward_difference(result: BisectResult) -> list[str]:
    """How the forward lock differs from BAD, a line per field."""
    if result.forward is None or result.culprit is None:
        return []
    unit = result.culprit.unit
    if unit.kind == "source":
        forward = next((s for s in result.forward.sources if s.name == unit.name), None)
        if forward is None:
            return [f"source {unit.name}: left out (GOOD has none)"]
        if unit.after is None:
            return [f"source {unit.name}: kept at GOOD's {describe(forward)}"]
        assert isinstance(unit.after, Source)
        return [f"source {unit.name}: commit {unit.after.commit} → {forward.commit}"] + (
            [f"source {unit.name}: tree {unit.after.tree} → {forward.tree}"] if forward.tree != unit.after.tree else []
        )
    assert isinstance(unit.before, tuple)
    return [f"{unit.label}: {describe(unit.after)} → {describe(unit.before)}"]
