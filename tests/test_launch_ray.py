"""The Ray backend against a real local Ray head: the fake trainer is submitted as a real job.

The head is this module's own: ``ray start --head --block`` as a child in a session of its own, stopped
by its PID (Ray's SIGTERM handler stops the node's processes) and then, by PID, anything left in that
session or naming its temp dir. Never ``ray stop``, which stops every Ray on the machine.

The module has a HOME of its own, holding ``~/.ray/auth_token``: Ray 2.60's ``ray start --head`` then
turns token authentication on, as on any machine that once ran ``ray.init()``, so every job here is
submitted, followed and stopped through a dashboard that answers 401 without the token; and the
machine's own HOME (with or without a token) changes nothing here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from envbuild.errors import EngineError
from envrun.execute import TargetRefused, execute_run
from envrun.launch import ray_backend
from envrun.prepare import PreparedRun, prepare_run
from envrun.ray_api import RayAuthError, auth_headers, job_client, list_nodes, submit
from envrun.rundir import read_status
from tests.lib.leftovers import register
from tests.lib.tinyrun import Tiny, envrun_until_sleeping

RAY = Path(sys.executable).parent / "ray"
pytestmark = [pytest.mark.ray, pytest.mark.slow]


def free_port(low: int = 20000) -> int:
    """A free port above Ray's worker range (10002-19999), where `ray start` refuses its own ports."""
    for port in range(low, 60000, 7):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def _ours(session: int, marker: str) -> list[int]:
    """PIDs of the processes in our head's session, or naming its temp dir (Ray's own daemons)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat[0] != "Z" and (int(stat[3]) == session or marker in args):
            found.append(int(entry.name))
    return found


def _stop_head(head: subprocess.Popen[bytes], marker: str) -> None:
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
    deadline = time.monotonic() + 30
    while (left := _ours(head.pid, marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


TOKEN = "envrun-test-" + "0123456789abcdef" * 2


@pytest.fixture(scope="module")
def ray_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """HOME for the head and for this module's clients, with a Ray token in it."""
    home = tmp_path_factory.mktemp("ray-home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(TOKEN + "\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            patch.delenv(name, raising=False)
        yield home


@pytest.fixture(scope="module")
def ray_head(ray_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    gcs = free_port(21000)
    dashboard = free_port(gcs + 1)
    client = free_port(dashboard + 1)
    temp_dir = f"/tmp/ray-envrun-{gcs}"  # short: Ray's unix sockets live under it
    log = tmp_path_factory.mktemp("ray") / "head.log"
    # Its daemons' temporary files too (the dashboard's multiprocessing forkserver leaves a pymp-* directory
    # with its listener socket when stopped): under the temp dir removed below, not in /tmp.
    Path(temp_dir).mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        head = subprocess.Popen(
            [
                str(RAY),
                "start",
                "--head",
                "--block",
                "--node-ip-address=127.0.0.1",
                f"--port={gcs}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                f"--ray-client-server-port={client}",
                "--num-cpus=2",
                f"--temp-dir={temp_dir}",
                "--disable-usage-stats",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a session of our own: what we stop is exactly what we started
            env={**os.environ, "TMPDIR": temp_dir},
        )
    # Ray's daemons name the temp dir; an interrupted run's are stopped at the next run's start
    entry = register(head.pid, f"ray head on port {gcs}", markers=[temp_dir], remove=[Path(temp_dir)])
    try:
        address = f"http://127.0.0.1:{dashboard}"
        _wait_for_job_api(address, head, log)
        yield address
    finally:
        _stop_head(head, temp_dir)
        assert not _ours(head.pid, temp_dir), "Ray processes left behind"
        shutil.rmtree(temp_dir, ignore_errors=True)  # its sessions' logs and sockets, 4 MB a run, not left in /tmp
        entry.forget()


def _wait_for_job_api(address: str, head: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert head.poll() is None, f"ray start exited {head.returncode}: {log.read_text()[-2000:]}"
        try:
            job_client(address).list_jobs()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def ray_run(tiny: Tiny, address: str, *, check_nodes: bool = False, **env: str) -> PreparedRun:
    """A Ray run of the fake trainer, which expects exactly its plan; ``env`` goes to the job only. This
    head runs this machine's Python, not an envbuild image: the per-node lock check is skipped unless asked."""
    extra_env = {"FAKE_TRAINER_EXPECT": str(tiny.expect_file), **env}
    request = tiny.strict().request(backend="ray", ray_address=address, extra_env=extra_env)
    if not check_nodes:
        request = replace(request, skip_checks=(*request.skip_checks, "ray-node"))
    prepared = prepare_run(request)
    tiny.expect(prepared.plan)
    return prepared


def test_job_runs_on_ray_and_streams_logs(ray_head: str, tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    # The env reaches the job only through Ray's runtime_env: the head was started without it.
    prepared = ray_run(tiny, ray_head)
    assert prepared.plan.backend == "ray"
    outcome = execute_run(prepared)
    assert outcome.status == "succeeded" and outcome.exit_status == 0
    assert "fake trainer: ok" in capsys.readouterr().out
    log = (outcome.run_dir / "output.log").read_text()
    assert "submitted Ray job envrun-tiny-" in log and "fake trainer: ok" in log
    assert read_status(outcome.run_dir)["status"] == "succeeded"


def test_nodes_that_cannot_be_checked_refuse_the_job(ray_head: str, tiny: Tiny) -> None:
    """This head is no envbuild image: its `python3` has no Ray, so the check cannot run there. Unverified
    is refused (a real image's answers are tested in test_cluster_ray.py)."""
    before = {job.submission_id for job in job_client(ray_head).list_jobs()}
    with pytest.raises(TargetRefused) as info:
        execute_run(ray_run(tiny, ray_head, check_nodes=True))
    assert info.value.exit_code == 1
    assert "nothing submitted: the nodes could not be asked which lock they run" in str(info.value)
    status = read_status(tiny.tmp / "run")
    assert status["status"] == "refused" and "could not be asked" in status["detail"]
    (line,) = [c for c in json.loads((tiny.tmp / "run" / "preflight.json").read_text()) if c["name"] == "ray-node"]
    assert line["status"] == "fail"
    new = {job.submission_id for job in job_client(ray_head).list_jobs()} - before
    assert len(new) == 1 and new.pop().startswith("envrun-nodecheck-")  # only the check was submitted


def test_a_skipped_node_check_is_recorded(ray_head: str, tiny: Tiny) -> None:
    outcome = execute_run(ray_run(tiny, ray_head))
    assert outcome.status == "succeeded"
    recorded = json.loads((outcome.run_dir / "preflight.json").read_text())
    assert {"name": "ray-node", "status": "skip", "detail": "skipped by --skip-check"} in recorded


def test_failed_ray_job_is_recorded(ray_head: str, tiny: Tiny) -> None:
    prepared = ray_run(tiny, ray_head)
    tiny.expect_file.write_text(json.dumps({"args": ["not", "these"], "env": {}}))
    outcome = execute_run(prepared)
    assert outcome.exit_status == 1
    assert read_status(outcome.run_dir)["status"] == "failed"
    assert "expected 'not'" in (outcome.run_dir / "output.log").read_text()


def signal_a_ray_run(ray_head: str, tiny: Tiny, signum: int) -> tuple[int, dict, str]:
    """Start envrun on a Ray job that sleeps, send ``signum`` once the job's own output streams back (it is
    really running), and return envrun's exit status, its recorded status and the Ray job's status."""
    ray_run(tiny, ray_head, FAKE_TRAINER_SLEEP="300")
    extra = ["--backend", "ray", "--ray-address", ray_head, "--skip-check", "ray-node"]
    extra += ["--env", f"FAKE_TRAINER_EXPECT={tiny.expect_file}", "--env", "FAKE_TRAINER_SLEEP=300"]
    run_dir = tiny.tmp / "run"
    with envrun_until_sleeping(tiny.args(*extra, "--run-dir", str(run_dir))) as run:
        code = run.stop(signum, timeout=120)
    job_id = next(
        line.split()[4] for line in (run_dir / "output.log").read_text().splitlines() if "submitted Ray job" in line
    )
    return code, read_status(run_dir), job_client(ray_head).get_job_status(job_id).value


def test_ctrl_c_stops_the_ray_job_and_records_interrupted(ray_head: str, tiny: Tiny) -> None:
    code, status, job = signal_a_ray_run(ray_head, tiny, signal.SIGINT)
    assert code == 130
    assert status["status"] == "interrupted" and "stopped on Ctrl-C" in status.get("detail", "")
    assert job == "STOPPED"


def test_ctrl_c_as_the_job_is_submitted_stops_it(ray_head: str, tiny: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C the moment Ray took the job (before envrun followed it) stops it there: it was left running on
    the cluster, and the record said the job never ran."""
    prepared = ray_run(tiny, ray_head, FAKE_TRAINER_SLEEP="300")
    real = ray_backend.ray_api.submit

    def submit_then_ctrl_c(*args: Any, **kwargs: Any) -> str:
        job = real(*args, **kwargs)
        jobs.append(job)
        os.kill(os.getpid(), signal.SIGINT)
        return job

    jobs: list[str] = []
    monkeypatch.setattr(ray_backend.ray_api, "submit", submit_then_ctrl_c)
    try:
        outcome = execute_run(prepared)
    except KeyboardInterrupt:  # not to pytest, which would end the whole session
        for job in jobs:
            job_client(ray_head).stop_job(job)
        pytest.fail("the Ctrl-C escaped envrun with the job submitted")
    [job] = jobs
    assert (outcome.status, outcome.exit_status) == ("interrupted", 130)
    assert read_status(outcome.run_dir)["detail"].startswith(f"stopped on Ctrl-C: Ray job {job} stopped (")
    assert job_client(ray_head).get_job_status(job).value == "STOPPED"


def test_the_head_asks_for_its_token_and_envrun_sends_it(ray_head: str, ray_home: Path) -> None:
    import requests

    assert requests.get(f"{ray_head}/api/jobs/", timeout=30).status_code == 401  # token auth is on
    assert requests.get(f"{ray_head}/api/jobs/", headers=auth_headers(), timeout=30).status_code == 200
    deadline = time.monotonic() + 60
    while not (nodes := list_nodes(ray_head)) and time.monotonic() < deadline:
        time.sleep(1)  # the state API lists the head a moment after the job API answers
    [node] = nodes  # the state API takes the token too
    assert node.alive and node.head


def test_a_client_without_the_token_is_told_so(ray_head: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token here
    assert auth_headers() == {}
    with pytest.raises(
        EngineError, match="found no token in .RAY_AUTH_TOKEN, .RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
    ):
        submit(job_client(ray_head), ray_head, ["true"])
    (tmp_path / "wrong").write_text("not-the-token\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "wrong"))
    with pytest.raises(EngineError, match="envrun sent the token it found: it is not this cluster's"):
        submit(job_client(ray_head), ray_head, ["true"])
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)  # where Ray's loader looks first
    assert auth_headers() == {"Authorization": f"Bearer {TOKEN}"}
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert auth_headers() == {}


@pytest.mark.docker
def test_status_says_a_token_problem_at_once_instead_of_dead_nodes(
    ray_head: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token the cluster refuses, or one that cannot be read, is said naming where it came from (up's
    wait asks the same list): it used to show every node DEAD, and up waited out its timeout."""
    from envrun.cli.main import main
    from envrun.cluster.state import ClusterState, save_state

    state = ClusterState("tokens", "up", "r/x@sha256:" + "a" * 64, "b" * 64, (os.environ["DOCKER_HOST"],), ray_head)
    save_state(tmp_path, state)
    status = ["cluster", "status", "tokens", "--cache-dir", str(tmp_path)]
    (tmp_path / "wrong").write_text("not-the-token\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "wrong"))
    assert main(status) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"envrun: error: {ray_head}: the cluster refused envrun: Authentication failed") and (
        f"it is not this cluster's; it came from {tmp_path / 'wrong'})\n" in err
    )
    assert err.count("\n") == 1
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token here
    with pytest.raises(RayAuthError, match="the cluster refused envrun: Authentication required.*found no token in"):
        list_nodes(ray_head)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/nonexistent")
    assert main(status) == 2
    assert capsys.readouterr().err == (
        "envrun: error: RAY_AUTH_TOKEN_PATH=/nonexistent: cannot read the Ray token there\n"
    )


def test_sigterm_stops_the_ray_job_and_records_it(ray_head: str, tiny: Tiny) -> None:
    """SIGTERM to envrun takes Ctrl-C's path: the Ray job is stopped on the cluster, recorded as SIGTERM."""
    code, status, job = signal_a_ray_run(ray_head, tiny, signal.SIGTERM)
    assert code == 130
    assert status["status"] == "interrupted" and status["detail"].startswith("stopped on SIGTERM"), status
    assert job == "STOPPED"
