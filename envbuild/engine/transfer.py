"""Long transfers to and from the container engine, as a person follows them: byte counts with a total,
one line at most every few seconds; build contexts produced as tar chunks on demand (never a whole
temporary tar); a push's per-layer events turned into a few lines. Used by :mod:`envbuild.engine.client`."""

from __future__ import annotations

import stat
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.data.jsonout import json_meta
from envbuild.progress import Progress

REPORT_EVERY = 5.0  # seconds between two progress lines of one long transfer
STEP_HEARTBEAT = 30.0  # seconds a build step runs before its progress says it still does, and between two such lines
LOG_TAIL = 20


def human_bytes(count: float) -> str:
    """``1.21 GB``, ``31.2 MB``, ``312 MB``, ``4.10 kB``: three digits (powers of 1000, as docker prints
    sizes)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= scale:
            value = count / scale
            return f"{value:.{2 if value < 10 else 1 if value < 100 else 0}f} {unit}"
    return f"{int(count)} B"


class Meter:
    """Counts the bytes of one long transfer and says how far it is: at most one line every
    ``every`` seconds while it runs, and one when it is done (never a line per chunk)."""

    def __init__(self, say: Progress, what: str, total: int | None = None, every: float = REPORT_EVERY) -> None:
        self.say, self.what, self.total, self.every = say, what, total, every
        self.count, self.start = 0, time.monotonic()
        self.last = self.start

    def add(self, count: int) -> None:
        self.count += count
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            of = f" of {human_bytes(self.total)}" if self.total else ""
            self.say(f"{self.what}: {human_bytes(self.count)}{of} ({now - self.start:.0f} s)")

    def done(self, detail: str = "") -> None:
        seconds = time.monotonic() - self.start
        self.say(f"{self.what}: {human_bytes(self.count)} in {seconds:.1f} s{detail}")

    def wrap(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self.add(len(chunk))
            yield chunk
        self.done()


@dataclass(frozen=True)
class ContextStream:
    """A build context as tar chunks made on demand, and the bytes of the files in it (for progress)."""

    chunks: Callable[[], Iterator[bytes]]
    payload: int
    # The same context as a directory, for the docker CLI's transport: one that already is (``directory``),
    # or how to write it into an empty one (``write_to``).
    directory: Path | None = None
    write_to: Callable[[Path], None] | None = None


def directory_context(root: Path) -> ContextStream:
    """A directory as a build context: every entry under it, sorted, with its own mode and mtime,
    owner 0:0 and no owner names."""
    entries = sorted(p for p in root.rglob("*"))
    payload = sum(p.lstat().st_size for p in entries if p.is_file() and not p.is_symlink())

    def chunks() -> Iterator[bytes]:
        sink = TarSink()
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for path in entries:
                info = tar.gettarinfo(str(path), path.relative_to(root).as_posix())
                # Whole seconds: a fractional mtime needs a PAX header, and BuildKit takes a body whose
                # first member has one for a Dockerfile, not a tar (what COPY keeps is whole seconds).
                info.mtime = int(info.mtime)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if stat.S_ISREG(path.lstat().st_mode):
                    with open(path, "rb") as data:
                        tar.addfile(info, data)
                else:
                    tar.addfile(info)
                yield from sink.drain()
        yield from sink.drain()

    return ContextStream(chunks, payload, directory=root)


class TarSink:
    """A write-only file object that keeps what ``tarfile`` writes until it is drained: lets a tar be
    produced chunk by chunk for a streaming upload."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def drain(self) -> Iterator[bytes]:
        parts, self.parts = self.parts, []
        yield from parts


@dataclass(frozen=True)
class Pulled:
    """What a pull brought: the image, its layers, and how many of them (and bytes) came from the registry."""

    image_id: str
    layers: int
    fetched: int
    fetched_bytes: int = field(metadata=json_meta(key="bytes"))


class LayerProgress:
    """Turns the engine's per-layer events of a push or a pull (Waiting, Pushing/Downloading with bytes,
    then Pushed, Layer already exists, Mounted from / Pull complete, Already exists) into a few lines:
    each layer once when it is done, and while bytes move, how many of how many, every few seconds; each
    retry the engine counts down to (``Retrying in 5 seconds``: the registry failed the layer) once."""

    _MOVING = {"push": "Pushing", "pull": "Downloading"}
    _MOVED = {"push": ("Pushed",), "pull": ("Pull complete",)}
    _THERE = ("Layer already exists", "Already exists", "Mounted from")

    def __init__(self, say: Progress, verb: str, name: str) -> None:
        self.say, self.verb, self.name = say, verb, name
        self.layers: dict[str, str] = {}  # layer id -> its last status
        self.sizes: dict[str, int] = {}
        self.moved: dict[str, int] = {}
        self.last = time.monotonic()

    def _finished(self, status: str) -> bool:
        return status in self._MOVED[self.verb] or status.startswith(self._THERE)

    def event(self, event: dict[str, Any]) -> None:
        layer, status = event.get("id"), str(event.get("status", ""))
        if not layer or not status or status.startswith(("Pulling from", "Digest:", "Status:", "The push refers")):
            return  # lines about the repository or the tag, not a layer
        previous = self.layers.get(layer)
        if previous is not None and self._finished(previous):
            return
        self.layers[layer] = status
        if status.startswith("Retrying in"):  # the registry failed this layer; docker counts down to a retry
            if not (previous or "").startswith("Retrying in"):  # said once a countdown, not each second of it
                self.say(f"{self.verb} {self.name}: layer {layer} failed, the engine {status[0].lower()}{status[1:]}")
            return
        detail = event.get("progressDetail") or {}
        if status == self._MOVING[self.verb] and detail.get("total"):
            self.sizes[layer], self.moved[layer] = int(detail["total"]), int(detail.get("current", 0))
            now = time.monotonic()
            if now - self.last >= REPORT_EVERY:
                self.last = now
                self.say(
                    f"{self.verb} {self.name}: {human_bytes(sum(self.moved.values()))} of "
                    f"{human_bytes(sum(self.sizes.values()))} ({self._done()} of {len(self.layers)} layers done)"
                )
        elif self._finished(status):
            if layer in self.sizes:
                self.moved[layer] = self.sizes[layer]
            size = f" ({human_bytes(self.sizes[layer])})" if layer in self.sizes else ""
            what = "sent" if status == "Pushed" else "fetched" if status == "Pull complete" else status.lower()
            self.say(f"{self.verb} {self.name}: layer {layer} {what}{size}, {self._done()} of {len(self.layers)} done")

    def _done(self) -> int:
        return sum(1 for status in self.layers.values() if self._finished(status))

    def fetched(self) -> tuple[int, int]:
        """How many layers moved, and their bytes (what the registry sent or received)."""
        moved = [layer for layer, status in self.layers.items() if status in self._MOVED[self.verb]]
        return len(moved), sum(self.sizes.get(layer, 0) for layer in moved)

    def summary(self) -> str:
        moved = self.fetched()[0]
        where = "in the registry" if self.verb == "push" else "in the engine"
        return (
            f"{len(self.layers)} layers, {moved} {'sent' if self.verb == 'push' else 'fetched'} "
            f"({human_bytes(sum(self.sizes.values()))}), {len(self.layers) - moved} already {where}"
        )


@dataclass(frozen=True)
class BuildStep:
    number: int
    total: int
    instruction: str
    cached: bool
    seconds: float
