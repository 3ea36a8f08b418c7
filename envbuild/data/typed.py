"""Decode YAML nodes into frozen dataclasses, strictly, and describe those dataclasses as JSON Schema.

One description of the data (the dataclasses, their type hints and per-field ``meta``) drives both
the validator and the committed JSON schema, so the two cannot drift apart. The decoder walks the
composed YAML node tree rather than the loaded Python objects, so every problem carries the line it
was found on, and it collects every problem instead of stopping at the first. The tree comes from
:mod:`envbuild.data.yamlfile`, which refuses aliases, so the walk visits each node once.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal, Union

import yaml

from envbuild.data.urls import key_path, redact_url
from envbuild.errors import Problem

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_NULL = "tag:yaml.org,2002:null"
_SCALARS = {str: (_STR, "string"), int: (_INT, "integer")}  # a field's type: its YAML tag, its JSON type
_TYPE_NAMES = {
    _STR: "a string",
    _INT: "an integer",
    _NULL: "null",
    "tag:yaml.org,2002:bool": "a boolean",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:timestamp": "a date",
}


def meta(
    description: str = "",
    pattern: str | None = None,
    check: Callable[[Any], str | None] | None = None,
    expect: str = "",
    *,
    max_length: int | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
    item_check: Callable[[Any], str | None] | None = None,
    since: int | None = None,
    version: bool = False,
) -> dict[str, Any]:
    """Field metadata: a ``pattern`` (checked and put in the schema), what it ``expect``s in words, an
    extra ``check`` returning a problem message or None (its message wins over the pattern's), bounds
    (``max_length`` for strings, ``minimum``/``maximum`` for integers: checked and in the schema), and an
    ``item_check`` run on each item of a list, so a problem names the item. For versioned formats:
    ``since``, the format version that introduced the field (an older file may not use it; an older
    version's schema leaves it out), and ``version``, marking the field that holds the format version
    (each version's schema allows only its own number)."""
    return {
        "description": description,
        "pattern": pattern,
        "check": check,
        "expect": expect,
        "max_length": max_length,
        "minimum": minimum,
        "maximum": maximum,
        "item_check": item_check,
        "since": since,
        "version": version,
    }


def mfield(default: Any = MISSING, *, default_factory: Any = MISSING, **kwargs: Any) -> Any:
    """A dataclass field carrying :func:`meta`."""
    return field(default=default, default_factory=default_factory, metadata=meta(**kwargs))


def shown(value: str, limit: int = 80) -> str:
    """A value as a message quotes it: ``repr``, cut to ``limit`` characters, and with everything before
    an '@' hidden (a URL's user part, or credentials pasted into a name)."""
    text = redact_url(value)
    if len(text) > limit:
        return f"{text[:limit]!r}… ({len(text)} characters)"
    return repr(text)


# YAML 1.1 also reads 0x1f, 0o17, 017 (octal!), 1_000 and 1:30 as integers; other YAML readers disagree
# on several of them, so data written by a tool uses plain decimal only.
DECIMAL_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
MAX_INT_DIGITS = 19  # beyond any field's range, and far below what int() refuses to parse (4300 digits)


@dataclass
class Decoder:
    """Collects problems while decoding one file; ``version``, the file's format version when it has one
    (a key of a later version is then refused, naming the version it needs)."""

    file: str
    problems: list[Problem] = field(default_factory=list)
    version: int | None = None

    def problem(self, node: yaml.Node, path: str, message: str) -> None:
        self.problems.append(Problem(self.file, node.start_mark.line + 1, path, message))

    def decode(self, hint: Any, node: yaml.Node, path: str) -> Any:
        """Return the decoded value, or ``None`` after recording a problem."""
        origin = typing.get_origin(hint)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return self._dataclass(hint, node, path)
        if _is_optional(hint):
            if node.tag == _NULL:
                return None
            return self.decode(_strip_none(hint), node, path)
        if origin is Literal:
            return self._literal(typing.get_args(hint), node, path)
        if origin is tuple:
            return self._sequence(typing.get_args(hint)[0], node, path)
        if origin is dict:
            return self._mapping_of_str(node, path)
        if hint in _SCALARS:
            return self._scalar(node, path, _SCALARS[hint][0])
        raise TypeError(f"typed: no decoder for {hint!r}")  # a programming error, not user input

    def _scalar(self, node: yaml.Node, path: str, tag: str) -> Any:
        if not isinstance(node, yaml.ScalarNode) or node.tag != tag:
            hint = " (quote it to make it a string)" if tag == _STR and isinstance(node, yaml.ScalarNode) else ""
            self.problem(node, path, f"expected {_TYPE_NAMES[tag]}, got {_describe(node)}{hint}")
            return None
        if tag == _STR:
            return node.value
        if not DECIMAL_INT.fullmatch(node.value):
            self.problem(node, path, f"expected a plain decimal integer, got {shown(node.value)}")
            return None
        if len(node.value.lstrip("-")) > MAX_INT_DIGITS:
            self.problem(node, path, f"{shown(node.value)} is out of range (more than {MAX_INT_DIGITS} digits)")
            return None
        return int(node.value)

    def _literal(self, choices: tuple[Any, ...], node: yaml.Node, path: str) -> Any:
        value = _literal_value(node)
        if value is None or value not in choices:
            allowed = " | ".join(str(c) for c in choices)
            decimal = " (written in plain decimal)" if node.tag == _INT and value is None else ""
            self.problem(node, path, f"expected one of {allowed}{decimal}, got {_describe(node)}")
            return None
        return value

    def _sequence(self, item: Any, node: yaml.Node, path: str) -> tuple[Any, ...] | None:
        if not isinstance(node, yaml.SequenceNode):
            self.problem(node, path, f"expected a list, got {_describe(node)}")
            return None
        return tuple(self.decode(item, child, f"{path}[{i}]") for i, child in enumerate(node.value))

    def _pairs(self, node: yaml.Node, path: str) -> list[tuple[str, yaml.Node, yaml.Node]] | None:
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, path, f"expected a mapping, got {_describe(node)}")
            return None
        pairs: list[tuple[str, yaml.Node, yaml.Node]] = []
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                self.problem(key_node, path or "(top level)", f"keys must be strings, got {_describe(key_node)}")
                continue
            if key_node.value in seen:
                self.problem(key_node, key_path(path, key_node.value), "duplicate key")
                continue
            seen.add(key_node.value)
            pairs.append((key_node.value, key_node, value_node))
        return pairs

    def _mapping_of_str(self, node: yaml.Node, path: str) -> dict[str, str] | None:
        pairs = self._pairs(node, path)
        if pairs is None:
            return None
        return {key: self._scalar(value, key_path(path, key), _STR) for key, _, value in pairs}

    def _dataclass(self, cls: type, node: yaml.Node, path: str) -> Any:
        pairs = self._pairs(node, path)
        if pairs is None:
            return None
        hints, fields = _shape(cls)
        values: dict[str, Any] = {}
        for key, key_node, value_node in pairs:
            at = key_path(path, key)
            if key not in fields:
                known = ", ".join(fields)
                self.problem(key_node, at, f"unknown key (known keys: {known})")
                continue
            since = fields[key].metadata.get("since")
            if since is not None and self.version is not None and since > self.version:
                needs = f"needs version {since} of the format (`version: {since}`); this file says `version: {self.version}`"
                self.problem(key_node, at, needs)
                continue
            value = self.decode(hints[key], value_node, at)
            if value is not None and _complete(value):
                self._check(fields[key], value, value_node, at)
            values[key] = value
        for name, f in fields.items():
            if _required(f) and name not in values:
                self.problem(node, key_path(path, name), "required key is missing")
        if any(_required(f) and values.get(name) is None for name, f in fields.items()):
            return None
        return cls(**{k: v for k, v in values.items() if v is not None})

    def _check(self, f: dataclasses.Field, value: Any, node: yaml.Node, path: str) -> None:
        """Bounds first (so no pattern ever runs over a huge string), then the check, then the pattern."""
        m = f.metadata
        if isinstance(value, str) and m.get("max_length") is not None and len(value) > m["max_length"]:
            self.problem(node, path, f"{len(value)} characters long, at most {m['max_length']} allowed")
        elif isinstance(value, int) and not _within(value, m.get("minimum"), m.get("maximum")):
            self.problem(node, path, f"{value} is out of range: expected {m.get('expect') or _bounds(m)}")
        elif m.get("check") is not None and (message := m["check"](value)):
            self.problem(node, path, message)
        elif m.get("pattern") and isinstance(value, str) and not re.fullmatch(m["pattern"], value):
            self.problem(node, path, f"expected {m.get('expect') or 'a match of ' + m['pattern']}, got {shown(value)}")
        elif m.get("item_check") is not None:
            for i, (item, child) in enumerate(zip(value, node.value)):
                if message := m["item_check"](item):
                    self.problem(child, f"{path}[{i}]", message)


@functools.cache
def _shape(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """A dataclass's resolved type hints and fields, worked out once per class: resolving string
    annotations compiles them, which was most of the time of reading a lock with many packages."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def _complete(value: Any) -> bool:
    """Whether a decoded list or mapping has every item (a failed item is None, already reported):
    checks only see values of the declared type."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else ()
    return all(item is not None for item in items)


def _within(value: int, minimum: int | None, maximum: int | None) -> bool:
    return (minimum is None or value >= minimum) and (maximum is None or value <= maximum)


def _bounds(m: Any) -> str:
    low = "" if m.get("minimum") is None else f"{m['minimum']} ≤ "
    high = "" if m.get("maximum") is None else f" ≤ {m['maximum']}"
    return f"{low}value{high}"


def _literal_value(node: yaml.Node) -> Any:
    """A scalar's value for comparing with Literal choices, without constructing it through YAML (a
    custom tag or a malformed ``!!int`` would raise): strings as written, integers in plain decimal."""
    if not isinstance(node, yaml.ScalarNode):
        return None
    if node.tag == _STR:
        return node.value
    if node.tag == _INT and DECIMAL_INT.fullmatch(node.value) and len(node.value) <= MAX_INT_DIGITS:
        return int(node.value)
    return None


def _required(f: dataclasses.Field) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _is_optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType) and type(None) in typing.get_args(hint)


def _strip_none(hint: Any) -> Any:
    return next(a for a in typing.get_args(hint) if a is not type(None))


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag == _NULL:
        return "null"
    kind = _TYPE_NAMES.get(node.tag, f"a value tagged {node.tag}")
    return f"{kind} {shown(node.value)}"


# --- JSON Schema --------------------------------------------------------------------------------


def json_schema(cls: type, *, title: str, schema_id: str, version: int | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a dataclass tree, with one ``$defs`` entry per class; for a
    versioned format, of its ``version``: fields introduced later are left out and the version field
    allows that number alone."""
    defs: dict[str, Any] = {}
    root = _schema(cls, defs, version)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id,
        "title": title,
        **root,
        "$defs": dict(sorted(defs.items())),
    }


def _schema(hint: Any, defs: dict[str, Any], version: int | None = None) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # placeholder against recursion
            hints = typing.get_type_hints(hint)
            props, required = {}, []
            for f in dataclasses.fields(hint):
                since = f.metadata.get("since")
                if since is not None and version is not None and since > version:
                    continue
                if f.metadata.get("version") and version is not None:
                    prop: dict[str, Any] = {"enum": [version]}
                else:
                    prop = _schema(hints[f.name], defs, version)
                if f.metadata.get("pattern"):
                    prop["pattern"] = f"^(?:{f.metadata['pattern']})$"  # the decoder uses fullmatch
                for key, keyword in (("max_length", "maxLength"), ("minimum", "minimum"), ("maximum", "maximum")):
                    if f.metadata.get(key) is not None:  # keywords that only constrain their own type
                        prop[keyword] = f.metadata[key]
                if f.metadata.get("description"):
                    prop["description"] = f.metadata["description"]
                props[f.name] = prop
                if _required(f):
                    required.append(f.name)
            body: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
            if required:
                body["required"] = required
            if hint.__doc__:
                body["description"] = " ".join(hint.__doc__.split())
            defs[hint.__name__] = body
        return {"$ref": f"#/$defs/{hint.__name__}"}
    if _is_optional(hint):
        return {"anyOf": [_schema(_strip_none(hint), defs, version), {"type": "null"}]}
    if origin is Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin is tuple:
        return {"type": "array", "items": _schema(typing.get_args(hint)[0], defs, version)}
    if origin is dict:
        return {"type": "object", "additionalProperties": {"type": "string"}}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint][1]}
    raise TypeError(f"typed: no schema for {hint!r}")
