"""The image proves the environment whole from inside: a real build (git daemon, local index, the test base
image pinned in the local registry, the real engine) whose source needs a package the lock lacks, and whose
package does not import, is not tagged; the failure names the distribution, the requirement and the source.
Waived by name (and the import skipped by name), the same lock builds and is tagged. A package's own
waiver (`cudaish` requires a CUDA library the lock does not hold) is honoured inside the image too."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from envbuild.config import SourceOptions
from envbuild.engine.client import Engine
from envbuild.errors import EngineError
from envbuild.image.build import ImageOptions, build_image
from envbuild.lock import Lock, Package, PackageFile, Source, write_lock
from envbuild.lock.io import read_lock
from envbuild.lock.model import BaseImage, Install, Platform, SkippedImport, Waiver
from envbuild.verify.pins import VerifyOptions, verify_lock
from tests.lib.gitrepos import Served
from tests.lib.imagelock import ImageLockEnv, make_wheels
from tests.lib.pyindex import PyIndex, make_wheel
from tests.lib.services import PushedImage, remove_lock_images

pytestmark = [pytest.mark.gitdaemon, pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]

LOCK_NAME = "wholetest"
NEEDY = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "needy"
version = "1.0"
dependencies = ["tinyone", "tinythree>=1"]

[tool.setuptools]
packages = ["needy", "npu_only"]
"""


@pytest.fixture(scope="module")
def lock(served: Served, pushed_base_image: PushedImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lock]:
    """One editable source, `needy`: it requires tinythree (not in the lock), and its second package needs what
    only an NPU host has. The lock does not record its requirements, so `lock verify` cannot see the gap
    (`unknown`, a warning): only the image can."""
    repo = served.repo("whole-needy")
    commit = repo.commit(
        files={
            "pyproject.toml": NEEDY,
            "needy/__init__.py": "import tinyone\n",
            "npu_only/__init__.py": "import libascend_hal_stand_in  # the driver a build host does not have\n",
        }
    )
    wheels = tmp_path_factory.mktemp("wheels")
    make_wheels(wheels, "test_closure_image")
    make_wheel(wheels, "cudaish", "1.0", requires=["nvidia-fake-cu12>=12"])
    with PyIndex(wheels) as index:
        env = ImageLockEnv(
            {}, {}, index, f"{pushed_base_image.repository}:{pushed_base_image.tag}", pushed_base_image.digest
        )
        yield Lock(
            version=1,
            name=LOCK_NAME,
            platform=Platform(os="linux", arch=env.arch, python=env.python),  # type: ignore[arg-type]
            base_image=BaseImage(name=env.base_name, digest=env.base_digest),
            index=index.url,
            source_date_epoch=1767225600,
            sources=(
                Source(
                    name="needy",
                    repo=served.url("whole-needy", "daemon-filter"),
                    ref="main",
                    ref_type="branch",
                    commit=commit,
                    install=Install(mode="editable"),
                ),
            ),
            packages=tuple(
                Package(
                    name=n,
                    version=v,
                    files=(PackageFile(f.name, index.sha256(f.name)),),
                    waive=(Waiver("nvidia-fake-cu12", "CUDA-only: never loaded on Ascend"),) if n == "cudaish" else (),
                )
                for n, v in (("cudaish", "1.0"), ("tinyone", "1.0"), ("tinytwo", "2.0"))
                for f in [next(wheels.glob(f"{n}-{v}-*.whl"))]
            ),
        )


@pytest.fixture(scope="module")
def engine(docker_client: docker.DockerClient) -> Iterator[Engine]:
    yield Engine(docker_client)
    remove_lock_images(docker_client, LOCK_NAME)


def build(lock: Lock, work: Path, tag: str, engine: Engine):  # type: ignore[no-untyped-def]
    path = work / f"{tag}.lock.yaml"
    write_lock(path, lock)
    options = ImageOptions(
        VerifyOptions(SourceOptions(cache_dir=work / "cache")), tags=(f"envbuild/{LOCK_NAME}:{tag}",)
    )
    return build_image(read_lock(path), options, engine=engine)


def test_a_missing_runtime_requirement_and_a_failing_import_leave_no_tag(
    lock: Lock, engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("whole")
    report = verify_lock(lock, "whole.lock.yaml", VerifyOptions(SourceOptions(cache_dir=work / "cache")))
    assert report.ok and [r.status for r in report.results if r.name == "needy" and r.kind == "requirement"] == [
        "unknown",
        "unknown",
    ]
    assert [(r.status, r.detail) for r in report.results if r.name == "cudaish" and r.kind == "requirement"] == [
        (
            "waived",
            "requires nvidia-fake-cu12>=12: waived: CUDA-only: never loaded on Ascend "
            "(unmet: no package or source in the lock provides nvidia-fake-cu12)",
        )
    ]
    with pytest.raises(EngineError) as info:
        build(lock, work, "gap", engine)
    message = str(info.value)
    assert "the built image does not hold what the lock pins (not tagged)" in message
    assert "source needy (needy 1.0) requires tinythree>=1, which is not installed" in message
    assert (
        "source needy: import npu_only failed: ModuleNotFoundError: No module named 'libascend_hal_stand_in'" in message
    )
    assert "import needy failed" not in message  # its requirement tinyone is locked: it imports
    assert "nvidia-fake-cu12" not in message  # cudaish waives it, by name: pip check's finding is forgiven
    assert engine.inspect(f"envbuild/{LOCK_NAME}:gap") is None


def test_waived_by_name_and_the_import_skipped_by_name_it_builds_and_is_tagged(
    lock: Lock, engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("whole")
    needy = dataclasses.replace(
        lock.sources[0],
        waive=(Waiver("tinythree", "provided at run time by the job's own environment"),),
        skip_imports=(SkippedImport("npu_only", "needs the NPU driver (libascend_hal.so); build hosts have none"),),
    )
    result = build(dataclasses.replace(lock, sources=(needy,)), work, "waived", engine)
    assert engine.inspect(f"envbuild/{LOCK_NAME}:waived")["Id"] == result.image_id  # type: ignore[index]
    out = engine.run(result.image_id, ["python3", "-c", "import needy; print('imported')"])
    assert (out.exit_code, out.stdout.strip()) == (0, "imported")
