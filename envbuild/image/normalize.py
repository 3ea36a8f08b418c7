"""Make a built image reproducible: rewrite a ``docker save`` archive into a canonical one.

``envbuild image`` no longer takes this road: a save reads every layer of the image, the base's too, and a
load writes them again (103 s and 17 s for a 4.7 GB base here), so its layers are made deterministic as
they are built and only the config is rewritten (:mod:`envbuild.image.normalise`). What stays in use is
the archive reader, :func:`_member`, through which ``envbuild check`` reads the archives it explains.

Two legacy builds of one Dockerfile differ only in file mtimes inside the added layers and, in the
image config, in ``created``, history timestamps, ``container``/``container_config`` and
``config.Image`` (upstream-facts §6). This module removes exactly those differences, plus the ones a
different machine or engine version brings (``docker_version``, owners' names, ``.pyc`` caches):

* the base image's layers are copied byte for byte;
* each layer the builder added is rewritten: entries sorted by name, hard links re-pointed so the
  first name in order holds the data, mtimes clamped to the epoch, owners 0:0 with no names, pax
  atime/ctime dropped, ``__pycache__`` directories dropped;
* the config gets ``created`` = the epoch, the builder's history entries too, loses ``container``,
  ``container_config``, ``docker_version``, ``config.Image`` and ``config.Hostname``, and gets the
  recomputed ``rootfs.diff_ids``; it is written as canonical JSON, so the image ID (sha256 of the
  config bytes) depends on content only.

Both archive layouts are read and written back in kind: the legacy one (``<id>/layer.tar``,
``<hex>.json``, ``manifest.json``, ``repositories``; docker 20.10, which Debian bookworm's docker.io
is) and the OCI one docker 25+ writes (``index.json``, ``oci-layout``, ``blobs/sha256/…`` plus the
same ``manifest.json``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO, Any, BinaryIO, Literal

from envbuild.errors import EnvbuildError
from envbuild.fileio import atomic_output, sha256_file

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
_DROPPED_PAX = {"atime", "ctime", "mtime", "uid", "gid", "uname", "gname", "path", "linkpath", "size"}
_CHUNK = 1 << 20


class NormalizeError(EnvbuildError):
    """A saved image archive cannot be normalised (unexpected layout, or not built on the base)."""


@dataclass(frozen=True)
class NormalizeResult:
    image_id: str  # "sha256:<hex>" of the canonical config bytes, as `docker load` will name it
    layout: Literal["docker-save", "oci"]
    diff_ids: tuple[str, ...]
    base_layers: int
    tags: tuple[str, ...]


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical_json(data: object) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """OCI chain IDs: each names a layer together with everything under it."""
    chain: list[str] = []
    for diff_id in diff_ids:
        chain.append(
            diff_id if not chain else "sha256:" + hashlib.sha256(f"{chain[-1]} {diff_id}".encode()).hexdigest()
        )
    return chain


def _member(outer: tarfile.TarFile, name: str, depth: int = 0) -> tarfile.TarInfo:
    """A member by name, following the symlinks `docker save` writes for repeated layers."""
    try:
        info = outer.getmember(name)
    except KeyError:
        raise NormalizeError(f"the saved image has no {name}") from None
    if info.issym() and depth < 8:
        target = PurePosixPath(name).parent / info.linkname
        parts: list[str] = []
        for part in target.parts:
            if part == "..":
                parts = parts[:-1]
            elif part != ".":
                parts.append(part)
        return _member(outer, "/".join(parts), depth + 1)
    if not info.isfile():
        raise NormalizeError(f"{name} in the saved image is not a file")
    return info


def _read_json(outer: tarfile.TarFile, name: str) -> object:
    handle = outer.extractfile(_member(outer, name))
    assert handle is not None
    return json.loads(handle.read())


# --- one added layer ----------------------------------------------------------------------------


def _dropped(name: str) -> bool:
    return "__pycache__" in PurePosixPath(name).parts


def normalize_layer(source: BinaryIO, out: BinaryIO, epoch: int) -> None:
    """Rewrite one layer tar (seekable *source*) canonically into *out*."""
    with tarfile.open(fileobj=source, mode="r:") as layer:
        latest: dict[str, tarfile.TarInfo] = {}
        for info in layer.getmembers():
            latest[info.name.rstrip("/")] = info  # a later entry of one name replaces an earlier one
        kept = {name: info for name, info in latest.items() if not _dropped(name)}

        # Hard links: the first name in sorted order must hold the data, the others link to it.
        data_of: dict[str, tarfile.TarInfo] = {}
        groups: dict[str, list[str]] = {}
        for name, info in kept.items():
            if info.islnk():
                root = info.linkname.rstrip("/")
                seen = set()
                while root in latest and latest[root].islnk() and root not in seen:
                    seen.add(root)
                    root = latest[root].linkname.rstrip("/")
                if root not in latest or not latest[root].isfile():
                    continue  # a link to something not in this layer: left as it is
                groups.setdefault(root, [root] if root in kept else []).append(name)
                data_of[root] = latest[root]
        holder: dict[str, str] = {}
        group_of: dict[str, str] = {}
        for root, names in groups.items():
            first = min(names, key=_sort_key)
            for name in names:
                holder[name], group_of[name] = first, root

        with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as writer:
            for name in sorted(kept, key=_sort_key):
                original = kept[name]
                info = _clean_header(original, epoch)
                data: IO[bytes] | None = None
                group = group_of.get(name)
                if group is not None:
                    source_info = data_of[group]
                    if holder[name] == name:
                        info.type, info.linkname = tarfile.REGTYPE, ""
                        info.size = source_info.size
                        info.mode = source_info.mode
                        data = layer.extractfile(source_info)
                    else:
                        info.type, info.linkname, info.size = tarfile.LNKTYPE, holder[name], 0
                elif original.isfile():
                    data = layer.extractfile(original)
                writer.addfile(info, data)


def _sort_key(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def _clean_header(original: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(original.name)
    info.type, info.linkname, info.size, info.mode = original.type, original.linkname, original.size, original.mode
    info.devmajor, info.devminor = original.devmajor, original.devminor
    info.mtime = int(min(int(original.mtime), epoch))
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.pax_headers = dict(sorted((k, v) for k, v in original.pax_headers.items() if k not in _DROPPED_PAX))
    if not (original.isfile() or original.islnk()):
        info.size = 0
    return info


# --- the archive ------------------------------------------------------------------------------


def normalize_image(
    archive: str | os.PathLike[str] | BinaryIO,
    dest: str | os.PathLike[str],
    *,
    base_diff_ids: Sequence[str],
    epoch: int,
    base_history: int | None = None,
    tags: Sequence[str] | None = None,
) -> NormalizeResult:
    """Rewrite the ``docker save`` *archive* (path or stream) into *dest*, a ``docker load``-able tar.

    *base_diff_ids* are the base image's ``RootFS.Layers``: the archive's first layers must be exactly
    these, and they are copied unchanged. *base_history* is the number of history entries of the base
    image (``len(client.api.history(base))``): with it, the base's own trailing empty-layer entries
    (``CMD``, ``ENV``) keep their timestamps; without it, every entry after the base's last layer gets
    the epoch. Returns the new image ID.
    """
    dest = Path(dest)
    work = Path(tempfile.mkdtemp(prefix=".envbuild-normalize-", dir=dest.parent))
    try:
        if isinstance(archive, (str, os.PathLike)):
            src_path = Path(archive)
        else:
            src_path = work / "input.tar"
            with open(src_path, "wb") as spool:
                shutil.copyfileobj(archive, spool, _CHUNK)
        with tarfile.open(src_path, mode="r:") as outer:
            result = _rewrite(outer, dest, work, list(base_diff_ids), epoch, base_history, tags)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _rewrite(
    outer: tarfile.TarFile,
    dest: Path,
    work: Path,
    base: list[str],
    epoch: int,
    base_history: int | None,
    tags: Sequence[str] | None,
) -> NormalizeResult:
    names = set(outer.getnames())
    layout: Literal["docker-save", "oci"] = "oci" if {"index.json", "oci-layout"} <= names else "docker-save"
    manifest = _read_json(outer, "manifest.json")
    if not isinstance(manifest, list) or len(manifest) != 1:
        raise NormalizeError("manifest.json must describe exactly one image (save one image at a time)")
    entry = manifest[0]
    config = _read_json(outer, entry["Config"])
    assert isinstance(config, dict)
    layer_paths: list[str] = entry["Layers"]
    diff_ids: list[str] = list(config.get("rootfs", {}).get("diff_ids", []))
    if len(diff_ids) != len(layer_paths):
        raise NormalizeError(f"the config lists {len(diff_ids)} layers, manifest.json {len(layer_paths)}")
    if diff_ids[: len(base)] != base:
        raise NormalizeError(
            "the image's first layers are not the base image's: it was not built on "
            f"the pinned base (expected {len(base)} base layers)"
        )

    new_ids: list[str] = list(base)
    rewritten: list[Path] = []
    for index in range(len(base), len(layer_paths)):
        target = work / f"layer-{index}.tar"
        source = outer.extractfile(_member(outer, layer_paths[index]))
        assert source is not None
        with open(target, "wb") as out:
            normalize_layer(source, out, epoch)  # type: ignore[arg-type]
        new_ids.append("sha256:" + sha256_file(target))
        rewritten.append(target)

    config = normalize_config(config, new_ids, base_layers=len(base), epoch=epoch, base_history=base_history)
    config_bytes = canonical_json(config)
    image_id = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    repo_tags = tuple(tags if tags is not None else entry.get("RepoTags") or ())

    layers: list[tuple[str, tarfile.TarInfo | Path]] = []
    for index, diff_id in enumerate(new_ids):
        layers.append(
            (diff_id, _member(outer, layer_paths[index]) if index < len(base) else rewritten[index - len(base)])
        )
    with (
        atomic_output(dest, durable=False) as raw,
        tarfile.open(fileobj=raw, mode="w:", format=tarfile.PAX_FORMAT) as writer,
    ):
        sink = _Writer(writer, outer, epoch)
        if layout == "oci":
            _write_oci(sink, layers, config_bytes, image_id, repo_tags)
        else:
            _write_legacy(sink, layers, config_bytes, image_id, repo_tags)
    return NormalizeResult(image_id, layout, tuple(new_ids), len(base), repo_tags)


def normalize_config(
    config: dict, diff_ids: Sequence[str], *, base_layers: int, epoch: int, base_history: int | None = None
) -> dict:
    """The config with build-time noise removed; pure."""
    config = json.loads(json.dumps(config))
    created = rfc3339(epoch)
    config["created"] = created
    for key in ("container", "container_config", "docker_version"):
        config.pop(key, None)
    inner = config.get("config")
    if isinstance(inner, dict):
        inner.pop("Image", None)
        inner.pop("Hostname", None)
    config.setdefault("rootfs", {"type": "layers"})["diff_ids"] = list(diff_ids)
    history = config.get("history") or []
    # The builder's history starts after the entry that made the last base layer.
    seen, first_added = 0, 0
    for index, item in enumerate(history):
        if seen == base_layers:
            first_added = index
            break
        if not item.get("empty_layer"):
            seen += 1
    else:
        first_added = len(history)
    if base_history is not None:
        if base_history < first_added:
            raise NormalizeError(
                f"the base image has {base_history} history entries, fewer than its {base_layers} layers need"
            )
        first_added = base_history
    for item in history[first_added:]:
        item["created"] = created
    return config


class _Writer:
    """Adds files to the output archive with fixed headers."""

    def __init__(self, writer: tarfile.TarFile, outer: tarfile.TarFile, epoch: int) -> None:
        self.writer, self.outer, self.epoch = writer, outer, epoch
        self.dirs: set[str] = set()

    def _info(self, name: str, size: int, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.size, info.type, info.mtime = size, kind, self.epoch
        info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
        return info

    def directory(self, name: str) -> None:
        parts = name.split("/")
        for depth in range(1, len(parts) + 1):
            path = "/".join(parts[:depth])
            if path not in self.dirs:
                self.dirs.add(path)
                self.writer.addfile(self._info(path, 0, tarfile.DIRTYPE))

    def data(self, name: str, payload: bytes) -> None:
        self.writer.addfile(self._info(name, len(payload)), io.BytesIO(payload))

    def layer(self, name: str, layer: tarfile.TarInfo | Path) -> int:
        if isinstance(layer, Path):
            size = layer.stat().st_size
            with open(layer, "rb") as handle:
                self.writer.addfile(self._info(name, size), handle)
        else:
            size = layer.size
            self.writer.addfile(self._info(name, size), self.outer.extractfile(layer))
        return size


def _write_legacy(
    out: _Writer, layers: list[tuple[str, tarfile.TarInfo | Path]], config: bytes, image_id: str, tags: Sequence[str]
) -> None:
    chain = chain_ids([diff for diff, _ in layers])
    paths = []
    for index, ((_, layer), layer_id) in enumerate(zip(layers, chain)):
        hex_id = layer_id.split(":", 1)[1]
        out.directory(hex_id)
        out.data(f"{hex_id}/VERSION", b"1.0")
        legacy = {"id": hex_id, **({"parent": chain[index - 1].split(":", 1)[1]} if index else {})}
        out.data(f"{hex_id}/json", canonical_json(legacy))
        out.layer(f"{hex_id}/layer.tar", layer)
        paths.append(f"{hex_id}/layer.tar")
    config_name = image_id.split(":", 1)[1] + ".json"
    out.data(config_name, config)
    out.data("manifest.json", canonical_json([{"Config": config_name, "RepoTags": list(tags), "Layers": paths}]))
    if tags and chain:
        out.data("repositories", canonical_json(_repositories(tags, chain[-1].split(":", 1)[1])))


def _write_oci(
    out: _Writer, layers: list[tuple[str, tarfile.TarInfo | Path]], config: bytes, image_id: str, tags: Sequence[str]
) -> None:
    out.directory("blobs/sha256")
    descriptors: list[dict[str, Any]] = []
    paths: list[str] = []
    written: set[str] = set()
    for diff_id, layer in layers:
        hex_id = diff_id.split(":", 1)[1]
        if hex_id not in written:
            size = out.layer(f"blobs/sha256/{hex_id}", layer)
            written.add(hex_id)
        else:
            size = next(d["size"] for d in descriptors if d["digest"] == diff_id)
        descriptors.append({"mediaType": OCI_LAYER, "digest": diff_id, "size": size})
        paths.append(f"blobs/sha256/{hex_id}")
    config_hex = image_id.split(":", 1)[1]
    out.data(f"blobs/sha256/{config_hex}", config)
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": image_id, "size": len(config)},
            "layers": descriptors,
        }
    )
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    out.data(f"blobs/sha256/{manifest_digest.split(':', 1)[1]}", manifest)
    index_entries = [
        {
            "mediaType": OCI_MANIFEST,
            "digest": manifest_digest,
            "size": len(manifest),
            **(
                {
                    "annotations": {
                        "io.containerd.image.name": tag,
                        "org.opencontainers.image.ref.name": tag.rsplit(":", 1)[-1],
                    }
                }
                if tag
                else {}
            ),
        }
        for tag in (tags or [""])
    ]
    out.data(
        "index.json",
        canonical_json(
            {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": index_entries}
        ),
    )
    out.data(
        "manifest.json",
        canonical_json([{"Config": f"blobs/sha256/{config_hex}", "RepoTags": list(tags), "Layers": paths}]),
    )
    out.data("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}))
    if tags and layers:
        out.data("repositories", canonical_json(_repositories(tags, layers[-1][0].split(":", 1)[1])))


def _repositories(tags: Sequence[str], top: str) -> dict[str, dict[str, str]]:
    repos: dict[str, dict[str, str]] = {}
    for tag in tags:
        repo, _, name = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
        repos.setdefault(repo, {})[name] = top
    return repos
