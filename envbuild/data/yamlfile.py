"""Reading a YAML file the way envbuild reads every one (lockfiles, the config file, recipes).

These files are data written by a tool, so everything YAML offers beyond plain data is refused before
anything is built from the document:

- a regular file only, opened so that a FIFO cannot block (:func:`~envbuild.fileio.open_regular`:
  ``FILE: not a regular file (a FIFO)``; ``/dev/zero`` is refused unread too);
- at most :data:`MAX_BYTES` bytes, read with a cap;
- UTF-8 only; a bad byte is reported with its line and the field it sits in;
- no anchors or aliases: ``*alias`` shares a node, and a decoder walking the tree visits it once per
  use, so aliases of aliases amplify an 11 KB file into millions of nodes (a "billion laughs");
- nesting at most :data:`MAX_DEPTH` levels (the composer recurses; deeper input would overflow it).

Each refusal is one :class:`~envbuild.errors.Problem` naming ``file:line``, raised as ``error`` (the
caller's subclass of :class:`~envbuild.errors.DataFileError`), so it exits 2 with one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import yaml

from envbuild.data.urls import key_path
from envbuild.errors import DataFileError, Problem
from envbuild.fileio import NotRegularFileError, open_regular

MAX_BYTES = 1 << 20  # 1 MiB: the GLM-5.2 lock, with its whole package closure, is 27 KB
MAX_DEPTH = 32  # a lock is 6 levels deep (lock → packages → package → files → file → value)
LIMIT_TEXT = "1 MiB"


# libyaml when PyYAML has it (its wheels do): the same events and nodes, 10-30 times faster than the
# pure-Python parser, which needs some 15 s for a 1 MiB file.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Refused(Exception):
    def __init__(self, mark: Any, field: str, message: str) -> None:
        self.mark, self.field, self.message = mark, field, message


@dataclass
class _Level:
    """An open mapping or sequence while walking the events, and where in it the next node goes."""

    path: str
    mapping: bool
    at_key: bool = True  # mapping: the next node is a key
    key: str = ""  # mapping: the key of the value that comes next
    index: int = 0  # sequence: the position of the next item

    def child(self) -> str:
        if not self.mapping:
            return f"{self.path}[{self.index}]"
        if self.at_key:
            return self.path  # a key is reported at its mapping
        return key_path(self.path, self.key)

    def done(self, scalar: str | None) -> None:
        """A node at this level is complete (``scalar`` is its text if it was a scalar)."""
        if not self.mapping:
            self.index += 1
        elif self.at_key:
            self.at_key, self.key = False, scalar or ""
        else:
            self.at_key = True


def _refuse_beyond_plain_data(text: str) -> None:
    """One pass over the parser's events, before any node exists: the first anchor, alias or level
    too deep is refused with the field path it is found at."""
    stack: list[_Level] = []
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            stack.pop()
            if stack:
                stack[-1].done(None)
            continue
        if not isinstance(event, yaml.NodeEvent):
            continue
        path = stack[-1].child() if stack else ""
        if isinstance(event, yaml.AliasEvent) or event.anchor is not None:
            name = event.anchor
            raise _Refused(
                event.start_mark,
                path,
                f"YAML anchors and aliases (&{name}, *{name}) are not allowed: write each value out in full",
            )
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(stack) >= MAX_DEPTH:
                raise _Refused(event.start_mark, path, f"nested more than {MAX_DEPTH} levels deep")
            stack.append(_Level(path, mapping=isinstance(event, yaml.MappingStartEvent)))
        elif stack and isinstance(event, yaml.ScalarEvent):
            stack[-1].done(event.value)


def read_capped(path: str | os.PathLike[str], error: type[DataFileError] = DataFileError) -> bytes:
    """The bytes of a regular file, refusing one larger than :data:`MAX_BYTES` without reading past the
    cap, and a FIFO, a device or a directory without reading it at all (a FIFO would block the read)."""
    file = str(path)
    try:
        with open_regular(path) as handle:
            data = handle.read(MAX_BYTES + 1)
    except NotRegularFileError as exc:
        raise error([Problem(file, 0, "", exc.reason)]) from None
    except OSError as exc:
        raise error([Problem(file, 0, "", f"cannot read: {exc.strerror or exc}")]) from None
    if len(data) > MAX_BYTES:
        raise error([_too_large(file)])
    return data


def compose_yaml(data: bytes | str, file: str, error: type[DataFileError] = DataFileError) -> yaml.Node | None:
    """The node tree of one YAML document of plain data, or None for an empty one; refusals as ``error``."""
    if len(data) > MAX_BYTES:  # for text, characters: never more than its bytes
        raise error([_too_large(file)])
    text = _decode(data, file, error) if isinstance(data, bytes) else data
    try:
        _refuse_beyond_plain_data(text)
        return yaml.compose(text, Loader=_LOADER)  # plain data now: no alias to follow, bounded depth
    except _Refused as exc:
        raise error([Problem(file, exc.mark.line + 1, exc.field, exc.message)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is None and isinstance(getattr(exc, "position", None), int):  # a ReaderError: a bad character
            line = text.count("\n", 0, exc.position) + 1  # type: ignore[attr-defined]
        else:
            line = mark.line + 1 if mark else 0
        reason = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc).splitlines()[0]
        raise error([Problem(file, line, "", f"not valid YAML: {reason}")]) from None


def node_line(root: yaml.Node, *path: str | int, nearest: bool = False) -> int:
    """The 1-based line of the node at ``path`` (mapping keys and sequence indexes) under ``root``, for a
    problem a check across fields finds. Where a step finds nothing: 0 (the file does not write that field),
    or with ``nearest`` the step is passed over, so the line is that of the deepest node found."""
    node = root
    for step in path:
        child = None
        if isinstance(step, int) and isinstance(node, yaml.SequenceNode) and 0 <= step < len(node.value):
            child = node.value[step]
        elif isinstance(node, yaml.MappingNode):
            child = next((value for key, value in node.value if key.value == step), None)
        if child is None:
            if not nearest:
                return 0
            continue
        node = child
    return node.start_mark.line + 1


def _too_large(file: str) -> Problem:
    return Problem(file, 0, "", f"larger than {LIMIT_TEXT}, the limit for a YAML file envbuild reads")


def _decode(data: bytes, file: str, error: type[DataFileError]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        # Where it is, in the document read with the bad bytes replaced: the field to fix.
        readable = data.decode("utf-8", errors="replace")
        where = _field_at(readable, len(data[: exc.start].decode("utf-8")))
        byte = data[exc.start]
        raise error([Problem(file, line, where, f"not UTF-8 (byte 0x{byte:02x}); save the file as UTF-8")]) from None


def _field_at(text: str, index: int) -> str:
    """The field path (``sources[0].repo``) of the node at character ``index``, '' when unknown."""
    try:
        _refuse_beyond_plain_data(text)
        node = yaml.compose(text, Loader=_LOADER)
    except (yaml.YAMLError, _Refused):
        return ""
    path = ""
    while node is not None:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode):
                    continue
                if _covers(key, index):
                    return path  # the bad byte is in the key itself: its mapping is the place to look
                if _covers(value, index):
                    path, child = key_path(path, key.value), value
                    break
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                if _covers(item, index):
                    path, child = f"{path}[{i}]", item
                    break
        node = child
    return path


def _covers(node: yaml.Node, index: int) -> bool:
    return node.start_mark.index <= index <= node.end_mark.index
