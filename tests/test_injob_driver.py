"""The head's driver (envrun.injob.driver) as a scheduler's job runs it: ``python3 -m envrun.injob driver``
with the spec ``--emit sbatch`` wrote, envrun's code beside it, no Ray answering (the nodes never join).
What envrun refuses on the way is one line, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from envrun.cli.main import main
from tests.lib.tinyrun import Tiny

DIGEST = "registry.example/glm5@sha256:" + "ab" * 32


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def emitted_job(tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The job directory ``--emit sbatch`` writes, its record aimed at ``tmp_path/record`` and its head's
    dashboard at a port where nothing listens; a join deadline of one second."""
    job = tmp_path / "job"
    args = tiny.args("--nnodes", "2", "--output-dir", "/runs", "--image", DIGEST, "--join-timeout", "1")
    assert main([*args, "--emit", "sbatch", str(job)]) == 0
    capsys.readouterr()
    spec = json.loads((job / "job.json").read_text())
    spec["plan"]["run_dir"] = str(tmp_path / "record")
    spec["dashboard_port"] = closed_port()
    (job / "job.json").write_text(json.dumps(spec))
    return job


def run_driver(job: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(job / "code"), "ENVRUN_NODE_INDEX": "0", "ENVRUN_NODE_IP": "127.0.0.1"}
    command = [sys.executable, "-m", "envrun.injob", "driver", str(job / "job.json")]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=job, timeout=120)


def test_a_job_submitted_again_over_its_record_is_one_line(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = emitted_job(tiny, tmp_path, capsys)
    first = run_driver(job)
    assert first.returncode == 1 and first.stderr.splitlines()[-1] == "envrun: 0 of 2 node(s) joined within 1 s (none)"
    status = json.loads((tmp_path / "record" / "status.json").read_text())
    assert status["status"] == "error"
    again = run_driver(job)  # `sbatch job.sbatch` once more: the record of the first is there
    assert "Traceback" not in again.stderr
    assert again.stderr == (
        f"envrun: {tmp_path / 'record'}: an earlier run of this job recorded itself there; nothing was run. "
        "Move it away, or emit the run again (a run id, and a record, of its own)\n"
    )
    assert again.returncode == 2
    assert json.loads((tmp_path / "record" / "status.json").read_text()) == status  # the first's record kept


def test_a_record_the_job_cannot_write_is_one_line(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = emitted_job(tiny, tmp_path, capsys)
    spec = json.loads((job / "job.json").read_text())
    (tmp_path / "runs").write_text("a file where the output directory should be\n")
    spec["plan"]["run_dir"] = str(tmp_path / "runs" / "record")
    (job / "job.json").write_text(json.dumps(spec))
    done = run_driver(job)
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        f"envrun: {tmp_path / 'runs' / 'record'}: cannot create the run directory"
    )
    assert done.returncode == 1
