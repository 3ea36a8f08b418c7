"""`envbuild lock update` then `envbuild lock verify`, as a user runs them: a source's declared requirements are
read from its pinned tree (real git daemon), resolved into the lock with uv (real local index), and the lock
verifies whole; a waived requirement is recorded, never resolved, and reported as waived."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import Lock, Source, read_lock, write_lock
from envbuild.lock.model import Install, Platform, Waiver
from tests.lib.gitrepos import Served
from tests.lib.pyindex import PyIndex, make_wheel

pytestmark = pytest.mark.gitdaemon

PYPROJECT = """\
[build-system]
requires = ["setuptools>=40"]
build-backend = "setuptools.build_meta"

[project]
name = "svc"
version = "0.3"
dependencies = ["app>=1", "cuda-kernels==9.9"]
"""


def test_update_resolves_what_the_source_declares_and_verify_checks_it_whole(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    repo = served.repo("update-svc")
    commit = repo.commit(files={"pyproject.toml": PYPROJECT, "svc/__init__.py": ""})
    dists = tmp_path / "dists"
    dists.mkdir()
    make_wheel(dists, "app", "1.2", requires=["pure"])
    make_wheel(dists, "pure", "0.5")
    make_wheel(dists, "setuptools", "80.0")
    with PyIndex(dists) as index:
        source = Source(
            name="svc",
            repo=served.url("update-svc", "daemon-filter"),
            ref="main",
            ref_type="branch",
            commit=commit,
            install=Install(),
            waive=(Waiver("cuda-kernels", "CUDA-only; not on this platform"),),
        )
        path = tmp_path / "svc.lock.yaml"
        write_lock(
            path,
            Lock(
                version=1,
                name="svc",
                sources=(source,),
                platform=Platform(os="linux", arch="aarch64", python="3.12"),
                index=index.url,
            ),
        )
        cache = ["--cache-dir", str(tmp_path / "cache"), "-q"]
        assert main(["lock", "update", str(path), *cache]) == 0
        capsys.readouterr()
        lock = read_lock(path).lock
        assert main(["lock", "verify", str(path), "--json", *cache]) == 0
        report = json.loads(capsys.readouterr().out)

    [svc] = lock.sources
    assert (svc.build_requires, svc.requires) == (("setuptools>=40",), ("app>=1", "cuda-kernels==9.9"))
    assert [(p.name, p.version) for p in lock.packages] == [("app", "1.2"), ("pure", "0.5"), ("setuptools", "80.0")]
    requirements = {(r["name"], r["requirement"]): r["status"] for r in report["results"] if r["kind"] == "requirement"}
    assert requirements == {
        ("svc", "setuptools>=40"): "ok",
        ("svc", "app>=1"): "ok",
        ("svc", "cuda-kernels==9.9"): "waived",
        ("app", "pure"): "ok",
    }
