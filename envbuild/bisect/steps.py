"""What a bisect searches, and how: pure.

The changes from GOOD to BAD are **units**, in a fixed order: the base image (with the platform), the
package closure (packages, requirements, index), the installer (uv, which installs the closure), each
source in BAD's order (then the sources only GOOD has, in its order), and the lock's settings (name,
``source_date_epoch``). Every field of the lock but its version (a candidate has the higher of the two) is
in one unit: what a build uses and differs between the locks is a change. The base and the closure come
first because the sources' recorded requirements are BAD's closure's: a source moved on before its
packages would fail verify's closure check, where old sources under new packages seldom do.

The **states** are GOOD with one more change applied each: state 0 is GOOD, state ``n`` is BAD. A unit is
one state, except a source whose commits between the two pins are known (:mod:`.history`): one state per
commit, oldest first, the last being BAD's pin. So the search for the first bad state finds the pin and,
for a source, the commit at once, in about ``log2(n)`` builds, where a search for the pin and then one
for the commit would spend ``log2(units) + log2(commits)``.

:class:`Search` is git bisect's: the first bad state between the last known good one and the first known
bad one, halving; a state that cannot be built is skipped, and the untested state nearest the middle is
tried instead; when only skipped states are left between, the first bad is any of them or the bad one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from envbuild.data.jsonout import jfield, json_meta
from envbuild.lock.model import Lock, Source

UnitKind = Literal["base_image", "packages", "installer", "source", "settings"]
Verdict = Literal["good", "bad", "skip", "stopped"]  # stopped: built, and its `--run` ended the search

# The lock's fields each lock-level unit carries, in the order the units are applied.
LOCK_FIELDS: dict[str, tuple[str, ...]] = {
    "base_image": ("base_image", "platform"),
    "packages": ("packages", "requirements", "index"),
    "installer": ("installer",),
    "settings": ("name", "source_date_epoch"),
}
Fields = tuple[tuple[str, Any], ...]  # (lock field, value) of a lock-level unit


def describe(value: Source | Fields | None) -> str:
    """A unit's value in one line: a source's ref and commit, the base image, counts of a closure."""
    if value is None:
        return "(none)"
    if isinstance(value, Source):
        return f"{value.ref_type} {value.ref} {value.commit}"
    said = []
    for name, field_value in value:
        if name == "base_image":
            said.append("(none)" if field_value is None else f"{field_value.name}@{field_value.digest or '(unpinned)'}")
        elif name == "platform":
            if field_value is not None:
                said.append(f"{field_value.os}/{field_value.arch} python {field_value.python}")
        elif name == "installer":
            said.append("(none: pip)" if field_value is None else f"{field_value.name} {field_value.version}")
        elif name in ("packages", "requirements"):
            said.append(f"{len(field_value)} {name}")
        else:
            said.append(f"{name} {field_value}")
    return ", ".join(said)


@dataclass(frozen=True)
class Rewrite:
    """A source's branch rewritten between the locks: GOOD's commit is not an ancestor of BAD's."""

    good: str  # GOOD's commit
    bad: str  # BAD's commit
    merge_base: str | None  # where the two histories meet; None: they share no commit the cache knows


@dataclass(frozen=True)
class Unit:
    """One change from GOOD to BAD. ``before`` is what the states before its turn hold, ``after`` BAD's: a
    source (None where a lock has none) or, for the other kinds, the lock's fields. ``before`` is GOOD's,
    except for a source whose branch was rewritten: then the merge base stands for GOOD's pin (GOOD's
    commit is on the branch no more, and verify refuses it). ``commits``: for a source whose commits are
    bisected, oldest first, the last being ``after.commit``; ``trees`` their trees."""

    kind: UnitKind
    name: str
    before: Source | Fields | None = field(metadata=json_meta(key="old", convert=describe))
    after: Source | Fields | None = field(metadata=json_meta(key="new", convert=describe))
    commits: tuple[str, ...] = jfield((), convert=lambda commits: len(commits) or None)
    trees: Mapping[str, str] = jfield(default_factory=dict, skip=True)
    note: str | None = None  # why its commits are not bisected, or what became of its branch
    rewrite: Rewrite | None = jfield(None, key="rewritten")

    @property
    def size(self) -> int:
        """The states it makes."""
        return len(self.commits) or 1

    @property
    def label(self) -> str:
        labels = {"source": f"source {self.name}", "base_image": "base image", "settings": "lock settings"}
        return labels.get(self.kind, self.kind)  # "packages", "installer"

    def source_at(self, commit: str) -> Source:
        """The source at one of its ``commits``: BAD's record (its requirements, install, waivers as BAD
        records them) at that commit and its tree."""
        assert isinstance(self.after, Source)
        if commit == self.after.commit:
            return self.after
        return dataclasses.replace(self.after, commit=commit, tree=self.trees[commit])


@dataclass(frozen=True)
class State:
    """State ``index`` of the search: the units before ``unit`` applied, ``unit`` at ``commit`` (a source
    bisected by commit; its ``position`` of ``of``) or applied whole, the rest as GOOD has them."""

    index: int
    unit: int | None  # None: state 0, GOOD
    commit: str | None = None
    position: int = 0  # 1-based among the unit's commits
    of: int = 0


def plan_units(good: Lock, bad: Lock) -> list[Unit]:
    """Every change from ``good`` to ``bad``, in the order of the module docstring; none when they pin the
    same things."""
    units: list[Unit] = []

    def fields(lock: Lock, kind: str) -> Fields:
        return tuple((name, getattr(lock, name)) for name in LOCK_FIELDS[kind])

    for kind in ("base_image", "packages", "installer"):
        if fields(good, kind) != fields(bad, kind):
            name = bad.base_image.name if kind == "base_image" and bad.base_image else kind
            units.append(Unit(kind, name, fields(good, kind), fields(bad, kind)))
    old = {s.name: s for s in good.sources}
    new = {s.name: s for s in bad.sources}
    for source in bad.sources:
        if old.get(source.name) != source:
            units.append(Unit("source", source.name, old.get(source.name), source))
    for source in good.sources:
        if source.name not in new:
            units.append(Unit("source", source.name, source, None))
    if fields(good, "settings") != fields(bad, "settings"):
        units.append(Unit("settings", "settings", fields(good, "settings"), fields(bad, "settings")))
    return units


def plan_states(units: list[Unit]) -> list[State]:
    """State 0 (GOOD*), then each unit's states in order; the last is BAD."""
    states = [State(0, None)]
    for number, unit in enumerate(units):
        if unit.commits:
            for position, commit in enumerate(unit.commits, 1):
                states.append(State(len(states), number, commit, position, len(unit.commits)))
        else:
            states.append(State(len(states), number))
    return states


def candidate(good: Lock, bad: Lock, units: list[Unit], state: State, source: Source | None = None) -> Lock:
    """The lock of ``state``: every unit before its turn at ``after``, its own unit at the state's value
    (``source``: the record to use for a commit state, else :meth:`Unit.source_at`), the rest at
    ``before``. Sources in BAD's order, then those only GOOD has; the version the two locks' higher."""
    lock = dataclasses.replace(good, version=max(good.version, bad.version))
    for number, unit in enumerate(units):
        if state.unit is None or number > state.unit:
            value = unit.before
        elif number < state.unit or state.commit is None:
            value = unit.after
        else:
            value = source if source is not None else unit.source_at(state.commit)
        lock = apply(lock, unit, value, bad)
    return lock


def apply(lock: Lock, unit: Unit, value: Source | Fields | None, bad: Lock) -> Lock:
    """``lock`` with ``unit`` at ``value``."""
    if unit.kind != "source":
        assert isinstance(value, tuple)
        return dataclasses.replace(lock, **dict(value))
    assert value is None or isinstance(value, Source)
    kept = {s.name: s for s in lock.sources if s.name != unit.name}
    if value is not None:
        kept[unit.name] = value
    order = [s.name for s in bad.sources] + [s.name for s in lock.sources] + [unit.name]  # one BAD drops: last
    ranked = {name: rank for rank, name in reversed(list(enumerate(order)))}
    return dataclasses.replace(lock, sources=tuple(sorted(kept.values(), key=lambda s: ranked[s.name])))


def forward_lock(bad: Lock, unit: Unit, last_good: Source | Fields | None) -> Lock:
    """BAD with ``unit`` at its last good value: what goes forward without the change that breaks. A
    version 1 BAD becomes version 2 only when the value records submodules."""
    lock = apply(bad, unit, last_good, bad)
    needs_two = any(s.submodules or s.submodules_unknown for s in lock.sources)
    return dataclasses.replace(lock, version=2) if needs_two else lock


def search_builds(states: int) -> int:
    """Builds a search needs at most, without skips, to find the first bad of states 1..``states`` when
    state 0 is good and ``states`` is known bad: ``ceil(log2(states))``."""
    return max(states - 1, 0).bit_length()


@dataclass
class Search:
    """The first bad of states ``0..last``, 0 good and ``last`` bad (tested or taken as such)."""

    last: int
    verdicts: dict[int, Verdict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.verdicts.setdefault(0, "good")
        self.verdicts.setdefault(self.last, "bad")

    def mark(self, index: int, verdict: Verdict) -> None:
        self.verdicts[index] = verdict

    @property
    def bounds(self) -> tuple[int, int]:
        """(the last good state below the first bad, the first bad state)."""
        bad = min(i for i, v in self.verdicts.items() if v == "bad")
        good = max(i for i, v in self.verdicts.items() if v == "good" and i < bad)
        return good, bad

    def next(self) -> int | None:
        """The state to test next: the untested one nearest the middle of the bounds (the middle first,
        then one above, one below, …); None when none is left."""
        good, bad = self.bounds
        middle = (good + bad) // 2
        for distance in range(bad - good):
            for index in (middle + distance, middle - distance):
                if good < index < bad and index not in self.verdicts:
                    return index
        return None

    def first_bad(self) -> tuple[int, ...]:
        """Where the first bad state is, once :meth:`next` is None: one state, or (skips between the
        bounds) each skipped state and the first bad."""
        good, bad = self.bounds
        return (*(i for i in range(good + 1, bad) if self.verdicts.get(i) == "skip"), bad)
