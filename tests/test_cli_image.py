"""`envbuild image --dry-run` renders from the lock alone: no network, no verify, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import read_lock

REAL_LOCK = Path(__file__).resolve().parents[1] / "lockfiles" / "glm5_2-ascend.lock.yaml"


def test_dry_run_of_the_real_lock_renders_and_says_what_a_build_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # nothing may talk to an engine
    assert main(["image", str(REAL_LOCK), "--dry-run", "--offline", "--cache-dir", str(tmp_path / "c")]) == 0
    captured = capsys.readouterr()
    lock = read_lock(REAL_LOCK).lock
    # BuildKit: the tools image (the base, its tools stage), the packages image on it, then the image
    # (the start stage, then the sources on it: the real lock has no copy-only source, so no stage of one)
    assert (
        captured.out.count("\nFROM ") == 6
        and "\nFROM envbuild-start\n" in captured.out
        and f"FROM {lock.base_image.name} AS envbuild-from\n" in captured.out
    )
    assert f"\nFROM envbuild-raw/{lock.name}:packages-tools\n" in captured.out
    for source in lock.sources:
        assert f"--mount=type=bind,source=src/{source.name},target=/opt/envbuild/mnt " in captured.out
    assert "VLLM_TARGET_DEVICE=empty" in captured.out and "COMPILE_CUSTOM_KERNELS=1" in captured.out
    assert "triton-ascend 3.2.2 has no files" in captured.err and "not pinned by digest" in captured.err
    # tags before branches: the two release tags come first
    order = [
        line.split(",")[1] for line in captured.out.splitlines() if line.startswith("RUN --mount=type=bind,source=src/")
    ]
    assert order[:2] == ["source=src/megatron-lm", "source=src/megatron-bridge"]


def test_a_bad_tag_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["image", str(REAL_LOCK), "--dry-run", "--tag", "Bad Tag", "--cache-dir", str(tmp_path)])
    assert code == 2 and "--tag" in capsys.readouterr().err
