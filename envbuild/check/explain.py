"""Explain why two builds of one lock gave different images: which layers differ and, in them, which
files were added, removed or changed, with the first differing bytes of text files. A diffoscope-style
summary, not the whole tree. Reads two ``docker save`` archives (legacy or OCI layout); pure file I/O."""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from itertools import zip_longest
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

from envbuild.check.report import Difference, FileDifference
from envbuild.errors import EnvbuildError

_HEAD = 64 * 1024  # bytes of a file compared for "first difference"


class ArchiveError(EnvbuildError):
    """A saved image archive is not as `docker save` writes one: a member its manifest names is missing or
    not a file, or its manifest describes other than one image."""


def archive_member(outer: tarfile.TarFile, name: str, depth: int = 0) -> tarfile.TarInfo:
    """A member by name, following the symlinks `docker save` writes for repeated layers."""
    try:
        info = outer.getmember(name)
    except KeyError:
        raise ArchiveError(f"the saved image has no {name}") from None
    if info.issym() and depth < 8:
        target = PurePosixPath(name).parent / info.linkname
        parts: list[str] = []
        for part in target.parts:
            if part == "..":
                parts = parts[:-1]
            elif part != ".":
                parts.append(part)
        return archive_member(outer, "/".join(parts), depth + 1)
    if not info.isfile():
        raise ArchiveError(f"{name} in the saved image is not a file")
    return info


@dataclass(frozen=True)
class _Entry:
    """A layer's entry, its fields in the order a difference names them (:data:`_ASPECTS`)."""

    kind: str
    digest: str
    size: int
    mode: int
    owner: str
    names: str  # uname:gname
    mtime: float  # exact: a PAX header can carry a fraction
    link: str
    pax: tuple[tuple[str, str], ...]  # the PAX records the fields above do not already say (xattrs …)
    head: bytes = field(compare=False)  # the digest says whether it differs


# A field of an entry as a difference names it, where that is not the field's own name.
_ASPECTS = {"kind": "type", "digest": "content", "names": "owner names", "pax": "pax headers"}
_KINDS = {
    "file": tarfile.TarInfo.isfile,
    "dir": tarfile.TarInfo.isdir,
    "symlink": tarfile.TarInfo.issym,
    "hardlink": tarfile.TarInfo.islnk,
}
_PAX_SAID = {"path", "linkpath", "size", "mtime", "uid", "gid", "uname", "gname"}


# What reading an archive that is not as `docker save` writes one raises (a truncated tar, a manifest that is
# not JSON or lacks a key, fewer layers than diff IDs): said as an ArchiveError naming the archive.
_MALFORMED = (
    tarfile.TarError,
    gzip.BadGzipFile,
    zlib.error,
    EOFError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
)


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    try:
        yield
    except _MALFORMED as exc:
        raise ArchiveError(f"{path}: not an image archive as `docker save` writes one: {exc!r}"[:400]) from None


class _Image:
    def __init__(self, path: Path) -> None:
        self.path = path
        with _reading(path):
            self.tar = tarfile.open(path, mode="r:")
        try:
            with _reading(path):
                manifest = json.loads(self._open("manifest.json").read())
                if not isinstance(manifest, list) or len(manifest) != 1:
                    raise ArchiveError(f"{path}: manifest.json must describe one image")
                self.config: dict[str, Any] = json.loads(self._open(manifest[0]["Config"]).read())
                self.layers: list[str] = list(manifest[0]["Layers"])
                self.diff_ids: list[str] = list(self.config.get("rootfs", {}).get("diff_ids", []))
        except BaseException:
            self.tar.close()
            raise

    def _open(self, name: str) -> IO[bytes]:
        try:
            member = archive_member(self.tar, name)
        except ArchiveError as exc:  # which of the two archives
            raise ArchiveError(f"{self.path}: {exc}") from None
        handle = self.tar.extractfile(member)
        assert handle is not None
        return handle

    def layer(self, index: int) -> IO[bytes]:
        """Layer ``index``'s tar, read through gzip where it was saved compressed (an OCI layout's blob), so
        that offsets are the tar's, as :meth:`names` gives them."""
        with _reading(self.path):
            handle = self._open(self.layers[index])
            compressed = handle.read(2) == b"\x1f\x8b"
            handle.seek(0)
            return cast(IO[bytes], gzip.GzipFile(fileobj=handle, mode="rb")) if compressed else handle

    def names(self, index: int) -> list[tuple[str, int, int]]:
        """Each member of layer ``index`` in archive order: its name, header offset and end of its data."""
        with _reading(self.path), tarfile.open(fileobj=self.layer(index), mode="r:") as layer:
            return [(info.name, info.offset, info.offset_data + info.size) for info in layer]

    def entries(self, index: int) -> dict[str, _Entry]:
        entries: dict[str, _Entry] = {}
        with _reading(self.path), tarfile.open(fileobj=self.layer(index), mode="r:") as layer:
            for info in layer:
                digest, head = "", b""
                if info.isfile():
                    data = layer.extractfile(info)
                    assert data is not None
                    head = data.read(_HEAD)
                    sha = hashlib.sha256(head)
                    while chunk := data.read(1 << 20):
                        sha.update(chunk)
                    digest = sha.hexdigest()
                entries[info.name.lstrip("./").rstrip("/") or "."] = _Entry(
                    kind=next((kind for kind, test in _KINDS.items() if test(info)), "other"),
                    digest=digest,
                    size=info.size,
                    mode=info.mode,
                    owner=f"{info.uid}:{info.gid}",
                    names=f"{info.uname}:{info.gname}",
                    mtime=info.mtime,
                    link=info.linkname,
                    pax=tuple(sorted((k, v) for k, v in info.pax_headers.items() if k not in _PAX_SAID)),
                    head=head,
                )
        return entries

    def step(self, index: int) -> str:
        """The build step that made layer ``index``, from the config's history (empty layers skipped)."""
        steps = [h.get("created_by", "") for h in self.config.get("history", []) if not h.get("empty_layer")]
        if index >= len(steps):
            return ""
        return step_label(steps[index])

    def close(self) -> None:
        self.tar.close()


def _is_text(data: bytes) -> bool:
    if b"\0" in data[:8192]:
        return False
    try:
        data[:8192].decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start > 8000  # a multi-byte character cut at the edge
    return True


def step_label(created_by: str) -> str:
    """A history entry's ``created_by`` as the Dockerfile line it was, at most 80 characters: the legacy
    builder writes ``/bin/sh -c #(nop) LABEL …`` and ``/bin/sh -c CMD``, BuildKit ``RUN /bin/sh -c CMD #
    buildkit`` and ``LABEL …``."""
    text = created_by.removesuffix(" # buildkit")
    for prefix, instead in (("/bin/sh -c #(nop) ", ""), ("/bin/sh -c ", "RUN "), ("RUN /bin/sh -c ", "RUN ")):
        if text.startswith(prefix):
            text = instead + text.removeprefix(prefix)
            break
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:79] + "…"


def first_difference(old: bytes, new: bytes, context: int = 24) -> str:
    """Where two byte strings first differ, with a little of each side: ``offset 12: '…' vs '…'``."""
    at = first_index(old, new)
    start = max(0, at - context)
    show = lambda data: data[start : at + context].decode("utf-8", "replace")  # noqa: E731
    return f"offset {at}: {show(old)!r} vs {show(new)!r}"


def _compare_entries(old: dict[str, _Entry], new: dict[str, _Entry]) -> list[FileDifference]:
    found: list[FileDifference] = []
    for path in sorted(old.keys() | new.keys()):
        a, b = old.get(path), new.get(path)
        if a is None:
            found.append(FileDifference(path, "added"))
        elif b is None:
            found.append(FileDifference(path, "removed"))
        elif a != b:
            aspects = [
                _ASPECTS.get(f.name, f.name)
                for f in fields(_Entry)
                if f.compare and getattr(a, f.name) != getattr(b, f.name)
            ]
            detail = None
            # equal heads of other files: they part past what was kept, at an offset not known here
            if "content" in aspects and a.head != b.head and _is_text(a.head) and _is_text(b.head):
                detail = first_difference(a.head, b.head)
            found.append(FileDifference(path, "changed", tuple(aspects), detail))
    return found


def _layer_bytes_difference(old: _Image, new: _Image, index: int) -> FileDifference:
    """Two layers whose entries are all the same: their order differs, or an entry appears twice, or
    the bytes of a header differ in what no field above compares (its format, padding)."""
    a, b = old.names(index), new.names(index)
    order_a, order_b = [name for name, _, _ in a], [name for name, _, _ in b]
    if order_a != order_b:
        at = first_index(order_a, order_b)
        show = lambda order: repr(order[at]) if at < len(order) else "(end)"  # noqa: E731
        repeated = sorted(name for name, count in (Counter(order_a) | Counter(order_b)).items() if count > 1)
        detail = f"entry {at}: {show(order_a)} vs {show(order_b)}"
        if repeated:
            detail += f"; listed more than once in one of them: {', '.join(repeated[:5])}"
        return FileDifference("(layer archive)", "changed", ("order",), detail)
    offset = _first_differing_offset(old.layer(index), new.layer(index))
    if offset is None:  # no engine saves this: a config whose diff ID is not the digest of its layer
        return FileDifference(
            "(layer archive)", "changed", ("diff id",), "the same bytes: a config's diff ID is not this layer's digest"
        )
    member = next((name for name, start, end in a if start <= offset < end), None)
    where = f"in the header or data of {member!r}" if member is not None else "after the last member"
    return FileDifference("(layer archive)", "changed", ("bytes",), f"offset {offset}, {where}")


def _first_differing_offset(old: IO[bytes], new: IO[bytes], chunk: int = 1 << 20) -> int | None:
    """Where two streams first differ; None when they are the same bytes."""
    offset = 0
    while True:
        x, y = old.read(chunk), new.read(chunk)
        if x != y:
            return offset + first_index(x, y)
        if not x:
            return None
        offset += len(x)


def first_index(old: Sequence[object], new: Sequence[object]) -> int:
    """The first index at which two sequences (bytes, names) differ (the shorter one's length when one is a
    prefix)."""
    limit = min(len(old), len(new))
    return next((i for i in range(limit) if old[i] != new[i]), limit)


def _config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[FileDifference]:
    """Config fields that differ (rootfs aside: the layers say that), as pseudo-paths."""

    def flat(value: Any, prefix: str) -> dict[str, str]:
        if isinstance(value, dict):
            items = [(f"{prefix}.{key}" if prefix else key, item) for key, item in value.items()]
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            items = [(f"{prefix}[{i}]", item) for i, item in enumerate(value)]
        else:
            return {prefix: json.dumps(value, sort_keys=True)}
        return {key: text for name, item in items for key, text in flat(item, name).items()}

    a = flat({k: v for k, v in old.items() if k != "rootfs"}, "")
    b = flat({k: v for k, v in new.items() if k != "rootfs"}, "")
    return [
        FileDifference(
            key,
            "added" if key not in a else "removed" if key not in b else "changed",
            (),
            None if key not in a or key not in b else f"{a[key]} vs {b[key]}",
        )
        for key in sorted(a.keys() | b.keys())
        if a.get(key) != b.get(key)
    ]


def explain(old_archive: Path, new_archive: Path, *, max_files: int = 40) -> tuple[Difference, ...]:
    """Every part that differs between two saved images; nothing when they are the same image."""
    old = _Image(old_archive)
    try:
        new = _Image(new_archive)
    except BaseException:
        old.close()
        raise
    try:
        differences: list[Difference] = []
        config = _config_differences(old.config, new.config)
        if config:
            differences.append(
                Difference("config", files=tuple(config[:max_files]), omitted=max(0, len(config) - max_files))
            )
        for index, (a, b) in enumerate(zip_longest(old.diff_ids, new.diff_ids, fillvalue="")):
            if a == b:
                continue
            files = _compare_entries(old.entries(index) if a else {}, new.entries(index) if b else {})
            if a and b and not files:  # the same entries, other bytes: say where the archives part
                files = [_layer_bytes_difference(old, new, index)]
            step = (new if b else old).step(index)
            differences.append(
                Difference(
                    f"layer {index}" + (f" ({step})" if step else ""),
                    a or "(none)",
                    b or "(none)",
                    tuple(files[:max_files]),
                    max(0, len(files) - max_files),
                )
            )
        return tuple(differences)
    finally:
        old.close()
        new.close()
