"""Reading a lockfile strictly and writing it canonically."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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

from envbuild.data.typed import DECIMAL_INT, MAX_INT_DIGITS, Decoder
from envbuild.data.yamlfile import LIMIT_TEXT, MAX_BYTES, compose_yaml, node_line, read_capped
from envbuild.errors import EnvbuildError, LockfileError, Problem
from envbuild.fileio import write_atomic
from envbuild.lock.model import LOCK_VERSION, LOCK_VERSIONS, Lock, Package, Source, Submodule
from envbuild.locking import flock_fd

HEADER = "# envbuild lockfile: written by `envbuild lock`; every pin is checked by `envbuild lock verify`.\n"


@dataclass(frozen=True)
class LockFile:
    """A lock as read from disk, with the sha256 of exactly the bytes it was parsed from (the digest an
    image built from it carries, and the key of its check history)."""

    path: Path
    lock: Lock
    sha256: str


def read_lock(path: str | os.PathLike[str]) -> LockFile:
    """Read and validate a lockfile; raise :class:`LockfileError` listing every problem. The one way
    envbuild and envrun read a lock from disk."""
    data = read_capped(path, LockfileError)
    return LockFile(Path(path), parse_lock(data, str(path)), hashlib.sha256(data).hexdigest())


def parse_lock(data: bytes | str, file: str = "<lock>") -> Lock:
    root = compose_yaml(data, file, LockfileError)
    if root is None:
        raise LockfileError([Problem(file, 0, "", "empty file; a lock needs version, name and sources")])
    decoder = Decoder(file, version=_check_version(root, file))
    lock = decoder.decode(Lock, root, "")
    if lock is not None:
        decoder.problems.extend(_cross_checks(lock, root, file))
    if decoder.problems or lock is None:
        raise LockfileError(decoder.problems)
    return lock


def _check_version(root: yaml.Node, file: str) -> int | None:
    """Give a missing and an unsupported version their own, clear messages before anything else (any
    other malformed version is the decoder's to report); the version, when it is one this envbuild reads."""
    if not isinstance(root, yaml.MappingNode):
        return None
    for key, value in root.value:
        if key.value != "version":
            continue
        number = value.value if isinstance(value, yaml.ScalarNode) and value.tag.endswith(":int") else ""
        if not (DECIMAL_INT.fullmatch(number) and len(number) <= MAX_INT_DIGITS):
            return None
        if int(number) not in LOCK_VERSIONS:
            readable = " and ".join(str(v) for v in LOCK_VERSIONS)
            message = (
                f"unsupported lockfile version {number}; this envbuild reads versions {readable} (upgrade envbuild)"
            )
            raise LockfileError([Problem(file, value.start_mark.line + 1, "version", message)])
        return int(number)
    raise LockfileError([Problem(file, 1, "version", f"required key is missing (add `version: {LOCK_VERSION}`)")])


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


def _cross_checks(lock: Lock, root: yaml.Node, file: str) -> list[Problem]:
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


# --- writing ------------------------------------------------------------------------------------


class _FlowMap(dict):
    """A mapping written on one line: used for package files, which are many and short."""


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # the reader refuses anchors and aliases, so the writer never emits one


_Dumper.add_representer(
    _FlowMap, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)
)


def _plain(value: Any) -> Any:
    """Dataclass tree to plain data, in field order, leaving out absent and empty optional fields."""
    if dataclasses.is_dataclass(value):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None or (item == () and f.default == ()):
                continue
            out[f.name] = _plain(item)
        return out
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return dict(sorted(value.items()))
    return value


_LOCK_KEY_ORDER = (
    "version",
    "name",
    "platform",
    "base_image",
    "index",
    "source_date_epoch",
    "sources",
    "requirements",
    "packages",
    "installer",
)


def _files_sorted(package: Package) -> Package:
    return dataclasses.replace(package, files=tuple(sorted(package.files, key=lambda f: f.filename)))


def canonical(lock: Lock) -> Lock:
    """The same lock with packages and their files (the installer's too) in canonical order."""
    packages = tuple(_files_sorted(p) for p in sorted(lock.packages, key=lambda p: canonicalize_name(p.name)))
    return dataclasses.replace(lock, packages=packages, installer=lock.installer and _files_sorted(lock.installer))


def dump_lock(lock: Lock) -> str:
    """Canonical text of a lock: the same lock always gives the same bytes."""
    plain = _plain(canonical(lock))
    data = {key: plain[key] for key in _LOCK_KEY_ORDER if key in plain}
    for package in [*data.get("packages", []), *([data["installer"]] if "installer" in data else [])]:
        for key in ("files", "waive"):
            if key in package:
                package[key] = [_FlowMap(entry) for entry in package[key]]
    for source in data.get("sources", []):
        if lock.version < 2 and ("submodules" in source or "submodules_unknown" in source):
            raise ValueError(f"source {source['name']}: a version 1 lock cannot record submodules (write version 2)")
        if "provides" in source:
            source["provides"] = _FlowMap(source["provides"])
        for key in ("waive", "skip_imports"):
            if key in source:
                source[key] = [_FlowMap(entry) for entry in source[key]]
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096, allow_unicode=True)
    return HEADER + body


class LockWriteRefused(EnvbuildError):
    """A lock was not written: what envbuild was about to write would fail its own reader (too large, or a
    value the reader refuses, such as a name read from a tree that is not a distribution name), and the
    lock on disk stays as it was. Exit 1: the lock a user wrote is fine; what upstream trees or the index
    gave is not, and the message names where."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{path}: not written, the old lock is unchanged: {reason}")


def checked_lock_text(lock: Lock, path: str | os.PathLike[str], text: str | None = None) -> str:
    """The text of ``lock`` (``text``, or its canonical text), once it has passed :func:`read_lock`'s
    checks (size cap and strict parsing) as the file at ``path`` would; raise
    :class:`LockWriteRefused` naming the first problem (and the source it sits in) otherwise. Every
    lock envbuild writes goes through here, so it never writes one it then refuses."""
    text = dump_lock(lock) if text is None else text
    size = len(text.encode("utf-8"))
    if size > MAX_BYTES:
        sizes = sorted((_source_size(lock, s), s.name) for s in lock.sources)
        where = f"; the largest source is {sizes[-1][1]!r} ({sizes[-1][0]:,} bytes)" if sizes else ""
        raise LockWriteRefused(
            path,
            f"the new lock is {size:,} bytes, over the reader's limit of {LIMIT_TEXT} ({MAX_BYTES:,} bytes){where}",
        )
    try:
        parse_lock(text, "<new lock>")
    except LockfileError as exc:
        first = exc.problems[0]
        more = f" (and {len(exc.problems) - 1} more problems)" if len(exc.problems) > 1 else ""
        raise LockWriteRefused(
            path,
            f"the new lock would fail the lock's reader: {_with_entry_name(lock, first.field)}{first.message}{more}",
        ) from None
    return text


def _source_size(lock: Lock, source: Source) -> int:
    alone = dataclasses.replace(lock, sources=(source,), requirements=(), packages=())
    return len(dump_lock(alone).encode("utf-8"))


def _with_entry_name(lock: Lock, field: str) -> str:
    """``sources[3].provides.name`` with the source's name (``packages[0]…`` with the package's), which a
    reader of the message knows."""
    for key, entries, kind in (("sources[", lock.sources, "source"), ("packages[", lock.packages, "package")):
        if field.startswith(key):
            index = field[len(key) : field.index("]")]
            if index.isdigit() and int(index) < len(entries):
                return f"{field} ({kind} {entries[int(index)].name!r}): "
    return f"{field}: " if field else ""


def bytes_as_read(read: LockFile) -> bytes:
    """The bytes of the file ``read`` came from, while they are still the ones it was read from; else
    :class:`LockWriteRefused` (another writer, or a person, changed the file while a command ran)."""
    try:
        now = read_capped(read.path, LockfileError)
    except LockfileError as exc:
        raise LockWriteRefused(read.path, exc.problems[0].message) from None
    if hashlib.sha256(now).hexdigest() != read.sha256:
        raise LockWriteRefused(
            read.path,
            "it changed since this command read it (another `lock update` or an edit, meanwhile); run it again",
        )
    return now


def replace_lock_file(read: LockFile, text: str) -> None:
    """Write ``text`` over the file ``read`` came from, unless that file changed since it was read: two
    commands updating one lock at once must not lose one's change without a word. The check and the
    rename are one step among envbuild's writers: each holds an ``flock`` on the file at the path (taken
    again when a writer replaced it meanwhile), so the loser reads the winner's bytes, and refuses."""
    while True:
        try:
            fd = os.open(read.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise LockWriteRefused(read.path, f"cannot open it again: {exc.strerror}") from None
        try:
            flock_fd(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = read.path.stat()
            except OSError as exc:
                raise LockWriteRefused(read.path, f"cannot read it again: {exc.strerror}") from None
            if (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
                continue  # replaced between the open and the lock: lock the file that is there now
            bytes_as_read(read)
            write_atomic(read.path, text)
            return
        finally:
            os.close(fd)


def write_lock(path: str | os.PathLike[str], lock: Lock) -> None:
    """Write atomically, after :func:`checked_lock_text`: a reader sees the old lock or the new one, never
    half of one, and never one it refuses."""
    write_atomic(path, checked_lock_text(lock, path))
