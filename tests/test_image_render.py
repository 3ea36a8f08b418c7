"""Rendering the Dockerfile: a pure function of the plan, with assertions that can fail."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from envbuild.errors import InputError
from envbuild.image.plan import plan_context
from envbuild.image.render import render_dockerfile
from envbuild.lock import Lock
from tests.lib.tinylock import BRANCH_COMMIT, DIGEST, LOCK_SHA, NONE_COMMIT, TAG_COMMIT, WHEEL_COMMIT, tiny_lock


def render(lock: Lock | None = None, **plan_args: object) -> str:
    return render_dockerfile(plan_context(lock or tiny_lock(), lock_sha256=LOCK_SHA, **plan_args))  # type: ignore[arg-type]


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def test_from_is_pinned_by_digest_without_the_tag() -> None:
    lines = instructions(render())
    assert lines[0] == f"FROM 127.0.0.1:5000/envbuild-test/base@{DIGEST}"
    assert sum(line.startswith("FROM ") for line in lines) == 1


def test_unpinned_base_is_refused_unless_allowed() -> None:
    lock = tiny_lock()
    unpinned = dataclasses.replace(lock, base_image=dataclasses.replace(lock.base_image, digest=None))
    with pytest.raises(InputError, match="not pinned"):
        render(unpinned)
    forged = dataclasses.replace(
        plan_context(unpinned, lock_sha256=LOCK_SHA, allow_unpinned=True), allow_unpinned=False
    )
    with pytest.raises(InputError, match="not pinned"):
        render_dockerfile(forged)  # the renderer checks on its own, not only the planner
    assert (
        instructions(render(unpinned, allow_unpinned=True))[0]
        == "FROM 127.0.0.1:5000/envbuild-test/base:bookworm-cann9.1.0"
    )


def test_no_base_image_and_no_epoch_are_reported_together() -> None:
    with pytest.raises(InputError) as info:
        render(tiny_lock(base_image=None, source_date_epoch=None))
    assert "base_image" in str(info.value) and "epoch" in str(info.value)
    assert "SOURCE_DATE_EPOCH=1234" in render(tiny_lock(source_date_epoch=None), epoch=1234)


def test_layer_order_packages_then_tags_then_branches_then_metadata() -> None:
    lines = instructions(render())
    copies = [line.split()[1] for line in lines if line.startswith("COPY ")]
    assert copies == [
        "wheels/",
        "envbuild/requirements.txt",
        "src/core/",
        "src/kernels/",
        "src/engine/",
        "src/data/",
        "envbuild/",
    ]
    kinds = [line.split()[0] for line in lines]
    assert kinds[:3] == ["FROM", "ENV", "RUN"]  # platform check before anything is installed
    assert kinds[-2:] == ["COPY", "LABEL"]
    epoch_at = lines.index("ENV SOURCE_DATE_EPOCH=1700000000")
    assert (
        lines.index(next(l for l in lines if "--require-hashes" in l))
        < epoch_at
        < lines.index(next(l for l in lines if l.startswith("COPY src/")))
    )


def test_packages_are_installed_with_hashes_and_no_index() -> None:
    run = next(line for line in instructions(render()) if "requirements.txt" in line and line.startswith("RUN"))
    for flag in ("--no-index", "--require-hashes", "--no-deps", "--no-compile", "--find-links /opt/envbuild/wheels"):
        assert flag in run
    plan = plan_context(tiny_lock(), lock_sha256=LOCK_SHA)
    assert plan.requirements.splitlines()[1:] == [
        f"another==2.0 --hash=sha256:{'a' * 64} --hash=sha256:{'f' * 64}",
        f"tiny-pkg==1.0 --hash=sha256:{'e' * 64}",
    ]


def test_each_source_installed_as_its_mode_with_only_its_env() -> None:
    lines = instructions(render())
    runs = {
        m.group(1): line
        for line in lines
        if (m := re.search(r"/opt/envbuild/src/([a-z]+)", line)) and line.startswith("RUN")
    }
    assert set(runs) == {"core", "engine", "kernels"}  # `none` is copied, not installed
    assert runs["engine"].startswith(
        "RUN NOTE='two words; $HOME' VLLM_TARGET_DEVICE=empty python3 -m pip install "
        "--no-build-isolation --no-deps --no-index --no-compile"
    )
    assert "-e /opt/envbuild/src/engine" in runs["engine"]
    assert "COMPILE_CUSTOM_KERNELS=1 python3 -m pip wheel --no-build-isolation --no-deps --no-index" in runs["kernels"]
    assert "install --no-index --no-deps --no-compile /tmp/envbuild-wheel-kernels/*.whl" in runs["kernels"]
    assert "VLLM_TARGET_DEVICE" not in runs["core"] + runs["kernels"]
    assert "COMPILE_CUSTOM_KERNELS" not in runs["core"] + runs["engine"]
    assert not any(line.startswith("ENV") and "VLLM" in line for line in lines)
    for run in runs.values():
        assert "rm -rf /tmp/envbuild-*" in run and "__pycache__" in run


def test_env_and_labels() -> None:
    lines = instructions(render())
    assert lines[1] == (
        "ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1"
    )
    labels = dict(re.findall(r'"([^"]+)"="([^"]+)"', lines[-1]))
    assert labels == {
        "io.envbuild.lock.name": "tiny",
        "io.envbuild.lock.sha256": LOCK_SHA,
        "io.envbuild.source.core.commit": TAG_COMMIT,
        "io.envbuild.source.engine.commit": BRANCH_COMMIT,
        "io.envbuild.source.data.commit": NONE_COMMIT,
        "io.envbuild.source.kernels.commit": WHEEL_COMMIT,
    }
    assert "{{" not in render()


def test_moving_one_branch_pin_changes_only_its_layer_and_what_follows() -> None:
    lock = tiny_lock()
    moved = dataclasses.replace(
        lock, sources=tuple(dataclasses.replace(s, commit="9" * 40) if s.name == "data" else s for s in lock.sources)
    )
    before, after = instructions(render(lock)), instructions(render(moved))
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(before) == len(after)
    assert changed == [len(before) - 1]  # the labels; the COPY text of src/data is the same, its content is not
    assert render(lock) == render(lock)


# --- the platform check, run for real against a CANN-like tree ------------------------------------


def _cann_tree(root: Path, version: str) -> Path:
    """The layout of tests/lib/baseimage.py's CANN-like toolkit (kept in step by hand: no docker import here)."""
    toolkit = root / "usr/local/Ascend/ascend-toolkit"
    version_dir = toolkit / version
    (version_dir / "x86_64-linux").mkdir(parents=True)
    (version_dir / "version.cfg").write_text(
        f"runtime_running_version=[7.9.0.1.100:{version}]\ntoolkit_running_version=[7.9.0.1.100:{version}]\n"
    )
    (version_dir / "x86_64-linux/ascend_toolkit_install.info").write_text(
        f"package_name=Ascend-cann-toolkit\nversion={version}\n"
    )
    (toolkit / "latest").symlink_to(version)
    return toolkit


def _run_platform_check(toolkit: Path, lock: Lock) -> subprocess.CompletedProcess[str]:
    plan = plan_context(lock, lock_sha256=LOCK_SHA)
    plan = dataclasses.replace(plan, python=None)  # the host's python is not the image's
    run = next(l for l in render_dockerfile(plan).split("\nRUN ")[1:] if "want_cann" in l)
    script = run.split("\nCOPY ")[0].replace("/usr/local/Ascend/ascend-toolkit", str(toolkit))
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("layout", ["install_info", "version_cfg_only", "symlink_only"])
def test_platform_check_accepts_the_locked_cann(tmp_path: Path, layout: str) -> None:
    toolkit = _cann_tree(tmp_path, "9.1.0")
    if layout != "install_info":
        (toolkit / "9.1.0/x86_64-linux/ascend_toolkit_install.info").unlink()
    if layout == "symlink_only":
        (toolkit / "9.1.0/version.cfg").unlink()
    result = _run_platform_check(toolkit, tiny_lock())
    assert result.returncode == 0, result.stderr


def test_platform_check_fails_the_build_on_another_cann(tmp_path: Path) -> None:
    toolkit = _cann_tree(tmp_path, "8.5.0")
    result = _run_platform_check(toolkit, tiny_lock())
    assert result.returncode == 1
    assert "CANN '8.5.0'" in result.stderr and "platform.cann is 9.1.0" in result.stderr
    missing = _run_platform_check(tmp_path / "nowhere", tiny_lock())
    assert missing.returncode == 1 and "none found" in missing.stderr


def test_every_run_is_valid_shell() -> None:
    runs = [line[len("RUN ") :] for line in instructions(render()) if line.startswith("RUN ")]
    assert len(runs) == 5  # platform check, packages, and three installed sources
    for run in runs:
        result = subprocess.run(["sh", "-n", "-c", run], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, (run, result.stderr)


def test_no_platform_means_no_check() -> None:
    text = render(tiny_lock(platform=None))
    assert "want_cann" not in text and "nothing to check" in text
