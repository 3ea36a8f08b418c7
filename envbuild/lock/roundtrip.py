"""Writing an updated lock over the one a person wrote, keeping what they wrote: comments, key order,
flow or block style and quoting of every value that did not change; only what changed is rewritten.

A lock is documentation as well as data (the GLM-5.2 lock's comments say why each pin is what it is),
so `lock update` must not flatten it. ruamel.yaml's round-trip mode keeps comments and layout; PyYAML
has no such mode. The new values come from the canonical text of the new lock (:func:`dump_lock`),
read the same way, so a key or an entry that appears is written as the canonical writer writes it
(flow maps for package files, and so on), placed where the canonical order puts it.

The result must read back as exactly the new lock through the lock's own reader (PyYAML, YAML 1.1),
or :func:`round_trip_text` returns None and the caller writes the canonical form: ruamel.yaml speaks
YAML 1.2, and a value the two read differently (``yes``, ``0o17``) must not change meaning on the way.
"""

from __future__ import annotations

import io
import os
from typing import Any, NamedTuple

from packaging.utils import canonicalize_name
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.util import load_yaml_guess_indent

from envbuild.lock.io import LockFile, bytes_as_read, canonical, checked_lock_text, dump_lock, parse_lock
from envbuild.lock.model import Lock

_IDENTITY = ("name", "path", "filename")  # what names an entry of a list: a source, a submodule, a file


def updated_text(old_text: str, old: Lock, new: Lock) -> tuple[str, bool]:
    """The text to write for ``new`` over ``old_text`` (which read as ``old``), and whether the layout of
    ``old_text`` was kept: a lock in canonical form (as envbuild writes one) stays canonical; any other
    keeps its comments and layout where :func:`round_trip_text` can, else it is written canonically."""
    if old_text == dump_lock(old):
        return dump_lock(new), True
    kept = round_trip_text(old_text, new)
    return (kept, True) if kept is not None else (dump_lock(new), False)


class NewText(NamedTuple):
    """:func:`text_over`'s answer."""

    text: str
    kept: bool  # the file's comments and layout kept (else the lock written afresh)
    changed: bool  # the text differs from the file's


def text_over(read: LockFile, new: Lock, path: str | os.PathLike[str] | None = None) -> NewText:
    """The text of ``new`` to write over the file ``read`` came from: its comments and layout kept where they
    can be, the file's own text when nothing changed; checked to read back as ``new`` where it is written
    (``path``, default ``read.path``), else :class:`~envbuild.lock.io.LockWriteRefused`."""
    if path is None:
        bytes_as_read(read)  # over the file read, still as read: else another's change would be merged in
    old_text = read.path.read_text(encoding="utf-8")
    same = canonical(new) == canonical(read.lock)
    text, kept = (old_text, True) if same else updated_text(old_text, read.lock, new)
    text = checked_lock_text(new, path if path is not None else read.path, text)
    return NewText(text, kept, text != old_text)


def round_trip_text(old_text: str, new: Lock) -> str | None:
    """``new`` written in the layout of ``old_text``; None when that cannot be done faithfully."""
    yaml = YAML()  # round-trip
    yaml.width = 4096
    yaml.preserve_quotes = True
    yaml.allow_unicode = True
    try:
        old = yaml.load(old_text)
        fresh = yaml.load(dump_lock(new))
    except Exception:  # ruamel.yaml raises many kinds; any of them means: write canonically
        return None
    if not isinstance(old, CommentedMap):
        return None
    _keep_indents(yaml, old, old_text)
    merged = _merge(old, fresh)
    out = io.StringIO()
    try:
        yaml.dump(merged, out)
        text = out.getvalue()
        read = parse_lock(text)
    except Exception:  # ruamel.yaml's dumper raises many kinds, the lock's reader a LockfileError
        return None
    return text if canonical(read) == canonical(new) else None


def _keep_indents(yaml: YAML, old: CommentedMap, old_text: str) -> None:
    """``yaml`` set to write block sequences and mappings indented as ``old_text`` is (``- name:`` at the
    parent's column, or indented under it): ruamel.yaml keeps comments and quotes, not indents. Its guess of
    the sequences' indent is taken, and the mappings' that writes ``old`` back exactly (else 2)."""
    try:
        _, sequence, offset = load_yaml_guess_indent(old_text)
    except Exception:  # read already; nothing to learn from it
        return
    sequence = sequence or 2
    offset = offset or 0
    for mapping in dict.fromkeys((2, sequence, 4)):
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        out = io.StringIO()
        try:
            yaml.dump(old, out)
        except Exception:  # the merged dump below says what fails
            break
        if out.getvalue() == old_text:
            return
    yaml.indent(mapping=2, sequence=sequence, offset=offset)


def _merge(old: Any, new: Any) -> Any:
    """``new``'s content, in ``old``'s nodes wherever both say the same; an empty map is not added where
    ``old`` has none."""
    if isinstance(old, CommentedMap) and isinstance(new, CommentedMap):
        for key in [k for k in old if k not in new]:
            del old[key]
        previous = -1
        for key, value in new.items():
            if key in old:
                old[key] = _merge(old[key], value)
                previous = list(old).index(key)
            elif isinstance(value, CommentedMap) and not value:
                continue  # an empty map the file leaves out (``env: {}``) reads back the same (an empty list
                # need not: ``requires: []`` says there are none, its absence that they are not known)
            else:
                previous += 1
                old.insert(previous, key, value)
        return old
    if isinstance(old, CommentedSeq) and isinstance(new, CommentedSeq):
        key = _identity(old, new)
        if key is None:
            return old if list(old) == list(new) else new
        by_id = {_id(item, key): item for item in old}
        merged = [_merge(by_id[_id(item, key)], item) if _id(item, key) in by_id else item for item in new]
        if [id(m) for m in merged] == [id(o) for o in old]:
            return old  # the same entries in the same order (each merged in place): comments stay
        old.clear()
        old.extend(merged)
        return old
    if type(old) is type(new) and old == new:
        return old  # unchanged: keeps its quoting
    if isinstance(old, str) and isinstance(new, str) and str(old) == str(new):
        return old
    return new


def _identity(old: CommentedSeq, new: CommentedSeq) -> str | None:
    items = [*old, *new]
    if not items or not all(isinstance(i, CommentedMap) for i in items):
        return None
    return next((k for k in _IDENTITY if all(k in i for i in items)), None)


def _id(item: CommentedMap, key: str) -> str:
    value = str(item[key])
    return canonicalize_name(value) if key == "name" else value
