"""Reading a lockfile strictly and writing it canonically."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.utils import (
    canonicalize_name,
)

from envbuild.data.typed import DECIMAL_INT, MAX_INT_DIGITS, Decoder
from envbuild.data.yamlfile import LIMIT_TEXT, MAX_BYTES, compose_yaml, read_capped
from envbuild.errors import EnvbuildError, LockfileError, Problem
from envbuild.fileio import write_atomic
from envbuild.lock.crosscheck import cross_checks
from envbuild.lock.model import LOCK_VERSION, LOCK_VERSIONS, Lock, Package, Source
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
        decoder.problems.extend(cross_checks(lock, root, file))
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
