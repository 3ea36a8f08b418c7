"""The one serialiser of typed values (envbuild.data.jsonout), and the JSON of the project's classes that
declare what their fields need: users' scripts read these documents, key order included."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from types import MappingProxyType
from typing import Any

import pytest

from envbuild.check.report import CheckFailure, CheckReport
from envbuild.data.jsonout import fields_json, jfield, json_meta, records, to_jsonable
from envbuild.lock.diff import Change
from envbuild.lock.moves import LoggedCommit, Moved, Pairing, Relation
from envbuild.verify.results import PinResult, VerifyReport
from envrun.checkpoint.audit import ModelAudit
from envrun.cluster.info import ClusterInfo, NodeInfo


class Colour(enum.Enum):
    RED = "red"


@dataclass(frozen=True)
class Leaf:
    name: str
    size: int | None = None


@dataclass(frozen=True)
class Tree:
    title: str
    leaves: tuple[Leaf, ...]
    where: PurePath
    labels: dict[str, Any] = field(default_factory=dict)
    colour: Colour = Colour.RED
    parent: Leaf | Verdict | None = None


def dumped(value: object) -> str:
    return json.dumps(to_jsonable(value))


def test_a_dataclass_is_its_fields_in_order_and_everything_inside_it_the_same_way() -> None:
    tree = Tree("t", (Leaf("a", 1), Leaf("b")), PurePosixPath("/x/y"), {"z": (Leaf("c"),), "a": [Path("p")]})
    assert dumped(tree) == (
        '{"title": "t", "leaves": [{"name": "a", "size": 1}, {"name": "b", "size": null}], "where": "/x/y", '
        '"labels": {"z": [{"name": "c", "size": null}], "a": ["p"]}, "colour": "red", "parent": null}'
    )
    # Mappings keep their order (a read-only one too), lists and tuples are arrays, plain values stay.
    assert to_jsonable(MappingProxyType({"b": 1, "a": (2, 3)})) == {"b": 1, "a": [2, 3]}
    assert to_jsonable(["x", 1, 1.5, True, None]) == ["x", 1, 1.5, True, None]


@dataclass(frozen=True)
class Declared:
    renamed: str = field(metadata=json_meta(key="shown_as"))
    hidden: str = field(metadata=json_meta(skip=True))
    maybe: int | None = jfield(None, omit="none")
    count: int = jfield(0, omit="empty")
    items: tuple[str, ...] = jfield((), omit="empty")
    pairs: tuple[tuple[str, str], ...] = jfield((), convert=records("name", "reason"))
    env: tuple[tuple[str, str], ...] = jfield((), convert=dict)


def test_what_a_field_declares_renames_hides_omits_and_converts_it() -> None:
    assert to_jsonable(Declared("r", "secret")) == {"shown_as": "r", "pairs": [], "env": {}}
    full = Declared("r", "secret", 0, 3, ("i",), (("n", "why"),), (("B", "2"), ("A", "1")))
    assert dumped(full) == (
        '{"shown_as": "r", "maybe": 0, "count": 3, "items": ["i"], "pairs": [{"name": "n", "reason": "why"}], '
        '"env": {"B": "2", "A": "1"}}'
    )


def test_none_is_omitted_only_where_declared_and_empty_omits_every_false_value() -> None:
    assert "maybe" in to_jsonable(Declared("r", "s", maybe=0))  # "none": 0 is a value
    assert "maybe" not in to_jsonable(Declared("r", "s", maybe=None))
    assert "count" not in to_jsonable(Declared("r", "s", count=0))
    assert "items" not in to_jsonable(Declared("r", "s", items=()))
    assert to_jsonable(Leaf("a"))["size"] is None  # undeclared: null is written


@dataclass(frozen=True)
class Inlined:
    first: str
    extra: Leaf | None = jfield(None, inline=True)
    more: dict[str, int] = jfield(default_factory=dict, inline=True, convert=lambda m: dict(sorted(m.items())))
    last: str = "z"


def test_an_inlined_field_puts_its_keys_at_its_place_and_none_puts_none() -> None:
    assert dumped(Inlined("a", Leaf("n", 2), {"y": 1, "b": 2})) == (
        '{"first": "a", "name": "n", "size": 2, "b": 2, "y": 1, "last": "z"}'
    )
    assert to_jsonable(Inlined("a")) == {"first": "a", "last": "z"}


@dataclass(frozen=True)
class Verdict:
    items: tuple[Leaf, ...]
    note: str = jfield("", key="why")

    @property
    def ok(self) -> bool:
        return not self.items

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **fields_json(self)}


def test_a_class_with_its_own_to_json_is_shown_by_it_wherever_it_is() -> None:
    assert to_jsonable(Verdict((Leaf("a"),), "n")) == {"ok": False, "items": [{"name": "a", "size": None}], "why": "n"}
    assert to_jsonable((Verdict(()),)) == [{"ok": True, "items": [], "why": ""}]
    assert to_jsonable(Tree("t", (), Path("/"), parent=Verdict(())))["parent"] == {"ok": True, "items": [], "why": ""}


def test_a_value_given_instead_keeps_the_fields_declaration() -> None:
    assert fields_json(Verdict((), "n"), note={"a": Path("p")}) == {"items": [], "why": {"a": "p"}}
    assert fields_json(Inlined("a"), extra={"k": 1}) == {"first": "a", "k": 1, "last": "z"}


def test_a_required_field_is_not_declared_with_jfield() -> None:
    # A type checker takes any call but field() for a default: a required field would look optional.
    with pytest.raises(TypeError, match="json_meta"):
        jfield(key="x")
    assert jfield(default_factory=list, omit="empty").default_factory is list


# The project's classes whose JSON is more than their fields in order: written exactly as before.
COMMIT = LoggedCommit("a" * 40, "fix", "2024-01-02T03:04:05Z")
PAIRED = Pairing("lib", "b" * 40, "c" * 40, Relation(ahead=2, behind=0))
CASES = [
    (Moved(ancestor=False, last=COMMIT), {"ancestor": False, "first": None, "last": to_jsonable(COMMIT)}),
    (
        Moved(commits=3, first_parent=0, dropped=0, ancestor=True),
        {"commits": 3, "first_parent_commits": 0, "dropped_commits": 0, "ancestor": True, "first": None, "last": None},
    ),
    (Relation(ahead=0, behind=0), {"relation": "same"}),
    (Relation(ahead=1, behind=4), {"relation": "diverged", "ahead": 1, "behind": 4}),
    (PAIRED, {"source": "lib", "commit": "b" * 40, "submodule_commit": "c" * 40, "relation": "contained", "ahead": 2}),
    (
        Pairing("lib", "b" * 40, "c" * 40, None),
        {"source": "lib", "commit": "b" * 40, "submodule_commit": "c" * 40, "relation": "unknown"},
    ),
    (
        Change("source", "lib", "changed", (("commit", "1", "2"),), ref="main", ref_type="branch"),
        {
            "kind": "source",
            "name": "lib",
            "action": "changed",
            "fields": [{"field": "commit", "old": "1", "new": "2"}],
            "ancestor": None,
        },
    ),
    (
        Change("source", "lib", "changed", (("commit", "1", "2"),), Moved(commits=1, ancestor=True)),
        {
            "kind": "source",
            "name": "lib",
            "action": "changed",
            "fields": [{"field": "commit", "old": "1", "new": "2"}],
            "commits": 1,
            "ancestor": True,
            "first": None,
            "last": None,
        },
    ),
    (Change("package", "p", "removed"), {"kind": "package", "name": "p", "action": "removed", "fields": []}),
    (
        PinResult("package", "p", "ok", "", {"z": 1, "a": 2}),
        {"kind": "package", "name": "p", "status": "ok", "detail": "", "a": 2, "z": 1},
    ),
    (
        CheckReport(VerifyReport("l", ()), False, compared_with="history", failure=CheckFailure("build", "boom")),
        {
            "ok": False,
            "verify": {"lock": "l", "ok": True, "results": []},
            "reproducible": False,
            "image_ids": [],
            "differences": [],
            "compared_with": "history",
            "failed_stage": "build",
            "error": "boom",
        },
    ),
    (
        CheckReport(VerifyReport("l", ()), True),
        {
            "ok": True,
            "verify": {"lock": "l", "ok": True, "results": []},
            "reproducible": True,
            "image_ids": [],
            "differences": [],
        },
    ),
    (
        ModelAudit("/p", False, ("m",), check="model", expected_from="the model", error="e", node="n1"),
        {
            "path": "/p",
            "ok": False,
            "missing": ["m"],
            "unexpected": [],
            "check": "model",
            "expected_from": "the model",
            "error": "e",
            "node": "n1",
        },
    ),
    (
        ModelAudit("/p", True),
        {"path": "/p", "ok": True, "missing": [], "unexpected": [], "check": None, "expected_from": "", "error": None},
    ),
    (
        ClusterInfo("c", None, (NodeInfo("h", "", "i", None, None, True, 0, alive=False, state="missing"),)),
        {
            "name": "c",
            "address": None,
            "nodes": [
                {
                    "host": "h",
                    "container": "",
                    "image_id": "i",
                    "lock_sha256": None,
                    "ray_node_id": None,
                    "head": True,
                    "npus": 0,
                    "alive": False,
                    "state": "missing",
                }
            ],
        },
    ),
]


@pytest.mark.parametrize(("value", "expected"), CASES)
def test_the_projects_json_keeps_its_keys_and_their_order(value: object, expected: dict[str, Any]) -> None:
    assert json.dumps(to_jsonable(value)) == json.dumps(expected)
