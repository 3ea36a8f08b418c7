"""Requirement files as pip reads them (``-r`` includes, comments, continuations), parsed into PEP 508
requirements: pure text handling, the files come from a callback.

Only what names a distribution is kept. Options that choose where packages come from (``--index-url``,
``--find-links``…) are the lock's business, not the source's: they are left out and said so. A line pip
would install but the lock cannot pin by name (``-e``, a path, a URL without a name) makes the whole file
unreadable, because a requirement silently dropped is what this module exists to prevent.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement

from envbuild.lock.model import check_tree_path

# One file's text, or None with the reason it cannot be read.
Load = Callable[[str], "tuple[str | None, str]"]

MAX_INCLUDES = 32
_INCLUDE = re.compile(r"^(?:-r|--requirement)(?:\s+|=)(\S+)$")
_CONSTRAINT = re.compile(r"^(?:-c|--constraint)(?:\s+|=)(\S+)$")
# Options about where to find packages, and global pip options: not requirements.
_IGNORED = (
    "-i",
    "--index-url",
    "--extra-index-url",
    "--no-index",
    "-f",
    "--find-links",
    "--pre",
    "--prefer-binary",
    "--trusted-host",
    "--only-binary",
    "--no-binary",
    "--use-feature",
    "--require-hashes",
)


class RequirementFileError(ValueError):
    """A requirement file cannot be read into requirements; the message names the file and the line."""


@dataclass
class ParsedFiles:
    requirements: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)  # every file read, includes too


def parse_requirement(text: str, where: str) -> Requirement:
    """One PEP 508 requirement; a direct URL is kept by name only (the lock resolves by name from its index).
    It is recorded as packaging writes it (``str``), the one spelling, so the same tree gives the same lock."""
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise RequirementFileError(f"{where}: not a PEP 508 requirement: {str(exc).splitlines()[0]}") from None
    return requirement


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) with comments removed and ``\\`` continuations joined, as pip reads them."""
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw)
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line, pending = (pending + line).strip(), ""
        if line:
            lines.append((start, line))
    if pending.strip():
        lines.append((start, pending.strip()))
    return lines


def parse_files(paths: list[str], load: Load) -> ParsedFiles:
    """Every requirement of ``paths`` in pip's order (an included file's where it is included), each file
    read once."""
    parsed = ParsedFiles()
    for path in paths:
        _parse_file(path, load, parsed)
    return parsed


def _parse_file(path: str, load: Load, parsed: ParsedFiles) -> None:
    if path in parsed.read:
        return
    if len(parsed.read) >= MAX_INCLUDES:
        raise RequirementFileError(f"{path}: more than {MAX_INCLUDES} requirement files include each other")
    text, problem = load(path)
    if text is None:
        raise RequirementFileError(f"{path}: {problem}")
    parsed.read.append(path)
    for number, line in logical_lines(text):
        where = f"{path}:{number}"
        if match := _INCLUDE.match(line):
            _parse_file(_relative(path, match.group(1), where), load, parsed)
            continue
        if _CONSTRAINT.match(line):
            parsed.notes.append(f"{where}: a constraints file is not a requirement; left out")
            continue
        if line.startswith("-"):
            option = re.split(r"[\s=]", line, maxsplit=1)[0]
            if option in _IGNORED:
                parsed.notes.append(f"{where}: pip option {option} left out (the lock names its indexes)")
                continue
            raise RequirementFileError(f"{where}: {option} names no distribution the lock can pin by name")
        # Per-requirement options (--hash=…, --config-settings …) follow the requirement.
        spec = re.split(r"\s--?[a-zA-Z]", f" {line}", maxsplit=1)[0].strip()
        requirement = parse_requirement(spec, where)
        if requirement.url is not None:
            parsed.notes.append(f"{where}: {requirement.name} is a direct URL reference; recorded by name")
            requirement.url = None
        parsed.requirements.append(str(requirement))


def _relative(path: str, target: str, where: str) -> str:
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if problem := check_tree_path(joined):
        raise RequirementFileError(f"{where}: includes {target!r}, outside the tree: {problem}")
    return joined
