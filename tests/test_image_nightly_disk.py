"""The nightly runner is held to the disk docs/image.md says the real lock's check needs, before it starts."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_the_nightly_check_refuses_a_runner_with_less_disk_than_the_docs_state() -> None:
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())
    job = workflow["jobs"]["check"]
    needs = int(job["env"]["ENVBUILD_NEEDS_GB"])
    runs = [step.get("run", "") for step in job["steps"]]
    check = next(i for i, run in enumerate(runs) if run.strip().startswith("envbuild check"))
    guard = next(i for i, run in enumerate(runs) if "ENVBUILD_NEEDS_GB" in run)
    assert guard < check  # before anything is pulled or built
    assert "df " in runs[guard] and "exit 1" in runs[guard] and "ENVBUILD_NIGHTLY_RUNNER" in runs[guard]
    assert "vars.ENVBUILD_NIGHTLY_RUNNER" in job["runs-on"]
    page = (REPO / "docs" / "image.md").read_text()
    stated = re.search(r"refuses to start below (\d+) GB free", page)
    assert stated is not None and int(stated.group(1)) == needs
