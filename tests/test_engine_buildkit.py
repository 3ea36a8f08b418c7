"""envbuild.engine.buildkit, .cli_build and Engine.buildkit_build: BuildKit's trace decoded from its protobuf
wire format (pure, on bytes written here by the same rules), and real BuildKit builds of the scripts/services
dockerd through both transports (the docker CLI's session, the Engine API): steps and the cache, no network,
a failing step's log tail in the error."""

from __future__ import annotations

import base64
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import docker
import pytest

from envbuild.engine.buildkit import (
    CONTEXT_LOST_HINT,
    LOST_LAYER_HINT,
    BuildKitProgress,
    ContextLost,
    LostLayer,
    StepFailed,
    decode_status,
    fields,
)
from envbuild.engine.claim import EngineClaim
from envbuild.engine.cli_build import CLI_ENV, TRANSPORT_ENV, choose_transport
from envbuild.engine.client import Engine
from envbuild.engine.transfer import directory_context
from envbuild.errors import EngineError
from envbuild.git import treehash
from envbuild.image import inimage_probe
from envbuild.image.cache.retention import empty_build_cache
from tests.lib.baseimage import BaseImage


def _varint(value: int) -> bytes:
    out = b""
    while True:
        byte, value = value & 0x7F, value >> 7
        out += bytes([byte | (0x80 if value else 0)])
        if not value:
            return out


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _vertex(digest: str, name: str, *, cached: bool = False, done: bool = False, error: str = "") -> bytes:
    body = _field(1, digest.encode()) + _field(3, name.encode()) + _field(5, b"\x08\x01")  # started
    body += (_field(4, 1) if cached else b"") + (_field(6, b"\x08\x02") if done else b"") + _field(7, error.encode())
    return _field(1, body)


def _log(digest: str, data: bytes) -> bytes:
    return _field(3, _field(1, digest.encode()) + _field(3, 1) + _field(4, data))


def _event(message: bytes) -> dict[str, object]:
    return {"id": "moby.buildkit.trace", "aux": base64.b64encode(message).decode()}


def test_the_trace_decodes_to_vertexes_and_logs() -> None:
    status = decode_status(
        base64.b64encode(_vertex("sha256:a", "[1/2] RUN x", done=True) + _log("sha256:a", b"hi\n")).decode()
    )
    assert [(v.digest, v.name, v.completed, v.cached) for v in status.vertexes] == [
        ("sha256:a", "[1/2] RUN x", True, False)
    ]
    assert [(log.vertex, log.data) for log in status.logs] == [("sha256:a", b"hi\n")]
    assert fields(_field(2, 300)) == [(2, 300)]
    with pytest.raises(EngineError, match="cannot be read"):
        decode_status(base64.b64encode(b"\x0a\x05ab").decode())  # a field longer than the message


def test_progress_counts_steps_and_keeps_the_failed_steps_log_tail() -> None:
    lines: list[str] = []
    with BuildKitProgress(lines.append) as progress:
        progress.event(_event(_vertex("sha256:i", "[internal] load build definition", done=True)))
        progress.event(_event(_vertex("sha256:f", "[1/3] FROM base", cached=True)))
        progress.event(_event(_vertex("sha256:r", "[2/3] RUN make")))
        progress.event(_event(_log("sha256:r", b"compiling\nthe-last-") + _log("sha256:r", b"words\n")))
        progress.event(_event(_vertex("sha256:r", "[2/3] RUN make", error="exit code: 2")))
        progress.event({"id": "moby.image.id", "aux": {"ID": "sha256:feed"}})
    assert [(s.instruction, s.cached) for s in progress.steps] == [("[1/3] FROM base", True)]  # internal: not a step
    assert "step [2/3] RUN make" in lines and "step [1/3] FROM base: cached" in lines
    message = str(progress.failed("exit code: 2"))
    assert message.startswith("build failed at step [2/3] RUN make: exit code: 2")
    assert message.endswith("\n    | compiling\n    | the-last-words")
    assert progress.image_id == "sha256:feed"


def test_a_step_on_a_layer_the_engine_lost_is_the_engines_failure_not_the_steps() -> None:
    """Docker 20.10's message (CI's run, verbatim but the IDs) when BuildKit's cache kept a step whose layer
    went: an EngineError that says how to recover, so a bisect does not blame the candidate; any other
    failure of a step stays the step's."""
    lost = (
        "failed to prepare 36cbtrugoonewa5egfqglf8h9: open "
        "/var/lib/envbuild-test/docker/overlay2/ue82woh247swqpe8h011s9oqw/committed: no such file or directory"
    )
    for message, kind in ((lost, LostLayer), ("exit code: 2", StepFailed)):
        with BuildKitProgress(lambda _: None) as progress:
            progress.event(_event(_vertex("sha256:r", "[envbuild-src-gamma 1/1] RUN cp")))
            progress.event(_event(_vertex("sha256:r", "[envbuild-src-gamma 1/1] RUN cp", error=message)))
        error = progress.failed(message)
        assert type(error) is kind
    assert str(error).startswith("build failed at step [envbuild-src-gamma 1/1] RUN cp: exit code: 2")
    with BuildKitProgress(lambda _: None) as progress:
        progress.event(_event(_vertex("sha256:r", "[envbuild-src-gamma 1/1] RUN cp", error=lost)))
    said = str(progress.failed(lost))
    assert said.startswith(f"build failed at step [envbuild-src-gamma 1/1] RUN cp: {lost} (")
    assert said.endswith(f"({LOST_LAYER_HINT})") and "`docker builder prune -af`" in LOST_LAYER_HINT


LOST_CONTEXT = (
    'failed to solve with frontend dockerfile.v0: failed to read downloaded context: Get "http://build-context-'
    'uc7rwruxlamkqadynzlxrcz9c": context not found'
)


def test_a_context_the_engine_lost_is_the_engines_failure_and_says_why() -> None:
    """Docker 20.10's words (a test run's, verbatim) when BuildKit read an Engine API build's context again
    after a prune took its record: ContextLost, which is sent again (below), never a step's failure."""
    with BuildKitProgress(lambda _: None) as progress:
        progress.event(_event(_vertex("sha256:c", "[internal] load remote build context", error=LOST_CONTEXT)))
    error = progress.failed(LOST_CONTEXT)
    assert type(error) is ContextLost
    assert (
        str(error) == f"build failed at step [internal] load remote build context: {LOST_CONTEXT} ({CONTEXT_LOST_HINT})"
    )


def test_a_long_silent_step_still_says_it_runs() -> None:
    """A step installing GBs prints nothing for minutes: a timer says it runs, with its last output."""
    lines: list[str] = []
    with BuildKitProgress(lines.append, heartbeat=0.2) as progress:
        progress.event(_event(_vertex("sha256:f", "[1/2] FROM base", cached=True)))
        progress.event(_event(_vertex("sha256:r", "[2/2] RUN pip install big.whl")))
        progress.event(_event(_log("sha256:r", b"Installing collected packages: big\n")))
        time.sleep(0.9)
        progress.event(_event(_vertex("sha256:r", "[2/2] RUN pip install big.whl", done=True)))
    beats = [line for line in lines if line.startswith("[2/2] RUN pip install big.whl: still running after ")]
    assert beats and beats[0].endswith("; last output: Installing collected packages: big")
    assert [(s.instruction, s.cached) for s in progress.steps] == [
        ("[1/2] FROM base", True),
        ("[2/2] RUN pip install big.whl", False),
    ]


@pytest.fixture(scope="module", params=["cli", "api"])
def engine(request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> Iterator[Engine]:
    """The engine, building through the docker CLI's session or the Engine API: both must give the
    same steps, cache and errors."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TRANSPORT_ENV, request.param)
        engine = Engine(docker_client)
        assert (engine.build_cli is not None) == (request.param == "cli")  # the machine has a CLI that serves
        yield engine


@pytest.mark.docker
def test_a_buildkit_build_runs_steps_without_network_and_from_the_cache(
    tmp_path: Path, engine: Engine, base_image: BaseImage
) -> None:
    marker = uuid.uuid4().hex
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hello.txt").write_text("hello\n")
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_image.tag}\n"
        f"RUN --mount=type=bind,source=data,target=/mnt cat /mnt/hello.txt > /hello && echo {marker} > /m\n"
        "RUN python3 -c \"import socket; socket.create_connection(('192.0.2.1', 80), 2)\" 2>/dev/null"
        " && echo network > /net || echo none > /net\n"
    )
    lines: list[str] = []
    first = engine.buildkit_build(directory_context(tmp_path), progress=lines.append)
    runs = [s for s in first.steps if "] RUN " in s.instruction]
    assert len(runs) == 2 and not any(s.cached for s in runs)
    out = engine.run(first.image_id, ["sh", "-c", "cat /hello /m /net"])
    assert out.stdout.split() == ["hello", marker, "none"]  # the mount's file, the step, no network
    again = engine.buildkit_build(directory_context(tmp_path))
    assert all(s.cached for s in again.steps if "] RUN " in s.instruction)
    fresh = engine.buildkit_build(directory_context(tmp_path), nocache=True)
    assert not any(s.cached for s in fresh.steps if "] RUN " in s.instruction)
    for image in {first.image_id, again.image_id, fresh.image_id}:
        engine.remove(image, force=True)


@pytest.mark.docker
@pytest.mark.engine_wide  # it takes a layer from under BuildKit's cache, then empties that cache
def test_a_step_on_a_lost_layer_fails_as_lost_and_builds_once_the_cache_is_emptied(
    tmp_path: Path, engine: Engine, base_image: BaseImage
) -> None:
    """The engine's own words for a step whose layer is gone, through each transport, made here as docker
    20.10 was seen to leave it: the step's image removed (its layer then BuildKit's alone), the layer's
    directory gone. A step prepared on it fails as LostLayer; emptied, the cache builds it again."""
    one = f"FROM {base_image.tag}\nRUN echo {uuid.uuid4().hex} > /one\n"
    (tmp_path / "Dockerfile").write_text(one)
    first = engine.buildkit_build(directory_context(tmp_path))
    found = engine.inspect(first.image_id)
    assert found is not None
    upper = found["GraphDriver"]["Data"].get("UpperDir")
    assert upper, f"the test engine's storage is {found['GraphDriver']['Name']}, not overlay2"
    engine.remove(first.image_id, force=True)
    shutil.rmtree(Path(upper).parent)
    (tmp_path / "Dockerfile").write_text(one + "RUN echo two > /two\n")
    with pytest.raises(LostLayer) as caught:
        engine.buildkit_build(directory_context(tmp_path))
    assert f"/committed: no such file or directory ({LOST_LAYER_HINT})" in str(caught.value)
    said: list[str] = []
    empty_build_cache(engine, EngineClaim(engine.address), caught.value, said.append)
    assert said[0] == f"warning: {str(caught.value).splitlines()[0]}"
    assert said[-1].startswith("emptied BuildKit's cache (") and said[-1].endswith("; building again")
    again = engine.buildkit_build(directory_context(tmp_path))
    assert engine.run(again.image_id, ["cat", "/two"]).stdout == "two\n"
    engine.remove(again.image_id, force=True)


@pytest.mark.docker
def test_a_failing_buildkit_step_names_itself_and_keeps_its_log_tail(
    tmp_path: Path, engine: Engine, base_image: BaseImage
) -> None:
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_image.tag}\nRUN echo first-line; echo the-last-words >&2; exit 3\n"
    )
    with pytest.raises(EngineError) as caught:
        engine.buildkit_build(directory_context(tmp_path))
    message = str(caught.value)
    assert message.startswith("build failed at step [2/2] RUN echo first-line"), message
    assert "exit code: 3" in message and "| the-last-words" in message


def test_the_transport_is_chosen_by_what_the_machine_has(tmp_path: Path) -> None:
    assert choose_transport({TRANSPORT_ENV: "api"}) is None
    found = choose_transport({})
    assert found is not None  # Debian's docker.io CLI, which scripts/install-test-deps installs
    assert int(found.version.split(".")[0]) < 23 or "buildx" in found.path
    assert choose_transport({TRANSPORT_ENV: "cli"}) == found
    with pytest.raises(EngineError, match="expected auto, cli or api"):
        choose_transport({TRANSPORT_ENV: "buildctl"})
    not_docker = tmp_path / "docker"
    not_docker.write_text("#!/bin/sh\necho 'not a docker CLI'\n")
    not_docker.chmod(0o755)
    for named in (str(not_docker), str(tmp_path / "missing")):
        with pytest.raises(
            EngineError, match=f"^{CLI_ENV}={named} is no docker CLI that builds with BuildKit by itself"
        ):
            choose_transport({CLI_ENV: named})


@pytest.mark.docker
@pytest.mark.engine_wide  # it counts every image of the engine
def test_a_step_runs_like_a_container_without_network_and_leaves_no_image(
    docker_client: docker.DockerClient, base_image: BaseImage
) -> None:
    """Engine.run_step: the files mounted read-only, stdout and stderr apart, the command's exit status, no
    network, and nothing left in the engine (the step's image is removed)."""
    engine = Engine(docker_client)
    before = {image["Id"] for image in docker_client.api.images(all=True)}
    script = (
        "cat /mnt/in/a.txt; echo to-stderr >&2; touch /mnt/in/b 2>/dev/null && echo writable;"
        " python3 -c \"import socket; socket.create_connection(('192.0.2.1', 80), 2)\" 2>/dev/null"
        " && echo network || echo no-network; exit 3"
    )
    out = engine.run_step(base_image.tag, ["sh", "-c", script], {"a.txt": b"from the host\n"}, mount="/mnt/in")
    assert (out.exit_code, out.stdout, out.stderr) == (3, "from the host\nno-network\n", "to-stderr\n")
    assert engine.run_step(base_image.tag, ["true"], {}, mount="/mnt/in").exit_code == 0
    assert {image["Id"] for image in docker_client.api.images(all=True)} == before


@pytest.mark.docker
def test_a_step_s_output_comes_whole_or_not_at_all(docker_client: docker.DockerClient, base_image: BaseImage) -> None:
    """BuildKit clips a step printing more than 200 KiB/s (docker 20.10): that is an error, never a short
    output; the in-image check's encoded report keeps under the rate, and a large one comes through whole."""
    engine = Engine(docker_client)
    flood = "import sys; sys.stdout.write(('y' * 99 + chr(10)) * 6000)"  # 600 kB at once
    with pytest.raises(EngineError, match="clipped"):
        engine.run_step(base_image.tag, ["python3", "-c", flood], {}, mount="/mnt/in")
    text = base64.b64encode(os.urandom(200_000)).decode() + "\n"  # does not compress: 267 kB on the log
    write = (
        "import sys; sys.path.insert(0, '/mnt/in'); import inimage_probe as p; "
        "p.write_encoded(open('/mnt/in/t').read(), sys.stdout)"
    )
    files = {
        "inimage_probe.py": Path(inimage_probe.__file__).read_bytes(),
        "treehash.py": Path(treehash.__file__).read_bytes(),  # the probe loads it from beside itself
        "t": text.encode(),
    }
    out = engine.run_step(base_image.tag, ["python3", "-c", write], files, mount="/mnt/in")
    assert out.exit_code == 0, out.stderr
    assert inimage_probe.read_encoded(out.stdout) == text


class Pruner:
    """BuildKit's cache pruned again and again beside the builds (another user's ``docker builder prune``,
    made constant), until told to stop: then it waits for the prune under way."""

    def __init__(self, engine: Engine) -> None:
        self.stop = threading.Event()
        self.prunes = 0
        self._thread = threading.Thread(target=self._loop, args=(engine,), daemon=True)
        self._thread.start()

    def _loop(self, engine: Engine) -> None:
        while not self.stop.is_set():
            engine.prune_build_cache(0, everything=True)
            self.prunes += 1

    def halt(self) -> None:
        self.stop.set()
        self._thread.join()


RESENT = "; sending the context again"
_R = TypeVar("_R")


def beside_prunes(engine: Engine, act: Callable[[Callable[[str], None]], _R]) -> tuple[list[_R], list[str], int]:
    """``act(say)`` beside a :class:`Pruner`, again until one act meets a lost context (each did but for 1 in
    20; at most 5): the pruner stops at that warning, so the context sent again meets no prune. What each
    act gave, what was said, and how many prunes ran."""
    pruner, said = Pruner(engine), []

    def say(line: str) -> None:
        said.append(line)
        if line.startswith("warning: ") and line.endswith(RESENT):
            pruner.halt()

    results = []
    try:
        for _attempt in range(5):
            results.append(act(say))
            if pruner.stop.is_set():
                break
    finally:
        pruner.halt()
    return results, said, pruner.prunes


@pytest.mark.docker
@pytest.mark.engine_wide  # it prunes BuildKit's whole cache, over and over
def test_an_api_build_whose_context_a_prune_took_is_sent_again(
    tmp_path: Path, docker_client: docker.DockerClient, base_image: BaseImage
) -> None:
    """A prune of BuildKit's cache during Engine API builds (measured: 19 of 20 builds failed with the
    engine's "context not found" beside a prune loop; none through the docker CLI). The first loss is said
    and the context sent again; the prune stops there, and the build and the step run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TRANSPORT_ENV, "api")
        engine = Engine(docker_client)
        assert engine.build_cli is None  # chosen now, while the variable is set

    def build(say: Callable[[str], None]) -> str:
        (tmp_path / "Dockerfile").write_text(f"FROM {base_image.tag}\nRUN echo {uuid.uuid4().hex} > /m\n")
        built = engine.buildkit_build(directory_context(tmp_path), nocache=True, progress=say)
        engine.remove(built.image_id, force=True)
        return built.image_id

    _built, said, prunes = beside_prunes(engine, build)
    lost = [line for line in said if line.endswith(RESENT)]
    assert len(lost) == 1, said
    assert "context not found" in lost[0] and f"({CONTEXT_LOST_HINT})" in lost[0]
    assert prunes > 0 and said[-1].startswith("built sha256:")

    # Engine.run_step, the in-image check's way, goes through the Engine API on every engine.
    runs, said, _prunes = beside_prunes(
        engine, lambda say: engine.run_step(base_image.tag, ["echo", "ran"], {}, mount="/mnt/in", say=say)
    )
    assert len([line for line in said if line.endswith(RESENT)]) == 1, said
    assert all((run.exit_code, run.stdout) == (0, "ran\n") for run in runs)
