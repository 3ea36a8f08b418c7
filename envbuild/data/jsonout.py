"""Typed values written as JSON: the one serialiser of every report, record and ``--json``.

A dataclass is an object of its fields, in the order they are declared; tuples and lists are arrays,
mappings objects, paths strings, enums their values. What one field's JSON needs beyond that is declared
beside the field (:func:`jfield`, or :func:`json_meta` in a field's ``metadata`` next to
:func:`envbuild.data.typed.meta`'s): another key, no key at all, no key when the value is None or empty,
a converted value, or its keys inlined into the object around it. A class whose JSON has keys no field
holds (a verdict derived from the fields, a format version) defines ``to_json()``, which calls
:func:`fields_json` for the fields and adds those keys; :func:`to_jsonable` prefers it wherever the class
appears, nested or not. Users' scripts read this JSON, so the key order is the declaration order.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# The key of a field's metadata that holds its Shown; typed.meta's keys are others, so both fit in one.
KEY = "json"
Omit = Literal["none", "empty"]


@dataclass(frozen=True)
class Shown:
    """How one field is shown in its object's JSON."""

    key: str | None = None  # the JSON key; None: the field's name
    skip: bool = False  # never shown
    omit: Omit | None = None  # not shown when None ("none"), or when false: None, 0, "", empty ("empty")
    convert: Callable[[Any], Any] | None = None  # the value shown for the field's value (then serialised)
    inline: bool = False  # the (converted) value's keys go into the object around it; None adds none


_PLAIN = Shown()


def json_meta(
    *,
    key: str | None = None,
    skip: bool = False,
    omit: Omit | None = None,
    convert: Callable[[Any], Any] | None = None,
    inline: bool = False,
) -> dict[str, Any]:
    """Field metadata for :func:`fields_json` (see :class:`Shown`)."""
    return {KEY: Shown(key, skip, omit, convert, inline)}


def jfield(default: Any = MISSING, *, default_factory: Any = MISSING, **shown: Any) -> Any:
    """A field with a default, carrying :func:`json_meta`. A required field is declared with
    ``field(metadata=json_meta(...))``: a type checker takes any other call for a default."""
    if default is MISSING and default_factory is MISSING:
        raise TypeError("jfield: a required field is field(metadata=json_meta(...))")
    return dataclasses.field(default=default, default_factory=default_factory, metadata=json_meta(**shown))


def records(*keys: str) -> Callable[[Iterable[Sequence[Any]]], list[dict[str, Any]]]:
    """A converter showing tuples of pairs (or triples) as objects: ``records("tag", "digest")``."""
    return lambda rows: [dict(zip(keys, row)) for row in rows]


def to_jsonable(value: object) -> Any:
    """``value`` as data ``json.dumps`` writes: a dataclass by its own ``to_json()`` when it has one,
    else by :func:`fields_json`, and everything inside it the same way."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        own = getattr(value, "to_json", None)
        return own() if own is not None else fields_json(value)
    if isinstance(value, Mapping):
        return {key: to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    return value


def fields_json(value: DataclassInstance, **instead: Any) -> dict[str, Any]:
    """A dataclass's fields as a JSON object, as their metadata says (never its own ``to_json()``:
    that is what calls this). ``instead``: by field name, a value shown in place of the field's own,
    the field's declaration still saying under which key."""
    shown: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        how: Shown = f.metadata.get(KEY, _PLAIN)
        if how.skip:
            continue
        raw = instead[f.name] if f.name in instead else getattr(value, f.name)
        if (how.omit == "none" and raw is None) or (how.omit == "empty" and not raw):
            continue
        data = to_jsonable(raw if how.convert is None else how.convert(raw))
        if how.inline:
            shown.update(data or {})
        else:
            shown[how.key or f.name] = data
    return shown
