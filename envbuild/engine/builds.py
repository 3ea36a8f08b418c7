"""Builds with the engine's own BuildKit, no network for the whole build: through the docker CLI's
session where a CLI serves (:mod:`.cli_build`), else ``POST /build?version=2`` over the SDK's
connection, the context as the tar body; the trace decoded by :mod:`.buildkit` into one progress line
per step, a failed step raised as an :class:`EngineError` with its instruction and the tail of its log.
The context is streamed to the engine as it is read (a :class:`~envbuild.engine.transfer.ContextStream`
of tar chunks): the SDK would first copy a directory into a temporary tar file."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypeVar

import requests

from envbuild.engine.buildkit import BuildKitProgress, ContextLost
from envbuild.engine.calls import TIMEOUT, EngineBase, engine_errors, event_error, short
from envbuild.engine.cli_build import BuildCli, choose_transport, cli_build
from envbuild.engine.containers import RunOutput
from envbuild.engine.transfer import BuildStep, ContextStream, Meter, human_bytes
from envbuild.errors import EngineError
from envbuild.progress import Progress, silent


@dataclass(frozen=True)
class BuildOutcome:
    image_id: str  # "sha256:<hex>" of the raw (not yet normalised) image
    steps: tuple[BuildStep, ...]


class Builds(EngineBase):
    """:class:`~envbuild.engine.client.Engine`'s builds."""

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

        def send() -> BuildOutcome:
            build = BuildKitProgress(progress)
            meter = Meter(progress, f"sent {what}", context.payload)
            return self._built(self._api_solve(context, build, meter, dockerfile, nocache, tag), build, progress)

        return sent_again(send, progress)

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
                    ssh_path=link.client_path() if (link := getattr(self, "_link", None)) is not None else None,
                )
        return self._built(image_id, build, say)

    def _api_solve(
        self,
        context: ContextStream,
        build: BuildKitProgress,
        meter: Meter | None,
        dockerfile: str,
        nocache: bool,
        tag: str | None,
    ) -> str:
        """``POST /build?version=2`` of the context as the tar body, its trace fed to ``build``: the image ID."""
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
        with engine_errors("build", self.address), build:
            response = self.api._post(
                self.api._url("/build"),
                params=params,
                data=meter.wrap(context.chunks()) if meter is not None else context.chunks(),
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
                    try:
                        event = json.loads(line)
                    except ValueError:  # not the engine's stream: what stands at its address, or a cut line
                        event = None
                    if not isinstance(event, dict):
                        raise EngineError(f"build: the engine sent a line that is no JSON object: {line[:200]!r}")
                    if (message := event_error(event)) is not None:
                        raise build.failed(message.strip())
                    build.event(event)
            finally:
                response.close()  # an interrupted client closes the stream: the daemon cancels the build
        if build.image_id is None:
            raise EngineError("build: the engine finished without naming the built image")
        return build.image_id

    def run_step(
        self,
        image: str,
        command: Sequence[str],
        files: Mapping[str, bytes],
        *,
        mount: str,
        started: threading.Event | None = None,
        say: Progress = silent,
    ) -> RunOutput:
        """Run ``command`` as the one ``RUN`` of a build on ``image`` (a name the engine holds), by the
        engine's BuildKit: no network, no cache, ``files`` ({name: bytes}) bind-mounted read-only at
        ``mount``, ``/tmp`` a tmpfs; its exit status, stdout and stderr, as a container's run gives them.
        What the command writes stays in an image of its own, removed after. Through the Engine API: a
        context of a few files needs neither the docker CLI's start nor its session. ``say`` hears only
        that a lost context is sent again (:func:`sent_again`).

        Why not a container: BuildKit's executor starts a step in ~0.07 s where the engine takes ~0.2 s
        to start a container (its network namespace, containerd's shim), measured on docker 20.10. The
        output comes back in BuildKit's trace, which clips a step printing more than some hundred kB a
        second: a command with more to say compresses it (a clipped output is an error here)."""
        archive = step_context(step_dockerfile(image, command, mount), files)

        def send() -> tuple[str, BuildKitProgress]:
            build = BuildKitProgress(silent, keep_output=STEP_OUTPUT, step_started=started)
            context = ContextStream(lambda: iter((archive,)), len(archive))
            return self._api_solve(context, build, None, "Dockerfile", True, None), build

        image_id, build = sent_again(send, say)
        try:
            stdout, stderr = build.output("RUN")
        finally:
            with engine_errors(f"remove the image of a step on {short(image)}", self.address):
                self.api.remove_image(image_id, force=True)
        if CLIPPED in stdout or CLIPPED in stderr:
            raise EngineError(
                f"a step on {short(image)} printed faster than BuildKit passes on: its output was clipped"
            )
        # The status follows the command's own stderr, which need not end with a newline.
        said, marker, status = stderr.rstrip(b"\n").rpartition(STEP_EXIT.encode())
        if not marker or not status.isdigit():
            raise EngineError(f"a step on {short(image)} ended without its exit status: {stderr[-200:]!r}")
        return RunOutput(int(status), stdout.decode("utf-8", "replace"), said.decode("utf-8", "replace"))

    @staticmethod
    def _built(image_id: str, build: BuildKitProgress, say: Progress) -> BuildOutcome:
        steps = build.steps
        say(f"built {image_id[:19]}: {len(steps)} steps, {sum(s.cached for s in steps)} from the cache")
        return BuildOutcome(image_id, steps)


_T = TypeVar("_T")


def sent_again(send: Callable[[], _T], say: Progress) -> _T:
    """``send()``, a build through the Engine API; once more if the engine lost its context
    (:class:`~envbuild.engine.buildkit.ContextLost`: a prune of BuildKit's cache during it). Once: a second
    loss is a prune that keeps on, and is raised."""
    try:
        return send()
    except ContextLost as lost:
        say(f"warning: {str(lost).splitlines()[0]}; sending the context again")
    return send()


STEP_EXIT = "envbuild-step-exit="  # the last line of a step's stderr: its command's exit status
STEP_OUTPUT = 64 << 20  # bytes of a step's stdout or stderr kept
CLIPPED = b"[output clipped, log limit"  # what BuildKit prints instead of what it drops


def step_dockerfile(image: str, command: Sequence[str], mount: str) -> str:
    """The Dockerfile of :meth:`Builds.run_step`: the step always succeeds, and says its command's exit
    status on its stderr's last line."""
    script = f'"$0" "$@"; echo {STEP_EXIT}$? >&2'
    argv = json.dumps(["/bin/sh", "-c", script, *command])
    return f"FROM {image}\nRUN --mount=type=bind,source=files,target={mount} --mount=type=tmpfs,target=/tmp {argv}\n"


def step_context(dockerfile: str, files: Mapping[str, bytes]) -> bytes:
    """The step's context as a tar: the Dockerfile, the directory ``files/``, each of ``files`` in it; GNU
    headers, never PAX (BuildKit takes a body whose first member has a PAX header for a Dockerfile)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:

        def add(name: str, data: bytes | None) -> None:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            else:
                info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        add("Dockerfile", dockerfile.encode())
        add("files", None)
        for name, data in sorted(files.items()):
            add(f"files/{name}", data)
    return out.getvalue()


def _buildkit_refusal(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = None
    message = str((body.get("message") if isinstance(body, dict) else None) or response.text)
    message = " ".join(message.split())[:300]
    if response.status_code != 400:  # an engine refuses version=2 as a bad parameter; a proxy (403) is not that
        return (
            f"build: the engine, or a proxy in front of it, refused the build (HTTP {response.status_code}: {message})"
        )
    return (
        f"this engine cannot run BuildKit builds (HTTP {response.status_code}: {message}): "
        "envbuild needs docker >= 20.10 on Linux"
    )
