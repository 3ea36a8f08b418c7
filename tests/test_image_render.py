"""Rendering the Dockerfiles: pure functions of the plan, with assertions that can fail."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from envbuild.errors import InputError
from envbuild.image.plan import ContextPlan, plan_context
from envbuild.image.render import (
    CLAMP,
    MOUNT_POINT,
    PACKAGES_EPOCH,
    packages_key,
    packages_reference,
    render_buildkit_image_dockerfile,
    render_buildkit_packages_script,
    render_dockerfile,
    render_packages_dockerfile,
    render_platform_check,
    render_tools_dockerfile,
    render_tools_script,
    tools_reference,
)
from envbuild.lock import Lock, Package, PackageFile
from tests.lib.tinylock import BRANCH_COMMIT, DIGEST, LOCK_SHA, NONE_COMMIT, TAG_COMMIT, WHEEL_COMMIT, tiny_lock

BASE = f"127.0.0.1:5000/envbuild-test/base@{DIGEST}"
UV_WHEEL = "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"  # the tiny lock is x86_64


def plan_of(lock: Lock | None = None, **plan_args: object) -> ContextPlan:
    return plan_context(lock or tiny_lock(), lock_sha256=LOCK_SHA, **plan_args)  # type: ignore[arg-type]


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def test_without_packages_one_dockerfile_on_the_base_checks_the_platform() -> None:
    plan = plan_of(tiny_lock(packages=()))
    text = render_dockerfile(plan)
    assert text == render_buildkit_image_dockerfile(plan)
    lines = instructions(text)
    assert lines[0] == f"FROM {BASE} AS envbuild-from"
    froms = [line for line in lines if line.startswith("FROM ")]
    assert all(line == "FROM envbuild-start" or " AS envbuild-" in line for line in froms)
    assert f"FROM {BASE} AS envbuild-start" in froms and froms[-1] == "FROM envbuild-start"
    assert any("want_cann=9.1.0" in line for line in lines)
    assert "wheels" not in text and "envbuild-pkg" not in text


def test_the_tools_stage_is_one_text_with_or_without_packages() -> None:
    """The stage that makes the tools layer begins both the tools image (a lock with packages) and the
    image itself (a lock without): the same instructions, but for where the platform is checked."""
    bare = [
        line for line in instructions(render_dockerfile(plan_of(tiny_lock(packages=())))) if "want_cann" not in line
    ]
    tools = instructions(render_tools_dockerfile(plan_of()))
    stage = tools[: tools.index(f"FROM {BASE}")]
    assert len(stage) == 3 and bare[: len(stage)] == stage


def test_unpinned_base_is_refused_unless_allowed() -> None:
    lock = tiny_lock()
    unpinned = dataclasses.replace(lock, base_image=dataclasses.replace(lock.base_image, digest=None))
    with pytest.raises(InputError, match="not pinned"):
        plan_of(unpinned)
    forged = dataclasses.replace(plan_of(unpinned, allow_unpinned=True), allow_unpinned=False)
    with pytest.raises(InputError, match="not pinned"):
        render_dockerfile(forged)  # the renderer checks on its own, not only the planner
    text = render_dockerfile(plan_of(unpinned, allow_unpinned=True))
    assert "\nFROM 127.0.0.1:5000/envbuild-test/base:bookworm-cann9.1.0 AS envbuild-from\n" in text


def test_no_base_image_and_no_epoch_are_reported_together() -> None:
    with pytest.raises(InputError) as info:
        plan_of(tiny_lock(base_image=None, source_date_epoch=None))
    assert "no base image" in str(info.value) and "--base-image" in str(info.value) and "epoch" in str(info.value)
    assert "SOURCE_DATE_EPOCH=1234" in render_dockerfile(plan_of(tiny_lock(source_date_epoch=None), epoch=1234))


def test_the_packages_script_checks_installs_with_hashes_reports_and_clamps() -> None:
    script = render_buildkit_packages_script(plan_of())
    lines = instructions(script)
    (pip,) = [line for line in lines if "pip install" in line]
    for flag in (
        "--ignore-installed",
        "--no-index",
        "--require-hashes",
        "--no-deps",
        "--no-compile",
        "--find-links wheels -r requirements.txt",
    ):
        assert flag in pip
    order = [
        next(i for i, line in enumerate(lines) if needle in line)
        for needle in (
            "want_cann=9.1.0",  # the platform first: nothing is installed on a wrong base
            "stage_packages.py before",
            "pip install",
            "stage_packages.py after",
            f'clamp-mtimes {PACKAGES_EPOCH} "$since"',
        )
    ]
    assert order == sorted(order)
    result = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert plan_of().requirements.splitlines()[1:] == [
        f"another==2.0 --hash=sha256:{'a' * 64} --hash=sha256:{'f' * 64}",
        f"tiny-pkg==1.0 --hash=sha256:{'e' * 64}",
    ]


def test_the_packages_key_follows_the_packages_not_the_sources() -> None:
    lock = tiny_lock()
    moved = dataclasses.replace(
        lock, sources=tuple(dataclasses.replace(s, commit="9" * 40) for s in lock.sources), source_date_epoch=1
    )
    assert packages_key(plan_of(moved)) == packages_key(plan_of(lock))  # pins and the epoch: same packages
    other = tiny_lock(packages=lock.packages[:1])
    assert packages_key(plan_of(other)) != packages_key(plan_of(lock))
    rebased = dataclasses.replace(lock, base_image=dataclasses.replace(lock.base_image, digest="sha256:" + "c" * 64))
    assert packages_key(plan_of(rebased)) != packages_key(plan_of(lock))


def test_each_source_installed_as_its_mode_with_only_its_env_and_clamped() -> None:
    lines = instructions(render_buildkit_image_dockerfile(plan_of()))
    runs = {m.group(1): line for line in lines if (m := re.search(r"source=src/([a-z]+),", line))}
    assert set(runs) == {"core", "engine", "kernels", "data"}  # `none` too: copied by its RUN
    assert "-m pip" not in runs["data"]  # copied, not installed
    assert "&& NOTE='two words; $HOME' VLLM_TARGET_DEVICE=empty python3 -m pip install" in " ".join(
        runs["engine"].split()
    )
    assert "-e /opt/envbuild/src/engine" in runs["engine"]
    assert (
        "COMPILE_CUSTOM_KERNELS=1 python3 -m pip install --no-build-isolation --no-deps --no-index --no-compile "
        "/opt/envbuild/src/kernels &&" in " ".join(runs["kernels"].split())
    )
    assert " -e " not in runs["kernels"]  # built as a wheel, not editable
    assert "VLLM_TARGET_DEVICE" not in runs["core"] + runs["kernels"]
    assert "COMPILE_CUSTOM_KERNELS" not in runs["core"] + runs["engine"]
    assert not any(line.startswith("ENV") and "VLLM" in line for line in lines)
    assert CLAMP not in runs.pop("data")  # its stage's RUN: every mtime set, its output COPYd
    for run in runs.values():
        assert "rm -rf /root/.cache/pip" in run and "__pycache__" in run
        assert run.endswith(f'&& {CLAMP} 1700000000 "$since"')  # the last thing the step does


def test_with_an_installer_each_source_is_built_and_installed_by_uv_mounted_below_the_step_s_tmp() -> None:
    installer = Package(name="uv", version="0.13.9", files=(PackageFile(UV_WHEEL, "c" * 64),))
    lines = instructions(render_buildkit_image_dockerfile(plan_of(tiny_lock(installer=installer))))
    installs = [line for line in lines if "source=src/" in line and "pip install" in line]
    assert len(installs) == 3, lines  # the tiny lock's three sources that are built (one is copied only)
    for run in (" ".join(line.split()) for line in installs):
        mounts = run.split(" since=")[0].split()
        # the installer's directory after the tmpfs at /tmp, below it: no mount point is made in the layer
        assert mounts[2:] == [
            "--mount=type=tmpfs,target=/tmp",
            "--mount=type=bind,source=installer,target=/tmp/envbuild-installer",
        ], mounts
        assert '/tmp/envbuild-installer/uv pip install --python "$(command -v python3)" --offline --no-index' in run
        assert "--no-deps --no-build-isolation --no-cache" in run and "-m pip" not in run
        assert "&& python3 -I -S -B /tmp/envbuild-installer/stage_packages.py unstamp &&" in run
        assert "UV_NO_INSTALLER_METADATA" not in run  # direct_url.json: how the in-image check finds a source
    assert any(" -e /opt/envbuild/src/" in run for run in installs)


def test_env_and_labels() -> None:
    lines = instructions(render_buildkit_image_dockerfile(plan_of()))
    assert (
        "ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1"
        in lines
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
    assert "{{" not in render_dockerfile(plan_of())


def test_moving_one_branch_pin_changes_only_its_layer_and_what_follows() -> None:
    lock = tiny_lock()
    moved = dataclasses.replace(
        lock, sources=tuple(dataclasses.replace(s, commit="9" * 40) if s.name == "data" else s for s in lock.sources)
    )
    before, after = instructions(render_dockerfile(plan_of(lock))), instructions(render_dockerfile(plan_of(moved)))
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(before) == len(after)
    assert changed == [len(before) - 1]  # the labels; the COPY text of src/data is the same, its content is not
    assert render_dockerfile(plan_of(lock)) == render_dockerfile(plan_of(lock))


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
    plan = dataclasses.replace(plan_of(lock), python=None)  # the host's python is not the image's
    run = render_platform_check(plan)
    assert run.startswith("RUN ")
    script = run[len("RUN ") :].replace("/usr/local/Ascend/ascend-toolkit", str(toolkit))
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


def test_no_platform_means_no_check() -> None:
    text = render_dockerfile(plan_of(tiny_lock(platform=None)))
    assert "want_cann" not in text and "nothing to check" in text


# --- the image on BuildKit: the layer rules, as properties of the text ----------------------------


def test_buildkit_layers_follow_the_rules_that_make_them_reproducible() -> None:
    plan = plan_of()
    lines = instructions(render_buildkit_image_dockerfile(plan))
    assert lines[0] == f"FROM {packages_reference(plan)} AS envbuild-start"  # the packages image: tools layer in it
    final = lines[lines.index("FROM envbuild-start") :]
    # No COPY from the build context: the one COPY takes the copy-only source's stage, whose times a RUN set.
    assert [line for line in lines if line.startswith("COPY ")] == ["COPY --from=envbuild-src-data /out/ /"]
    stage = lines[lines.index("FROM envbuild-start AS envbuild-src-data") : lines.index("FROM envbuild-start")]
    assert len(stage) == 2 and "source=src/data," in stage[1] and "find /out -exec touch -h -d @1700000000" in stage[1]
    assert "touch -h -r /opt /out/opt" in stage[1]  # /opt as the image has it
    bare = instructions(render_buildkit_image_dockerfile(plan_of(tiny_lock(packages=()))))
    start = bare[bare.index(f"FROM {BASE} AS envbuild-start") : bare.index("FROM envbuild-start")]
    assert bare[0] == f"FROM {BASE} AS envbuild-from"
    assert any("want_cann=9.1.0" in line for line in bare[: bare.index(start[0])])  # in the tools stage
    assert "COPY --from=envbuild-tools /out/ /" in start  # before the copy stage and every source's RUN
    runs = [line for line in final if line.startswith("RUN ")]
    assert len(runs) == 3  # the sources installed; `none` is the COPY; the metadata is a layer envbuild writes
    for run in runs:
        targets = re.findall(r"--mount=\S*target=([^,\s]+)", run)
        assert set(targets) <= {MOUNT_POINT, "/tmp"} and "/tmp" in targets, run
        assert run.endswith(f'&& {CLAMP} 1700000000 "$since"'), run
        body = run.split(" since=", 1)[1]
        result = subprocess.run(["sh", "-n", "-c", "since=" + body], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, (run, result.stderr)
    body = stage[1].split(f"target={MOUNT_POINT} ", 1)[1]
    result = subprocess.run(["sh", "-n", "-c", body], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, (stage[1], result.stderr)
    steps = [re.search(r"source=src/([a-z]+),|envbuild-src-([a-z]+) ", line) for line in final]
    order = [next(g for g in m.groups() if g) for m in steps if m is not None]
    assert order == ["core", "kernels", "engine", "data"]  # tags before branches
    assert "source=meta" not in "\n".join(lines)


def test_buildkit_dry_run_is_the_default_and_names_the_packages_step() -> None:
    plan = plan_of()
    text = render_dockerfile(plan)
    tools = instructions(render_tools_dockerfile(plan))
    packages = instructions(render_packages_dockerfile(plan))
    assert instructions(text) == tools + packages + instructions(render_buildkit_image_dockerfile(plan))
    assert tools[0] == f"FROM {BASE} AS envbuild-from" and tools[-2:] == [
        f"FROM {BASE}",
        "COPY --from=envbuild-tools /out/ /",
    ]
    # The install step's parent is a built image, never a step of its own build (the engine's two
    # layer writers, docs/image.md): one FROM, the tools image's tag, and the RUN.
    assert tools_reference(plan) == "envbuild-raw/tiny:packages-tools"
    assert packages[0] == f"FROM {tools_reference(plan)}" and len(packages) == 2
    assert packages[-1].endswith(f"sh {MOUNT_POINT}/packages.sh")
    assert text.index("# ---- 1 of 3: the tools image") < text.index("# ---- 2 of 3: the packages image")
    install = packages[-1]
    assert (
        f"--mount=type=bind,source=packages,target={MOUNT_POINT}" in install
        and "--mount=type=tmpfs,target=/tmp" in install
    )
    script = render_buildkit_packages_script(plan)
    assert all(f"#     {line}" in text for line in script.splitlines() if line)
    assert "--require-hashes --no-deps" in script and "--no-index" in script
    assert script.rstrip().endswith(f'{CLAMP} {PACKAGES_EPOCH} "$since"')
    assert packages_reference(plan) == f"envbuild-pkg/tiny:{packages_key(plan)[:16]}"
    assert "{{" not in text and "{{" not in render_tools_script()
    assert f"mkdir -p $out/etc $out{MOUNT_POINT} $out/opt/envbuild/bin" in render_tools_script()


def test_no_step_writes_bytecode_or_mounts_a_cache_of_it() -> None:
    """A timestamp .pyc is trusted for a file of the same path, mtime and size, and below a source step
    every package file is at the packages epoch: bytecode kept between builds could be another lock's
    (reproduced with plain BuildKit, caaf133). No step keeps any: every RUN runs with the image's
    PYTHONDONTWRITEBYTECODE, reading the image's own bytecode, and mounts no cache."""
    for lock in (tiny_lock(), tiny_lock(packages=())):
        plan = plan_of(lock)
        text = "\n".join([render_dockerfile(plan), render_buildkit_packages_script(plan), render_tools_script()])
        assert "type=cache" not in text and "PYTHONPYCACHEPREFIX" not in text
        assert "unset PYTHONDONTWRITEBYTECODE" not in text and "PYTHONDONTWRITEBYTECODE=\n" not in text
        image = render_buildkit_image_dockerfile(plan)
        assert "ENV PYTHONDONTWRITEBYTECODE=1 " in image  # in the start stage, under every source's RUN
        assert image.index("ENV PYTHONDONTWRITEBYTECODE=1 ") < image.index("FROM envbuild-start\n")
    assert "export PYTHONDONTWRITEBYTECODE=1 " in render_buildkit_packages_script(plan_of(tiny_lock()))


def test_the_build_backends_the_sources_import_are_compiled_once_in_the_packages_step() -> None:
    """Each source's step builds without isolation, importing its backend from the packages layer, where
    nothing has bytecode: the locked packages a source's build requires are compiled in the packages step,
    checked by hash (and in the packages key, through the script). A source whose build requirements are not
    known builds with setuptools, PEP 517's fallback; a copy-only source builds nothing; a build requirement
    the lock does not install is not there to compile."""
    lock = tiny_lock()
    setuptools = Package("setuptools", "81.0.0", (PackageFile("setuptools-81.0.0-py3-none-any.whl", "b" * 64),))
    assert plan_of(lock).compiled == ()  # none of its sources' builds needs a locked package
    assert "stage_packages.py compile" not in render_buildkit_packages_script(plan_of(lock))
    with_backend = dataclasses.replace(lock, packages=(*lock.packages, setuptools))
    plan = plan_of(with_backend)  # no source records its build requirements: setuptools, for all of them
    assert plan.compiled == ("setuptools",)
    assert plan.to_json()["compiled"] == ["setuptools"]
    lines = instructions(render_buildkit_packages_script(plan))
    (compiling,) = [line for line in lines if "stage_packages.py compile" in line]
    assert compiling == "PYTHONHASHSEED=0 python3 stage_packages.py compile requirements.txt setuptools"
    assert lines.index(compiling) < next(i for i, line in enumerate(lines) if "stage_packages.py after" in line)
    assert packages_key(plan) != packages_key(dataclasses.replace(plan, compiled=()))
    recorded = {
        "engine": ("setuptools>=70", "pybind11"),  # pybind11: not locked
        "core": ("Another[extra]; python_version > '3'",),  # as the lock names it, whatever the marker
        "data": ("Tiny_Pkg",),  # copy-only: never built
        "kernels": ("setuptools",),
    }
    sources = tuple(dataclasses.replace(s, build_requires=recorded[s.name]) for s in with_backend.sources)
    assert plan_of(dataclasses.replace(with_backend, sources=sources)).compiled == ("another", "setuptools")
