"""Long transfers to and from the container engine, as a person follows them: byte counts with a total,
one line at most every few seconds; build contexts produced as tar chunks on demand (never a whole
temporary tar); a push's per-layer events turned into a few lines. Used by :mod:`envbuild.engine`."""

from __future__ import annotations

import stat
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.progress import Progress

REPORT_EVERY = 5.0  # seconds between two progress lines of one long transfer


def human_bytes(count: float) -> str:
    """``1.21 GB``, ``312 MB``, ``4.1 kB`` (powers of 1000, as docker prints sizes)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= scale:
            return f"{count / scale:.3g} {unit}" if count < 100 * scale else f"{count / scale:.0f} {unit}"
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


def directory_context(root: Path) -> ContextStream:
    """A directory as a build context: every entry under it, sorted, with its own mode and mtime,
    owner 0:0 and no owner names (what the legacy builder's COPY keeps of a header is mode and mtime)."""
    entries = sorted(p for p in root.rglob("*"))
    payload = sum(p.lstat().st_size for p in entries if p.is_file() and not p.is_symlink())

    def chunks() -> Iterator[bytes]:
        sink = TarSink()
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for path in entries:
                info = tar.gettarinfo(str(path), path.relative_to(root).as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if stat.S_ISREG(path.lstat().st_mode):
                    with open(path, "rb") as data:
                        tar.addfile(info, data)
                else:
                    tar.addfile(info)
                yield from sink.drain()
        yield from sink.drain()

    return ContextStream(chunks, payload)


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


class PushProgress:
    """Turns the engine's push events (per layer: Preparing, Waiting, Pushing with bytes, Pushed, Layer
    already exists, Mounted from) into a few lines."""

    def __init__(self, say: Progress, name: str) -> None:
        self.say, self.name = say, name
        self.layers: dict[str, str] = {}  # layer id -> its last status
        self.sizes: dict[str, int] = {}
        self.sent: dict[str, int] = {}
        self.last = time.monotonic()

    def event(self, event: dict[str, Any]) -> None:
        layer, status = event.get("id"), str(event.get("status", ""))
        if not layer or not status or status.startswith(("The push refers", f"{self.name.rsplit(':', 1)[-1]}:")):
            return
        previous = self.layers.get(layer)
        self.layers[layer] = status
        detail = event.get("progressDetail") or {}
        if status == "Pushing" and detail.get("total"):
            self.sizes[layer], self.sent[layer] = int(detail["total"]), int(detail.get("current", 0))
            now = time.monotonic()
            if now - self.last >= REPORT_EVERY:
                self.last = now
                self.say(
                    f"push {self.name}: {human_bytes(sum(self.sent.values()))} of "
                    f"{human_bytes(sum(self.sizes.values()))} sent ({self._done()} of {len(self.layers)} layers done)"
                )
        elif status != previous and (status in ("Pushed", "Layer already exists") or status.startswith("Mounted from")):
            if layer in self.sizes:
                self.sent[layer] = self.sizes[layer]
            size = f" ({human_bytes(self.sizes[layer])})" if layer in self.sizes else ""
            what = "sent" if status == "Pushed" else status[0].lower() + status[1:]
            self.say(f"push {self.name}: layer {layer} {what}{size}, {self._done()} of {len(self.layers)} done")

    def _done(self) -> int:
        return sum(
            1 for s in self.layers.values() if s in ("Pushed", "Layer already exists") or s.startswith("Mounted")
        )

    def summary(self) -> str:
        sent = sum(1 for s in self.layers.values() if s == "Pushed")
        return (
            f"{len(self.layers)} layers, {sent} sent ({human_bytes(sum(self.sizes.values()))}), "
            f"{len(self.layers) - sent} already in the registry"
        )
