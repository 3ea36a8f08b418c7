"""The Slurm of scripts/services, as the scheduler backend will use it: srun runs a task on each of its two
nodes, sbatch runs a script whose exit code and output are where Slurm says, scancel ends a running job.

Jobs reach it through ``SLURM_CONF`` (the env file of scripts/services sets it); each test cancels what it
submitted, and waits on job states with deadlines, never a fixed sleep."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

# A job ends in one of these (scontrol's JobState); it stays listed for MinJobAge (an hour).
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)


def _job(job_id: str) -> dict[str, str]:
    """The fields of ``scontrol show job`` that hold no spaces (JobState, ExitCode, StdOut, NodeList, ...)."""
    shown = _run("scontrol", "show", "job", "--oneliner", job_id, timeout=30)
    assert shown.returncode == 0, shown.stderr
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", shown.stdout))


def _wait_for(job_id: str, states: set[str], seconds: float) -> dict[str, str]:
    deadline = time.monotonic() + seconds
    while True:
        job = _job(job_id)
        if job["JobState"] in states:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {job['JobState']} after {seconds}s, not {sorted(states)}: {job}")
        time.sleep(0.1)


@pytest.fixture
def submitted() -> Iterator[list[str]]:
    """The IDs of the jobs a test submits: any still running at its end is cancelled."""
    ids: list[str] = []
    yield ids
    if ids:
        _run("scancel", *ids, timeout=30)


def _sbatch(submitted: list[str], *args: str) -> str:
    result = _run("sbatch", "--parsable", *args, timeout=30)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip().split(";")[0]
    submitted.append(job_id)
    return job_id


def test_srun_runs_one_task_on_each_node(tmp_path: Path) -> None:
    report = (
        "import os\n"
        "print(f'cwd={os.getcwd()}')\n"
        "for k, v in sorted(os.environ.items()):\n"
        "    if k.startswith('SLURM'):\n"
        "        print(f'{k}={v}')\n"
    )
    # --label: each line says which task printed it (the two tasks' lines interleave).
    result = _run("srun", "-N2", "--ntasks-per-node=1", "--label", f"--chdir={tmp_path}", sys.executable, "-c", report)
    assert result.returncode == 0, result.stderr
    tasks: list[dict[str, str]] = [{}, {}]
    for line in result.stdout.splitlines():
        task, _, variable = line.partition(": ")
        name, _, value = variable.partition("=")
        tasks[int(task)][name] = value
    assert [env["SLURMD_NODENAME"] for env in tasks] == ["n1", "n2"]
    for rank, env in enumerate(tasks):
        assert env["SLURM_PROCID"] == env["SLURM_NODEID"] == str(rank)
        assert env["SLURM_LOCALID"] == "0"
        assert env["SLURM_NNODES"] == env["SLURM_NTASKS"] == "2"
        assert env["SLURM_JOB_NODELIST"] == env["SLURM_STEP_NODELIST"] == "n[1-2]"
        assert env["SLURM_JOB_ID"] == tasks[0]["SLURM_JOB_ID"] and env["SLURM_JOB_ID"].isdigit()
        assert env["SLURM_STEP_ID"] == "0"
        assert env["cwd"] == str(tmp_path)


def test_sbatch_job_exit_code_and_output_file(tmp_path: Path, submitted: list[str]) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        'echo "batch on $SLURMD_NODENAME of $SLURM_JOB_NODELIST"\n'
        "srun -N2 --ntasks-per-node=1 printenv SLURMD_NODENAME | sort\n"
        "exit 3\n"
    )
    output = tmp_path / "logs" / "job.out"
    output.parent.mkdir()
    job_id = _sbatch(submitted, "-N2", f"--output={output}", f"--chdir={tmp_path}", str(script))
    job = _wait_for(job_id, FINISHED, 30)
    assert job["JobState"] == "FAILED"
    assert job["ExitCode"] == "3:0"
    assert job["StdOut"] == str(output)
    assert output.read_text() == "batch on n1 of n[1-2]\nn1\nn2\n"


def test_scancel_ends_a_running_batch_job(tmp_path: Path, submitted: list[str]) -> None:
    job_id = _sbatch(
        submitted, "-N2", f"--output={tmp_path / 'job.out'}", f"--chdir={tmp_path}", "--wrap", "exec sleep 300"
    )
    _wait_for(job_id, {"RUNNING"}, 30)
    cancelled = _run("scancel", job_id, timeout=30)
    assert cancelled.returncode == 0, cancelled.stderr
    job = _wait_for(job_id, FINISHED, 15)
    assert job["JobState"] == "CANCELLED"
