"""Builds through the docker CLI: the engine's own BuildKit with the CLI's session, which syncs the
context directory file by file (only what BuildKit's copy of it lacks) instead of sending it whole as a
tar body. The docker SDK cannot speak that session protocol; the docker CLI of docker.io 20.10, which
still builds with BuildKit by itself (``DOCKER_BUILDKIT=1``, no buildx), can. A newer CLI does so only
through its buildx plugin, so a CLI is used when ``docker buildx version`` answers or its version is
below 23; else the build goes through the Engine API (:meth:`Engine.buildkit_build`'s other transport).

The CLI's ``--progress=plain`` output is read line by line into the same :class:`BuildKitProgress` as the
API's trace (``#N <name>``, ``#N CACHED``, ``#N DONE 1.2s``, ``#N ERROR: …``, ``#N 0.123 <log line>``),
so both transports report the same steps; the image ID comes from ``--iidfile``. The CLI resets every
file's owner to 0:0 (as the API transport's tar does); modes and mtimes are the directory's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from envbuild.engine.buildkit import BuildKitProgress, Vertex, VertexLog
from envbuild.errors import EngineError

TRANSPORT_ENV = "ENVBUILD_BUILD_TRANSPORT"  # auto (the default) | cli | api
CLI_ENV = "ENVBUILD_DOCKER_CLI"  # the docker CLI to build with, instead of the one found on PATH
CANDIDATES = ("docker", "/usr/bin/docker")
_LINE = re.compile(r"#(\d+) (.*)$")
_LOG = re.compile(r"(\d+\.\d+) ?(.*)$")
_DONE = re.compile(r"DONE \d+(\.\d+)?s$")
TAIL = 20


@dataclass(frozen=True)
class BuildCli:
    """A docker CLI whose ``docker build`` runs on the engine's BuildKit with a session of its own."""

    path: str
    version: str


def choose_transport(environ: dict[str, str] | None = None) -> BuildCli | None:
    """The CLI to build with, or None for the Engine API; ``ENVBUILD_BUILD_TRANSPORT=cli`` insists on a
    CLI (an :class:`EngineError` when none serves), ``api`` never looks for one."""
    env = os.environ if environ is None else environ
    wanted = env.get(TRANSPORT_ENV, "auto") or "auto"
    if wanted not in ("auto", "cli", "api"):
        raise EngineError(f"{TRANSPORT_ENV}={wanted!r}: expected auto, cli or api")
    if wanted == "api":
        return None
    named = env.get(CLI_ENV)
    found = _usable(named) if named else next((c for c in map(_usable, CANDIDATES) if c is not None), None)
    if found is None and (wanted == "cli" or named):
        what = f"{CLI_ENV}={named} is no docker CLI that" if named else "no docker CLI on PATH or at /usr/bin/docker"
        asked = f"{TRANSPORT_ENV}=cli: " if wanted == "cli" else ""
        unset = " and ".join(([TRANSPORT_ENV] if wanted == "cli" else []) + ([CLI_ENV] if named else []))
        raise EngineError(
            f"{asked}{what} builds with BuildKit by itself (it needs to be docker < 23, as Debian's docker.io, "
            f"or to have the buildx plugin); unset {unset} to build through the Engine API"
        )
    return found


def begin_choose_transport() -> None:
    """:func:`choose_transport` begun in a thread of its own (``docker version`` takes 0.05 s): its answer
    is kept for the build that asks next; what it refuses is said when the build asks."""

    def choose() -> None:
        with suppress(EngineError):
            choose_transport()

    threading.Thread(target=choose, name="envbuild-docker-cli", daemon=True).start()


def _usable(command: str) -> BuildCli | None:
    with _asking:  # a second thread that asks waits for the first one's answer
        return _asked(command)


_asking = threading.Lock()


@cache
def _asked(command: str) -> BuildCli | None:
    path = shutil.which(command)
    if path is None:
        return None
    try:
        version = subprocess.run(
            [path, "version", "--format", "{{.Client.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "DOCKER_HOST": "unix:///nonexistent"},  # the client's version only
        ).stdout.strip()
        if not re.match(r"\d+\.", version):  # not a docker CLI, or one that cannot say its version
            return None
        if int(version.split(".")[0]) >= 23:
            buildx = subprocess.run([path, "buildx", "version"], capture_output=True, timeout=30)
            if buildx.returncode != 0:
                return None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return BuildCli(path, version)


class PlainTrace:
    """``docker build --progress=plain`` output turned into the vertexes and logs of BuildKit's trace."""

    def __init__(self, build: BuildKitProgress) -> None:
        self.build = build
        self._names: dict[str, str] = {}
        self.tail: deque[str] = deque(maxlen=TAIL)  # lines that belong to no vertex: the CLI's own errors
        self._pending: str | None = None  # a step whose name came, not yet said as started

    def flush(self, except_for: str | None = None) -> None:
        """Say the pending step started (unless it is ``except_for``): a step's next line, or the end."""
        pending, self._pending = self._pending, None
        if pending is not None and pending != except_for:
            self.build.vertex(Vertex(pending, self._names[pending], False, True, False, ""))

    def line(self, text: str) -> None:
        text = text.rstrip("\r\n")
        match = _LINE.match(text)
        if match is None:
            if text.strip():
                self.tail.append(text)
            return
        digest, rest = f"cli-{match.group(1)}", match.group(2)
        name = self._names.get(digest)
        if name is None:  # the step begins; said as started with its next line, unless that is CACHED
            self._names[digest] = rest
            self.flush()
            self._pending = digest
            return
        if rest == name or rest.startswith("sha256:"):  # the name again, or the vertex's digest
            return
        self.flush(except_for=digest if rest == "CACHED" else None)
        if rest == "CACHED":
            self.build.vertex(Vertex(digest, name, True, True, False, ""))
        elif _DONE.match(rest):
            self.build.vertex(Vertex(digest, name, False, True, True, ""))
        elif rest.startswith("ERROR"):
            self.build.vertex(Vertex(digest, name, False, True, False, rest.partition(":")[2].strip() or rest))
        elif rest.startswith("transferring ") and rest.endswith(" done"):
            self.build.say(f"sent {rest.removeprefix('transferring ').removesuffix(' done')} (what BuildKit lacked)")
        elif (log := _LOG.match(rest)) is not None:
            self.build.log(VertexLog(digest, (log.group(2) + "\n").encode()))


def cli_build(
    cli: BuildCli,
    address: str,
    directory: Path,
    build: BuildKitProgress,
    *,
    dockerfile: str,
    nocache: bool,
    tag: str | None,
    iidfile: Path,
    ssh_path: str | None = None,
) -> str:
    """Build ``directory`` with the CLI against the engine at ``address``, no network; the image ID, which
    the CLI writes into ``iidfile`` (the caller's to remove). ``ssh_path``: a directory whose ``ssh`` the CLI
    runs for an ``ssh://`` address (:meth:`.SshLink.client_path`), before the system's."""
    command = [cli.path, "build", "--progress=plain", "--network=none", "--iidfile", str(iidfile)]
    command += ["-f", str(directory / dockerfile)]
    command += ["--no-cache"] if nocache else []
    command += ["-t", tag] if tag else []
    command.append(str(directory))
    trace = PlainTrace(build)
    env = {**os.environ, "DOCKER_HOST": address, "DOCKER_BUILDKIT": "1", "BUILDKIT_PROGRESS": "plain"}
    if ssh_path is not None:
        env["PATH"] = os.pathsep.join([ssh_path, env.get("PATH", os.defpath)])
    code = _run(command, env, trace)
    if code != 0:
        raise build.failed(_last_error(trace.tail, code))
    try:
        image_id = iidfile.read_text().strip()
    except OSError:
        image_id = ""
    if not image_id.startswith("sha256:"):
        raise EngineError("build: the docker CLI finished without naming the built image")
    return image_id


def _run(command: Sequence[str], env: dict[str, str], trace: PlainTrace) -> int:
    """Run the CLI, feeding its output to ``trace``; an interrupt stops the CLI first (its session closes
    and the engine cancels the build), then goes on."""
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        errors="replace",
        bufsize=1,
    )
    try:
        assert process.stdout is not None
        for text in process.stdout:
            trace.line(text)
        trace.flush()
        return process.wait()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _last_error(lines: Iterable[str], code: int) -> str:
    """The CLI's own last word (``executor failed running …: exit code: 3``, ``error: …``): its last line
    outside the failed step's quoted log (``------``, `` > [2/2] RUN …:``)."""
    kept = [line.strip() for line in lines if line.strip() and not set(line.strip()) <= {"-"}]
    said = [line for line in kept if not line.startswith(">")]
    if said:
        return said[-1].removeprefix("error: ").removeprefix("ERROR: ")
    ended = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"  # Popen's -N: signal N
    return f"the docker CLI {ended}" + (": " + " / ".join(kept[-3:]) if kept else "")
