"""The nightly workflow is scheduled, runs the check command docs/check.md documents, and publishes it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

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
    check_runs = [r.strip() for r in runs(workflow()) if r.strip().startswith("envbuild check")]
    assert check_runs and set(check_runs) <= set(documented), (check_runs, documented)
    args = build_parser().parse_args(shlex.split(check_runs[0])[1:])  # and it parses as the CLI reads it
    assert args.report == Path("report") and args.history is not None
    assert (REPO / str(args.lockfile)).is_file()


def test_workflow_publishes_summary_and_report() -> None:
    steps = [step for job in workflow()["jobs"].values() for step in job["steps"]]
    assert any("GITHUB_STEP_SUMMARY" in step.get("run", "") and "report/check.md" in step["run"] for step in steps)
    upload = next(step for step in steps if str(step.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["path"].rstrip("/") == "report" and upload.get("if") == "always()"
