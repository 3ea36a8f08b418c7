"""Run paths no other test reached, from the preflight to the record: the model, data and NPU checks a
recipe and a host can meet (an override that sets the model, a model that is no directory, no NPU here, a
Ray run that counts NPUs on its nodes, a check skipped), the job probe where it cannot run (an
interpreter not installed, one that hangs, a container the engine cannot start, an image of another
lock), a launch that fails or is interrupted before the job ran (an entry point not on PATH, an image
the engine lacks, Ctrl-C while the nodes are asked), Ray's job API failing each way envrun meets it (no
Ray installed, a token file it cannot read, a submission refused, a short job that does not end, a
dashboard that does not answer), the export audit when the nodes cannot be asked or the Slurm job
recorded none, a Slurm job cancelled by someone else, and a job environment Kubernetes nodes refuse.

Runs go through ``envrun.cli.main`` or :func:`envrun.prepare.prepare_run` with the tiny recipe
(tests/lib/tinyrun.py) and variants of it written here. Ray's job API is met at a port where nothing
listens, or at a small HTTP server here that answers as Ray's dashboard does and then misbehaves
(tests/test_launch_ray.py meets a real head); the engine, the registry and Slurm are the real test
services.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import pytest

import envrun.schedule.slurm
from envbuild.errors import EngineError, InputError
from envbuild.image.plan import LOCK_LABEL
from envbuild.interrupts import sigterm_interrupts
from envrun import ray_api
from envrun.checkpoint.audit import NOT_A_MODEL_DIR, ModelAudit
from envrun.cli.main import main
from envrun.execute import RunOutcome, execute_run
from envrun.exports import ExportSearch, export_verdict, search_from_answers
from envrun.launch import local
from envrun.launch.base import LaunchResult, LogSink
from envrun.launch.local import LocalLauncher
from envrun.launch.ray_backend import RayLauncher
from envrun.plan import RunPlan, Scheduled, Volume
from envrun.prepare import PreparedRun, prepare_run
from envrun.probe.report import ExportLayout
from envrun.rundir import read_status
from envrun.schedule.slurm import SlurmLauncher, job_fields
from tests.lib.gitrepos import LoopbackServer
from tests.lib.legacybuild import dockerfile_context
from tests.lib.tinyrun import LOCK, TINY_RECIPE, Tiny

DIGEST = "registry.example/glm5@sha256:" + "ab" * 32
LAYOUT = ExportLayout("/runs/ckpts", "global_step_*/actor/huggingface", True, "trainer.save_freq=5", False)


def closed_port() -> int:
    """A port of 127.0.0.1 where nothing listens (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_recipe(tiny: Tiny, name: str, *, entry: str = "python3", lenient: bool = True, probe: bool = False,
                 parameters: str | None = None) -> Path:  # fmt: skip
    """The tiny recipe with another entry point's interpreter, without its lenient save, with a probe, or
    with other ``parameters`` (a flow mapping)."""
    text = TINY_RECIPE.replace("entry_point: [python3,", f"entry_point: [{json.dumps(entry)},")
    if parameters is not None:
        start = text.index("parameters: {")
        text = text[:start] + f"parameters: {parameters}\n" + text[text.index("}\n", start) + 2 :]
    if not lenient:
        text = text[: text.index("lenient_checkpoint:")] + text[text.index("override_groups:") :]
    if probe:
        text += "probe: {}\n"
    path = tiny.tmp / f"{name}.yaml"
    path.write_text(text)
    return path


def run_args(tiny: Tiny, recipe: Path, *extra: str) -> list[str]:
    """``envrun run`` of ``recipe`` with the tiny lock and config, recorded under ``tiny.tmp / "run"``."""
    return ["run", str(recipe), "--lock", str(LOCK), "--verl-config", str(tiny.config), "-q",
            "--run-dir", str(tiny.tmp / "run"), *extra]  # fmt: skip


def dry_run_lines(tiny: Tiny, capsys: pytest.CaptureFixture[str], args: list[str], code: int = 0) -> dict[str, Any]:
    """The dry run's preflight lines by check name (each check's first line), after exit ``code``."""
    assert main([*args, "--dry-run", "--json"]) == code
    out = capsys.readouterr().out
    lines: dict[str, Any] = {}
    for line in json.loads(out)["preflight"]:
        lines.setdefault(line["name"], line)
    return lines


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("envrun: error: "), err
    return err.removeprefix("envrun: error: ").rstrip("\n")


# --- the preflight's checks of the model, the data and the NPUs ---------------------------------------


def test_a_model_and_data_set_by_overrides_are_said_so_not_checked(
    tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tiny, "plain", lenient=False, parameters="{nnodes: trainer.nnodes}")
    args = run_args(tiny, recipe, "-o", f"model.path={tiny.model}", "-o", f"data.train_files={tiny.data}")
    lines = dry_run_lines(tiny, capsys, args)
    assert lines["model"] == {
        "name": "model",
        "status": "skip",
        "detail": "the model path is set by an override, not --model",
    }
    assert lines["data"] == {
        "name": "data",
        "status": "skip",
        "detail": "the data files are set by overrides, not --data",
    }


def test_without_a_lenient_save_the_model_needs_only_be_a_directory(
    tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tiny, "strict", lenient=False)
    lines = dry_run_lines(tiny, capsys, run_args(tiny, recipe, "--model", str(tiny.model), "--data", str(tiny.data)))
    assert lines["model"]["status"] == "ok" and lines["model"]["detail"] == f"{tiny.model}: a directory"
    weights = tiny.model / "config.json"  # a file given for the model directory
    assert main(run_args(tiny, recipe, "--model", str(weights), "--data", str(tiny.data), "--skip-check", "npus")) == 2
    assert one_error(capsys) == f"preflight failed, nothing started: model: {weights}: {NOT_A_MODEL_DIR}"
    assert not (tiny.tmp / "run").exists()


def test_a_run_here_without_an_npu_is_refused_before_anything_starts(
    tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not list(Path("/dev").glob("davinci[0-9]*")), "this test expects a host without Ascend NPUs"
    args = [a for a in tiny.args("--run-dir", str(tiny.tmp / "run")) if a not in ("--skip-check", "npus")]
    assert main(args) == 2
    assert one_error(capsys) == (
        "preflight failed, nothing started: npus: no /dev/davinci* device: no Ascend NPU visible on this host"
    )
    assert not (tiny.tmp / "run").exists()


def test_a_ray_run_counts_its_npus_on_the_nodes_and_a_skipped_ray_check_is_said(tiny: Tiny) -> None:
    request = tiny.request(backend="ray", ray_address=f"http://127.0.0.1:{closed_port()}")
    prepared = prepare_run(replace(request, skip_checks=("ray-resources",)))  # no dry run: nothing asked
    lines = {line.name: line for line in prepared.plan.preflight}
    assert (lines["npus"].status, lines["npus"].detail) == (
        "skip",
        "the cluster's nodes run the job; counted there (ray-node)",
    )
    ray = [line for line in prepared.plan.preflight if line.name == "ray-resources"]
    assert [(line.status, line.detail) for line in ray] == [("skip", "skipped by --skip-check")]


# --- the job probe where it cannot run ---------------------------------------------------------------


def test_a_probe_whose_interpreter_is_not_installed_refuses_the_run_naming_it(
    tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tiny, "noprobe", entry="python3.99", probe=True)
    args = run_args(tiny, recipe, "--model", str(tiny.model), "--data", str(tiny.data))
    lines = dry_run_lines(tiny, capsys, args, code=2)
    assert lines["job-probe"]["status"] == "fail"
    assert lines["job-probe"]["detail"] == (
        "this host (python3.99): python3.99: not found on PATH (the job's interpreter)"
    )


def test_a_probe_that_hangs_is_given_up_at_its_deadline(tiny: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    hangs = tiny.tmp / "python3-hangs"
    hangs.write_text("#!/bin/sh\nexec sleep 60\n")
    hangs.chmod(0o755)
    monkeypatch.setattr("envrun.probe.run.TIMEOUT_SECONDS", 1)  # 900 s, made short
    request = replace(tiny.request(dry_run=True), recipe=str(write_recipe(tiny, "hangs", entry=str(hangs), probe=True)))
    (line,) = [line for line in prepare_run(request).plan.preflight if line.name == "job-probe"]
    assert (line.status, line.detail) == ("fail", f"this host ({hangs}): the probe did not finish in 1 s")


@pytest.fixture()
def other_lock_image(docker_client: docker.DockerClient, base_image: Any) -> Iterator[str]:
    """The base image with the lock label of another lock; removed by its ID after."""
    other = hashlib.sha256(b"another lock").hexdigest()
    context = dockerfile_context(f"FROM {base_image.tag}\nLABEL {LOCK_LABEL}={other}\n")
    image, _ = docker_client.images.build(
        fileobj=context, custom_context=True, tag="envrun-gaps/otherlock:1", network_mode="none", rm=True
    )
    try:
        yield other
    finally:
        docker_client.images.remove(str(image.id), force=True)


@pytest.mark.docker
def test_an_image_of_another_lock_is_refused_and_the_probe_not_run_in_it(
    tiny: Tiny, other_lock_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    image = "envrun-gaps/otherlock:1"
    recipe = write_recipe(tiny, "probed", probe=True)
    args = run_args(tiny, recipe, "--model", str(tiny.model), "--data", str(tiny.data), "--backend", "docker")
    lines = dry_run_lines(tiny, capsys, [*args, "--image", image], code=2)
    sha = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    assert lines["image-lock-label"] == {
        "name": "image-lock-label",
        "status": "fail",
        "detail": f"{image} was built from lock sha256 {other_lock_image}, not {LOCK} (sha256 {sha}); rebuild the "
        "image or pass the lock it was built from",
    }
    assert lines["job-probe"] == {
        "name": "job-probe",
        "status": "skip",
        "detail": "not run: the image is not the lock's",
    }


@pytest.mark.docker
def test_a_probe_the_engine_cannot_start_a_container_for_is_named(
    tiny: Tiny, docker_client: docker.DockerClient, capsys: pytest.CaptureFixture[str]
) -> None:
    image = "envrun-gaps/never-built:1"
    recipe = write_recipe(tiny, "probed", probe=True)
    args = run_args(tiny, recipe, "--model", str(tiny.model), "--data", str(tiny.data), "--backend", "docker")
    args += ["--image", image, "--skip-check", "image-lock-label", "--skip-check", "image-platform"]
    lines = dry_run_lines(tiny, capsys, args, code=2)
    assert lines["job-probe"]["status"] == "fail"
    assert lines["job-probe"]["detail"].startswith(
        f"image {image}: cannot run the probe in a container: run in {image}: no such image ("
    )
    assert docker_client.images.list(name="envrun-gaps/never-built") == []  # nothing pulled or built


# --- launches that fail or are interrupted before the job ran ---------------------------------------------


def test_an_entry_point_not_on_path_is_recorded_as_an_error(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    args = tiny.args("--run-dir", str(tiny.tmp / "run"), "--entry-point", "no-such-trainer --flag", entry=False)
    assert main(args) == 2
    assert one_error(capsys) == "no-such-trainer: entry point not found on PATH"
    assert read_status(tiny.tmp / "run") == {
        "status": "error",
        "exit_code": None,
        "detail": "no-such-trainer: entry point not found on PATH",
    }


# A trainer that goes on through Ctrl-C: it notes each SIGINT (a line in DIR/heard) and keeps running; with
# --own-log it sends its output to a log of its own once started (as a wrapper's `exec >log 2>&1` does).
DEAF_TRAINER = """\
import os, signal, sys, time
here = sys.argv[1]
def heard(signum, frame):
    with open(os.path.join(here, "heard"), "a") as note:
        note.write("SIGINT\\n")
signal.signal(signal.SIGINT, heard)
print("deaf trainer: started", flush=True)
if "--own-log" in sys.argv:  # its Hydra overrides follow
    log = os.open(os.path.join(here, "own.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
with open(os.path.join(here, "pid"), "w") as pid:
    pid.write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def lines_in(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def run_deaf_trainer(tiny: Tiny, *args: str, ctrl_c: int) -> tuple[RunOutcome, float]:
    """A local run of the deaf trainer, Ctrl-C'd ``ctrl_c`` times (each once the trainer heard the one
    before); the outcome and how long it took from the first. A trainer left running fails the test (and
    is killed, by its PID)."""
    script = tiny.tmp / "deaf.py"
    script.write_text(DEAF_TRAINER)
    prepared = prepare_run(tiny.request(entry_point=(sys.executable, str(script), str(tiny.tmp), *args)))
    pid_file, heard = tiny.tmp / "pid", tiny.tmp / "heard"
    first: list[float] = []

    def interrupt() -> None:
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        first.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
        for count in range(1, ctrl_c):
            while lines_in(heard) < count and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        try:
            outcome = execute_run(prepared)
        except KeyboardInterrupt:  # not to pytest, which would end the whole session (a worker "crashed")
            pytest.fail("a Ctrl-C escaped envrun's stop of the job")
    finally:
        pid = int(pid_file.read_text()) if pid_file.exists() else None
        left = pid is not None and alive(pid)
        if pid is not None and left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"the trainer (PID {pid}) outlived envrun"
    return outcome, time.monotonic() - first[0]


def test_a_second_ctrl_c_kills_a_trainer_that_goes_on_through_the_first(tiny: Tiny) -> None:
    outcome, took = run_deaf_trainer(tiny, ctrl_c=2)
    assert took < 15  # not the 20 s of grace one Ctrl-C gives it
    assert lines_in(tiny.tmp / "heard") == 1  # the first reached it; then SIGKILL
    assert read_status(tiny.tmp / "run") == {
        "status": "interrupted",
        "exit_code": -9,
        "detail": "stopped on Ctrl-C: process group stopped",
    }
    assert outcome.exit_status == 130


def test_a_second_ctrl_c_that_comes_before_envrun_goes_on_with_its_stop_still_kills_the_trainer(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    """envrun slow to go on once it passed the first Ctrl-C on (a loaded machine): the second, which the
    trainer may outrun, still kills it, and is never an exception out of the stop (it once ended envrun
    with the trainer running, and the record said the job never ran)."""
    passed_on = local._signal_group

    def slow(child: subprocess.Popen[str], sig: int) -> None:
        passed_on(child, sig)
        if sig == signal.SIGINT:
            time.sleep(2)  # the second Ctrl-C comes in here, once the trainer heard the first

    monkeypatch.setattr(local, "_signal_group", slow)
    outcome, took = run_deaf_trainer(tiny, ctrl_c=2)
    assert lines_in(tiny.tmp / "heard") == 1 and took < 15
    assert read_status(tiny.tmp / "run") == {
        "status": "interrupted",
        "exit_code": -9,
        "detail": "stopped on Ctrl-C: process group stopped",
    }
    assert outcome.exit_status == 130


def test_a_trainer_whose_output_ended_is_still_killed_when_its_grace_ends(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its output closed (it writes a log of its own), a trainer that goes on through Ctrl-C must still get
    SIGKILL when the grace ends: not outlive envrun while the record says it was stopped."""
    monkeypatch.setattr("envrun.launch.local.STOP_GRACE_SECONDS", 1.0)  # 20 s, made short
    outcome, took = run_deaf_trainer(tiny, "--own-log", ctrl_c=1)
    assert lines_in(tiny.tmp / "heard") == 1
    assert read_status(tiny.tmp / "run") == {
        "status": "interrupted",
        "exit_code": -9,
        "detail": "stopped on Ctrl-C: process group stopped",
    }
    assert outcome.exit_status == 130 and took < 5


@pytest.mark.docker
def test_a_docker_run_of_an_image_the_engine_lacks_is_recorded_as_an_error(
    tiny: Tiny, docker_client: docker.DockerClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """The image checks skipped, the engine is asked for the image only when the job starts."""
    image = "envrun-gaps/never-built:1"
    args = tiny.args("--run-dir", str(tiny.tmp / "run"), "--backend", "docker", "--image", image)
    assert main([*args, "--skip-check", "image-lock-label", "--skip-check", "image-platform"]) == 2
    assert one_error(capsys) == f"image {image} not found in the local engine"
    assert read_status(tiny.tmp / "run") == {
        "status": "error",
        "exit_code": None,
        "detail": f"image {image} not found in the local engine",
    }
    assert docker_client.images.list(name="envrun-gaps/never-built") == []


def test_a_docker_dry_run_without_an_engine_shows_the_container_without_a_bytecode_volume(
    tiny: Tiny, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    nowhere = f"unix://{tiny.tmp}/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", nowhere)
    args = tiny.args("--run-dir", str(tiny.tmp / "run"), "--backend", "docker", "--image", DIGEST)
    assert main([*args, "--dry-run", "--json"]) == 2
    out, err = capsys.readouterr()
    plan = json.loads(out)
    (label,) = [line for line in plan["preflight"] if line["name"] == "image-lock-label"]
    assert label["status"] == "fail" and label["detail"].startswith(
        f"{DIGEST}: no container engine answers at {nowhere}"
    )
    assert plan["launch"]["backend"] == "docker" and plan["launch"]["image"] == DIGEST
    assert not any("envrun-bytecode" in host for host in plan["launch"]["volumes"])
    assert "--volume=envrun-bytecode" not in plan["launch"]["command"]
    assert err.startswith("envrun: error: preflight failed, nothing started: image-lock-label: ")


@dataclass
class HangingServer(LoopbackServer):
    """A port that accepts connections and never answers (a dashboard wedged); ``accepted`` is set once a
    client is connected."""

    accepted: threading.Event = field(default_factory=threading.Event)
    port: int = 0
    _server: socket.socket | None = None
    _sockets: list[socket.socket] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self, client: socket.socket) -> None:
        self.accepted.set()


def test_ctrl_c_while_the_nodes_are_asked_records_the_run_as_stopped_before_the_job(tiny: Tiny) -> None:
    server = HangingServer().start()
    try:
        prepared = prepare_run(tiny.request(backend="ray", ray_address=server.address))

        def interrupt() -> None:
            if server.accepted.wait(30):
                os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            execute_run(prepared)
    finally:
        server.close()
    assert read_status(tiny.tmp / "run") == {
        "status": "interrupted",
        "exit_code": None,
        "detail": "stopped on Ctrl-C before the job ran",
    }
    assert "submitted" not in (tiny.tmp / "run" / "output.log").read_text()  # nothing reached Ray


def spin() -> None:
    for _ in range(100_000):  # bytecode boundaries, where Python runs its handlers
        pass


class StoppedSlowly(LocalLauncher):
    """The local launcher's checks; its launch a scheduler's job being stopped on Ctrl-C when a SIGTERM
    comes (a user's second Ctrl-C, or the machine's shutdown) while the stop is waited for."""

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            spin()
        except KeyboardInterrupt:
            log("envrun: cancelling\n")
            os.kill(os.getpid(), signal.SIGTERM)
            spin()
        raise AssertionError("no signal came")


def test_a_second_signal_while_a_stopped_job_is_waited_for_is_not_recorded_as_before_the_job_ran(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = prepare_run(tiny.request())
    monkeypatch.setattr("envrun.execute.launcher_for", lambda plan, cluster: StoppedSlowly())
    with pytest.raises(KeyboardInterrupt):
        execute_run(prepared)
    assert read_status(tiny.tmp / "run") == {
        "status": "interrupted",
        "exit_code": None,
        "detail": "stopped on Ctrl-C, then on SIGTERM before the job was seen to end",
    }


def test_exports_the_nodes_cannot_be_asked_about_fail_the_audit(tiny: Tiny) -> None:
    address = f"http://127.0.0.1:{closed_port()}"
    prepared = prepare_run(tiny.request(backend="ray", ray_address=address))
    search = RayLauncher(address).find_exports(prepared.plan, LAYOUT, lambda _: None)
    said = f"the nodes could not be asked: {address}: cannot reach the Ray job API: Failed to connect to Ray at address: {address}."
    assert search == ExportSearch("the cluster", False, (ModelAudit("", False, error=said),))
    verdict = export_verdict(LAYOUT, search)
    assert not verdict.ok and verdict.failures == (said,)


# --- Ray's job API -----------------------------------------------------------------------------------------


class HeadLostMidJob:
    """Ray's job client when the head dies while its job runs: the log stream breaks, every call after fails."""

    def submit_job(self, **options: Any) -> str:
        return str(options["submission_id"])

    async def tail_job_logs(self, job_id: str) -> Any:
        yield "step 1\n"
        raise RuntimeError("WebSocket connection closed unexpectedly with close code 1006")

    def get_job_status(self, job_id: str) -> Any:
        raise ConnectionError("Failed to connect to Ray")


def test_a_head_lost_mid_job_is_one_line_not_a_traceback(tiny: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    address = f"http://127.0.0.1:{closed_port()}"
    plan = prepare_run(tiny.request(backend="ray", ray_address=address)).plan
    monkeypatch.setattr(ray_api, "job_client", lambda _: HeadLostMidJob())
    logged: list[str] = []
    launcher = RayLauncher(address)
    with pytest.raises(EngineError) as info:
        launcher.launch(plan, logged.append)
    assert str(info.value) == (
        f"{address}: lost Ray job {launcher.job_id}: WebSocket connection closed unexpectedly with close code 1006 "
        "(is the cluster's head up?)"
    )
    assert logged[-1] == "step 1\n"


def test_a_ray_token_file_envrun_cannot_read_is_refused_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    for path in (tmp_path / "missing", tmp_path):  # no such file; a directory
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
        with pytest.raises(InputError) as info:
            ray_api.auth_headers()
        assert str(info.value) == f"RAY_AUTH_TOKEN_PATH={path}: cannot read the Ray token there"


def test_without_ray_installed_a_ray_run_says_what_to_install(
    tiny: Tiny, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """envbuild without its ``ray`` extra: the modules cannot be imported (None in sys.modules)."""
    for module in ("ray.job_submission", "ray.util.state", "ray.util.state.common"):
        monkeypatch.setitem(sys.modules, module, None)
    address = f"http://127.0.0.1:{closed_port()}"
    args = tiny.args("--run-dir", str(tiny.tmp / "run"), "--backend", "ray", "--ray-address", address)
    assert main(args) == 2
    said = "Ray is needed here: pip install 'envbuild[ray]'"
    assert one_error(capsys) == said
    assert read_status(tiny.tmp / "run") == {"status": "error", "exit_code": None, "detail": said}
    with pytest.raises(InputError, match=r"^Ray is needed here: pip install 'envbuild\[ray\]'$"):
        ray_api.list_nodes(address)


# A module whose import, as Ray's Cython core (ray._raylet) does when it is first imported, meets an
# interrupt in code whose errors it only prints: "Exception ignored in: <module 'collections.abc'> …
# KeyboardInterrupt", "Cython module failed to patch module with custom type".
SWALLOWING_IMPORT = """\
import os, signal, sys
try:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100_000):  # bytecode boundaries, where Python runs the SIGTERM handler
        pass
except BaseException as exc:
    print(f"Exception ignored: {exc!r}", file=sys.stderr)
"""


def test_an_interrupt_during_rays_first_import_is_delivered_when_the_import_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was lost: `envrun cluster up` SIGTERMed as it first imported Ray's state API went on waiting for
    its nodes until its timeout, their containers running (caught in tests/test_cluster_gaps.py's SIGTERM
    test under load, with py-spy: the main thread still in _wait_joined, Cython's lines on stderr)."""
    (tmp_path / "raylike_core.py").write_text(SWALLOWING_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(KeyboardInterrupt), sigterm_interrupts():
            ray_api.ray_module("raylike_core")
        assert "raylike_core" in sys.modules  # imported whole: the interrupt came once it ended, not inside it
    finally:
        sys.modules.pop("raylike_core", None)  # this process's later tests never meet it


class Dashboard(BaseHTTPRequestHandler):
    """Ray's job API as a head answers it (its version, a job's submission, status and stop), with the
    faults a test sets: ``submit_status`` (an error answer to the submission) or a job that stays RUNNING."""

    submit_status = 200
    asked: list[str]  # "METHOD PATH" of each request, set per server

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.asked.append(f"GET {self.path}")
        if self.path == "/api/version":
            self._answer(200, {"version": "4", "ray_version": "2.60.0", "ray_commit": "0" * 40})
        elif self.path.startswith("/api/jobs/"):
            job = self.path.removeprefix("/api/jobs/")
            self._answer(200, {"type": "SUBMISSION", "submission_id": job, "status": "RUNNING", "entrypoint": "true"})
        else:
            self._answer(404, {})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.asked.append(f"POST {self.path}")
        if self.path == "/api/jobs/":
            if self.submit_status != 200:
                self._answer(self.submit_status, b"No space left on device")
            else:
                self._answer(200, {"job_id": None, "submission_id": body["submission_id"]})
        elif self.path.endswith("/stop"):
            self._answer(200, {"stopped": True})
        else:
            self._answer(404, {})

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture()
def dashboard(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, type[Dashboard]]]:
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    handler = type("Handler", (Dashboard,), {"asked": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_submission_the_job_api_refuses_is_said_with_its_answer(dashboard: tuple[str, type[Dashboard]]) -> None:
    address, handler = dashboard
    handler.submit_status = 500
    with pytest.raises(EngineError) as info:
        ray_api.run_job(address, ["python3", "-c", "pass"], timeout=5, submission_id="envrun-gaps-refused")
    assert str(info.value) == (
        f"{address}: job submission failed: Request failed with status code 500: No space left on device."
    )
    assert handler.asked[-1] == "POST /api/jobs/"


def test_a_short_job_that_does_not_end_in_time_is_stopped(dashboard: tuple[str, type[Dashboard]]) -> None:
    address, handler = dashboard
    with pytest.raises(EngineError) as info:
        ray_api.run_job(address, ["python3", "-c", "pass"], timeout=1, submission_id="envrun-gaps-stuck")
    assert str(info.value) == f"{address}: job envrun-gaps-stuck did not finish within 1 s"
    assert handler.asked[-1] == "POST /api/jobs/envrun-gaps-stuck/stop"


def test_a_dashboard_that_does_not_answer_lists_no_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    address = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(EngineError) as info:
        ray_api.list_nodes(address, timeout=5)
    assert str(info.value) == (
        f"{address}: cannot list the cluster's nodes: its dashboard does not answer there (is the head up, with "
        "its dashboard, at that address?)"
    )


# --- Kubernetes and Slurm ----------------------------------------------------------------------------------


def test_a_job_environment_that_unsets_ascends_device_rule_is_refused_for_kubernetes(
    tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tiny.tmp / "k8s"
    args = tiny.args("--nnodes", "2", "--output-dir", "/runs", "--image", DIGEST, "--run-dir", str(tiny.tmp / "r"))
    noset = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
    assert main([*args, "--env", f"{noset}=0", "--emit", "volcano", str(target)]) == 2
    assert one_error(capsys) == f"Kubernetes job r: the job's environment sets {noset}='0'; envrun's nodes need 1"
    assert not target.exists()


def slurm_run(tiny: Tiny, *sbatch_args: str) -> PreparedRun:
    """A two-node Slurm run of the tiny recipe, prepared (its image is never pulled: nothing runs)."""
    request = tiny.request(
        backend="slurm",
        nnodes=2,
        image=DIGEST,
        output_dir=Path("/runs"),
        volumes=(Volume(str(tiny.tmp), "/runs", "rw"),),
        scheduled=Scheduled(join_timeout=30, scheduler_args=sbatch_args),
    )
    return prepare_run(request)


def test_a_slurm_run_where_slurm_is_not_installed_is_an_error_naming_its_command(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = slurm_run(tiny)
    (tiny.tmp / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tiny.tmp / "bin"))
    with pytest.raises(InputError) as info:
        execute_run(prepared)
    said = "sbatch not found: --backend slurm runs Slurm's commands on this host"
    assert str(info.value) == said
    assert read_status(tiny.tmp / "run") == {"status": "error", "exit_code": None, "detail": said}


def test_the_slurm_audit_is_what_the_heads_audit_recorded(tiny: Tiny) -> None:
    prepared = slurm_run(tiny)
    launcher = SlurmLauncher()
    nothing = launcher.find_exports(prepared.plan, LAYOUT, lambda _: None)
    assert nothing == ExportSearch("the Slurm job", False, (ModelAudit("", False, error="the job recorded no audit"),))
    assert export_verdict(LAYOUT, nothing).failures == ("the job recorded no audit",)
    # What the head wrote after the job: one node's export lost a layer, another's is whole.
    lost = {"path": "/runs/ckpts/global_step_5/actor/huggingface", "ok": False, "missing": ["lm_head.weight"]}
    whole = {"path": "/runs/ckpts/global_step_5/actor/huggingface", "ok": True, "check": "checkpoint-audit"}
    answers = [
        {"name": "n1", "exports": {"present": True, "audits": [lost]}},
        {"name": "n2", "exports": {"present": True, "audits": [whole]}},
    ]
    heads = export_verdict(LAYOUT, search_from_answers(answers))
    record = tiny.tmp / "run" / "slurm" / "record"
    record.mkdir(parents=True)
    (record / "exports.json").write_text(json.dumps(heads.to_json()))
    found = launcher.find_exports(prepared.plan, LAYOUT, lambda _: None)
    assert [(a.node, a.ok, a.missing) for a in found.audits] == [("n1", False, ("lm_head.weight",)), ("n2", True, ())]
    assert (
        export_verdict(LAYOUT, found).failures
        == heads.failures
        == ("n1: /runs/ckpts/global_step_5/actor/huggingface: lm_head.weight",)
    )


@pytest.mark.slurm
def test_a_job_slurm_does_not_know_has_no_fields() -> None:
    assert job_fields("999999999") == {}


@pytest.mark.slurm
def test_a_held_job_cancelled_by_someone_else_is_recorded_as_interrupted(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held, the job never reaches a node; someone's ``scancel`` ends it as soon as it is submitted (not
    envrun's Ctrl-C), and the job recorded nothing of its own."""
    prepared = slurm_run(tiny, "--hold")
    cancelled: list[str] = []
    launch = SlurmLauncher.launch

    def cancelling(self: SlurmLauncher, plan: RunPlan, log: LogSink) -> LaunchResult:
        def watch(line: str) -> None:
            log(line)
            if line.startswith("envrun: submitted Slurm job ") and not cancelled:
                cancelled.append(line.split()[4].rstrip(";"))
                subprocess.run(["scancel", cancelled[0]], check=True, timeout=60)

        return launch(self, plan, watch)

    monkeypatch.setattr(SlurmLauncher, "launch", cancelling)
    outcome = execute_run(prepared)
    (job,) = cancelled
    assert (outcome.status, outcome.exit_status) == ("interrupted", 130)
    assert read_status(tiny.tmp / "run") == {
        "status": "interrupted",
        "exit_code": 0,
        "detail": f"Slurm job {job} CANCELLED: cancelled",
    }
    fields = job_fields(job)
    assert fields is not None and fields["JobState"] == "CANCELLED"


@pytest.mark.slurm
def test_a_second_ctrl_c_as_envrun_cancels_the_job_still_cancels_it(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C twice, the second as envrun goes to ``scancel``: the job is cancelled all the same (it was
    left holding its place in the queue, or its nodes, as envrun ended)."""
    prepared = slurm_run(tiny, "--hold")
    jobs: list[str] = []
    launch, slurm = SlurmLauncher.launch, envrun.schedule.slurm._slurm

    def interrupted(self: SlurmLauncher, plan: RunPlan, log: LogSink) -> LaunchResult:
        def watch(line: str) -> None:
            log(line)
            if line.startswith("envrun: submitted Slurm job ") and not jobs:
                jobs.append(line.split()[4].rstrip(";"))
                os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C
                spin()

        return launch(self, plan, watch)

    def cancel(argv: list[str]) -> str:
        if argv[0] == "scancel":
            os.kill(os.getpid(), signal.SIGINT)  # the second, just before scancel runs
            spin()
        return slurm(argv)

    monkeypatch.setattr(SlurmLauncher, "launch", interrupted)
    monkeypatch.setattr(envrun.schedule.slurm, "_slurm", cancel)
    try:
        try:
            outcome = execute_run(prepared)
        except KeyboardInterrupt:
            pytest.fail("the second Ctrl-C ended envrun before it cancelled the job")
        (job,) = jobs
        fields = job_fields(job)
        assert fields is not None and fields["JobState"] == "CANCELLED"
        assert (outcome.status, outcome.exit_status) == ("interrupted", 130)
        assert read_status(tiny.tmp / "run")["detail"] == f"stopped on Ctrl-C: cancelled Slurm job {job} (CANCELLED)"
    finally:
        for job in jobs:
            subprocess.run(["scancel", job], check=False, timeout=60)
