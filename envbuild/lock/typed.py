"""Decode YAML nodes into frozen dataclasses, strictly, and describe those dataclasses as JSON Schema.

One description of the data (the dataclasses, their type hints and per-field ``meta``) drives both
the validator and the committed JSON schema, so the two cannot drift apart. The decoder walks the
composed YAML node tree rather than the loaded Python objects, so every problem carries the line it
was found on, and it collects every problem instead of stopping at the first.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, Literal, Union

import yaml

from envbuild.errors import Problem

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_TYPE_NAMES = {
    _STR: "a string",
    _INT: "an integer",
    _NULL: "null",
    _BOOL: "a boolean",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:timestamp": "a date",
}


def meta(
    description: str = "",
    pattern: str | None = None,
    check: Callable[[Any], str | None] | None = None,
    expect: str = "",
) -> dict[str, Any]:
    """Field metadata: a ``pattern`` (checked and put in the schema), what it ``expect``s in words,
    and an extra ``check`` returning a problem message or None."""
    return {"description": description, "pattern": pattern, "check": check, "expect": expect}


def mfield(default: Any = MISSING, *, default_factory: Any = MISSING, **kwargs: Any) -> Any:
    """A dataclass field carrying :func:`meta`."""
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta(**kwargs))
    return field(default=default, metadata=meta(**kwargs))


@dataclass
class Decoder:
    """Collects problems while decoding one file."""

    file: str
    problems: list[Problem] = field(default_factory=list)

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
        if hint is str:
            return self._scalar(node, path, _STR, str)
        if hint is int:
            return self._scalar(node, path, _INT, int)
        raise TypeError(f"typed: no decoder for {hint!r}")  # a programming error, not user input

    def _scalar(self, node: yaml.Node, path: str, tag: str, to: type) -> Any:
        if not isinstance(node, yaml.ScalarNode) or node.tag != tag:
            hint = " (quote it to make it a string)" if tag == _STR and isinstance(node, yaml.ScalarNode) else ""
            self.problem(node, path, f"expected {_TYPE_NAMES[tag]}, got {_describe(node)}{hint}")
            return None
        return to(yaml.safe_load(yaml.serialize(node))) if tag != _STR else node.value

    def _literal(self, choices: tuple[Any, ...], node: yaml.Node, path: str) -> Any:
        value = yaml.safe_load(yaml.serialize(node)) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(node, yaml.ScalarNode) or value not in choices or isinstance(value, bool):
            allowed = " | ".join(str(c) for c in choices)
            self.problem(node, path, f"expected one of {allowed}, got {_describe(node, value)}")
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
            key_path = f"{path}.{key_node.value}" if path else str(key_node.value)
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                self.problem(key_node, path or "(top level)", f"keys must be strings, got {_describe(key_node)}")
                continue
            if key_node.value in seen:
                self.problem(key_node, key_path, "duplicate key")
                continue
            seen.add(key_node.value)
            pairs.append((key_node.value, key_node, value_node))
        return pairs

    def _mapping_of_str(self, node: yaml.Node, path: str) -> dict[str, str] | None:
        pairs = self._pairs(node, path)
        if pairs is None:
            return None
        return {key: self._scalar(value, f"{path}.{key}", _STR, str) for key, _, value in pairs}

    def _dataclass(self, cls: type, node: yaml.Node, path: str) -> Any:
        pairs = self._pairs(node, path)
        if pairs is None:
            return None
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, key_node, value_node in pairs:
            key_path = f"{path}.{key}" if path else key
            if key not in fields:
                known = ", ".join(fields)
                self.problem(key_node, key_path, f"unknown key (known keys: {known})")
                continue
            value = self.decode(hints[key], value_node, key_path)
            if value is not None:
                self._check(fields[key], value, value_node, key_path)
            values[key] = value
        for name, f in fields.items():
            required = f.default is MISSING and f.default_factory is MISSING
            if required and name not in values:
                self.problem(node, f"{path}.{name}" if path else name, "required key is missing")
        if any(_required(f) and values.get(name) is None for name, f in fields.items()):
            return None
        return cls(**{k: v for k, v in values.items() if v is not None})

    def _check(self, f: dataclasses.Field, value: Any, node: yaml.Node, path: str) -> None:
        pattern, check = f.metadata.get("pattern"), f.metadata.get("check")
        if pattern and isinstance(value, str) and not re.fullmatch(pattern, value):
            self.problem(node, path, f"expected {f.metadata.get('expect') or 'a match of ' + pattern}, got {value!r}")
        elif check is not None and (message := check(value)):
            self.problem(node, path, message)


def _required(f: dataclasses.Field) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _is_optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType) and type(None) in typing.get_args(hint)


def _strip_none(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0]


def _describe(node: yaml.Node, value: Any = None) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    kind = _TYPE_NAMES.get(node.tag, node.tag)
    return f"{kind} {node.value!r}" if node.tag != _NULL else "null"


# --- JSON Schema --------------------------------------------------------------------------------


def json_schema(cls: type, *, title: str, schema_id: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a dataclass tree, with one ``$defs`` entry per class."""
    defs: dict[str, Any] = {}
    root = _schema(cls, defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id,
        "title": title,
        **root,
        "$defs": dict(sorted(defs.items())),
    }


def _schema(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # placeholder against recursion
            hints = typing.get_type_hints(hint)
            props, required = {}, []
            for f in dataclasses.fields(hint):
                prop = _schema(hints[f.name], defs)
                if f.metadata.get("pattern"):
                    prop["pattern"] = f"^(?:{f.metadata['pattern']})$"  # the decoder uses fullmatch
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
        return {"anyOf": [_schema(_strip_none(hint), defs), {"type": "null"}]}
    if origin is Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin is tuple:
        return {"type": "array", "items": _schema(typing.get_args(hint)[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": {"type": "string"}}
    if hint is str:
        return {"type": "string"}
    if hint is int:
        return {"type": "integer"}
    raise TypeError(f"typed: no schema for {hint!r}")
