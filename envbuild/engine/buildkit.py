"""BuildKit's progress as the Engine API streams it, read without BuildKit's Go client.

``POST /build?version=2`` answers with JSON lines; the progress comes as ``{"id": "moby.buildkit.trace",
"aux": "<base64>"}``, each a protobuf ``StatusResponse`` of BuildKit's control API: ``vertexes = 1``
(``digest 1, inputs 2, name 3, cached 4, started 5, completed 6, error 7``), ``statuses = 2``, ``logs = 3``
(``vertex 1, timestamp 2, stream 3, msg 4``). The few fields read here need no protobuf library: a
wire-format reader of varints and length-delimited fields is enough. The image comes as ``{"id":
"moby.image.id", "aux": {"ID": ...}}``.

:class:`BuildKitProgress` turns the trace into one line per step (``cached`` or its seconds), a line while
a step runs long, and the failed step's log tail for the error. Pure but for the clock.
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from envbuild.engine.transfer import LOG_TAIL, STEP_HEARTBEAT, BuildStep
from envbuild.errors import EngineError
from envbuild.progress import Progress

TRACE_ID = "moby.buildkit.trace"
IMAGE_ID = "moby.image.id"
DONE_AFTER = 5.0  # seconds: a step that ran this long says when it is done too (its start was said)


class StepFailed(EngineError):
    """A step of the Dockerfile failed (its command exited non-zero, or BuildKit could not run it): what
    the build was given does not build, where a plain :class:`EngineError` is the engine's own failure.
    ``step``: the instruction as BuildKit names it (``[stage-2 3/7] RUN …``); ``log``: the last lines it printed."""

    def __init__(self, message: str, step: str, log: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.step, self.log = step, log


@dataclass(frozen=True)
class Vertex:
    digest: str
    name: str
    cached: bool
    started: bool
    completed: bool
    error: str


@dataclass(frozen=True)
class VertexLog:
    vertex: str
    data: bytes
    stream: int = 1  # 1 stdout, 2 stderr (the docker CLI's plain progress does not tell them apart)


@dataclass(frozen=True)
class Status:
    vertexes: tuple[Vertex, ...]
    logs: tuple[VertexLog, ...]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if at >= len(data):
            raise ValueError("a varint runs past the end of the message")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, at
        shift += 7


def fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message: an int for a varint, bytes otherwise."""
    out: list[tuple[int, int | bytes]] = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError("a field runs past the end of the message")
            value, at = data[at : at + size], at + size
        elif wire == 1:
            value, at = data[at : at + 8], at + 8
        elif wire == 5:
            value, at = data[at : at + 4], at + 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")
        out.append((number, value))
    return out


def _text(value: int | bytes | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""


def decode_status(aux: str) -> Status:
    """One trace event's ``aux`` as typed vertexes and logs; a malformed one is an :class:`EngineError`."""
    try:
        message = fields(base64.b64decode(aux, validate=True))
        vertexes, logs = [], []
        for number, value in message:
            if number == 1 and isinstance(value, bytes):
                v = dict(fields(value))
                vertexes.append(
                    Vertex(_text(v.get(1)), _text(v.get(3)), bool(v.get(4)), 5 in v, 6 in v, _text(v.get(7)))
                )
            elif number == 3 and isinstance(value, bytes):
                log = dict(fields(value))
                data, stream = log.get(4), log.get(3)
                logs.append(
                    VertexLog(
                        _text(log.get(1)),
                        data if isinstance(data, bytes) else b"",
                        stream if isinstance(stream, int) else 1,
                    )
                )
    except (ValueError, binascii.Error) as exc:
        raise EngineError(f"build: the engine sent a BuildKit trace that cannot be read: {exc}") from None
    return Status(tuple(vertexes), tuple(logs))


class BuildKitProgress:
    """BuildKit's trace as steps and lines. Steps are BuildKit's vertexes named for the Dockerfile's
    instructions (``[stage-2 3/7] RUN …``). Use as a context manager around reading the stream: a timer
    thread says when a step runs long."""

    def __init__(
        self,
        say: Progress,
        heartbeat: float = STEP_HEARTBEAT,
        *,
        keep_output: int = 0,
        step_started: threading.Event | None = None,
    ) -> None:
        self.say, self.heartbeat = say, heartbeat
        self.step_started = step_started  # set when the first step that is not from the cache starts
        self.keep_output = keep_output  # bytes of each step's stdout and stderr kept whole (:meth:`output`)
        self.image_id: str | None = None
        self._names: dict[str, str] = {}
        self._started: dict[str, float] = {}
        self._said: dict[str, float] = {}
        self._done: dict[str, BuildStep] = {}
        self._order: list[str] = []
        self._logs: dict[str, deque[str]] = {}
        self._partial: dict[str, str] = {}
        self._output: dict[tuple[str, int], bytearray] = {}
        self._failed: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="envbuild-buildkit-progress", daemon=True)

    def __enter__(self) -> BuildKitProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def steps(self) -> tuple[BuildStep, ...]:
        """The Dockerfile's instructions that ran or came from the cache, in the order BuildKit started
        them (stages run in parallel); BuildKit's own work (loading the context, resolving images) is not
        a step."""
        done = [self._done[d] for d in self._order if d in self._done and _numbered(self._done[d].instruction)]
        return tuple(BuildStep(i + 1, len(done), s.instruction, s.cached, s.seconds) for i, s in enumerate(done))

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat, 5.0)):
            now = time.monotonic()
            with self._lock:
                for digest, start in self._started.items():
                    if digest in self._done or now - self._said.get(digest, start) < self.heartbeat:
                        continue
                    self._said[digest] = now
                    tail = self._logs.get(digest)
                    last = f"; last output: {tail[-1].strip()[:80]}" if tail else ""
                    self.say(f"{_short(self._names[digest])}: still running after {now - start:.0f} s{last}")

    def event(self, event: dict[str, Any]) -> None:
        """One JSON line of the build stream."""
        aux = event.get("aux")
        if event.get("id") == IMAGE_ID and isinstance(aux, dict) and isinstance(aux.get("ID"), str):
            self.image_id = aux["ID"]
        elif event.get("id") == TRACE_ID and isinstance(aux, str):
            status = decode_status(aux)
            with self._lock:
                for vertex in status.vertexes:
                    self._vertex(vertex)
                for log in status.logs:
                    self._log(log)

    def vertex(self, vertex: Vertex) -> None:
        """One vertex's news from a trace read elsewhere (the docker CLI's plain progress)."""
        with self._lock:
            self._vertex(vertex)

    def log(self, log: VertexLog) -> None:
        with self._lock:
            self._log(log)

    def _vertex(self, vertex: Vertex) -> None:
        digest, now = vertex.digest, time.monotonic()
        if digest not in self._names:
            self._order.append(digest)
        self._names[digest] = vertex.name or self._names.get(digest, digest)
        if vertex.started and digest not in self._started:
            self._started[digest] = now
            if _numbered(self._names[digest]) and not vertex.cached:
                self.say(f"step {_short(self._names[digest])}")
                if self.step_started is not None:
                    self.step_started.set()
        if vertex.error:
            self._failed = digest
            return
        if (vertex.completed or vertex.cached) and digest not in self._done:
            seconds = round(now - self._started.get(digest, now), 3)
            self._done[digest] = BuildStep(0, 0, self._names[digest], vertex.cached, seconds)
            if _numbered(self._names[digest]) and (vertex.cached or seconds >= DONE_AFTER):
                self.say(
                    f"step {_short(self._names[digest])}: {'cached' if vertex.cached else f'done in {seconds:.1f} s'}"
                )

    def _log(self, log: VertexLog) -> None:
        if self.keep_output:
            kept = self._output.setdefault((log.vertex, log.stream), bytearray())
            if len(kept) + len(log.data) > self.keep_output:
                raise EngineError(f"build: a step printed more than {self.keep_output} bytes, more than is kept")
            kept += log.data
        text = self._partial.pop(log.vertex, "") + log.data.decode("utf-8", "replace")
        lines = text.split("\n")
        self._partial[log.vertex] = lines.pop()
        tail = self._logs.setdefault(log.vertex, deque(maxlen=LOG_TAIL))
        tail.extend(line.rstrip("\r") for line in lines)

    def output(self, instruction: str) -> tuple[bytes, bytes]:
        """The whole stdout and stderr (as BuildKit passed them on: it clips a step that prints more than
        some hundred kB a second) of the step whose instruction starts with ``instruction`` (``RUN``),
        with ``keep_output``."""
        with self._lock:
            found = [d for d in self._order if self._names[d].partition("] ")[2].startswith(instruction)]
            if len(found) != 1:
                raise EngineError(f"build: {len(found)} steps ran {instruction}, expected one")
            return bytes(self._output.get((found[0], 1), b"")), bytes(self._output.get((found[0], 2), b""))

    def failed(self, message: str) -> EngineError:
        """The error of a failed build, to raise: the engine's message, the failed step and the tail of its
        log; a :class:`StepFailed` when a Dockerfile step failed, a :class:`LostLayer` when the engine did."""
        with self._lock:
            digest = self._failed
            step = self._names.get(digest) if digest is not None else None
            partial = self._partial.get(digest) if digest is not None else None  # a last line without its end
            log = [*self._logs.get(digest, ()), *([partial] if partial else [])] if digest is not None else []
        if step is None:
            text = f"build failed: {message}"
        else:
            shown = "".join(f"\n    | {line}" for line in log[-LOG_TAIL:] if line.strip())
            text = f"build failed at step {_short(step, 200)}: {message}{shown}"
        if _LOST_LAYER.search(message):  # the engine's fault, not the step's: a bisect must not blame it
            return LostLayer(f"{text} ({LOST_LAYER_HINT})")
        if _CONTEXT_LOST.search(message):
            return ContextLost(f"{text} ({CONTEXT_LOST_HINT})")
        if step is None or not _numbered(step):
            return EngineError(text)
        return StepFailed(text, step, tuple(line for line in log if line.strip())[-LOG_TAIL:])


class LostLayer(EngineError):
    """Docker 20.10's BuildKit kept a step in its cache whose layer's directory is gone: every build that
    prepares a step on it fails so, whatever it builds, until that cache is emptied
    (:func:`envbuild.image.cache.retention.empty_build_cache`)."""


_LOST_LAYER = re.compile(r"failed to prepare \S+: open \S*/committed: no such file or directory")
LOST_LAYER_HINT = (
    "the engine's BuildKit cache holds a step whose layer is gone, a fault of docker 20.10's BuildKit: "
    "`docker builder prune -af` empties that cache, then build again"
)


class ContextLost(EngineError):
    """A build through the Engine API whose context the engine no longer had when BuildKit read it again:
    docker hands the context of ``POST /build`` to BuildKit once, BuildKit's HTTP source reads it once for
    its digest and keeps it as a cache record it does not hold, and reads it again if a prune of BuildKit's
    cache took that record before the step ran. The build did nothing yet; sent again, it runs
    (:func:`envbuild.engine.builds.sent_again`)."""


_CONTEXT_LOST = re.compile(r'Get "http://build-context-[a-z0-9]+": context not found')
CONTEXT_LOST_HINT = (
    "BuildKit's cache was pruned during the build, and the engine gives the context it was sent out once"
)


def _numbered(name: str) -> bool:
    """A Dockerfile instruction (``[2/5] RUN …``, ``[stage 1/2] …``) rather than BuildKit's own work."""
    return name.startswith("[") and not name.startswith("[internal]")


def _short(name: str, width: int = 100) -> str:
    one = " ".join(name.split())
    return one if len(one) <= width else one[: width - 1] + "…"
