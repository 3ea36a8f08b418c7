"""Normalising a built image without reading its layers: only its config is rewritten.

The build's layers are already the same bytes on every build (:mod:`.render`), so the normalised image
shares every layer with the raw one: :func:`normalise` reads what the engine says about the raw image
(``inspect``; its history; where a base was built locally by the legacy builder, its parent chain,
which tells which entries made a layer), composes the canonical config (:mod:`.normalised_config`) and loads it with a manifest that names the
layers without carrying them. Its cost does not grow with the base: no ``docker save``, no layer read or
written, no second copy of any layer in the engine.

:func:`save_added_layers` is the one place that saves an image (for ``envbuild check`` to explain a
difference): the engine can only save all of it, but the base's layers are dropped from the archive.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envbuild.engine.calls import short
from envbuild.engine.client import Engine
from envbuild.errors import EngineError
from envbuild.image.normalised_config import (
    HistoryEntry,
    canonical_config,
    extend_config,
    files_layer,
    image_id,
    load_archive,
    removal_layer,
    settle_empty,
)
from envbuild.image.plan import DISTRO_REMOVED_LABEL, IMAGE_META, LOCK_NAME_LABEL
from envbuild.image.render import PACKAGES_EPOCH
from envbuild.progress import Progress


@dataclass(frozen=True)
class CanonicalImage:
    image_id: str
    diff_ids: tuple[str, ...]


def settled_history(engine: Engine, ref: str) -> tuple[dict[str, Any], list[HistoryEntry]]:
    """``inspect`` of ``ref`` and its history, oldest first, every entry marked empty or not: where the
    engine keeps the parent chain (each build step's image), by the layers each step added; below it (the
    base, or an image envbuild loaded), settled by :func:`settle_empty`."""
    top = _inspect(engine, ref)
    entries = [
        HistoryEntry(
            int(h.get("Created") or 0), h.get("CreatedBy") or "", h.get("Comment") or "", int(h.get("Size") or 0), None
        )
        for h in reversed(engine.history(ref))
    ]
    index, image = len(entries) - 1, top
    while image.get("Parent") and index >= 0:
        parent = _inspect(engine, image["Parent"])
        entries[index] = replace(
            entries[index], empty=len(image["RootFS"]["Layers"]) == len(parent["RootFS"]["Layers"])
        )
        index, image = index - 1, parent
    below = settle_empty(entries[: index + 1], len(image["RootFS"]["Layers"]))
    return top, below + entries[index + 1 :]


def _inspect(engine: Engine, ref: str) -> dict[str, Any]:
    found = engine.inspect(ref)
    if found is None:
        raise EngineError(f"the engine has no {ref} any more (removed while the build ran?); build again")
    return found


def _load(
    engine: Engine, config: dict[str, Any], say: Progress, added: tuple[AddedLayer, ...], epoch: int
) -> tuple[str, dict[str, Any]]:
    """Load ``config`` with the ``added`` layers on top (carried in the load: a few kilobytes): the image
    ID, the computed one, and its config."""
    for layer in added:
        config = extend_config(config, layer.diff_id, layer.created_by, epoch)
    expected = image_id(config)
    if engine.inspect(expected) is None:
        loaded = engine.load([load_archive(config, layers={layer.diff_id: layer.tar for layer in added})], say)
        if expected not in loaded and engine.inspect(expected) is None:
            raise EngineError(f"docker load gave {', '.join(loaded) or 'no image'}, not the computed {expected}")
    return expected, config


@dataclass(frozen=True)
class AddedLayer:
    """A layer envbuild wrote itself (its tar's bytes), put on top at normalising, and what made it."""

    tar: bytes
    created_by: str

    @property
    def diff_id(self) -> str:
        return "sha256:" + hashlib.sha256(self.tar).hexdigest()


def normalise(
    engine: Engine, raw_id: str, base: str, epoch: int, say: Progress, added: tuple[AddedLayer, ...] = ()
) -> CanonicalImage:
    """Load the canonical config of the raw image ``raw_id`` built on ``base`` (its layers shared), with
    the ``added`` layers on top (carried in the load: a few kilobytes)."""
    inspect, history = settled_history(engine, raw_id)
    config = canonical_config(inspect, history, base_entries=len(engine.history(base)), epoch=epoch)
    normalised, config = _load(engine, config, say, added, epoch)
    written = f"the config and {len(added)} small layer{'s' * (len(added) > 1)}" if added else "the config"
    say(f"normalised {raw_id[:19]} → {normalised[:19]} ({written} only: every built layer is shared)")
    return CanonicalImage(normalised, tuple(config["rootfs"]["diff_ids"]))


def meta_layer(parents: Mapping[str, tarfile.TarInfo], files: dict[str, bytes], epoch: int) -> AddedLayer:
    """The in-image check's files (``files``: the manifest, the probe, the requirements) as the layer
    :data:`IMAGE_META` on top of the raw image: written here, not by a build step (a step costs a
    container, and a stage BuildKit must commit before a ``COPY`` reads it), its parents kept as the raw
    image has them (``parents``: :data:`META_PARENTS` as the in-image check reports them)."""
    layer = files_layer(parents, IMAGE_META, files, epoch)
    return AddedLayer(layer, f"envbuild: the in-image check's files in {IMAGE_META}")


def load_packages_image(
    engine: Engine,
    base: str,
    built: str,
    lock_name: str,
    packages: int,
    report: dict[str, Any],
    tag: str,
    say: Progress,
    tools_layers: tuple[str, ...] = (),
    installer: str = "pip",
) -> str:
    """The packages image: the base's canonical config with the layers of ``built`` (the packages step's
    image, by its tag or ID) on top (``tools_layers`` names each layer below the install's: BuildKit's
    tools layer; none for an image built without one; ``installer`` what installed them, as history says) and,
    when the base holds distributions the lock replaces, a layer removing their files (whiteouts at the
    packages epoch, written here: a removal the engine makes carries the clock's time); tagged ``tag``.
    Its ID depends only on the base, what pip wrote and what was removed."""
    inspect, history = settled_history(engine, base)
    config = canonical_config(inspect, history, base_entries=len(history), epoch=PACKAGES_EPOCH)
    # The lock's name label, as every image envbuild makes for the lock carries (the image sets it too):
    # the engine's tidying finds it by that (retention).
    config["config"]["Labels"] = {**(config["config"].get("Labels") or {}), LOCK_NAME_LABEL: lock_name}
    if report.get("distro"):  # what of the distro's own Python the lock replaced: shown by inspect, in the record
        config["config"]["Labels"][DISTRO_REMOVED_LABEL] = json.dumps(report["distro"], sort_keys=True)
    layers = _inspect(engine, built)["RootFS"]["Layers"]
    install = f"envbuild: install the lock's {packages} package files ({installer}, no index)"
    added = (*tools_layers, install)
    below = config["rootfs"]["diff_ids"]
    if layers[: len(below)] != below or len(layers) != len(below) + len(added):
        raise EngineError(
            f"the packages image {short(built)} is not {len(added)} layer(s) on {base}: {len(layers) - len(below)}"
        )
    for diff_id, created_by in zip(layers[len(below) :], added, strict=True):
        config = extend_config(config, diff_id, created_by, PACKAGES_EPOCH)
    removal: tuple[AddedLayer, ...] = ()
    if report["remove"]:
        layer = removal_layer(report["remove"], report["directories"], PACKAGES_EPOCH)
        removal = (AddedLayer(layer, f"envbuild: remove the base's own {', '.join(report['replaced'])}"),)
    loaded, _ = _load(engine, config, say, removal, PACKAGES_EPOCH)
    engine.tag(loaded, tag)
    return loaded


def save_added_layers(engine: Engine, ref: str, dest: Path, skip: set[str], say: Progress) -> Path:
    """``docker save`` of ``ref`` into ``dest`` without the layers in ``skip`` (the base's diff IDs):
    the manifest still names them, so the archive loads where the base is. Scratch: one layer at most,
    spooled beside ``dest`` while its digest is computed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    spool_dir = Path(tempfile.mkdtemp(prefix=".envbuild-save-", dir=dest.parent))
    try:
        with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as out:
            stream = io.BufferedReader(
                _Reader(engine.save_stream(ref, say, f"saving {ref[:19]} (the engine reads every layer)")), 1 << 20
            )
            with tarfile.open(fileobj=stream, mode="r|") as saved:
                for member in saved:
                    data = saved.extractfile(member) if member.isfile() else None
                    if data is None:
                        out.addfile(member)
                        continue
                    if member.name.startswith("blobs/sha256/") and f"sha256:{member.name.rsplit('/', 1)[1]}" in skip:
                        continue
                    spool = spool_dir / "member"
                    digest = hashlib.sha256()
                    with open(spool, "wb") as held:
                        while chunk := data.read(1 << 20):
                            digest.update(chunk)
                            held.write(chunk)
                    if member.name.endswith("layer.tar") and f"sha256:{digest.hexdigest()}" in skip:
                        continue
                    with open(spool, "rb") as held:
                        out.addfile(member, held)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(spool_dir, ignore_errors=True)
    return dest


class _Reader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (for tarfile's stream mode)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.rest = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.rest:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.rest = memoryview(chunk)
        count = min(len(buffer), len(self.rest))
        buffer[:count], self.rest = self.rest[:count], self.rest[count:]
        return count
