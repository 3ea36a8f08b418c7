"""Short-lived containers of an image: a command run to its end (no network, no devices), and files read
from an image through a container that is created and never started. Each is removed after, however it
ends, with the anonymous volumes the engine made for it (an image's ``VOLUME``s, made at creation even for
a container never started; named volumes are the engine's to keep)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import docker
import docker.errors
import docker.types

from envbuild.engine.calls import TIMEOUT, EngineBase, engine_errors, short
from envbuild.errors import EngineError
from envbuild.interrupts import deferred_interrupts


@dataclass(frozen=True)
class RunOutput:
    exit_code: int
    stdout: str
    stderr: str


class Containers(EngineBase):
    """:class:`~envbuild.engine.client.Engine`'s short-lived containers."""

    def run(
        self,
        image: str,
        command: list[str],
        volumes: dict[str, dict[str, str]] | None = None,
        environment: dict[str, str] | None = None,
        network_mode: str = "none",
    ) -> RunOutput:
        """Run ``command`` in a new container of ``image`` with no network (``network_mode="host"``: the
        host's, to read its interfaces) and no devices; always removed after."""
        with engine_errors(f"run in {short(image)}", self.address):
            container = None
            try:
                with deferred_interrupts():  # Ctrl-C while it is created: taken once it can be removed
                    container = self.client.containers.create(
                        image,
                        command,
                        network_mode=network_mode,
                        volumes=volumes or {},
                        environment=environment or {},
                        detach=True,
                    )
                container.start()
                status = container.wait(timeout=TIMEOUT)
                out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
                err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
            finally:
                if container is not None:
                    container.remove(force=True, v=True)
        return RunOutput(int(status.get("StatusCode", -1)), out, err)

    def missing_paths(self, image: str, paths: Iterable[str]) -> list[str]:
        """The ``paths`` that do not exist on the engine's host. A ``volumes`` bind of a missing path is
        created empty by the engine, silently; a bind *mount* of one is refused when the container is
        created, so each path is tried as a read-only mount of a container of ``image`` that never runs."""
        missing = []
        for path in paths:
            with engine_errors(f"check {path} on {self.address}", self.address):
                mount = docker.types.Mount("/envbuild-path-check", path, type="bind", read_only=True)
                try:
                    container = self.client.containers.create(image, ["true"], network_mode="none", mounts=[mount])
                except docker.errors.APIError as exc:
                    if "bind source path does not exist" not in str(exc):
                        raise
                    missing.append(path)
                    continue
                container.remove(force=True, v=True)
        return missing

    def entry_headers(self, image: str, paths: Sequence[str]) -> dict[str, tarfile.TarInfo]:
        """The tar header the engine writes for each of ``paths`` of ``image`` (type, mode, owner, mtime:
        what a layer holding that entry must say), through a container that is created, never started,
        and removed; of a directory, its own header only: what it holds is not read."""
        found: dict[str, tarfile.TarInfo] = {}
        with (
            engine_errors(f"stat {', '.join(paths)} of {short(image)}", self.address),
            self._unstarted(image) as container,
        ):
            for path in paths:
                response = self.api._get(
                    self.api._url("/containers/{0}/archive", container), params={"path": path}, stream=True
                )
                try:
                    try:
                        self.api._raise_for_status(response)
                    except docker.errors.NotFound:
                        raise EngineError(f"{short(image)} has no {path}") from None
                    with tarfile.open(fileobj=response.raw, mode="r|*") as tar:  # gzip, as the engine sends it
                        member = tar.next()
                finally:
                    response.close()  # the rest of a directory's archive is never read
                if member is None:
                    raise EngineError(f"the engine archived nothing for {path} of {short(image)}")
                found[path] = member
        return found

    @contextmanager
    def _unstarted(self, image: str, command: Sequence[str] = ("true",)) -> Iterator[str]:
        """The ID of a container of ``image`` (``command``, no network), created, not started by this, and
        removed after."""
        with deferred_interrupts():  # Ctrl-C while it is created: taken once it can be removed
            created = self.api.create_container(
                image, list(command), host_config=self.api.create_host_config(network_mode="none")
            )
        try:
            yield created["Id"]
        finally:
            self.api.remove_container(created["Id"], force=True, v=True)

    def read_file(self, image: str, path: str, limit: int = 1 << 24) -> bytes:
        """The bytes of one regular file of ``image``, through a container that is created, never
        started, and removed: no layer is read but the file's."""
        with engine_errors(f"read {path} of {short(image)}", self.address), self._unstarted(image) as container:
            try:
                chunks, _ = self.api.get_archive(container, path)
                data = b"".join(chunks)
            except docker.errors.NotFound:
                raise EngineError(f"{short(image)} has no {path}") from None
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            extracted = tar.extractfile(member) if member is not None and member.isfile() else None
            if extracted is None or member is None or member.size > limit:
                raise EngineError(f"{path} of {short(image)} is not a regular file of at most {limit} bytes")
            return extracted.read()
