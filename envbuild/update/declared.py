"""What a source declares it needs, read from the files of its pinned tree: pure, and no upstream code runs.

Read, in this order of trust:

- build requirements: ``[build-system].requires`` of ``pyproject.toml``; without one, what pip builds a
  setuptools project with (``setuptools>=40.8.0``);
- runtime requirements: ``[project].dependencies`` and ``[project].optional-dependencies`` where static
  (extras become ``extra == "…"`` markers, as in core metadata); where they are dynamic, the files the
  setuptools ``[tool.setuptools.dynamic]`` table names (``{file = …}``); for a project without a
  ``[project]`` table, ``setup.cfg``'s ``install_requires`` and ``extras_require``; and always the files the
  lock names for the source (``requires_files``), for a ``setup.py`` that reads them itself;
- the distribution: ``[project].name`` (or ``setup.cfg``'s), and the version where it is a literal,
  including setuptools' ``attr:`` form when the attribute is a string constant in the module's source.

What cannot be read this way (dependencies a ``setup.py`` computes and the lock names no file for, a
``pyproject.toml`` that is not TOML) is not guessed: :class:`Declared` says it is unknown, and why.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import posixpath
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from packaging.markers import Marker
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuild.data.tomldepth import MAX_TOML_DEPTH, toml_too_deep
from envbuild.git.files import TreeFile
from envbuild.lock.model import Provides
from envbuild.update.reqfile import RequirementFileError, parse_files, parse_requirement

# tomllib from Python 3.11 on; tomli (the same code, a dependency on 3.10) before.
tomllib = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")

Read = Callable[[Sequence[str]], Mapping[str, TreeFile]]

PIP_DEFAULT_BUILD = ("setuptools>=40.8.0",)
ROOT_FILES = ("pyproject.toml", "setup.cfg", "setup.py")


@dataclass(frozen=True)
class Declared:
    """A source's declared requirements; ``None`` where they could not be read, with ``unknown`` saying why."""

    provides: Provides | None
    build_requires: tuple[str, ...] | None
    requires: tuple[str, ...] | None
    unknown: str | None = None
    notes: tuple[str, ...] = ()


class _Unreadable(Exception):
    """Part of the declaration cannot be read statically."""


@dataclass
class _Reading:
    read: Read
    notes: list[str] = field(default_factory=list)

    def text(self, path: str) -> tuple[str | None, str]:
        found = self.read([path])[path]
        if found.data is None:
            return None, found.problem or "absent"
        try:
            return found.data.decode("utf-8"), ""
        except UnicodeDecodeError:
            return None, "not UTF-8 text"

    def requirement_files(self, paths: Sequence[str], extra: str | None = None) -> list[str]:
        try:
            parsed = parse_files(list(paths), self.text)
        except RequirementFileError as exc:
            raise _Unreadable(str(exc)) from None
        self.notes += parsed.notes
        return [_with_extra(r, extra) for r in parsed.requirements]


def read_declared(read: Read, requires_files: Sequence[str] = ()) -> Declared:
    """Everything the files of one tree declare; ``read`` gives files of the tree by path."""
    root = read(ROOT_FILES)
    reading = _Reading(read)
    pyproject: dict[str, Any] | None = None
    if root["pyproject.toml"].data is not None:
        try:
            text = root["pyproject.toml"].data.decode("utf-8")
            if toml_too_deep(text):
                why = f"pyproject.toml nests arrays or tables more than {MAX_TOML_DEPTH} levels deep; not read"
                return Declared(None, None, None, why)
            pyproject = tomllib.loads(text)
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            why = f"pyproject.toml is not valid TOML ({exc})"
            return Declared(None, None, None, why)
    setup_cfg = _config(root["setup.cfg"].data)
    if pyproject is None and setup_cfg is None and root["setup.py"].data is None:
        why = "no pyproject.toml, setup.cfg or setup.py at the root of the tree: not a Python project pip installs"
        if root["setup.cfg"].data is not None:  # there, but _config could not read it
            why = (
                "no pyproject.toml or setup.py at the root of the tree, and its setup.cfg is not valid INI: "
                "not a Python project pip installs"
            )
        return Declared(None, None, None, why)

    project = pyproject.get("project") if pyproject else None
    project = project if isinstance(project, dict) else None
    provides = _provides(project, pyproject or {}, setup_cfg, reading)
    unknown: list[str] = []
    build: tuple[str, ...] | None = None
    requires: tuple[str, ...] | None = None
    try:
        build = _build_requires(pyproject, reading)
    except RequirementFileError as exc:
        unknown.append(f"build requirements: {exc}")
    try:
        requires = tuple(dict.fromkeys(_runtime(project, pyproject or {}, setup_cfg, requires_files, reading)))
    except (_Unreadable, RequirementFileError) as exc:
        unknown.append(str(exc))
    return Declared(provides, build, requires, "; ".join(unknown) or None, tuple(reading.notes))


def _build_requires(pyproject: dict[str, Any] | None, reading: _Reading) -> tuple[str, ...]:
    system = pyproject.get("build-system") if pyproject else None
    requires = system.get("requires") if isinstance(system, dict) else None
    if requires is None:
        reading.notes.append("no [build-system].requires: pip builds it with setuptools>=40.8.0")
        return PIP_DEFAULT_BUILD
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        reading.notes.append("[build-system].requires is not a list of strings: pip would refuse it")
        return ()
    return tuple(dict.fromkeys(str(parse_requirement(r, "[build-system].requires")) for r in requires))


def _runtime(
    project: dict[str, Any] | None,
    pyproject: dict[str, Any],
    setup_cfg: configparser.ConfigParser | None,
    requires_files: Sequence[str],
    reading: _Reading,
) -> list[str]:
    found: list[str] = []
    missing: list[str] = []
    dynamic_table = _table(pyproject, "tool", "setuptools", "dynamic")
    if project is not None:
        dynamic = project.get("dynamic", [])
        if "dependencies" not in dynamic:
            found += _strings(project.get("dependencies", []), "[project].dependencies")
        elif files := _file_directive(dynamic_table.get("dependencies")):
            found += reading.requirement_files(files)
        else:
            missing.append("[project].dependencies are dynamic")
        if "optional-dependencies" not in dynamic:
            for extra, items in sorted(_mapping(project.get("optional-dependencies", {})).items()):
                found += [_with_extra(r, extra) for r in _strings(items, f"[project].optional-dependencies.{extra}")]
        else:
            for extra, directive in sorted(_mapping(dynamic_table.get("optional-dependencies", {})).items()):
                if files := _file_directive(directive):
                    found += reading.requirement_files(files, extra)
                else:
                    missing.append(f"optional dependencies {extra!r} are dynamic")
    elif setup_cfg is not None and setup_cfg.has_option("options", "install_requires"):
        found += _cfg_requirements(setup_cfg.get("options", "install_requires"), None, reading)
        if setup_cfg.has_section("options.extras_require"):
            for extra, value in sorted(setup_cfg.items("options.extras_require")):
                found += _cfg_requirements(value, extra, reading)
    else:
        missing.append("no [project] table: the metadata is computed by setup.py")
    if requires_files:
        found += reading.requirement_files(requires_files)
    elif missing:
        raise _Unreadable(f"{'; '.join(missing)}, and the lock names no requirement files for it (`requires_files`)")
    return found


def _provides(
    project: dict[str, Any] | None,
    pyproject: dict[str, Any],
    setup_cfg: configparser.ConfigParser | None,
    reading: _Reading,
) -> Provides | None:
    name: Any = project.get("name") if project is not None else None
    version: Any = None
    if project is not None and "version" not in project.get("dynamic", []):
        version = project.get("version")
    elif project is not None:
        directive = _table(pyproject, "tool", "setuptools", "dynamic").get("version")
        if isinstance(directive, dict) and isinstance(directive.get("attr"), str):
            dirs = _table(pyproject, "tool", "setuptools").get("package-dir", {})
            version = _attr_version(directive["attr"], dirs if isinstance(dirs, dict) else {}, reading)
    elif setup_cfg is not None and setup_cfg.has_section("metadata"):
        name = setup_cfg.get("metadata", "name", fallback=None)
        value = setup_cfg.get("metadata", "version", fallback="")
        if value.startswith("attr:"):
            version = _attr_version(value[5:].strip(), {}, reading)
        elif value and not value.startswith("file:"):
            version = value
    if not isinstance(name, str) or not name:
        return None
    try:
        checked = str(Version(version)) if isinstance(version, str) else None
    except InvalidVersion:
        checked = None
    return Provides(name=str(canonicalize_name(name)), version=checked)


def _attr_version(attr: str, package_dir: dict[str, Any], reading: _Reading) -> str | None:
    """setuptools' ``attr:`` read the way setuptools first tries it: a string constant assigned in the
    module's source, found without importing it; anything computed stays unknown."""
    module, _, name = attr.rpartition(".")
    top = module.split(".")[0]
    base = package_dir.get(top)
    if isinstance(base, str):
        path = posixpath.join(base, *module.split(".")[1:])
    else:
        prefix = package_dir.get("", "")
        path = posixpath.join(prefix if isinstance(prefix, str) else "", *module.split("."))
    for candidate in (f"{path}.py", f"{path}/__init__.py"):
        text, _ = reading.text(candidate)
        if text is None:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return None
        for node in tree.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            value = getattr(node, "value", None)
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    return value.value
                reading.notes.append(f"the version ({attr}) is computed in {candidate}; not read")
                return None
        return None
    return None


def _cfg_requirements(value: str, extra: str | None, reading: _Reading) -> list[str]:
    value = value.strip()
    if value.startswith("file:"):
        files = [f.strip() for f in value[5:].split(",") if f.strip()]
        return reading.requirement_files(files, extra)
    where = "setup.cfg " + (f"extras_require.{extra}" if extra else "install_requires")
    lines = [line.strip() for line in value.replace(";", "\n;").splitlines()]
    merged: list[str] = []
    for line in lines:  # a marker may sit on its own line after ';'
        if line.startswith(";") and merged:
            merged[-1] += line
        elif line and not line.startswith("#"):
            merged.append(line)
    return [_with_extra(str(parse_requirement(line, where)), extra) for line in merged]


def _with_extra(requirement: str, extra: str | None) -> str:
    if extra is None:
        return requirement
    parsed = parse_requirement(requirement, "extra")
    condition = f'extra == "{canonicalize_name(extra)}"'
    parsed.marker = Marker(f"({parsed.marker}) and {condition}" if parsed.marker else condition)
    return str(parsed)


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Unreadable(f"{where} is not a list of strings")
    try:
        return [str(parse_requirement(v, where)) for v in value]
    except RequirementFileError as exc:
        raise _Unreadable(str(exc)) from None


def _file_directive(value: Any) -> list[str] | None:
    files = value.get("file") if isinstance(value, dict) else None
    if isinstance(files, str):
        return [files]
    if isinstance(files, list) and files and all(isinstance(f, str) for f in files):
        return files
    return None


def _table(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    for key in keys:
        value = data.get(key)
        if not isinstance(value, dict):
            return {}
        data = value
    return data


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _config(data: bytes | None) -> configparser.ConfigParser | None:
    if data is None:
        return None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(data.decode("utf-8"))
    except (UnicodeDecodeError, configparser.Error):
        return None
    return parser
