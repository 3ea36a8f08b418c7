"""The engine's images and its storage: inspect, list, save and load, tag, remove, push and pull (each
layer said once, the bytes while they move), the disk usage and BuildKit's cache."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import docker.errors

from envbuild.data.reference import split_reference, split_tag
from envbuild.engine.calls import CHUNK, EngineBase, chunks_of, engine_errors, event_error
from envbuild.engine.transfer import LayerProgress, Meter, Pulled
from envbuild.errors import EngineError
from envbuild.progress import Progress, silent

DF_WAIT = 60.0  # seconds to wait for another caller's `docker system df`, which the engine runs alone
DF_BUSY = "a disk usage operation is already running"


class Images(EngineBase):
    """:class:`~envbuild.engine.client.Engine`'s images and storage."""

    def inspect(self, ref: str) -> dict[str, Any] | None:
        """The image's inspect data, or None when the engine does not have it."""
        with engine_errors(f"inspect {ref}", self.address):
            try:
                return self.api.inspect_image(ref)
            except docker.errors.ImageNotFound:
                return None

    def history(self, ref: str) -> list[dict[str, Any]]:
        """The image's history as the engine reports it: newest entry first, each with the ``Id`` of
        the image that made it when the engine still has that image (else ``<missing>``)."""
        with engine_errors(f"history of {ref}", self.address):
            return list(self.api.history(ref))

    def images(self, *, name: str | None = None, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The engine's images (leaves only, as ``docker images`` lists them), by repository or filters."""
        with engine_errors("list images", self.address):
            return list(self.api.images(name=name, filters=filters))

    def disk_usage(self) -> dict[str, Any]:
        """``docker system df``: the engine's layers' size, images and build cache. The engine runs one at
        a time and refuses a second meanwhile (``a disk usage operation is already running``): another
        build tidying the same engine; that one is waited for (:data:`DF_WAIT`), then asked again."""
        deadline = time.monotonic() + DF_WAIT
        while True:
            try:
                with engine_errors("disk usage", self.address):
                    return dict(self.api.df())
            except EngineError as exc:
                if DF_BUSY not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def save_stream(self, ref: str, progress: Progress = silent, what: str | None = None) -> Iterator[bytes]:
        """``docker save`` of one image, as chunks, counted in ``progress``. The engine has no way to save
        part of an image: every layer, the base's too, is read and sent."""
        image = self.inspect(ref)
        meter = Meter(progress, what or f"docker save {ref}", (image or {}).get("Size"))
        with engine_errors(f"save {ref}", self.address):
            yield from meter.wrap(self.api.get_image(ref, chunk_size=CHUNK))

    def save(self, ref: str, dest: Path, progress: Progress = silent) -> None:
        with open(dest, "wb") as out:
            out.writelines(self.save_stream(ref, progress))

    def load(self, archive: Path | Iterable[bytes], progress: Progress = silent) -> list[str]:
        """Load a ``docker save`` archive (a file or chunks); the image IDs the engine reports. A layer
        the engine already has (the same chain of layers) is not read: an archive may name such layers in
        its manifest without carrying them."""
        name = str(archive) if isinstance(archive, Path) else "an image archive"
        meter = Meter(progress, "sent to docker load")
        loaded: list[str] = []
        with engine_errors(f"load {name}", self.address):
            for event in self.api.load_image(meter.wrap(chunks_of(archive))):
                if "error" in event:
                    raise EngineError(f"load {name}: {event['error']}")
                for line in str(event.get("stream", "")).splitlines():
                    if line.startswith("Loaded image ID: "):
                        loaded.append(line.split(": ", 1)[1].strip())
                    elif line.startswith("Loaded image: "):
                        loaded.append(self.api.inspect_image(line.split(": ", 1)[1].strip())["Id"])
        return loaded

    def tag(self, image: str, name: str) -> None:
        repository, tag = split_tag(name)
        with engine_errors(f"tag {name}", self.address):
            if not self.api.tag(image, repository, tag):
                raise EngineError(f"tag {name}: the engine refused the tag")

    def remove(self, ref: str, *, force: bool = False) -> bool:
        """Remove an image or a tag (an image that loses its last tag goes, with its untagged parents);
        False when it was not there."""
        with engine_errors(f"remove {ref}", self.address):
            try:
                self.api.remove_image(ref, force=force)
            except docker.errors.ImageNotFound:
                return False
        return True

    def push(self, name: str, progress: Progress = silent) -> str:
        """Push ``repository:tag`` with the docker config's credentials; returns the manifest digest.
        Progress: each layer once when it is done (sent, already in the registry, or mounted from another
        repository) and, while layers are sent, the bytes sent of their total."""
        repository, tag = split_tag(name)
        digest = None
        push = LayerProgress(progress, "push", name)
        with engine_errors(f"push {name}", self.address):
            for event in self.api.push(repository, tag, stream=True, decode=True):
                if (message := event_error(event)) is not None:
                    raise EngineError(f"push {name}: {message}")
                push.event(event)
                digest = (event.get("aux") or {}).get("Digest", digest)
        if digest is None:
            raise EngineError(f"push {name}: the registry reported no manifest digest")
        progress(f"pushed {name} ({digest}): {push.summary()}")
        return digest

    def distribution(self, name: str) -> tuple[str, tuple[str, ...]]:
        """What the registry serves for ``name`` now: its manifest digest (an index's, for a
        multi-platform image) and the platforms it has images for (``linux/arm64``, …), pulling nothing."""
        with engine_errors(f"registry data of {name}", self.address):
            data = self.api.inspect_distribution(name)
        platforms = tuple(
            f"{p.get('os') or p.get('OS')}/{p.get('architecture') or p.get('Architecture')}"
            for p in data.get("Platforms") or ()
        )
        return str(data["Descriptor"]["digest"]), platforms

    def pull(self, reference: str, progress: Progress = silent, *, platform: str | None = None) -> Pulled:
        """Pull ``repository@sha256:…`` (or ``repository:tag``) with the docker config's credentials, each
        layer said when it is fetched and the bytes while they come; returns the image ID and what was
        fetched. ``platform`` (``linux/arm64``) picks that variant of a multi-platform index, instead of
        the engine's own."""
        pull = LayerProgress(progress, "pull", reference)
        name, tag, digest = split_reference(reference)
        repository, tag = name, digest or tag or "latest"
        with engine_errors(f"pull {reference}", self.address):
            for event in self.api.pull(repository, tag, stream=True, decode=True, platform=platform):
                if (message := event_error(event)) is not None:
                    raise EngineError(f"pull {reference} on {self.address}: {message}")
                pull.event(event)
            image_id = self.api.inspect_image(reference)["Id"]
        progress(f"pulled {reference} on {self.address}: {pull.summary()}")
        fetched, fetched_bytes = pull.fetched()
        return Pulled(str(image_id), len(pull.layers), fetched, fetched_bytes)

    def machine(self) -> str:
        """The engine host's machine name, as the engine reports it (``x86_64``, ``aarch64``)."""
        return str(self._host_info.get("Architecture") or "")

    def memory_bytes(self) -> int:
        """The engine host's memory, as the engine reports it."""
        return int(self._host_info.get("MemTotal") or 0)

    @cached_property
    def _host_info(self) -> dict[str, Any]:
        """``docker info``, asked once for this object (the host's machine and memory do not change)."""
        with engine_errors("info", self.address):
            return dict(self.api.info())

    def prune_build_cache(self, keep_storage: int, *, everything: bool = False) -> int:
        """Prune BuildKit's cache down to ``keep_storage`` bytes (what it reports it reclaimed); with
        ``everything``, every record not in use, BuildKit's own too (``docker builder prune -af``). The
        cache is a store of its own: removing images does not shrink it."""
        params = {"keep-storage": str(keep_storage), **({"all": "1"} if everything else {})}
        with engine_errors("prune the build cache", self.address):
            answer = self.api._result(self.api._post(self.api._url("/build/prune"), params=params), True)
        return int(answer.get("SpaceReclaimed") or 0)

    def build_cache_size(self, *, in_use: bool = True) -> int:
        """Bytes BuildKit's cache holds of its own, as ``docker system df``'s "Build Cache" and BuildKit's
        prune count them: a record shared with an image (its layers) is the image's, and never pruned.
        Without ``in_use``, only what a prune can take now: a record in use is a running build's, or one
        the engine never let go (seen on docker 20.10: 21 records of builds long ended, 39 MB, still in use
        after three runs of the test suite; a restart of dockerd let them go)."""
        records = self.disk_usage().get("BuildCache") or []
        return sum(
            int(entry.get("Size") or 0)
            for entry in records
            if not entry.get("Shared") and (in_use or not entry.get("InUse"))
        )
