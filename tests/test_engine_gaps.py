"""The container engine's door (:mod:`envbuild.engine`) at the edges no other test reached: what an engine,
a docker CLI, a registry or a proxy can answer that is not a build, a pull or a run going well.

- BuildKit's trace cut inside a number, or carrying fields of a kind the reader does not read; a step that
  prints more than is kept; a step whose stderr does not end with a newline (its status still read);
- a build whose base the engine can neither find nor fetch (the engine's failure, not the Dockerfile's),
  through both transports; an engine that refuses BuildKit builds (docker 18.06's own answer), a proxy
  that forbids them, an answer that is no engine's JSON, and a build stream that ends without naming the
  image (a small HTTP server on loopback answering as each of those does: the real engine answers none);
- the docker CLI transport: a CLI that is gone from the engine, a wrapper that names no image, a CLI that
  fails saying nothing or is killed, one that cannot even say its version, and a Ctrl-C while it builds;
- containers and images: host paths through a regular file, paths an image lacks or holds as no regular
  file, an archive that is no ``docker save``, a push to a registry out of reach, a pull of a layer that is
  no tar, a job that cannot start for a device its host lacks, containers and volumes removed meanwhile;
- an engine address that is no address, and an engine gone before ``docker system df``.

Real services where they can answer: the suite's dockerd, its registry, the machine's docker CLI; the
wrappers of ``ENVBUILD_DOCKER_CLI`` are small shell scripts in ``tmp_path``, as a user's own would be."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import signal
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import docker
import pytest
import requests

from envbuild.engine.buildkit import BuildKitProgress, decode_status
from envbuild.engine.cli_build import CLI_ENV, TRANSPORT_ENV, BuildCli, choose_transport, cli_build
from envbuild.engine.client import Engine
from envbuild.engine.jobs import JobSpec
from envbuild.engine.transfer import directory_context
from envbuild.errors import EngineError, InputError
from envbuild.lock.platform import OCI_ARCH
from tests.lib.baseimage import BaseImage
from tests.lib.registryapi import CONFIG, MANIFEST, put_blob, put_manifest
from tests.lib.signals import default_sigint


@pytest.fixture(scope="module")
def engine(docker_client: docker.DockerClient) -> Engine:
    return Engine(docker_client)


def gone_engine() -> Engine:
    """An engine whose socket is gone (a dockerd stopped since it was reached)."""
    address = f"unix:///tmp/envbuild-test-gone-{uuid.uuid4().hex[:8]}/docker.sock"
    return Engine(docker.DockerClient(base_url=address, version="1.41"), address)


# --- BuildKit's trace (no engine) ---------------------------------------------------------------------------


def _key(number: int, wire: int) -> bytes:
    return bytes([number << 3 | wire])


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited field (every one here is shorter than 128 bytes: its length is one byte)."""
    return _key(number, 2) + bytes([len(value)]) + value


def _trace(message: bytes) -> dict[str, object]:
    return {"id": "moby.buildkit.trace", "aux": base64.b64encode(message).decode()}


def test_a_trace_cut_inside_a_number_or_with_a_group_is_one_line_and_fixed_width_fields_are_skipped() -> None:
    """The reader reads varints and length-delimited fields; a newer BuildKit's fixed-width fields (wire
    types 1 and 5) are stepped over, the vertex around them still read; a varint the message ends inside,
    or a group (wire type 3, which no BuildKit sends), is one line saying the trace cannot be read."""
    fixed = _key(8, 1) + b"\x01" * 8 + _key(9, 5) + b"\x02" * 4  # a double and a float, as a newer BuildKit may add
    vertex = _field(1, _field(1, b"sha256:a") + fixed + _field(3, b"[1/2] RUN make"))
    status = decode_status(base64.b64encode(vertex).decode())
    assert [(v.digest, v.name) for v in status.vertexes] == [("sha256:a", "[1/2] RUN make")]
    for message, why in (
        (_key(2, 0) + b"\x80\x80", "a varint runs past the end of the message"),
        (_key(2, 3), "protobuf wire type 3 is not read here"),
    ):
        with pytest.raises(EngineError) as caught:
            decode_status(base64.b64encode(message).decode())
        assert str(caught.value) == f"build: the engine sent a BuildKit trace that cannot be read: {why}"


def test_a_step_that_prints_more_than_is_kept_is_an_error_not_a_short_output() -> None:
    """An engine whose BuildKit does not clip a step's log (its limits lifted) can send more than a step's
    output kept whole: that is an error, never the first part of it taken for all of it."""
    progress = BuildKitProgress(lambda _: None, keep_output=8)
    progress.event(_trace(_field(3, _field(1, b"sha256:run") + _field(4, b"ok\n"))))
    with pytest.raises(EngineError) as caught:
        progress.event(_trace(_field(3, _field(1, b"sha256:run") + _field(4, b"toolong"))))
    assert str(caught.value) == "build: a step printed more than 8 bytes, more than is kept"


# --- builds through the engine ------------------------------------------------------------------------------


@pytest.mark.docker
def test_a_step_whose_stderr_does_not_end_with_a_newline_keeps_its_exit_status(
    engine: Engine, base_image: BaseImage
) -> None:
    """The in-image check's step says its command's status after the command's stderr; a command that
    leaves its last stderr line open (a progress bar, printf) is still a step that ended with that status."""
    for script, ended in (
        ("printf partial >&2; exit 4", (4, "", "partial")),
        ("echo out; echo a >&2; printf b >&2", (0, "out\n", "a\nb")),
        ("echo a >&2; echo >&2; exit 1", (1, "", "a\n\n")),  # and a stderr that ends its lines, as it was
    ):
        out = engine.run_step(base_image.tag, ["sh", "-c", script], {}, mount="/mnt/in")
        assert (out.exit_code, out.stdout, out.stderr) == ended


@pytest.mark.docker
@pytest.mark.parametrize("transport", ["cli", "api"])
def test_a_base_the_engine_cannot_find_or_fetch_is_the_engines_failure_not_a_step(
    transport: str, tmp_path: Path, docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base removed from the engine since it was made sure of, and no registry to fetch it from: BuildKit
    fails resolving it, before any step of the Dockerfile; that is an EngineError naming BuildKit's own
    step, never a StepFailed (which a bisect would blame on the candidate). Both transports say the same."""
    monkeypatch.setenv(TRANSPORT_ENV, transport)
    base = f"127.0.0.1:1/envbuild-test/enginegaps:{uuid.uuid4().hex[:12]}"
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN true\n")
    with pytest.raises(EngineError) as caught:
        Engine(docker_client).buildkit_build(directory_context(tmp_path))
    assert type(caught.value) is EngineError  # neither a StepFailed nor a LostLayer
    repository, tag = base.rsplit(":", 1)
    assert str(caught.value) == (
        f"build failed at step [internal] load metadata for {base}: failed to solve with frontend dockerfile.v0: "
        f'failed to create LLB definition: failed to do request: Head "http://127.0.0.1:1/v2/'
        f'{repository.removeprefix("127.0.0.1:1/")}/manifests/{tag}": dial tcp 127.0.0.1:1: connect: connection refused'
    )


@dataclass
class StandIn:
    """An HTTP server on loopback standing where the engine's API is: it answers ``POST …/build`` with
    ``status``, ``body`` and ``content_type`` once it has read the whole context, and 404 to the rest."""

    status: int
    body: bytes
    content_type: str = "application/json"

    def __enter__(self) -> Engine:
        answer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                while size := int(self.rfile.readline().strip() or b"0", 16):  # the context, chunked
                    self.rfile.read(size + 2)
                self.rfile.readline()
                status = answer.status if self.path.partition("?")[0].endswith("/build") else 404
                self.send_response(status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        address = f"tcp://127.0.0.1:{self._server.server_address[1]}"
        self._engine = Engine(docker.DockerClient(base_url=address, version="1.41"), address)
        return self._engine

    def __exit__(self, *exc: object) -> None:
        self._engine.close()
        self._server.shutdown()
        self._server.server_close()


HAPROXY_403 = b"<html><body><h1>403 Forbidden</h1>\nRequest forbidden by administrative rules.\n</body></html>\n"


def test_an_engine_or_a_proxy_that_refuses_the_build_is_said_as_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker 18.06 without experimental mode refuses ``version=2`` with a 400 of its own words: an engine
    too old for envbuild. A socket proxy in front of a good engine (docker-socket-proxy with BUILD=0) answers
    403 with HAProxy's HTML page: the proxy's refusal, not the engine's age."""
    monkeypatch.setenv(TRANSPORT_ENV, "api")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    old = json.dumps({"message": "buildkit is only supported with experimental mode"}).encode()
    with StandIn(400, old) as engine, pytest.raises(EngineError) as caught:
        engine.buildkit_build(directory_context(tmp_path))
    assert str(caught.value) == (
        "this engine cannot run BuildKit builds (HTTP 400: buildkit is only supported with experimental mode): "
        "envbuild needs docker >= 20.10 on Linux"
    )
    with StandIn(403, HAPROXY_403, "text/html") as engine, pytest.raises(EngineError) as caught:
        engine.buildkit_build(directory_context(tmp_path))
    assert str(caught.value) == (
        "build: the engine, or a proxy in front of it, refused the build (HTTP 403: <html><body><h1>403 Forbidden"
        "</h1> Request forbidden by administrative rules. </body></html>)"
    )


def test_a_build_stream_that_ends_without_naming_the_image_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream that ends cleanly after BuildKit's first news and before the image's ID (a proxy ending the
    answer at its own deadline): no image to take for the build's."""
    monkeypatch.setenv(TRANSPORT_ENV, "api")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    vertex = _field(1, _field(1, b"sha256:i") + _field(3, b"[internal] load build definition from Dockerfile"))
    stream = json.dumps(_trace(vertex)).encode() + b"\r\n"
    with StandIn(200, stream) as engine, pytest.raises(EngineError) as caught:
        engine.buildkit_build(directory_context(tmp_path))
    assert str(caught.value) == "build: the engine finished without naming the built image"


def test_an_answer_that_is_not_the_engines_json_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What stands at the engine's address answers the build as no engine does: 200 with a page (a gateway's
    login page), or a refusal whose JSON is not an object. Each is one line naming what came."""
    monkeypatch.setenv(TRANSPORT_ENV, "api")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with StandIn(200, b"<html>sign in</html>\r\n", "text/html") as engine, pytest.raises(EngineError) as caught:
        engine.buildkit_build(directory_context(tmp_path))
    assert str(caught.value) == "build: the engine sent a line that is no JSON object: b'<html>sign in</html>'"
    with StandIn(502, b'["bad gateway"]') as engine, pytest.raises(EngineError) as caught:
        engine.buildkit_build(directory_context(tmp_path))
    assert str(caught.value) == (
        'build: the engine, or a proxy in front of it, refused the build (HTTP 502: ["bad gateway"])'
    )


# --- builds through the docker CLI --------------------------------------------------------------------------


def test_a_cli_build_on_an_engine_gone_away_says_what_the_cli_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine's docker CLI (the one the transport picks) building on an engine that stopped since it
    was reached: the build fails at no step, with the CLI's own last word."""
    monkeypatch.setenv(TRANSPORT_ENV, "cli")
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    engine = gone_engine()
    with pytest.raises(EngineError) as caught:
        engine.buildkit_build(directory_context(context))
    assert type(caught.value) is EngineError
    socket = engine.address.removeprefix("unix://")
    assert str(caught.value) in (  # the CLI asks the engine twice at once (its session, a ping): either fails first
        f"build failed: Cannot connect to the Docker daemon at {engine.address}. Is the docker daemon running?",
        "build failed: failed to dial gRPC: cannot connect to the Docker daemon. Is 'docker daemon' running on "
        f"this host?: dial unix {socket}: connect: no such file or directory",
    )


def wrapper(tmp_path: Path, build: str) -> BuildCli:
    """A user's ``ENVBUILD_DOCKER_CLI``: a script that says it is docker 20.10 and runs ``build`` as given."""
    script = tmp_path / "docker-wrapper"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = version ]; then echo 20.10.24; exit 0; fi\n'
        'while [ "$1" != --iidfile ]; do shift; done\niid="$2"\n' + build
    )
    script.chmod(0o755)
    return BuildCli(str(script), "20.10.24")


def run_cli(cli: BuildCli, tmp_path: Path) -> str:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    build = BuildKitProgress(lambda _: None)
    return cli_build(
        cli, "unix:///nowhere.sock", tmp_path, build, dockerfile="Dockerfile", nocache=False, tag=None,
        iidfile=tmp_path / "iid",
    )  # fmt: skip


@pytest.mark.parametrize("writes", ["", 'echo not-an-image-id > "$iid"\n'])
def test_a_cli_that_succeeds_without_naming_the_image_is_one_line(tmp_path: Path, writes: str) -> None:
    """A wrapper that runs the CLI where envbuild's ``--iidfile`` path is not the same file (in a toolbox
    container, under sudo with a private /tmp) exits 0 and leaves no image ID, or not one envbuild reads."""
    cli = wrapper(tmp_path, f'echo "#1 [1/1] FROM scratch"\necho "#1 DONE 0.0s"\n{writes}exit 0\n')
    with pytest.raises(EngineError) as caught:
        run_cli(cli, tmp_path)
    assert str(caught.value) == "build: the docker CLI finished without naming the built image"


@pytest.mark.parametrize(
    ("build", "said"),
    [
        ("exit 3\n", "the docker CLI exited with status 3"),
        (
            'printf -- "------\\n > [1/1] RUN make:\\n------\\n"\nexit 1\n',
            "the docker CLI exited with status 1: > [1/1] RUN make:",
        ),
        ("kill -9 $$\n", "the docker CLI was killed by signal 9"),
    ],
)
def test_a_cli_that_fails_saying_nothing_of_its_own_is_said_by_how_it_ended(
    tmp_path: Path, build: str, said: str
) -> None:
    """No line of the CLI's own to quote (only a step's quoted log, or nothing: killed by the OOM killer):
    how it ended is the message, and a CLI killed by a signal is not said to have exited with a status."""
    with pytest.raises(EngineError) as caught:
        run_cli(wrapper(tmp_path, build), tmp_path)
    assert type(caught.value) is EngineError
    assert str(caught.value) == f"build failed: {said}"


def test_a_docker_cli_that_cannot_start_is_not_one_that_serves(tmp_path: Path) -> None:
    """``ENVBUILD_DOCKER_CLI`` naming a script whose interpreter is gone: it cannot even say its version."""
    broken = tmp_path / "docker"
    broken.write_text("#!/nonexistent/sh\necho 20.10.24\n")
    broken.chmod(0o755)
    with pytest.raises(EngineError) as caught:
        choose_transport({CLI_ENV: str(broken)})
    assert str(caught.value) == (
        f"{CLI_ENV}={broken} is no docker CLI that builds with BuildKit by itself (it needs to be docker < 23, as "
        f"Debian's docker.io, or to have the buildx plugin); unset {CLI_ENV} to build through the Engine API"
    )
    with pytest.raises(EngineError) as caught:  # asked for by both variables
        choose_transport({CLI_ENV: str(broken), TRANSPORT_ENV: "cli"})
    assert str(caught.value).startswith(f"{TRANSPORT_ENV}=cli: {CLI_ENV}={broken} is no docker CLI that builds")
    assert str(caught.value).endswith(f"unset {TRANSPORT_ENV} and {CLI_ENV} to build through the Engine API")


def test_ctrl_c_during_a_cli_build_stops_the_cli_and_waits_for_it(tmp_path: Path) -> None:
    """A SIGINT to envbuild alone (``kill -INT``, a scheduler's signal: not the terminal's, which reaches the
    CLI too) while the CLI builds: the CLI is sent SIGINT, so its session closes and the engine cancels the
    build, and it is waited for before the interrupt goes on."""
    cli = wrapper(
        tmp_path,
        f"trap 'echo interrupted > {tmp_path}/said; exit 130' INT\necho $$ > {tmp_path}/pid\n"
        'echo "#1 [1/2] FROM scratch"\necho "#1 0.100 working"\nwhile :; do sleep 0.05; done\n',
    )

    def interrupt() -> None:
        while not (tmp_path / "pid").exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    with default_sigint():
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run_cli(cli, tmp_path)
    assert (tmp_path / "said").read_text() == "interrupted\n"
    with pytest.raises(ProcessLookupError):  # exited and reaped: no CLI left building
        os.kill(int((tmp_path / "pid").read_text()), 0)


# --- containers and images ----------------------------------------------------------------------------------


@pytest.mark.docker
def test_a_host_path_through_a_regular_file_is_one_line_naming_it(
    engine: Engine, base_image: BaseImage, tmp_path: Path
) -> None:
    """A cluster file's volume under a path whose parent is a file (a checkpoint's file taken for its
    directory): the engine refuses the mount for another reason than a missing path, said as it is."""
    (tmp_path / "model.safetensors").write_bytes(b"\0")
    path = f"{tmp_path}/model.safetensors/shards"
    with pytest.raises(EngineError) as caught:
        engine.missing_paths(base_image.tag, [path])
    assert str(caught.value) == (
        f'check {path} on {engine.address}: invalid mount config for type "bind": stat {path}: not a directory'
    )


@pytest.mark.docker
def test_a_path_an_image_lacks_or_holds_as_no_regular_file_is_one_line(engine: Engine, base_image: BaseImage) -> None:
    tag = base_image.tag
    with pytest.raises(EngineError) as caught:
        engine.entry_headers(tag, ["/etc/os-release", "/envbuild/none"])
    assert str(caught.value) == f"{tag} has no /envbuild/none"
    with pytest.raises(EngineError) as caught:
        engine.read_file(tag, "/envbuild/none")
    assert str(caught.value) == f"{tag} has no /envbuild/none"
    for path, limit in (("/etc", 1 << 24), ("/etc/passwd", 10)):
        with pytest.raises(EngineError) as caught:
            engine.read_file(tag, path, limit)
        assert str(caught.value) == f"{path} of {tag} is not a regular file of at most {limit} bytes"


@pytest.mark.docker
def test_an_archive_that_is_no_docker_save_is_refused_naming_it(engine: Engine, tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
    with pytest.raises(EngineError) as caught:
        engine.load(archive)
    assert re.fullmatch(rf"load {archive}: open /\S+/repositories: no such file or directory", str(caught.value))


@pytest.mark.docker
def test_a_push_to_a_registry_out_of_reach_is_one_line(engine: Engine, base_image: BaseImage) -> None:
    name = f"127.0.0.1:1/envbuild-test/enginegaps:{uuid.uuid4().hex[:12]}"
    engine.tag(base_image.image_id, name)
    try:
        with pytest.raises(EngineError) as caught:
            engine.push(name)
    finally:
        engine.remove(name)  # the tag only: the base keeps its own
    assert str(caught.value) == (
        f'push {name}: Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused'
    )


LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


@pytest.mark.docker
@pytest.mark.registry
def test_a_pull_of_a_layer_that_is_no_tar_fails_naming_the_engine(engine: Engine, registry: str) -> None:
    """A registry serving an image whose layer is not the tar its media type says (a broken upload): the
    engine fails it while the pull streams, and nothing is left in the engine."""
    repository = f"envbuild-test/enginegaps-{uuid.uuid4().hex[:12]}"
    layer = b"no tar, nor gzip " * 8
    config = json.dumps(
        {
            "architecture": OCI_ARCH.get(engine.machine(), engine.machine()),
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
            "config": {},
        }
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "size": len(config), "digest": put_blob(registry, repository, config)},
        "layers": [{"mediaType": LAYER, "size": len(layer), "digest": put_blob(registry, repository, layer)}],
    }
    digest = put_manifest(registry, repository, "broken", json.dumps(manifest).encode(), MANIFEST)
    reference = f"{registry}/{repository}@{digest}"
    try:
        with pytest.raises(EngineError) as caught:
            engine.pull(reference)
    finally:
        requests.delete(f"http://{registry}/v2/{repository}/manifests/{digest}", timeout=60)
    assert str(caught.value) == (
        f"pull {reference} on {engine.address}: failed to register layer: Error processing tar file(exit status 1): "
        "unexpected EOF"
    )
    assert engine.inspect(reference) is None


# --- long-lived containers and volumes ----------------------------------------------------------------------


@pytest.mark.docker
def test_a_job_that_cannot_start_for_a_device_its_host_lacks_leaves_no_container(
    engine: Engine, base_image: BaseImage, tmp_path: Path
) -> None:
    """The engine creates the container and refuses to start it (an NPU's device node missing on the
    host): one line, and the created container is removed again."""
    label = {"envbuild-test.enginegaps": uuid.uuid4().hex}
    device = f"{tmp_path}/davinci0"
    spec = JobSpec(base_image.tag, ("sleep", "30"), devices=(f"{device}:/dev/davinci0:rwm",), labels=label)
    try:
        with pytest.raises(EngineError) as caught:
            engine.start(spec)
        assert engine.containers(label) == []
    finally:  # a container this test made, were it left
        for left in engine.containers(label):
            engine.remove_container(left.id, stop_timeout=0)
    assert str(caught.value) == (
        f"start {base_image.tag} on {engine.address}: error gathering device information while adding custom "
        f'device "{device}": no such file or directory'
    )


@pytest.mark.docker
def test_a_container_or_a_volume_removed_meanwhile_is_gone_not_an_error(
    engine: Engine, base_image: BaseImage, docker_client: docker.DockerClient
) -> None:
    """Removed by hand (``docker rm -f``, ``docker volume rm``) between a listing and the next call."""
    label = {"envbuild-test.enginegaps": uuid.uuid4().hex}
    container = engine.start(JobSpec(base_image.tag, ("sleep", "30"), labels=label))
    docker_client.api.remove_container(container, force=True)
    assert engine.container(container) is None
    assert engine.remove_container(container) is False
    assert engine.remove_container(container, stop_timeout=0) is False
    volume = f"envbuild-test-enginegaps-{label['envbuild-test.enginegaps']}"
    engine.ensure_volume(volume, label)
    docker_client.api.remove_volume(volume)
    assert engine.remove_volume(volume) is False
    assert engine.volumes(f"envbuild-test.enginegaps={label['envbuild-test.enginegaps']}") == {}


# --- reaching the engine ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("tcp://", "Invalid bind address format: tcp://"),
        ("fd://engine", "fd protocol is not implemented"),
    ],
)
def test_an_engine_address_that_is_no_address_is_one_line(
    address: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", address)
    with pytest.raises(EngineError) as caught:
        Engine.connect()
    assert str(caught.value) == f"no container engine answers at {address}: {said} (start dockerd or set DOCKER_HOST)"


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("tcp://127.0.0.1:notaport", "Port could not be cast to integer value as 'notaport'"),
        ("tcp://[::1", "Invalid IPv6 URL"),
    ],
)
def test_an_engine_address_docker_cannot_parse_is_bad_input_naming_docker_host(
    address: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", address)
    with pytest.raises(InputError) as caught:
        Engine.connect()
    assert str(caught.value) == f"DOCKER_HOST {address!r}: not an address docker can reach ({said})"


@pytest.mark.parametrize(
    ("address", "shown", "kind"),
    [
        ("tcp://user:secret@127.0.0.1:1", "tcp://***@127.0.0.1:1", EngineError),
        ("ssh://user:secret@127.0.0.1", "ssh://***@127.0.0.1", InputError),
        ("tcp://user:secret@127.0.0.1:x", "tcp://***@127.0.0.1:x", EngineError),
    ],
)
def test_a_password_in_the_engine_address_is_never_printed(
    address: str, shown: str, kind: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> None:
    """security.md: a refused URL shows its user part as ***, so a token pasted into one reaches no CI log."""
    monkeypatch.setenv("DOCKER_HOST", address)
    with pytest.raises(kind) as caught:
        Engine.connect()
    assert "secret" not in str(caught.value) and shown in str(caught.value), caught.value


@pytest.mark.parametrize("auth", ["dXNlcg==", "not base64!"])
def test_a_docker_config_the_sdk_cannot_read_is_named_not_docker_host(
    auth: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An `auths` entry the docker CLI only warns about (for any registry) stops docker-py making any client:
    once reported as a DOCKER_HOST docker cannot reach."""
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"other.example": {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/engine.sock")
    with pytest.raises(InputError) as caught:
        Engine.connect()
    message = str(caught.value)
    assert (
        message.startswith(f"{tmp_path / 'config.json'}: docker's SDK cannot read it (")
        and "DOCKER_HOST" not in message
    )
    assert message.endswith("an `auths` entry's `auth` must be base64 of user:password")


def test_an_engine_gone_before_its_disk_usage_is_said_at_once_not_waited_for(tmp_path: Path) -> None:
    """Only another caller's ``docker system df`` is waited for; an engine that stopped answering is not."""
    engine = gone_engine()
    with pytest.raises(EngineError) as caught:
        engine.disk_usage()
    assert (
        str(caught.value) == f"disk usage: the container engine at {engine.address} stopped answering: no such socket"
    )
