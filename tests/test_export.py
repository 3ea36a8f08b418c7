"""Export formats: each parses back with its own tool's reader and carries exactly the lock's pins."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.pylock import Pylock
from packaging.requirements import Requirement

from envbuild.lock import Lock, Package, PackageFile, Platform, Source, parse_lock
from envbuild.lock.export import (
    export_lock,
    export_pylock,
    export_repos,
    export_requirements,
)
from tests.lib.pyindex import PyIndex, make_sdist, make_wheel

OWN_INDEX = "https://mirrors.example.org/ascend/pypi"


def sample_lock(index: PyIndex | None = None, shas: dict[str, str] | None = None) -> Lock:
    sha = (shas or {}).get
    return Lock(
        version=1,
        name="sample",
        index=index.url if index else None,
        platform=Platform(os="linux", arch="aarch64", python="3.12"),
        sources=(
            Source(name="zeta", repo="https://example.org/zeta.git", ref="v1", ref_type="tag", commit="b" * 40),
            Source(name="alpha-src", repo="https://example.org/a.git", ref="main", ref_type="branch", commit="a" * 40),
        ),
        packages=(
            Package(
                name="Beta_Pkg",
                version="2.0",
                files=(
                    PackageFile("beta_pkg-2.0-cp312-cp312-manylinux_2_28_aarch64.whl", sha("x", "1" * 64)),
                    PackageFile("beta_pkg-2.0-py3-none-any.whl", sha("beta_pkg-2.0-py3-none-any.whl", "2" * 64)),
                ),
            ),
            Package(
                name="alpha", version="1.0", files=(PackageFile("alpha-1.0.tar.gz", sha("alpha-1.0.tar.gz", "3" * 64)),)
            ),
            Package(name="triton-ascend", version="3.2.2", index=OWN_INDEX),
        ),
    )


def parse_requirements(text: str) -> dict[str, tuple[str, set[str]]]:
    """A reader independent of the writer: join continuations, then PEP 508 + --hash options."""
    out: dict[str, tuple[str, set[str]]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        if not line.strip() or line.startswith(("#", "--")):
            continue
        spec, *options = line.split()
        req = Requirement(spec)
        assert all(o.startswith("--hash=sha256:") for o in options)
        out[req.name] = (str(req.specifier), {o.removeprefix("--hash=sha256:") for o in options})
    return out


def test_requirements_parse_back() -> None:
    text = export_requirements(sample_lock())
    assert parse_requirements(text) == {"alpha": ("==1.0", {"3" * 64}), "Beta_Pkg": ("==2.0", {"1" * 64, "2" * 64})}
    assert "--index-url https://pypi.org/simple\n" in text and f"--extra-index-url {OWN_INDEX}\n" in text
    assert "# NOT INSTALLABLE FROM THIS FILE: triton-ascend==3.2.2" in text
    assert text == export_requirements(sample_lock())
    lock = sample_lock()
    if lock.sources:  # the sources are left out, and the file says so
        names = ", ".join(s.name for s in lock.sources)
        assert f"# NOT IN THIS FILE: the lock's {len(lock.sources)} git sources ({names})" in text
    else:
        assert "NOT IN THIS FILE" not in text


def test_pip_installs_from_requirements_with_hashes(tmp_path: Path) -> None:
    """pip itself accepts the file with --require-hashes, and refuses it once a hash is wrong."""
    dists = tmp_path / "dists"
    dists.mkdir()
    make_wheel(dists, "beta_pkg", "2.0")
    make_sdist(dists, "alpha", "1.0")
    with PyIndex(dists) as index:
        shas = {p.name: index.sha256(p.name) for p in dists.iterdir()}
        lock = sample_lock(index, shas)
        lock = dataclasses.replace(lock, packages=lock.packages[:1])  # the wheel-only package: no build needed
        req = tmp_path / "requirements.txt"
        req.write_text(export_requirements(lock))
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--platform",
            "manylinux_2_28_aarch64",
            "--python-version",
            "3.12",
            "--target",
            str(tmp_path / "t"),
            "--no-cache-dir",
            "--disable-pip-version-check",
            "-r",
            str(req),
        ]
        ok = subprocess.run(cmd, capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        assert "beta_pkg-2.0" in ok.stdout or "beta-pkg-2.0" in ok.stdout.lower()
        req.write_text(export_requirements(lock).replace(shas["beta_pkg-2.0-py3-none-any.whl"], "9" * 64))
        bad = subprocess.run(cmd, capture_output=True, text=True)
        assert bad.returncode != 0 and "HASHES" in bad.stderr.upper()


def test_pylock_has_pep751_shape() -> None:
    text = export_pylock(sample_lock(), urls={"alpha-1.0.tar.gz": "https://files.example.org/alpha-1.0.tar.gz"})
    data = tomllib.loads(text)
    Pylock.from_dict(data)  # packaging's own PEP 751 validator
    assert data["lock-version"] == "1.0" and data["created-by"] == "envbuild"
    assert data["requires-python"] == "==3.12.*"
    assert [p["name"] for p in data["packages"]] == ["alpha", "beta-pkg"]
    alpha, beta = data["packages"]
    assert alpha["sdist"] == {
        "name": "alpha-1.0.tar.gz",
        "url": "https://files.example.org/alpha-1.0.tar.gz",
        "hashes": {"sha256": "3" * 64},
    }
    assert alpha["index"] == "https://pypi.org/simple" and "wheels" not in alpha
    assert [w["path"] for w in beta["wheels"]] == [
        "files/beta_pkg-2.0-cp312-cp312-manylinux_2_28_aarch64.whl",
        "files/beta_pkg-2.0-py3-none-any.whl",
    ]
    assert data["tool"]["envbuild"]["unresolved"] == ["triton-ascend==3.2.2"]
    assert text == export_pylock(sample_lock(), urls={"alpha-1.0.tar.gz": "https://files.example.org/alpha-1.0.tar.gz"})


def test_pylock_escapes_strings() -> None:
    lock = parse_lock(
        'version: 1\nname: q\nsources: []\nindex: "https://example.org/a%22b"\n'
        'packages: [{name: a, version: "1", files: [{filename: a-1-py3-none-any.whl, sha256: "' + "0" * 64 + '"}]}]\n'
    )
    assert (
        tomllib.loads(export_pylock(lock, urls={"a-1-py3-none-any.whl": 'https://x/"q"\\\u00e9'}))["packages"][0][
            "wheels"
        ][0]["url"]
        == 'https://x/"q"\\\u00e9'
    )


def test_repos_parses_as_vcstool_file() -> None:
    data = yaml.safe_load(export_repos(sample_lock()))
    assert data == {
        "repositories": {
            "alpha-src": {"type": "git", "url": "https://example.org/a.git", "version": "a" * 40},
            "zeta": {"type": "git", "url": "https://example.org/zeta.git", "version": "b" * 40},
        }
    }


def test_real_lock_exports(tmp_path: Path) -> None:
    from envbuild.lock import read_lock

    lock = read_lock(Path(__file__).parent.parent / "lockfiles" / "glm5_2-ascend.lock.yaml").lock
    for fmt in ("requirements", "pylock", "repos"):
        assert export_lock(lock, fmt)
    Pylock.from_dict(tomllib.loads(export_pylock(lock)))
    assert len(yaml.safe_load(export_repos(lock))["repositories"]) == len(lock.sources)
    with pytest.raises(ValueError, match="unknown export format"):
        export_lock(lock, "conda")
