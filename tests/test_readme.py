"""The README's words, followed literally from a fresh clone: its quick start and its test command.

The commands are read out of README.md's code blocks (not copied here), so the README cannot drift from
what works. The clone is of the committed HEAD, as a new user (and CI) gets it; its own virtualenv is
made by the commands themselves.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.lib.gitrepos import git

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def code_block(section: str) -> str:
    """The first ```sh block under the README heading ``## <section>``."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(section)}\b.*?^```sh\n(.*?)^```", text, re.M | re.S)
    assert match is not None, f"README.md has no sh block under '## {section}'"
    return match.group(1).strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("readme") / "envbuild"
    git("clone", "-q", "--no-hardlinks", str(REPO), str(path))
    return path


def sh(command: str, cwd: Path, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**clean, **env}
    )


@pytest.mark.network
@pytest.mark.slow
def test_the_quick_start_from_a_fresh_clone(clone: Path, tmp_path: Path) -> None:
    command = code_block("Quick start")
    assert "envbuild lock verify lockfiles/glm5_2-ascend.lock.yaml" in command
    done = sh(command + " --json", clone, 900, ENVBUILD_CACHE=str(tmp_path / "cache"))  # an empty cache too
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # The README: 0 every pin holds, 1 a pin fails (GitHub is out of reach from here), 2 invalid input.
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])
    kinds = {r["kind"] for r in report["results"]}
    assert kinds == {"source", "submodule", "package", "requirement", "base_image"}
    assert len([r for r in report["results"] if r["kind"] == "source"]) == 9
    submodules = {r["name"]: r["status"] for r in report["results"] if r["kind"] == "submodule"}
    assert "megatron-bridge/3rdparty/Megatron-LM" in submodules and len(submodules) == 8  # 7 sources unknown
    packages = [r for r in report["results"] if r["kind"] == "package"]
    assert sum(r["status"] == "ok" for r in packages) >= len(packages) - 1  # triton-ascend: Ascend's own index


@pytest.mark.network
@pytest.mark.docker
@pytest.mark.slow
def test_the_test_command_from_a_fresh_clone(clone: Path) -> None:
    command = code_block("Tests")
    assert command == "scripts/test"
    # "Extra arguments go to pytest": one fast module, so the suite does not run itself whole.
    done = sh(f"{command} tests/test_lock_model.py -q -p no:cacheprovider", clone, 1500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert re.search(r"\d+ passed", done.stdout), done.stdout[-2000:]
