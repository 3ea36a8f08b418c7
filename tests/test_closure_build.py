"""What a build needs is checked before the engine starts: a source whose recorded build requirements the lock
does not meet is refused, naming each, and no engine is ever contacted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.config import SourceOptions
from envbuild.image.build import ImageOptions, build_image
from envbuild.lock import Lock, Package, Source, write_lock
from envbuild.lock.io import read_lock
from envbuild.lock.model import BaseImage, Install, Platform, Waiver
from envbuild.verify.buildcheck import UnmetBuildRequirements, build_requirement_problems
from envbuild.verify.pins import VerifyOptions
from envbuild.verify.results import PinResult, VerifyReport
from tests.lib.gitrepos import make_repo

ARM = Platform(os="linux", arch="aarch64", python="3.12")
DIGEST = "sha256:" + "ab" * 32


def src(name: str, **fields: object) -> Source:
    return Source(
        name=name, repo=f"https://example.org/{name}.git", ref="main", ref_type="branch", commit="1" * 40, **fields
    )  # type: ignore[arg-type]


def test_each_unmet_or_conflicting_build_requirement_is_named() -> None:
    lock = Lock(
        version=1,
        name="b",
        platform=ARM,
        sources=(
            src("bridge", build_requires=("setuptools<80.0.0", "wheel", "pybind11", "torch")),
            src("core", build_requires=("setuptools>=80", "cmake>=3.26; platform_machine == 'x86_64'")),
            src(
                "waived", build_requires=("setuptools<80",), waive=(Waiver("setuptools", "one setuptools builds all"),)
            ),
            src("unread"),  # not recorded: cannot be checked, not refused (verify says unknown)
            src("files", install=Install(mode="none"), build_requires=("nothing-at-all",)),
            src("torch-src", build_requires=()),
        ),
        packages=(Package(name="setuptools", version="84.2.1"), Package(name="pybind11", version="3.0.1")),
    )
    assert build_requirement_problems(lock) == [
        "source bridge builds with setuptools<80.0.0: setuptools 84.2.1 is locked, outside <80.0.0 (conflict)",
        "source bridge builds with wheel: no package or source in the lock provides wheel (unmet)",
        "source bridge builds with torch: no package or source in the lock provides torch (unmet)",
    ]
    provided = dataclasses.replace(
        lock, sources=(*lock.sources[:-1], dataclasses.replace(lock.sources[-1], provides=None))
    )
    assert build_requirement_problems(provided) == build_requirement_problems(lock)


def unbuildable_lock(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "upstream")
    commit = repo.commit(files={"pyproject.toml": '[build-system]\nrequires = ["setuptools>=99"]\n'})
    lock = Lock(
        version=1,
        name="b",
        platform=ARM,
        base_image=BaseImage(name="example.org/base:1", digest=DIGEST),
        source_date_epoch=1700000000,
        sources=(
            Source(
                name="svc",
                repo=repo.path.as_uri(),
                ref="main",
                ref_type="branch",
                commit=commit,
                build_requires=("setuptools>=99",),
                requires=(),
            ),
        ),
    )
    path = tmp_path / "b.lock.yaml"
    write_lock(path, lock)
    return path


def test_the_build_is_refused_before_the_engine_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # any contact would fail otherwise
    path = unbuildable_lock(tmp_path)
    options = ImageOptions(verify=VerifyOptions(SourceOptions(cache_dir=tmp_path / "cache")))
    # Even when verify is settled elsewhere (`envbuild check` hands its report in), the build checks this.
    passing = VerifyReport(str(path), (PinResult("source", "svc", "ok"),))
    with pytest.raises(UnmetBuildRequirements) as info:
        build_image(read_lock(path), options, verified=passing)
    assert "source svc builds with setuptools>=99: no package or source in the lock provides" in str(info.value)
    assert not (tmp_path / "cache" / "git-export").exists()  # nothing fetched for a build


def test_envbuild_image_refuses_it_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    path = unbuildable_lock(tmp_path)
    code = main(["image", str(path), "--cache-dir", str(tmp_path / "cache"), "-q"])
    err = capsys.readouterr().err
    assert code == 1
    assert "setuptools>=99" in err and "refusing to build" in err
    assert "engine" not in err.lower() and "Traceback" not in err


def test_a_dry_run_warns_of_each_unmet_build_requirement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = unbuildable_lock(tmp_path)
    code = main(["image", str(path), "--dry-run", "--offline", "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 1  # a dry run renders; it says what a build would refuse, and its status says so too
    assert (
        "warning: source svc builds with setuptools>=99: no package or source in the lock provides setuptools "
        "(unmet): a build refuses it"
    ) in err
