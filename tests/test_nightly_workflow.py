"""The nightly workflow is scheduled, runs the check command docs/check.md documents, and publishes it; and its
run: steps, executed literally in a fresh clone, do what the workflow says."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from envbuild.cli import build_parser

REPO = Path(__file__).resolve().parents[1]


def workflow() -> dict:
    return yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())


def runs(data: dict) -> list[str]:
    return [step["run"] for job in data["jobs"].values() for step in job["steps"] if "run" in step]


def test_workflow_is_scheduled_nightly() -> None:
    data = workflow()
    triggers = data[True] if True in data else data["on"]  # YAML 1.1 reads a bare `on` as true
    (schedule,) = triggers["schedule"]
    minute, hour, day, month, weekday = schedule["cron"].split()
    assert (day, month, weekday) == ("*", "*", "*") and hour.isdigit() and minute.isdigit()


def test_workflow_runs_the_command_the_docs_document() -> None:
    page = (REPO / "docs" / "check.md").read_text()
    documented = re.findall(r"^(envbuild check .+)$", page, flags=re.M)
    assert documented, "docs/check.md documents no `envbuild check` command line"
    check_job = {"jobs": {"check": workflow()["jobs"]["check"]}}  # the bump job checks its own moved lock
    check_runs = [r.strip() for r in runs(check_job) if r.strip().startswith("envbuild check")]
    assert check_runs and set(check_runs) <= set(documented), (check_runs, documented)
    args = build_parser().parse_args(shlex.split(check_runs[0])[1:])  # and it parses as the CLI reads it
    assert args.report == Path("report") and args.history is not None
    assert (REPO / str(args.lockfile)).is_file()


def test_workflow_publishes_summary_and_report() -> None:
    steps = [step for job in workflow()["jobs"].values() for step in job["steps"]]
    assert any("GITHUB_STEP_SUMMARY" in step.get("run", "") and "report/check.md" in step["run"] for step in steps)
    upload = next(step for step in steps if str(step.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["path"].rstrip("/") == "report" and upload.get("if") == "always()"


# ---- the workflow's run: steps, executed literally in a fresh clone ----------------------------------------

NOT_RUN_HERE = {
    # It deletes the runner image's preinstalled toolchains (sudo rm -rf /usr/share/dotnet …) and prunes the
    # whole engine: right on a disposable runner, destructive on a shared machine. Its disk arithmetic is
    # plain shell; every other run: step is executed below, as the runner executes it.
    "Make room for the image",
}


@pytest.mark.network
@pytest.mark.docker
@pytest.mark.slow
def test_the_workflows_run_steps_run_literally_in_a_fresh_clone(tmp_path: Path) -> None:
    """As the runner runs them: `bash -e` per step, in a fresh clone of the committed HEAD (actions/checkout),
    with `python` a fresh virtual environment's (actions/setup-python), the job's env, no history restored
    (the first night) and $GITHUB_STEP_SUMMARY a file. On a machine without GitHub the check stops at
    verify (exit 1) and still writes the report the summary and the upload take."""
    data = workflow()
    job = data["jobs"]["check"]
    steps = [s for s in job["steps"] if "run" in s]
    assert {s["name"] for s in steps} >= NOT_RUN_HERE
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
    venv = tmp_path / "python"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    summary = tmp_path / "step-summary.md"
    summary.touch()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "ENVBUILD_"))}
    env = {
        **keep,
        **{k: str(v) for k, v in job.get("env", {}).items()},
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "GITHUB_STEP_SUMMARY": str(summary),
        "ENVBUILD_CACHE": str(tmp_path / "cache"),  # the runner's empty cache
        "CI": "true",
    }
    codes = {}
    for step in steps:
        if step["name"] in NOT_RUN_HERE:
            continue
        done = subprocess.run(
            ["bash", "-e", "-c", step["run"]], cwd=clone, env=env, capture_output=True, text=True, timeout=1500
        )
        codes[step["name"]] = done.returncode
        assert "Traceback" not in done.stderr, (step["name"], done.stderr[-3000:])
        if step["name"] == "Install envbuild":
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # No GitHub here: the check stops at verify, exit 1, as docs/check.md says of an unreachable pin.
    assert codes == {"Install envbuild": 0, "envbuild check": 1, "Disk after the check": 0, "Job summary": 0}
    report = clone / "report"
    assert sorted(p.name for p in report.iterdir()) == ["check.html", "check.json", "check.md"]
    assert summary.read_text() == (report / "check.md").read_text() != ""
    assert "Stopped at verify" in summary.read_text()
    history = clone / ".envbuild-history" / "check-history.jsonl"
    assert len(history.read_text().splitlines()) == 1  # what the cache step saves for the next night
