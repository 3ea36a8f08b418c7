"""Long-lived containers: a job run with its devices, mounts and network (its output streamed, Ctrl-C
stopping it), containers found by label, inspected, exec'd into and removed, and named volumes."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field

import docker.errors
import requests

from envbuild.engine.calls import EngineBase, engine_errors
from envbuild.engine.containers import RunOutput
from envbuild.engine.transfer import LOG_TAIL
from envbuild.interrupts import deferred_interrupts


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
    # docker-init (tini) as PID 1: a SIGTERM from `docker stop` reaches the job, which as PID 1 would
    # ignore it and be killed after stop_timeout; the orphans of its workers are reaped.
    init: bool = True


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


class Jobs(EngineBase):
    """:class:`~envbuild.engine.client.Engine`'s long-lived containers and volumes."""

    def run_job(self, spec: JobSpec, on_output: Callable[[str], None]) -> tuple[int | None, bool]:
        """Run a long job: stream its output to ``on_output`` until it ends; on Ctrl-C stop the container
        (SIGTERM, then SIGKILL after ``spec.stop_timeout``). Returns (exit code, interrupted)."""
        container_id = None
        try:
            with deferred_interrupts():  # Ctrl-C while it starts: taken once it can be stopped and removed
                container_id = self.start(spec)
            with engine_errors(f"run {spec.image}", self.address):
                container = self.client.containers.get(container_id)
            try:
                for chunk in container.logs(stream=True, follow=True):
                    on_output(chunk.decode("utf-8", errors="replace"))
                with engine_errors(f"wait for {container.short_id}", self.address):
                    return int(container.wait()["StatusCode"]), False
            except KeyboardInterrupt:
                with engine_errors(f"stop {container.short_id}", self.address):
                    container.stop(timeout=spec.stop_timeout)
                    return int(container.wait(timeout=spec.stop_timeout + 10)["StatusCode"]), True
        finally:
            # the engine gone away: nothing more to clean here
            with suppress(docker.errors.DockerException, requests.RequestException):
                if container_id is not None:
                    self.api.remove_container(container_id, force=True, v=True)

    def start(self, spec: JobSpec) -> str:
        """Create and start a detached, long-running container; its ID. A container that was created but
        would not start is removed again."""
        with engine_errors(f"start {spec.name or spec.image} on {self.address}", self.address):
            same = ("ipc_mode", "network_mode", "working_dir", "name", "shm_size", "init")  # the SDK's names for them
            container = None
            try:
                with deferred_interrupts():  # Ctrl-C while it is created: taken once it can be removed
                    container = self.client.containers.create(
                        spec.image,
                        command=list(spec.command),
                        environment=dict(spec.env),
                        devices=list(spec.devices),
                        volumes=dict(spec.volumes),
                        labels=dict(spec.labels),
                        **{option: getattr(spec, option) for option in same},
                    )
                container.start()
            except BaseException:
                if container is not None:
                    container.remove(force=True, v=True)
                raise
        return str(container.id)

    def containers(self, labels: dict[str, str]) -> list[ContainerState]:
        """Every container (running or not) carrying all of ``labels``, by name."""
        wanted = [f"{key}={value}" for key, value in sorted(labels.items())]
        with engine_errors(f"list containers on {self.address}", self.address):
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
        with engine_errors(f"inspect container {container_id[:12]} on {self.address}", self.address):
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
        with engine_errors(f"exec in {container_id[:12]} on {self.address}", self.address):
            handle = self.api.exec_create(container_id, command, stdout=True, stderr=True)
            out, err = self.api.exec_start(handle["Id"], demux=True)
            code = self.api.exec_inspect(handle["Id"]).get("ExitCode")
        return RunOutput(
            -1 if code is None else int(code),
            (out or b"").decode("utf-8", "replace"),
            (err or b"").decode("utf-8", "replace"),
        )

    def logs_tail(self, container_id: str, lines: int = LOG_TAIL) -> str:
        with engine_errors(f"logs of {container_id[:12]} on {self.address}", self.address):
            return self.api.logs(container_id, tail=lines).decode("utf-8", "replace")

    def remove_container(self, container_id: str, stop_timeout: int = 30) -> bool:
        """Stop (SIGTERM, SIGKILL after ``stop_timeout``; 0 kills at once) and remove a container, running or
        not; False when it was gone already."""
        with engine_errors(f"remove container {container_id[:12]} on {self.address}", self.address):
            try:
                if stop_timeout:
                    self.api.stop(container_id, timeout=stop_timeout)
                self.api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                return False
        return True

    # -- volumes ------------------------------------------------------------------------------

    def ensure_volume(self, name: str, labels: dict[str, str]) -> None:
        """The named volume, created with ``labels`` unless the engine has it already."""
        with engine_errors(f"create volume {name} on {self.address}", self.address):
            self.api.create_volume(name, labels=labels)  # the engine answers with the existing one

    def volumes(self, label: str) -> dict[str, dict[str, str]]:
        """The engine's volumes carrying ``label``: each name with its labels."""
        with engine_errors(f"list volumes on {self.address}", self.address):
            found = self.api.volumes(filters={"label": label}).get("Volumes") or []
        return {v["Name"]: dict(v.get("Labels") or {}) for v in found}

    def remove_volume(self, name: str) -> bool:
        """Remove a volume no container uses; False when it is in use or gone."""
        with engine_errors(f"remove volume {name} on {self.address}", self.address):
            try:
                self.api.remove_volume(name)
            except docker.errors.NotFound:
                return False
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # in use
                    return False
                raise
        return True
