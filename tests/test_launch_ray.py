"""The Ray backend against a real local Ray head: the fake trainer is submitted as a real job."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from envrun.cli_run import main_for_tests
from envrun.rundir import read_status
from tests.lib.tinyrun import Tiny, dry_run_json

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


def _ray_processes(marker: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if marker in line and "ps -eo" not in line]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    gcs = free_port(21000)
    dashboard = free_port(gcs + 1)
    client = free_port(dashboard + 1)
    temp_dir = f"/tmp/ray-envrun-{gcs}"  # short: Ray's unix sockets live under it
    start = subprocess.run(
        [
            str(RAY),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={gcs}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--ray-client-server-port={client}",
            "--num-cpus=2",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        assert start.returncode == 0, start.stderr[-2000:]
        address = f"http://127.0.0.1:{dashboard}"
        _wait_for_job_api(address)
        yield address
    finally:
        subprocess.run([str(RAY), "stop", "--force"], capture_output=True, timeout=120)
        deadline = time.monotonic() + 30
        while _ray_processes(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _ray_processes(temp_dir), "Ray processes left behind"


def _wait_for_job_api(address: str) -> None:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + 60
    while True:
        try:
            JobSubmissionClient(address).list_jobs()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_job_runs_on_ray_and_streams_logs(ray_head: str, tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    expect = tiny.tmp / "expect.json"
    extra = ["--backend", "ray", "--ray-address", ray_head, "--env", f"FAKE_TRAINER_EXPECT={expect}"]
    plan = dry_run_json(tiny, capsys, *extra)
    assert plan["backend"] == "ray"
    # The env reaches the job only through Ray's runtime_env: the head was started without it.
    expect.write_text(json.dumps({"args": plan["argv"][2:], "env": plan["env"]}))
    run_dir = tiny.tmp / "run"
    assert main_for_tests(tiny.args(*extra, "--run-dir", str(run_dir))) == 0
    assert "fake trainer: ok" in capsys.readouterr().out
    log = (run_dir / "output.log").read_text()
    assert "submitted Ray job envrun-tiny-" in log and "fake trainer: ok" in log
    assert read_status(run_dir)["status"] == "succeeded"


def test_failed_ray_job_is_recorded(ray_head: str, tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    expect = tiny.tmp / "expect.json"
    expect.write_text(json.dumps({"args": ["not", "these"], "env": {}}))
    run_dir = tiny.tmp / "run"
    code = main_for_tests(
        tiny.args(
            "--backend",
            "ray",
            "--ray-address",
            ray_head,
            "--env",
            f"FAKE_TRAINER_EXPECT={expect}",
            "--run-dir",
            str(run_dir),
        )
    )
    assert code == 1
    assert read_status(run_dir)["status"] == "failed"
    assert "expected 'not'" in (run_dir / "output.log").read_text()


def test_ctrl_c_stops_the_ray_job_and_records_interrupted(
    ray_head: str, tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import signal

    from ray.job_submission import JobSubmissionClient

    from tests.lib.tinyrun import REPO

    expect = tiny.tmp / "expect.json"
    extra = [
        "--backend",
        "ray",
        "--ray-address",
        ray_head,
        "--env",
        f"FAKE_TRAINER_EXPECT={expect}",
        "--env",
        "FAKE_TRAINER_SLEEP=300",
    ]
    plan = dry_run_json(tiny, capsys, *extra)
    expect.write_text(json.dumps({"args": plan["argv"][2:], "env": plan["env"]}))
    run_dir = tiny.tmp / "run"
    cli = subprocess.Popen(
        [sys.executable, "-m", "envrun.cli_run", *tiny.args(*extra, "--run-dir", str(run_dir))],
        cwd=REPO,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert cli.stdout is not None
        for line in cli.stdout:  # the job's own output, streamed back: it is really running
            if "fake trainer: sleeping" in line:
                break
        cli.send_signal(signal.SIGINT)
        cli.communicate(timeout=120)
    finally:
        cli.kill()
    assert cli.returncode == 130
    status = read_status(run_dir)
    assert status["status"] == "interrupted" and "stopped on Ctrl-C" in status.get("detail", "")
    job_id = next(
        line.split()[4] for line in (run_dir / "output.log").read_text().splitlines() if "submitted Ray job" in line
    )
    assert JobSubmissionClient(ray_head).get_job_status(job_id).value == "STOPPED"
