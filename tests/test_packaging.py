"""The tool installs as a plain wheel, not only editable: templates, schema and recipes ship inside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.network  # the build backend (setuptools) comes from PyPI in pip's isolated build
@pytest.mark.slow
def test_the_wheel_carries_its_data_files(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("envbuild-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (REPO / "images").glob("*.in"):
        assert f"envbuild/image/templates/{template.name}" in names
    assert {"envbuild/lock/lock-v1.schema.json", "envbuild/lock/lock-v2.schema.json"} <= names
    assert "envbuild/image/inimage_probe.py" in names
    assert "envrun/recipes/grpo-glm5.yaml" in names
    assert "envrun/recipes/lockfiles/glm5_2-ascend.lock.yaml" in names  # the recipe's lock, for an installed envrun
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)
