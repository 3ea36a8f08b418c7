"""The engine's BuildKit through the docker CLI: its session transport (fsutil's file sync), which the
Engine API's tar body does not have and the docker SDK cannot drive.

Why: the CLI streams a context directory file by file and, for a directory it built before (the CLI
keys the session by the directory's path), sends only the files whose metadata changed, where a tar
body is sent whole and unpacked by the engine before the first step. Measured on 1.06 GB of package
files (docs/benchmarks.md): a first transfer 14–20 s against the tar's 25–34 s, a rebuild of an unchanged
or nearly unchanged context 0.5–0.9 s against 15–26 s. The file sync compares size and mtime, never
content: the directory must give a changed file a changed mtime (:mod:`envbuild.image.syncdir`).

Which CLI (:func:`choose_transport`, pure): docker 20.10 to 22 run BuildKit with ``DOCKER_BUILDKIT=1
docker build``; from 23 ``docker build`` needs the buildx plugin, so ``docker buildx build --load`` on
the engine's own builder, and a CLI without buildx is passed over. ``ENVBUILD_DOCKER_CLI`` names the
CLI (``none``: the Engine API). Without a usable CLI the build goes through the Engine API, and says why.

The CLI runs in a session of its own, so that a Ctrl-C at the terminal reaches envbuild alone: an
interrupt (or SIGTERM, taken as one while a build runs) terminates the CLI, the engine cancels the
build with its connection, and the engine's caches are left as after any cancelled build.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from envbuild.engine.buildkit import BuildKitProgress, Status, Vertex, VertexLog
from envbuild.engine.transfer import BuildStep
from envbuild.errors import EngineError
from envbuild.progress import Progress

CLI_ENV = "ENVBUILD_DOCKER_CLI"
CANDIDATES = ("docker", "/usr/bin/docker", "/usr/local/bin/docker")
MIN_VERSION = (20, 10)  # RUN --mount without a `# syntax` line
BUILDX_FROM = (23, 0)  # docker build needs the buildx plugin for BuildKit from here on
PROBE_TIMEOUT = 20  # seconds for `docker --version` / `docker buildx version`
STOP_TIMEOUT = 10  # seconds the CLI has to end after SIGTERM before it is killed
CACHED_AFTER = 0.5  # seconds: a step not answered from the cache by then has started


@dataclass(frozen=True)
class CliProbe:
    """What one docker CLI said about itself."""

    path: str
    version: str  # "20.10.24+dfsg1"; "" when it is not a docker CLI or did not answer
    buildx: bool  # `docker buildx version` works


@dataclass(frozen=True)
class BuildKitCli:
    path: str
    version: str
    command: tuple[str, ...]  # ("build",) or ("buildx", "build", "--load", "--builder", "default")

    def describe(self) -> str:
        verb = " ".join(self.command[:2]) if self.command[0] == "buildx" else "build"
        return f"{self.path} {verb} (docker {self.version}, the CLI's session transport)"


@dataclass(frozen=True)
class Transport:
    """How builds reach the engine's BuildKit: through ``cli``, or the Engine API when it is None."""

    cli: BuildKitCli | None
    reason: str  # why this one: said in the build's progress

    def describe(self) -> str:
        return self.cli.describe() if self.cli else "the Engine API"


def _version(text: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def usable(probe: CliProbe) -> BuildKitCli | str:
    """The probe as a CLI that runs BuildKit builds, or why it cannot."""
    version = _version(probe.version)
    if version is None:
        return f"{probe.path} is not a docker CLI that answers"
    if version < MIN_VERSION:
        return f"{probe.path} is docker {probe.version}, older than 20.10"
    if version < BUILDX_FROM:
        return BuildKitCli(probe.path, probe.version, ("build",))
    if probe.buildx:
        return BuildKitCli(probe.path, probe.version, ("buildx", "build", "--load", "--builder", "default"))
    return f"{probe.path} is docker {probe.version} without the buildx plugin its BuildKit builds need"


def choose_transport(probes: Sequence[CliProbe], named: str | None = None) -> Transport:
    """The first usable CLI of ``probes`` (in the order tried), or the Engine API and why. ``named`` is
    ``ENVBUILD_DOCKER_CLI``: ``none`` picks the Engine API; a path must be usable."""
    if named is not None and named.strip().lower() in ("", "none"):
        return Transport(None, f"{CLI_ENV}={named!r} asks for the Engine API")
    reasons: list[str] = []
    for probe in probes:
        found = usable(probe)
        if isinstance(found, BuildKitCli):
            passed = f" ({'; '.join(reasons)})" if reasons else ""
            return Transport(found, f"{found.path} runs BuildKit builds: only changed files are sent{passed}")
        if named is not None:
            raise EngineError(f"{CLI_ENV}={named}: {found}; set it to a docker CLI >= 20.10 (or to none)")
        reasons.append(found)
    why = "; ".join(reasons) or "no docker CLI on PATH"
    return Transport(None, f"no docker CLI that runs BuildKit builds ({why}): the context is sent whole")


def probe_cli(path: str) -> CliProbe:
    """Ask one docker CLI its version, and whether it has buildx (a real subprocess each)."""

    def answer(*args: str) -> str | None:
        try:
            done = subprocess.run(
                [path, *args], capture_output=True, text=True, timeout=PROBE_TIMEOUT, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    said = answer("--version") or ""
    match = re.search(r"version (\S+?),?(?:\s|$)", said)
    version = match.group(1).rstrip(",") if match and said.lower().startswith("docker") else ""
    buildx = bool(version) and (_version(version) or (0, 0)) >= BUILDX_FROM and answer("buildx", "version") is not None
    return CliProbe(path, version, buildx)


def find_transport(environ: Mapping[str, str] | None = None) -> Transport:
    """The transport builds use here: ``ENVBUILD_DOCKER_CLI`` or the first usable docker CLI of PATH,
    ``/usr/bin/docker``, ``/usr/local/bin/docker``; else the Engine API."""
    env = os.environ if environ is None else environ
    named = env.get(CLI_ENV)
    if named is not None:
        if named.strip().lower() in ("", "none"):
            return choose_transport((), named)
        paths: Iterable[str] = [shutil.which(named, path=env.get("PATH")) or named]
    else:
        paths = [found for name in CANDIDATES if (found := shutil.which(name, path=env.get("PATH")))]
    seen: dict[str, str] = {}
    for path in paths:
        seen.setdefault(os.path.realpath(path), path)
    return choose_transport([probe_cli(path) for path in seen.values()], named)


# --- one build -------------------------------------------------------------------------------------

_LINE = re.compile(r"#(\d+) (.*)")
_TIMED_LOG = re.compile(r"(\d+\.\d+) (.*)")
_SIZE = re.compile(r"transferring context: ([\d.]+)([kMGT]?B)")
_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


class PlainProgress:
    """The CLI's ``--progress plain`` lines as BuildKit vertexes and logs, fed to :class:`BuildKitProgress`
    (the same step lines, heartbeat and failure tail as the Engine API's trace gives). A step's header
    comes before the line saying it is cached, so a step counts as started only when it prints, ends,
    or has not been answered from the cache after :data:`CACHED_AFTER` seconds."""

    def __init__(self, build: BuildKitProgress) -> None:
        self.build = build
        self.sent = 0
        self.messages: list[str] = []  # lines outside any step: the CLI's own error at the end
        self._names: dict[str, str] = {}
        self._pending: dict[str, float] = {}  # header seen, not yet known to have started

    def line(self, text: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        match = _LINE.match(text)
        if match is None:
            if text.strip() and not text.startswith(("------", " > ")):
                self.messages.append(text.strip())
            return
        vertex, rest = match.groups()
        if rest.startswith("[") and vertex not in self._names:
            self._names[vertex] = rest
            self._pending[vertex] = now
            return
        name = self._names.get(vertex, f"#{vertex}")
        if rest == "CACHED":
            self._pending.pop(vertex, None)
            self._feed(Vertex(vertex, name, True, True, True, ""))
        elif rest.startswith("DONE"):
            self._start(vertex)
            self._feed(Vertex(vertex, name, False, True, True, ""))
        elif rest.startswith("ERROR"):
            self._start(vertex)
            self._feed(Vertex(vertex, name, False, True, False, rest.partition(":")[2].strip() or "failed"))
        elif (size := _SIZE.match(rest)) is not None:
            self.sent = int(float(size.group(1)) * _UNITS[size.group(2)])
        elif (log := _TIMED_LOG.match(rest)) is not None:
            self._start(vertex)
            self.build.status(Status((), (VertexLog(vertex, (log.group(2) + "\n").encode()),)))

    def tick(self, now: float | None = None) -> None:
        """Steps not answered from the cache within :data:`CACHED_AFTER` seconds have started."""
        now = time.monotonic() if now is None else now
        for vertex, seen in list(self._pending.items()):
            if now - seen >= CACHED_AFTER:
                self._start(vertex)

    def _start(self, vertex: str) -> None:
        if self._pending.pop(vertex, None) is not None:
            self._feed(Vertex(vertex, self._names[vertex], False, True, False, ""))

    def _feed(self, vertex: Vertex) -> None:
        self.build.status(Status((vertex,), ()))

    def error(self) -> str:
        """The CLI's own last word on a failed build, without its ``error:`` prefix."""
        message = self.messages[-1] if self.messages else "the docker CLI failed"
        return re.sub(r"^(error|ERROR): ", "", message)


@dataclass(frozen=True)
class CliOutcome:
    image_id: str
    steps: tuple[BuildStep, ...]
    sent: int  # bytes the CLI said it transferred of the context


def run_cli_build(
    cli: BuildKitCli,
    address: str,
    directory: Path,
    *,
    nocache: bool,
    tag: str | None,
    progress: Progress,
) -> CliOutcome:
    """Build ``directory`` (its ``Dockerfile``) with ``cli`` against the engine at ``address``, no
    network; the image ID from ``--iidfile``. An interrupt terminates the CLI and is raised again."""
    build = BuildKitProgress(progress)
    plain = PlainProgress(build)
    with tempfile.TemporaryDirectory(prefix="envbuild-iid-") as scratch:
        iidfile = Path(scratch, "iid")
        command = [cli.path, *cli.command, "--network", "none", "--progress", "plain", "--iidfile", str(iidfile)]
        command += ["--no-cache"] * nocache + (["--tag", tag] if tag else []) + [str(directory)]
        env = {k: v for k, v in os.environ.items() if k != "DOCKER_CONTEXT"}
        env |= {"DOCKER_HOST": address, "DOCKER_BUILDKIT": "1"}
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a Ctrl-C at the terminal is envbuild's to handle
            )
        except OSError as exc:
            raise EngineError(f"build: cannot run {cli.path}: {exc.strerror or exc}") from None
        try:
            with build:
                _relay(proc, plain)
                code = proc.wait()
        except BaseException:
            _stop(proc)
            raise
        if code != 0:
            raise EngineError(build.failure(plain.error()))
        try:
            image_id = iidfile.read_text(encoding="ascii").strip()
        except OSError:
            image_id = ""
    if not image_id.startswith("sha256:"):
        raise EngineError(f"build: {cli.path} finished without naming the built image")
    steps = build.steps
    progress(f"built {image_id[:19]}: {len(steps)} steps, {sum(s.cached for s in steps)} from the cache")
    return CliOutcome(image_id, steps, plain.sent)


def _relay(proc: subprocess.Popen[bytes], plain: PlainProgress) -> None:
    assert proc.stdout is not None
    fd, partial = proc.stdout.fileno(), b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            if selector.select(timeout=CACHED_AFTER):
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                *lines, partial = (partial + data).split(b"\n")
                for line in lines:
                    plain.line(line.decode("utf-8", "replace").rstrip("\r"))
            plain.tick()
    if partial:
        plain.line(partial.decode("utf-8", "replace"))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the CLI: SIGTERM to its session, SIGKILL after :data:`STOP_TIMEOUT`. The engine cancels the
    build when the CLI's connection closes."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    if proc.stdout is not None:
        proc.stdout.close()
