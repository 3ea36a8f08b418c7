"""The normalised image config, and the small archives envbuild hands ``docker load``; pure.

The layers of a build come out of the engine deterministic (:mod:`.render`, :mod:`.stream`): only the
image config carries build-time noise (``created``, history times, ``container``, ``container_config``,
``docker_version``, ``config.Image``, ``config.Hostname``). :func:`canonical_config` composes the config
from what the engine says about the built image — ``inspect`` (platform, ``Config``, layers) and its
history, each entry marked empty or not — with every build-time field fixed: ``created`` and the times of
the entries the build added are the epoch, the base's entries keep their time (as the engine reports it,
to the second). The image ID is the sha256 of its canonical JSON bytes.

``docker load`` reads a layer's tar only when the engine lacks that chain of layers, so
:func:`load_archive` names the layers the engine has in the manifest without carrying them: loading the
normalised config costs a few kilobytes however large the base is.

:func:`removal_layer` writes the one layer the engine cannot write deterministically: the removal of
base files (a whiteout the engine makes carries the clock's time).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any

# Instructions that change only the config, never the file system (legacy "#(nop) X" and BuildKit "X").
_METADATA = re.compile(
    r"^(/bin/sh -c #\(nop\)\s+)?(ARG|CMD|ENTRYPOINT|ENV|EXPOSE|HEALTHCHECK|LABEL|MAINTAINER|ONBUILD|SHELL|"
    r"STOPSIGNAL|USER|VOLUME)\b"
)
_DROPPED_CONFIG = ("Image", "Hostname")


@dataclass(frozen=True)
class HistoryEntry:
    """One history entry as the engine reports it (``docker history``), oldest first."""

    created: int  # Unix seconds
    created_by: str
    comment: str
    size: int
    empty: bool | None  # None: the engine cannot tell (an image without its parent chain)

    def config_json(self, created: str) -> dict[str, Any]:
        """The entry in the normalised config, at the time the caller gives (the base's own, or the epoch)."""
        out: dict[str, Any] = {"created": created, "created_by": self.created_by}
        if self.comment:
            out["comment"] = self.comment
        if self.empty:
            out["empty_layer"] = True
        return out


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical_json(data: object) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def image_id(config: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(config)).hexdigest()


def settle_empty(entries: Sequence[HistoryEntry], layers: int) -> list[HistoryEntry]:
    """Decide the entries whose emptiness the engine does not report, so that exactly ``layers`` of all
    are non-empty: an entry with a size made a layer; then the newest undecided entries that are not
    config-only instructions; then the newest others. Deterministic: the same history gives the same
    answer (the layer order, not which entry named a base layer, is what later stages rely on)."""
    decided = [e.empty if e.empty is not None else (False if e.size > 0 else None) for e in entries]
    missing = layers - sum(flag is False for flag in decided)
    undecided = [i for i, flag in enumerate(decided) if flag is None]
    if missing < 0 or missing > len(undecided):
        raise ValueError(f"the history has {len(entries)} entries for {layers} layers: they cannot match")
    newest_first = sorted(undecided, key=lambda i: (bool(_METADATA.match(entries[i].created_by)), -i))
    chosen = set(newest_first[:missing])
    return [
        HistoryEntry(e.created, e.created_by, e.comment, e.size, i not in chosen if decided[i] is None else decided[i])
        for i, e in enumerate(entries)
    ]


def canonical_config(
    inspect: dict[str, Any], history: Sequence[HistoryEntry], *, base_entries: int, epoch: int
) -> dict[str, Any]:
    """The normalised config of a built image from ``docker inspect`` and its settled history (oldest
    first); the first ``base_entries`` entries are the base image's and keep their time."""
    layers = list(inspect["RootFS"]["Layers"])
    if sum(not e.empty for e in history) != len(layers):
        raise ValueError(f"{sum(not e.empty for e in history)} non-empty history entries for {len(layers)} layers")
    config: dict[str, Any] = {
        "architecture": inspect["Architecture"],
        "os": inspect["Os"],
        "config": {k: v for k, v in (inspect.get("Config") or {}).items() if k not in _DROPPED_CONFIG},
        "created": rfc3339(epoch),
        "history": [
            e.config_json(rfc3339(e.created) if index < base_entries else rfc3339(epoch))
            for index, e in enumerate(history)
        ],
        "rootfs": {"type": "layers", "diff_ids": layers},
    }
    for key, field in (("variant", "Variant"), ("os.version", "OsVersion"), ("author", "Author")):
        if inspect.get(field):
            config[key] = inspect[field]
    return config


def extend_config(config: dict[str, Any], diff_id: str, created_by: str, epoch: int) -> dict[str, Any]:
    """``config`` with one more layer on top (one envbuild wrote), created at the epoch."""
    extended = json.loads(json.dumps(config))
    extended["created"] = rfc3339(epoch)
    extended["history"].append({"created": rfc3339(epoch), "created_by": created_by})
    extended["rootfs"]["diff_ids"].append(diff_id)
    return extended


def _member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    return info.tobuf(tarfile.PAX_FORMAT) + data + bytes(-len(data) % tarfile.BLOCKSIZE)


def load_archive(config: dict[str, Any], tags: Sequence[str] = (), layers: dict[str, bytes] | None = None) -> bytes:
    """A ``docker load`` archive (the layout ``docker save`` writes) of ``config``: the manifest names
    every layer, and only those in ``layers`` (diff ID → tar bytes) are carried — the engine must hold
    the others, with the same layers below them."""
    data = canonical_json(config)
    hex_id = hashlib.sha256(data).hexdigest()
    carried = layers or {}
    paths = [f"{diff.split(':', 1)[1]}/layer.tar" for diff in config["rootfs"]["diff_ids"]]
    manifest = [{"Config": f"{hex_id}.json", "RepoTags": list(tags), "Layers": paths}]
    out = [_member(f"{hex_id}.json", data), _member("manifest.json", canonical_json(manifest))]
    out += [_member(f"{diff.split(':', 1)[1]}/layer.tar", tar) for diff, tar in sorted(carried.items())]
    return b"".join(out) + bytes(2 * tarfile.BLOCKSIZE)


def removal_layer(remove: Sequence[str], directories: Mapping[str, Sequence[int]], epoch: int) -> bytes:
    """A layer tar that removes ``remove`` (absolute paths) from the layers below: a whiteout
    (``.wh.<name>``) each, under its directories with the modes and owners they have (``directories``:
    path → [mode, uid, gid]), every mtime the epoch, sorted, no owner names."""
    entries: dict[str, tarfile.TarInfo] = {}
    for path in remove:
        pure = PurePosixPath(path)
        if not pure.is_absolute() or ".." in pure.parts or len(pure.parts) < 2:
            raise ValueError(f"cannot remove {path!r}: not an absolute path below /")
        for parent in list(pure.parents)[:-1]:
            name = str(parent).lstrip("/")
            if name not in entries:
                mode, uid, gid = directories[str(parent)]
                entries[name] = _info(name, tarfile.DIRTYPE, mode, uid, gid, epoch)
        whiteout = str(pure.parent / f".wh.{pure.name}").lstrip("/")
        entries[whiteout] = _info(whiteout, tarfile.REGTYPE, 0o600, 0, 0, epoch)
    return _sorted_tar(entries, {})


def files_layer(
    parents: Mapping[str, tarfile.TarInfo], directory: str, files: Mapping[str, bytes], epoch: int
) -> bytes:
    """A layer tar adding ``files`` (name → bytes; root, 0644) in ``directory`` (an absolute path; root,
    0755), both at the epoch, under its ``parents`` (absolute path → the header the engine gives that
    directory now: kept as it is, as a build step's own layer keeps a directory it only adds to); sorted,
    no owner names."""
    entries: dict[str, tarfile.TarInfo] = {}
    for path, header in parents.items():
        name = path.strip("/")
        entries[name] = _info(name, tarfile.DIRTYPE, header.mode & 0o7777, header.uid, header.gid, int(header.mtime))
    expected = {str(p).lstrip("/") for p in list(PurePosixPath(directory).parents)[:-1]}
    if set(entries) != expected:
        raise ValueError(f"{directory}: its parents are {sorted(expected)}, not {sorted(entries)}")
    top = directory.strip("/")
    if not top:
        raise ValueError(f"{directory}: not a directory below /")
    entries[top] = _info(top, tarfile.DIRTYPE, 0o755, 0, 0, epoch)
    data: dict[str, bytes] = {}
    for filename, content in files.items():
        if "/" in filename or filename in ("", ".", ".."):
            raise ValueError(f"{filename!r}: not a file name")
        name = f"{top}/{filename}"
        entries[name] = _info(name, tarfile.REGTYPE, 0o644, 0, 0, epoch)
        entries[name].size, data[name] = len(content), content
    return _sorted_tar(entries, data)


def _sorted_tar(entries: Mapping[str, tarfile.TarInfo], data: Mapping[str, bytes]) -> bytes:
    """A layer tar of ``entries`` sorted by name's bytes, each regular file's content from ``data``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries, key=lambda n: n.encode("utf-8", "surrogateescape")):
            tar.addfile(entries[name], io.BytesIO(data[name]) if name in data else None)
    return buffer.getvalue()


def _info(name: str, kind: bytes, mode: int, uid: int, gid: int, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid, info.mtime = kind, mode, uid, gid, epoch
    info.uname = info.gname = ""
    return info
