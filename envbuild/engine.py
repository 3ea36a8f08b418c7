"""The only module that talks to the container engine: the docker SDK against ``DOCKER_HOST``.

Builds use the legacy builder (what the SDK's build endpoint runs), with no network for ``RUN``
steps and without a final tag; the stream is turned into one progress line per step, and a failed
step raises :class:`EngineError` with that step's instruction and the tail of its log. Every failure
of the engine or of the connection to it becomes a one-line :class:`EngineError`; registry
credentials come from the docker config (the SDK reads it) and are never printed.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from envbuild.errors import EngineError
from envbuild.progress import Progress

TIMEOUT = 3600  # seconds for one API call: a build step or a save of a multi-GB image
CONNECT_TIMEOUT = 30  # seconds for the first answer of an engine
LOG_TAIL = 20
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The builder's own chatter, not the step's output.
_NOISE = re.compile(r"^(---> |Removing intermediate container |Successfully )")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class BuildStep:
    number: int
    total: int
    instruction: str
    cached: bool
    seconds: float


@dataclass(frozen=True)
class BuildOutcome:
    image_id: str  # "sha256:<hex>" of the raw (not yet normalised) image
    steps: tuple[BuildStep, ...]

    @property
    def cached_steps(self) -> int:
        return sum(step.cached for step in self.steps)


@dataclass(frozen=True)
class RunOutput:
    exit_code: int
    stdout: str
    stderr: str


def _reason(exc: BaseException) -> str:
    """One line a user can act on, from the SDK's or requests' nested messages."""
    text = str(exc)
    for needle, reason in (
        ("No such file or directory", "no such socket"),
        ("Connection refused", "connection refused"),
        ("Permission denied", "permission denied"),
        ("timed out", "timed out"),
        ("Connection aborted", "connection aborted"),
    ):
        if needle in text:
            return reason
    if isinstance(exc, docker.errors.APIError):
        return str(exc.explanation or exc).splitlines()[0]
    return text.splitlines()[0][:300] if text else type(exc).__name__


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


@contextmanager
def _engine_errors(what: str, address: str | None = None) -> Iterator[None]:
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise EngineError(f"{what}: no such image ({_reason(exc)})") from None
    except (docker.errors.DockerException, requests.RequestException) as exc:
        if isinstance(exc, docker.errors.APIError) and exc.response is not None:
            raise EngineError(f"{what}: {_reason(exc)}") from None
        raise EngineError(
            f"{what}: the container engine at {address or engine_address()} stopped answering: {_reason(exc)}"
        ) from None


class Engine:
    """A docker engine. ``Engine.connect()`` checks that one answers."""

    def __init__(self, client: docker.DockerClient, address: str | None = None) -> None:
        self.client = client
        self.api = client.api
        self.address = address or engine_address()

    @classmethod
    def connect(cls, address: str | None = None) -> "Engine":
        """The engine at ``DOCKER_HOST``, or at ``address``: ``unix:///path``, ``tcp://host:port`` or
        ``ssh://user@host`` (through the system's ssh client, so its config and agent apply)."""
        try:
            if address is None:
                client = docker.from_env(version="auto", timeout=CONNECT_TIMEOUT)
            else:
                client = docker.DockerClient(
                    base_url=address,
                    version="auto",
                    timeout=CONNECT_TIMEOUT,
                    use_ssh_client=address.startswith("ssh://"),
                )
            client.ping()
        except (docker.errors.DockerException, requests.RequestException) as exc:
            hint = "start dockerd or set DOCKER_HOST" if address is None else "is dockerd running there, and reachable?"
            raise EngineError(
                f"no container engine answers at {address or engine_address()}: {_reason(exc)} ({hint})"
            ) from None
        client.api.timeout = TIMEOUT  # a host that does not answer is found out fast; a long build is not cut
        return cls(client, address)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- build --------------------------------------------------------------------------------

    def build(self, context: Path, *, nocache: bool = False, progress: Progress | None = None) -> BuildOutcome:
        """Build ``context/Dockerfile`` with the legacy builder; no tag, no network for RUN steps."""
        say = progress or (lambda message: None)
        steps: list[BuildStep] = []
        current: dict[str, Any] | None = None
        log: deque[str] = deque(maxlen=LOG_TAIL)
        image_id: str | None = None
        short_id: str | None = None

        def finish(now: float) -> None:
            if current is not None:
                steps.append(
                    BuildStep(
                        current["number"],
                        current["total"],
                        current["instruction"],
                        current["cached"],
                        round(now - current["start"], 3),
                    )
                )

        with _engine_errors("build"):
            stream = self.api.build(
                path=str(context), rm=True, forcerm=True, nocache=nocache, pull=False, network_mode="none", decode=True
            )
            try:
                for event in stream:
                    if "error" in event or "errorDetail" in event:
                        message = (event.get("errorDetail") or {}).get("message") or event.get("error") or "failed"
                        where = (
                            f"step {current['number']}/{current['total']} ({current['instruction'][:120]})"
                            if current
                            else "before the first step"
                        )
                        tail = "".join(f"\n    | {line}" for line in log)
                        raise EngineError(f"build failed at {where}: {message.strip()}{tail}")
                    if "aux" in event and isinstance(event["aux"], dict) and "ID" in event["aux"]:
                        image_id = event["aux"]["ID"]
                    for line in _ANSI.sub("", str(event.get("stream", ""))).splitlines():
                        if match := _STEP.match(line.strip()):
                            now = time.monotonic()
                            finish(now)
                            # FROM builds nothing: it counts as answered from what the engine holds.
                            current = {
                                "number": int(match[1]),
                                "total": int(match[2]),
                                "instruction": match[3],
                                "cached": match[3].upper().startswith("FROM "),
                                "start": now,
                            }
                            log.clear()
                            say(f"step {match[1]}/{match[2]}: {match[3][:100]}")
                        elif line.strip() == "---> Using cache" and current is not None:
                            current["cached"] = True
                        elif line.startswith("Successfully built "):
                            short_id = line.split()[-1]
                        elif line.strip() and not _NOISE.match(line.strip()):
                            log.append(line.rstrip())
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()  # an interrupted client closes the stream: the daemon cancels the build
            finish(time.monotonic())
            if image_id is None and short_id is not None:
                image_id = self.api.inspect_image(short_id)["Id"]
        if image_id is None:
            raise EngineError("build: the engine finished without naming the built image")
        cached = sum(s.cached for s in steps)
        say(f"built {image_id[:19]}: {len(steps)} steps, {cached} from the layer cache")
        return BuildOutcome(image_id, tuple(steps))

    # -- images -------------------------------------------------------------------------------

    def inspect(self, ref: str) -> dict[str, Any] | None:
        """The image's inspect data, or None when the engine does not have it."""
        with _engine_errors(f"inspect {ref}", self.address):
            try:
                return self.api.inspect_image(ref)
            except docker.errors.ImageNotFound:
                return None

    def history_length(self, ref: str) -> int:
        with _engine_errors(f"history of {ref}"):
            return len(self.api.history(ref))

    def save(self, ref: str, dest: Path) -> None:
        with _engine_errors(f"save {ref}"), open(dest, "wb") as out:
            for chunk in self.api.get_image(ref, chunk_size=_CHUNK):
                out.write(chunk)

    def load(self, archive: Path) -> list[str]:
        """Load a ``docker save`` archive; the image IDs the engine reports."""
        loaded: list[str] = []
        with _engine_errors(f"load {archive}"), open(archive, "rb") as data:
            for event in self.api.load_image(data):
                if "error" in event:
                    raise EngineError(f"load {archive}: {event['error']}")
                text = str(event.get("stream", ""))
                for line in text.splitlines():
                    if line.startswith("Loaded image ID: "):
                        loaded.append(line.split(": ", 1)[1].strip())
                    elif line.startswith("Loaded image: "):
                        loaded.append(self.api.inspect_image(line.split(": ", 1)[1].strip())["Id"])
        return loaded

    def tag(self, image: str, name: str) -> None:
        repository, tag = split_tag(name)
        with _engine_errors(f"tag {name}"):
            if not self.api.tag(image, repository, tag):
                raise EngineError(f"tag {name}: the engine refused the tag")

    def remove(self, ref: str, *, force: bool = False) -> bool:
        """Remove an image or a tag; False when it was not there."""
        with _engine_errors(f"remove {ref}"):
            try:
                self.api.remove_image(ref, force=force)
            except docker.errors.ImageNotFound:
                return False
        return True

    def push(self, name: str, progress: Progress | None = None) -> str:
        """Push ``repository:tag`` with the docker config's credentials; returns the manifest digest."""
        repository, tag = split_tag(name)
        digest = None
        with _engine_errors(f"push {name}"):
            for event in self.api.push(repository, tag, stream=True, decode=True):
                if "error" in event or "errorDetail" in event:
                    message = (event.get("errorDetail") or {}).get("message") or event.get("error")
                    raise EngineError(f"push {name}: {message}")
                digest = (event.get("aux") or {}).get("Digest", digest)
        if digest is None:
            raise EngineError(f"push {name}: the registry reported no manifest digest")
        if progress:
            progress(f"pushed {name} ({digest})")
        return digest

    def registry_digest(self, name: str) -> str:
        """The manifest digest the registry serves for ``name`` now (read back after a push)."""
        with _engine_errors(f"registry data of {name}", self.address):
            return self.api.inspect_distribution(name)["Descriptor"]["digest"]

    def pull(self, reference: str, progress: Progress | None = None) -> str:
        """Pull ``repository@sha256:…`` (or ``repository:tag``) with the docker config's credentials;
        returns the image ID."""
        repository, tag = split_reference(reference)
        with _engine_errors(f"pull {reference}", self.address):
            for event in self.api.pull(repository, tag, stream=True, decode=True):
                if "error" in event or "errorDetail" in event:
                    message = (event.get("errorDetail") or {}).get("message") or event.get("error")
                    raise EngineError(f"pull {reference} on {self.address}: {message}")
            image_id = self.api.inspect_image(reference)["Id"]
        if progress:
            progress(f"pulled {reference} on {self.address}")
        return image_id

    def memory_bytes(self) -> int:
        """The engine host's memory, as the engine reports it."""
        with _engine_errors("info", self.address):
            return int(self.api.info().get("MemTotal") or 0)

    # -- containers ---------------------------------------------------------------------------

    def run(self, image: str, command: list[str], volumes: dict[str, dict[str, str]] | None = None) -> RunOutput:
        """Run ``command`` in a new container of ``image`` with no network; always removed after."""
        with _engine_errors(f"run in {image[:19] if image.startswith('sha256:') else image}", self.address):
            container = self.client.containers.create(
                image, command, network_mode="none", volumes=volumes or {}, detach=True
            )
            try:
                container.start()
                status = container.wait(timeout=TIMEOUT)
                out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
                err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
            finally:
                container.remove(force=True)
        return RunOutput(int(status.get("StatusCode", -1)), out, err)

    def run_job(self, spec: JobSpec, on_output: Callable[[str], None]) -> tuple[int | None, bool]:
        """Run a long job: stream its output to ``on_output`` until it ends; on Ctrl-C stop the container
        (SIGTERM, then SIGKILL after ``spec.stop_timeout``). Returns (exit code, interrupted)."""
        container_id = self.start(spec)
        try:
            with _engine_errors(f"run {spec.image}", self.address):
                container = self.client.containers.get(container_id)
            try:
                for chunk in container.logs(stream=True, follow=True):
                    on_output(chunk.decode("utf-8", errors="replace"))
                with _engine_errors(f"wait for {container.short_id}"):
                    return int(container.wait()["StatusCode"]), False
            except KeyboardInterrupt:
                with _engine_errors(f"stop {container.short_id}"):
                    container.stop(timeout=spec.stop_timeout)
                    return int(container.wait(timeout=spec.stop_timeout + 10)["StatusCode"]), True
        finally:
            try:
                self.api.remove_container(container_id, force=True)
            except (docker.errors.DockerException, requests.RequestException):
                pass  # the engine went away; nothing more to clean here

    def start(self, spec: JobSpec) -> str:
        """Create and start a detached, long-running container; its ID. A container that was created but
        would not start is removed again."""
        with _engine_errors(f"start {spec.name or spec.image} on {self.address}", self.address):
            same = ("ipc_mode", "network_mode", "working_dir", "name", "shm_size")  # the SDK's names for them
            container = self.client.containers.create(
                spec.image,
                command=list(spec.command),
                environment=dict(spec.env),
                devices=list(spec.devices),
                volumes=dict(spec.volumes),
                labels=dict(spec.labels),
                **{option: getattr(spec, option) for option in same},
            )
            try:
                container.start()
            except BaseException:
                container.remove(force=True)
                raise
        return str(container.id)

    def containers(self, labels: dict[str, str]) -> list[ContainerState]:
        """Every container (running or not) carrying all of ``labels``, by name."""
        wanted = [f"{key}={value}" for key, value in sorted(labels.items())]
        with _engine_errors(f"list containers on {self.address}", self.address):
            found = self.api.containers(all=True, filters={"label": wanted})
        return sorted(
            (
                ContainerState(
                    c["Id"], (c.get("Names") or ["/"])[0].lstrip("/"), c["State"], c["ImageID"], c.get("Labels") or {}
                )
                for c in found
            ),
            key=lambda c: c.name,
        )

    def container(self, container_id: str) -> ContainerState | None:
        """A container's state now, or None when it is gone."""
        with _engine_errors(f"inspect container {container_id[:12]} on {self.address}", self.address):
            try:
                attrs = self.api.inspect_container(container_id)
            except docker.errors.NotFound:
                return None
        config = attrs.get("Config") or {}
        return ContainerState(
            attrs["Id"], attrs["Name"].lstrip("/"), attrs["State"]["Status"], attrs["Image"], config.get("Labels") or {}
        )

    def exec(self, container_id: str, command: list[str]) -> RunOutput:
        """Run ``command`` in a running container and wait for it."""
        with _engine_errors(f"exec in {container_id[:12]} on {self.address}", self.address):
            handle = self.api.exec_create(container_id, command, stdout=True, stderr=True)
            out, err = self.api.exec_start(handle["Id"], demux=True)
            code = self.api.exec_inspect(handle["Id"]).get("ExitCode")
        return RunOutput(
            -1 if code is None else int(code),
            (out or b"").decode("utf-8", "replace"),
            (err or b"").decode("utf-8", "replace"),
        )

    def logs_tail(self, container_id: str, lines: int = LOG_TAIL) -> str:
        with _engine_errors(f"logs of {container_id[:12]} on {self.address}", self.address):
            return self.api.logs(container_id, tail=lines).decode("utf-8", "replace")

    def remove_container(self, container_id: str, stop_timeout: int = 30) -> bool:
        """Stop (SIGTERM, SIGKILL after ``stop_timeout``) and remove a container; False when it was gone."""
        with _engine_errors(f"remove container {container_id[:12]} on {self.address}", self.address):
            try:
                self.api.stop(container_id, timeout=stop_timeout)
                self.api.remove_container(container_id, force=True)
            except docker.errors.NotFound:
                return False
        return True


@dataclass(frozen=True)
class JobSpec:
    """A container for a long job: what runs, with which devices, mounts and network."""

    image: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] = ()  # "host:container:rwm"
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    network_mode: str = "none"
    ipc_mode: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    stop_timeout: int = 20
    name: str | None = None  # the container's name; None lets the engine pick one
    shm_size: int | None = None  # bytes of /dev/shm; None is the engine's default (64 MB)


@dataclass(frozen=True)
class ContainerState:
    """A container as the engine sees it now."""

    id: str  # full 64 hex
    name: str
    state: str  # created | running | paused | restarting | removing | exited | dead
    image_id: str
    labels: dict[str, str]

    @property
    def running(self) -> bool:
        return self.state == "running"


def split_reference(reference: str) -> tuple[str, str]:
    """``repo@sha256:…`` → (repo, "sha256:…"); otherwise as :func:`split_tag`."""
    repository, at, digest = reference.partition("@")
    return (repository, digest) if at else split_tag(reference)


def split_tag(name: str) -> tuple[str, str]:
    """``repo:tag`` → (repo, tag); a ``:port`` belongs to the registry; no tag means ``latest``."""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        repository, _, tag = name.rpartition(":")
        return repository, tag
    return name, "latest"
