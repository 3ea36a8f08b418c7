"""What a lock's schema cannot say, checked once it is decoded: its fields against each other (names
given twice, one distribution installed by two sources, submodule paths one inside another, file names
of another package or version, an installer that is not uv)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from envbuild.data.yamlfile import node_line
from envbuild.errors import Problem
from envbuild.lock.model import Lock, Package, Source, Submodule


def _field(*path: Any) -> str:
    """``sources[3].submodules[0]``: the field a problem names, from the keys and indexes of its node."""
    return "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path).lstrip(".")


def _duplicates(
    entries: tuple[Any, ...],
    root: yaml.Node,
    file: str,
    path: tuple[Any, ...],
    noun: str = "",
    key: Callable[[str], str] = str,
) -> list[Problem]:
    """Entries of one list (``sources``, ``packages``, ``waive``, ``skip_imports``) whose name, as ``key``
    compares names, an earlier one has."""
    problems: list[Problem] = []
    first: dict[str, int] = {}
    for j, entry in enumerate(entries):
        if entry is None:
            continue
        name = key(entry.name)
        if name in first:
            message = f"duplicate {noun}{entry.name!r} (first at {path[-1]}[{first[name]}])"
            problems.append(
                Problem(file, node_line(root, *path, j, "name", nearest=True), f"{_field(*path, j)}.name", message)
            )
        first.setdefault(name, j)
    return problems


def cross_checks(lock: Lock, root: yaml.Node, file: str) -> list[Problem]:
    """Every problem of ``lock`` (decoded from ``root``, of ``file``) that no one field shows, each at the
    line of the field it names."""
    problems = _duplicates(lock.sources, root, file, ("sources",), "source name ")
    for i, source in enumerate(lock.sources):
        if source is None:
            continue
        problems += _duplicates(source.waive, root, file, ("sources", i, "waive"), key=canonicalize_name)
        problems += _duplicates(source.skip_imports, root, file, ("sources", i, "skip_imports"))
        problems += _submodule_problems(source.submodules, root, file, ("sources", i))
    problems += _provided_twice(lock.sources, root, file)
    problems += _duplicates(lock.packages, root, file, ("packages",), "package ", canonicalize_name)
    for i, package in enumerate(lock.packages):
        if package is None:
            continue
        problems += _duplicates(package.waive, root, file, ("packages", i, "waive"), key=canonicalize_name)
        names: set[str] = set()
        for j, dist in enumerate(package.files):
            if dist is None:
                continue
            where = f"packages[{i}].files[{j}].filename"
            line = node_line(root, "packages", i, "files", j, "filename", nearest=True)
            if dist.filename in names:
                problems.append(Problem(file, line, where, f"duplicate file {dist.filename!r}"))
            names.add(dist.filename)
            if message := _filename_mismatch(package.name, package.version, dist.filename):
                problems.append(Problem(file, line, where, message))
    return problems + _installer_problems(lock.installer, root, file)


def _provided_twice(sources: tuple[Source, ...], root: yaml.Node, file: str) -> list[Problem]:
    """Two installed sources that install one distribution: the second would replace the first in the
    image, and what the first requires would go unchecked (a package of that name is another matter: the
    source replaces it, by design)."""
    problems: list[Problem] = []
    first: dict[str, int] = {}
    for j, source in enumerate(sources):
        if source is None or not source.installed:
            continue
        name = canonicalize_name(source.distribution)
        if name in first:
            path: tuple[Any, ...] = ("sources", j, "provides", "name") if source.provides else ("sources", j, "name")
            message = (
                f"{source.distribution!r} is installed by source {sources[first[name]].name!r} too "
                f"(sources[{first[name]}]): one distribution, one source"
            )
            problems.append(Problem(file, node_line(root, *path, nearest=True), _field(*path), message))
        first.setdefault(name, j)
    return problems


def _installer_problems(installer: Package | None, root: yaml.Node, file: str) -> list[Problem]:
    """The installer is uv (the only one a build knows how to run from a wheel it never installs), its
    files are wheels of that version."""
    if installer is None:
        return []
    if canonicalize_name(installer.name) != "uv":
        line = node_line(root, "installer", "name", nearest=True)
        return [Problem(file, line, "installer.name", f"{installer.name!r}: the only installer envbuild runs is uv")]
    problems = []
    for j, dist in enumerate(installer.files):
        if dist is None:
            continue
        where, line = (
            f"installer.files[{j}].filename",
            node_line(root, "installer", "files", j, "filename", nearest=True),
        )
        message = _filename_mismatch(installer.name, installer.version, dist.filename)
        if message is None and not dist.filename.endswith(".whl"):
            message = f"{dist.filename}: the installer is run from its wheel; an sdist cannot be"
        if message:
            problems.append(Problem(file, line, where, message))
    return problems


def _submodule_problems(
    submodules: tuple[Submodule, ...], root: yaml.Node, file: str, path: tuple[Any, ...]
) -> list[Problem]:
    """Each level of a source's submodules: what the image gets has a repository and a commit, a skipped
    one nothing below it, and no path is named twice or inside another's."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for j, sub in enumerate(submodules):
        if sub is None:
            continue
        here = (*path, "submodules", j)
        name = _field(*here)

        def problem(key: str, message: str) -> None:  # called in this iteration only: the loop's names are its own
            problems.append(Problem(file, node_line(root, *here, key, nearest=True), f"{name}.{key}", message))  # noqa: B023

        if sub.skipped:
            if sub.submodules:
                problem("submodules", "a skipped submodule is not written, so it has no submodules of its own")
            if sub.tree is not None:
                problem("tree", "a skipped submodule is not written, so it pins no tree")
        else:
            for key in ("repo", "commit"):
                if getattr(sub, key) is None:
                    problem(
                        key,
                        "required for a submodule the image gets (`envbuild lock update` records it), "
                        "or skip it by name: `skip: REASON`",
                    )
        if sub.path in seen:
            problem("path", f"duplicate {sub.path!r} (first at submodules[{seen[sub.path]}])")
        for other, k in seen.items():
            if sub.path.startswith(other + "/") or other.startswith(sub.path + "/"):
                problem("path", f"{sub.path!r} and {other!r} (submodules[{k}]) are one inside the other")
        seen.setdefault(sub.path, j)
        problems += _submodule_problems(sub.submodules, root, file, here)
    return problems


def _filename_mismatch(name: str, version: str, filename: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            file_name, file_version, _, _ = parse_wheel_filename(filename)
        else:
            file_name, file_version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename) as exc:
        return f"not a valid distribution filename: {exc}"
    try:
        wanted = Version(version)
    except InvalidVersion:
        return None  # reported on the version field already
    if file_name != canonicalize_name(name) or file_version != wanted:
        return f"{filename!r} is not a file of {name} {version}"
    return None
