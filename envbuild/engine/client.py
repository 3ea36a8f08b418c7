"""With :mod:`.cli_build` (the docker CLI, for builds), the only code that talks to the container engine: the
docker SDK against ``DOCKER_HOST``.

Builds use the engine's BuildKit (:meth:`Engine.buildkit_build`: through the docker CLI's session where
a CLI serves, :mod:`.cli_build`; else ``POST /build?version=2`` over the SDK's connection, the context as
the tar body; the trace decoded by :mod:`.buildkit`), with
no network; the stream is turned into one progress line per step, and a failed step raises :class:`EngineError` with that step's
instruction and the tail of its log. The build context is
streamed to the engine as it is read (a directory, or a :class:`ContextStream` of tar chunks): the SDK
would first copy a directory into a temporary tar file, a second copy of every package file.

Long transfers say how far they are, one line at most every few seconds and one at the end: the
context sent, a ``docker save`` read, a ``docker load`` sent, each layer of a push. Every failure of the
engine or of the connection to it becomes a one-line :class:`EngineError`; registry credentials come
from the docker config (the SDK reads it) and are never printed.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from envbuild.data.reference import split_reference, split_tag
from envbuild.engine.buildkit import BuildKitProgress
from envbuild.engine.cli_build import BuildCli, choose_transport, cli_build
from envbuild.engine.transfer import (
    LOG_TAIL,
    BuildStep,
    ContextStream,
    LayerProgress,
    Meter,
    human_bytes,
)
from envbuild.errors import EngineError
from envbuild.interrupts import deferred_interrupts
from envbuild.progress import Progress, silent

TIMEOUT = 3600  # seconds for one API call: a build step or a save of a multi-GB image
CONNECT_TIMEOUT = 30  # seconds for the first answer of an engine
_CHUNK = 1 << 20
DF_WAIT = 60.0  # seconds to wait for another caller's `docker system df`, which the engine runs alone
_DF_BUSY = "a disk usage operation is already running"


def _chunks_of(archive: Path | Iterable[bytes]) -> Iterator[bytes]:
    if not isinstance(archive, Path):
        yield from archive
        return
    with open(archive, "rb") as data:
        while chunk := data.read(_CHUNK):
            yield chunk


@dataclass(frozen=True)
class BuildOutcome:
    image_id: str  # "sha256:<hex>" of the raw (not yet normalised) image
    steps: tuple[BuildStep, ...]


@dataclass(frozen=True)
class RunOutput:
    exit_code: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class PreparedRun:
    """A created container of :meth:`Engine.prepared_run`: added to, started, then its output."""

    engine: Engine
    container: str
    image: str

    def put(self, archive: bytes) -> None:
        """Extract ``archive`` (a tar) at ``/`` of the container, modes, owners and mtimes as it says."""
        with _engine_errors(f"copy files into a container of {_short(self.image)}", self.engine.address):
            self.engine.api.put_archive(self.container, "/", archive)

    def start(self) -> None:
        with _engine_errors(f"run in {_short(self.image)}", self.engine.address):
            self.engine.api.start(self.container)

    def output(self) -> RunOutput:
        """Wait for the command to end: its exit status, stdout and stderr."""
        with _engine_errors(f"run in {_short(self.image)}", self.engine.address):
            status = self.engine.api.wait(self.container, timeout=TIMEOUT)
            out = self.engine.api.logs(self.container, stdout=True, stderr=False)
            err = self.engine.api.logs(self.container, stdout=False, stderr=True)
        return RunOutput(
            int(status.get("StatusCode", -1)), out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        )


def _event_error(event: dict[str, Any]) -> str | None:
    """The message of an error event in a build, push or pull stream (None for any other event)."""
    if "error" not in event and "errorDetail" not in event:
        return None
    return str((event.get("errorDetail") or {}).get("message") or event.get("error") or "failed")


def _buildkit_refusal(response: requests.Response) -> str:
    try:
        message = str(response.json().get("message") or response.text)
    except ValueError:
        message = response.text
    message = " ".join(message.split())[:300]
    return (
        f"this engine cannot run BuildKit builds (HTTP {response.status_code}: {message}): "
        "envbuild needs docker >= 20.10 on Linux"
    )


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
    def connect(cls, address: str | None = None) -> Engine:
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

    @cached_property
    def build_cli(self) -> BuildCli | None:
        """The docker CLI builds go through (its session syncs only what changed), or None: the Engine
        API, the whole context as the body (:mod:`.cli_build` says which and why)."""
        return choose_transport()

    def buildkit_build(
        self,
        context: ContextStream,
        *,
        dockerfile: str = "Dockerfile",
        nocache: bool = False,
        progress: Progress = silent,
        tag: str | None = None,
        what: str = "the build context",
        context_dir: Path | None = None,
    ) -> BuildOutcome:
        """Build ``dockerfile`` of the context with the engine's own BuildKit, no network for the whole
        build; ``tag`` is set when the build succeeds (and only then). Through the docker CLI when one
        serves, the context as a directory: the stream's own, or written into ``context_dir`` (emptied
        first, removed after; on the file system of the context's files, which are hard-linked; a
        temporary directory without). Else through the Engine API (``POST /build?version=2``, the context
        as the tar body). Needs docker >= 20.10 (``RUN --mount`` without a ``# syntax`` line).

        The CLI names BuildKit's synced copy of a context by its path and sends again only the files whose
        size, mode or mtime changed: the stream's writer gives every file an mtime that changes with its
        content, so one ``context_dir`` per lock and build is safe and a rebuild sends only what changed;
        a directory context must keep that rule itself."""
        cli = self.build_cli
        if cli is not None and (context.directory is not None or context.write_to is not None):
            return self._cli_build(cli, context, dockerfile, nocache, progress, tag, what, context_dir)
        return self._api_build(context, dockerfile, nocache, progress, tag, what)

    def _cli_build(
        self,
        cli: BuildCli,
        context: ContextStream,
        dockerfile: str,
        nocache: bool,
        say: Progress,
        tag: str | None,
        what: str,
        context_dir: Path | None,
    ) -> BuildOutcome:
        build = BuildKitProgress(say)
        with ExitStack() as stack:

            def made(where: Path | None, prefix: str) -> Path:
                """A directory of this build: ``where`` (emptied first: a killed build's), or a temporary
                one; removed when the build ends, however it ends."""
                if where is None:
                    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
                shutil.rmtree(where, ignore_errors=True)
                where.mkdir(parents=True)
                stack.callback(shutil.rmtree, where, ignore_errors=True)
                return where

            directory = context.directory
            if directory is None:
                assert context.write_to is not None
                directory = made(context_dir, "envbuild-context-")
                context.write_to(directory)
            # The CLI's --iidfile: beside the context directory, so a killed build's is cleared by the next.
            scratch = made(context_dir.with_name(f"{context_dir.name}.cli") if context_dir else None, "envbuild-cli-")
            say(f"{what}: {human_bytes(context.payload)}, synced by the docker CLI (only what BuildKit lacks is sent)")
            with build:
                image_id = cli_build(
                    cli,
                    self.address,
                    directory,
                    build,
                    dockerfile=dockerfile,
                    nocache=nocache,
                    tag=tag,
                    iidfile=scratch / "iid",
                )
        return self._built(image_id, build, say)

    def _api_build(
        self, context: ContextStream, dockerfile: str, nocache: bool, say: Progress, tag: str | None, what: str
    ) -> BuildOutcome:
        meter = Meter(say, f"sent {what}", context.payload)
        build = BuildKitProgress(say)
        params: dict[str, str] = {
            "version": "2",
            "dockerfile": dockerfile,
            "networkmode": "none",
            "rm": "1",
            "forcerm": "1",
            "pull": "0",
        }
        if nocache:
            params["nocache"] = "1"
        if tag:
            params["t"] = tag
        with _engine_errors("build", self.address), build:
            response = self.api._post(
                self.api._url("/build"),
                params=params,
                data=meter.wrap(context.chunks()),
                headers={"Content-Type": "application/x-tar"},
                stream=True,
                timeout=TIMEOUT,
            )
            try:
                if response.status_code != 200:
                    raise EngineError(_buildkit_refusal(response))
                for line in response.iter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if (message := _event_error(event)) is not None:
                        raise EngineError(build.failure(message.strip()))
                    build.event(event)
            finally:
                response.close()  # an interrupted client closes the stream: the daemon cancels the build
        if build.image_id is None:
            raise EngineError("build: the engine finished without naming the built image")
        return self._built(build.image_id, build, say)

    @staticmethod
    def _built(image_id: str, build: BuildKitProgress, say: Progress) -> BuildOutcome:
        steps = build.steps
        say(f"built {image_id[:19]}: {len(steps)} steps, {sum(s.cached for s in steps)} from the cache")
        return BuildOutcome(image_id, steps)

    def prune_build_cache(self, keep_storage: int) -> int:
        """Prune BuildKit's cache down to ``keep_storage`` bytes (what it reports it reclaimed). The
        cache is a store of its own: removing images does not shrink it."""
        with _engine_errors("prune the build cache", self.address):
            answer = self.api._result(
                self.api._post(self.api._url("/build/prune"), params={"keep-storage": str(keep_storage)}), True
            )
        return int(answer.get("SpaceReclaimed") or 0)

    def build_cache_size(self) -> int:
        """Bytes BuildKit's cache holds of its own, as ``docker system df``'s "Build Cache" and BuildKit's
        prune count them: a record shared with an image (its layers) is the image's, and never pruned."""
        records = self.disk_usage().get("BuildCache") or []
        return sum(int(entry.get("Size") or 0) for entry in records if not entry.get("Shared"))

    # -- images -------------------------------------------------------------------------------

    def inspect(self, ref: str) -> dict[str, Any] | None:
        """The image's inspect data, or None when the engine does not have it."""
        with _engine_errors(f"inspect {ref}", self.address):
            try:
                return self.api.inspect_image(ref)
            except docker.errors.ImageNotFound:
                return None

    def history(self, ref: str) -> list[dict[str, Any]]:
        """The image's history as the engine reports it: newest entry first, each with the ``Id`` of
        the image that made it when the engine still has that image (else ``<missing>``)."""
        with _engine_errors(f"history of {ref}", self.address):
            return list(self.api.history(ref))

    def images(self, *, name: str | None = None, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The engine's images (leaves only, as ``docker images`` lists them), by repository or filters."""
        with _engine_errors("list images", self.address):
            return list(self.api.images(name=name, filters=filters))

    def disk_usage(self) -> dict[str, Any]:
        """``docker system df``: the engine's layers' size, images and build cache. The engine runs one at
        a time and refuses a second meanwhile (``a disk usage operation is already running``): another
        build tidying the same engine; that one is waited for (:data:`DF_WAIT`), then asked again."""
        deadline = time.monotonic() + DF_WAIT
        while True:
            try:
                with _engine_errors("disk usage", self.address):
                    return dict(self.api.df())
            except EngineError as exc:
                if _DF_BUSY not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def save_stream(self, ref: str, progress: Progress = silent, what: str | None = None) -> Iterator[bytes]:
        """``docker save`` of one image, as chunks, counted in ``progress``. The engine has no way to save
        part of an image: every layer, the base's too, is read and sent."""
        image = self.inspect(ref)
        meter = Meter(progress, what or f"docker save {ref}", (image or {}).get("Size"))
        with _engine_errors(f"save {ref}", self.address):
            yield from meter.wrap(self.api.get_image(ref, chunk_size=_CHUNK))

    def save(self, ref: str, dest: Path, progress: Progress = silent) -> None:
        with open(dest, "wb") as out:
            for chunk in self.save_stream(ref, progress):
                out.write(chunk)

    def load(self, archive: Path | Iterable[bytes], progress: Progress = silent) -> list[str]:
        """Load a ``docker save`` archive (a file or chunks); the image IDs the engine reports. A layer
        the engine already has (the same chain of layers) is not read: an archive may name such layers in
        its manifest without carrying them."""
        name = str(archive) if isinstance(archive, Path) else "an image archive"
        meter = Meter(progress, "sent to docker load")
        loaded: list[str] = []
        with _engine_errors(f"load {name}", self.address):
            for event in self.api.load_image(meter.wrap(_chunks_of(archive))):
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
        with _engine_errors(f"tag {name}", self.address):
            if not self.api.tag(image, repository, tag):
                raise EngineError(f"tag {name}: the engine refused the tag")

    def remove(self, ref: str, *, force: bool = False) -> bool:
        """Remove an image or a tag (an image that loses its last tag goes, with its untagged parents);
        False when it was not there."""
        with _engine_errors(f"remove {ref}", self.address):
            try:
                self.api.remove_image(ref, force=force)
            except docker.errors.ImageNotFound:
                return False
        return True

    def push(self, name: str, progress: Progress = silent) -> str:
        """Push ``repository:tag`` with the docker config's credentials; returns the manifest digest.
        Progress: each layer once when it is done (sent, already in the registry, or mounted from another
        repository) and, while layers are sent, the bytes sent of their total."""
        say = progress
        repository, tag = split_tag(name)
        digest = None
        push = LayerProgress(say, "push", name)
        with _engine_errors(f"push {name}", self.address):
            for event in self.api.push(repository, tag, stream=True, decode=True):
                if (message := _event_error(event)) is not None:
                    raise EngineError(f"push {name}: {message}")
                push.event(event)
                digest = (event.get("aux") or {}).get("Digest", digest)
        if digest is None:
            raise EngineError(f"push {name}: the registry reported no manifest digest")
        say(f"pushed {name} ({digest}): {push.summary()}")
        return digest

    def registry_digest(self, name: str) -> str:
        """The manifest digest the registry serves for ``name`` now (read back after a push)."""
        return self.distribution(name)[0]

    def distribution(self, name: str) -> tuple[str, tuple[str, ...]]:
        """What the registry serves for ``name`` now: its manifest digest (an index's, for a
        multi-platform image) and the platforms it has images for (``linux/arm64``, …), pulling nothing."""
        with _engine_errors(f"registry data of {name}", self.address):
            data = self.api.inspect_distribution(name)
        platforms = tuple(
            f"{p.get('os') or p.get('OS')}/{p.get('architecture') or p.get('Architecture')}"
            for p in data.get("Platforms") or ()
        )
        return str(data["Descriptor"]["digest"]), platforms

    def pull(self, reference: str, progress: Progress = silent, *, platform: str | None = None) -> str:
        """Pull ``repository@sha256:…`` (or ``repository:tag``) with the docker config's credentials, each
        layer said when it is fetched and the bytes while they come; returns the image ID. ``platform``
        (``linux/arm64``) picks that variant of a multi-platform index, instead of the engine's own."""
        say = progress
        pull = LayerProgress(say, "pull", reference)
        name, tag, digest = split_reference(reference)
        repository, tag = name, digest or tag or "latest"
        with _engine_errors(f"pull {reference}", self.address):
            for event in self.api.pull(repository, tag, stream=True, decode=True, platform=platform):
                if (message := _event_error(event)) is not None:
                    raise EngineError(f"pull {reference} on {self.address}: {message}")
                pull.event(event)
            image_id = self.api.inspect_image(reference)["Id"]
        say(f"pulled {reference} on {self.address}: {pull.summary()}")
        return str(image_id)

    def machine(self) -> str:
        """The engine host's machine name, as the engine reports it (``x86_64``, ``aarch64``)."""
        with _engine_errors("info", self.address):
            return str(self.api.info().get("Architecture") or "")

    def memory_bytes(self) -> int:
        """The engine host's memory, as the engine reports it."""
        with _engine_errors("info", self.address):
            return int(self.api.info().get("MemTotal") or 0)

    # -- containers ---------------------------------------------------------------------------

    def run(
        self,
        image: str,
        command: list[str],
        volumes: dict[str, dict[str, str]] | None = None,
        environment: dict[str, str] | None = None,
    ) -> RunOutput:
        """Run ``command`` in a new container of ``image`` with no network and no devices; always removed after."""
        with _engine_errors(f"run in {image[:19] if image.startswith('sha256:') else image}", self.address):
            container = None
            try:
                with deferred_interrupts():  # Ctrl-C while it is created: taken once it can be removed
                    container = self.client.containers.create(
                        image,
                        command,
                        network_mode="none",
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
                    container.remove(force=True)
        return RunOutput(int(status.get("StatusCode", -1)), out, err)

    def missing_paths(self, image: str, paths: Iterable[str]) -> list[str]:
        """The ``paths`` that do not exist on the engine's host. A ``volumes`` bind of a missing path is
        created empty by the engine, silently; a bind *mount* of one is refused when the container is
        created, so each path is tried as a read-only mount of a container of ``image`` that never runs."""
        missing = []
        for path in paths:
            with _engine_errors(f"check {path} on {self.address}", self.address):
                mount = docker.types.Mount("/envbuild-path-check", path, type="bind", read_only=True)
                try:
                    container = self.client.containers.create(image, ["true"], network_mode="none", mounts=[mount])
                except docker.errors.APIError as exc:
                    if "bind source path does not exist" not in str(exc):
                        raise
                    missing.append(path)
                    continue
                container.remove(force=True)
        return missing

    # A container to install into and commit (the packages image): create, copy files in, run, commit.

    def entry_headers(self, image: str, paths: Sequence[str]) -> dict[str, tarfile.TarInfo]:
        """The tar header the engine writes for each of ``paths`` of ``image`` (type, mode, owner, mtime:
        what a layer holding that entry must say), through a container that is created, never started,
        and removed; of a directory, its own header only: what it holds is not read."""
        found: dict[str, tarfile.TarInfo] = {}
        with (
            _engine_errors(f"stat {', '.join(paths)} of {_short(image)}", self.address),
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
                        raise EngineError(f"{_short(image)} has no {path}") from None
                    with tarfile.open(fileobj=response.raw, mode="r|*") as tar:  # gzip, as the engine sends it
                        member = tar.next()
                finally:
                    response.close()  # the rest of a directory's archive is never read
                if member is None:
                    raise EngineError(f"the engine archived nothing for {path} of {_short(image)}")
                found[path] = member
        return found

    @contextmanager
    def prepared_run(self, image: str, command: list[str]) -> Iterator[PreparedRun]:
        """A container of ``image`` that will run ``command`` with no network, created and not started:
        files added before it starts, its output taken once it ends (the caller works while it runs);
        always removed."""
        with _engine_errors(f"run in {_short(image)}", self.address), self._unstarted(image, command) as container:
            yield PreparedRun(self, container, image)

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
            self.api.remove_container(created["Id"], force=True)

    def read_file(self, image: str, path: str, limit: int = 1 << 24) -> bytes:
        """The bytes of one regular file of ``image``, through a container that is created, never
        started, and removed: no layer is read but the file's."""
        with _engine_errors(f"read {path} of {_short(image)}", self.address), self._unstarted(image) as container:
            try:
                chunks, _ = self.api.get_archive(container, path)
                data = b"".join(chunks)
            except docker.errors.NotFound:
                raise EngineError(f"{_short(image)} has no {path}") from None
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            extracted = tar.extractfile(member) if member is not None and member.isfile() else None
            if extracted is None or member is None or member.size > limit:
                raise EngineError(f"{path} of {_short(image)} is not a regular file of at most {limit} bytes")
            return extracted.read()

    def run_job(self, spec: JobSpec, on_output: Callable[[str], None]) -> tuple[int | None, bool]:
        """Run a long job: stream its output to ``on_output`` until it ends; on Ctrl-C stop the container
        (SIGTERM, then SIGKILL after ``spec.stop_timeout``). Returns (exit code, interrupted)."""
        container_id = None
        try:
            with deferred_interrupts():  # Ctrl-C while it starts: taken once it can be stopped and removed
                container_id = self.start(spec)
            with _engine_errors(f"run {spec.image}", self.address):
                container = self.client.containers.get(container_id)
            try:
                for chunk in container.logs(stream=True, follow=True):
                    on_output(chunk.decode("utf-8", errors="replace"))
                with _engine_errors(f"wait for {container.short_id}", self.address):
                    return int(container.wait()["StatusCode"]), False
            except KeyboardInterrupt:
                with _engine_errors(f"stop {container.short_id}", self.address):
                    container.stop(timeout=spec.stop_timeout)
                    return int(container.wait(timeout=spec.stop_timeout + 10)["StatusCode"]), True
        finally:
            try:
                if container_id is not None:
                    self.api.remove_container(container_id, force=True)
            except (docker.errors.DockerException, requests.RequestException):
                pass  # the engine went away; nothing more to clean here

    def start(self, spec: JobSpec) -> str:
        """Create and start a detached, long-running container; its ID. A container that was created but
        would not start is removed again."""
        with _engine_errors(f"start {spec.name or spec.image} on {self.address}", self.address):
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
        """Stop (SIGTERM, SIGKILL after ``stop_timeout``; 0 kills at once) and remove a container, running or
        not; False when it was gone already."""
        with _engine_errors(f"remove container {container_id[:12]} on {self.address}", self.address):
            try:
                if stop_timeout:
                    self.api.stop(container_id, timeout=stop_timeout)
                self.api.remove_container(container_id, force=True)
            except docker.errors.NotFound:
                return False
        return True

    # -- volumes ------------------------------------------------------------------------------

    def ensure_volume(self, name: str, labels: dict[str, str]) -> None:
        """The named volume, created with ``labels`` unless the engine has it already."""
        with _engine_errors(f"create volume {name} on {self.address}", self.address):
            self.api.create_volume(name, labels=labels)  # the engine answers with the existing one

    def volumes(self, label: str) -> dict[str, dict[str, str]]:
        """The engine's volumes carrying ``label``: each name with its labels."""
        with _engine_errors(f"list volumes on {self.address}", self.address):
            found = self.api.volumes(filters={"label": label}).get("Volumes") or []
        return {v["Name"]: dict(v.get("Labels") or {}) for v in found}

    def remove_volume(self, name: str) -> bool:
        """Remove a volume no container uses; False when it is in use or gone."""
        with _engine_errors(f"remove volume {name} on {self.address}", self.address):
            try:
                self.api.remove_volume(name)
            except docker.errors.NotFound:
                return False
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # in use
                    return False
                raise
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


def _short(ref: str) -> str:
    return ref[:19] if ref.startswith("sha256:") else ref
