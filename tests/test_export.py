"""Export formats: each parses back with its own tool's reader and carries exactly the lock's pins."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.pylock import Pylock
from packaging.requirements import Requirement

from envbuild.cli import main
from envbuild.fetch import package_file_locations
from envbuild.index.filecache import FileCache
from envbuild.lock import Lock, Package, PackageFile, Platform, Source, parse_lock, write_lock
from envbuild.lock.export import (
    FileLocation,
    export_lock,
    export_pylock,
    export_repos,
    export_requirements,
)
from envbuild.lock.model import Install, Provides
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
    files = {"alpha-1.0.tar.gz": FileLocation("https://files.example.org/alpha-1.0.tar.gz", 1234)}
    text = export_pylock(sample_lock(), files=files)
    data = tomllib.loads(text)
    Pylock.from_dict(data)  # packaging's own PEP 751 validator
    assert data["lock-version"] == "1.0" and data["created-by"] == "envbuild"
    assert data["environments"] == ['sys_platform == "linux" and platform_machine == "aarch64"']
    assert data["requires-python"] == "==3.12.*"
    assert [p["name"] for p in data["packages"]] == ["alpha", "alpha-src", "beta-pkg", "zeta"]
    alpha, alpha_src, beta, zeta = data["packages"]
    assert alpha["sdist"] == {
        "name": "alpha-1.0.tar.gz",
        "url": "https://files.example.org/alpha-1.0.tar.gz",
        "size": 1234,
        "hashes": {"sha256": "3" * 64},
    }
    assert alpha["index"] == "https://pypi.org/simple" and "wheels" not in alpha
    assert [w["path"] for w in beta["wheels"]] == [
        "files/beta_pkg-2.0-cp312-cp312-manylinux_2_28_aarch64.whl",
        "files/beta_pkg-2.0-py3-none-any.whl",
    ]
    assert not any("size" in w for w in beta["wheels"])  # unknown: left out, as PEP 751 allows
    assert zeta == {
        "name": "zeta",
        "vcs": {
            "type": "git",
            "url": "https://example.org/zeta.git",
            "requested-revision": "v1",
            "commit-id": "b" * 40,
        },
    }
    assert alpha_src["vcs"]["commit-id"] == "a" * 40 and "version" not in alpha_src
    assert data["tool"]["envbuild"] == {"unresolved": ["triton-ascend==3.2.2"]}
    assert text == export_pylock(sample_lock(), files=files)


def test_pylock_sources_by_distribution_and_left_out_when_not_installed() -> None:
    lock = sample_lock()
    zeta, alpha_src = lock.sources
    lock = dataclasses.replace(
        lock,
        sources=(
            dataclasses.replace(zeta, provides=Provides("Zeta_Core", "0.3"), install=Install(env={"B": "2", "A": "1"})),
            dataclasses.replace(alpha_src, install=Install(mode="none")),
        ),
    )
    data = tomllib.loads(export_pylock(lock))
    Pylock.from_dict(data)
    assert [p["name"] for p in data["packages"]] == ["alpha", "beta-pkg", "zeta-core"]
    assert data["packages"][2]["version"] == "0.3"  # a static version of the pinned tree: it cannot differ
    assert data["packages"][2]["tool"] == {"envbuild": {"build-env": {"A": "1", "B": "2"}}}
    assert list(data["tool"]["envbuild"]["sources-left-out"]) == ["alpha-src"]
    assert "install: none" in data["tool"]["envbuild"]["sources-left-out"]["alpha-src"]


def test_pylock_names_a_package_a_source_replaces_instead_of_listing_it_twice() -> None:
    """PEP 751: one entry per name applies; two `beta-pkg` entries without markers made uv refuse the file
    ("Multiple active package entries"). The source installs after the packages, as in the image."""
    lock = sample_lock()
    zeta, alpha_src = lock.sources
    lock = dataclasses.replace(lock, sources=(dataclasses.replace(zeta, provides=Provides("beta.pkg")), alpha_src))
    data = tomllib.loads(export_pylock(lock))
    Pylock.from_dict(data)
    names = [p["name"] for p in data["packages"]]
    assert names == ["alpha", "alpha-src", "beta-pkg"] and "vcs" in data["packages"][2]
    assert data["tool"]["envbuild"]["packages-replaced"] == {"Beta_Pkg==2.0": "source zeta replaces it"}


def test_pylock_spells_an_scp_like_repository_as_a_url_and_escapes_del() -> None:
    """PEP 751's vcs.url is a URL: `git@host:path`, which a lock takes, made uv refuse the whole file
    ("relative URL without a base"). TOML forbids DEL unescaped, which JSON's escaping leaves."""
    lock = sample_lock()
    zeta, alpha_src = lock.sources
    scp = dataclasses.replace(zeta, repo="git@github.com:benjaminp/six.git", install=Install(env={"A_B": "x\x7fy"}))
    data = tomllib.loads(export_pylock(dataclasses.replace(lock, sources=(scp, alpha_src))))
    Pylock.from_dict(data)
    (entry,) = [p for p in data["packages"] if p["name"] == "zeta"]
    assert entry["vcs"]["url"] == "ssh://git@github.com/benjaminp/six.git"
    assert entry["tool"]["envbuild"]["build-env"] == {"A_B": "x\x7fy"}


def test_pylock_sizes_offline_from_the_file_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Offline, a file in envbuild's cache gives its size (its bytes are the ones the lock's sha256 pins);
    a file not there has none, and every file is a path under files/."""
    cached = b"a wheel's bytes"
    lock = sample_lock(shas={"beta_pkg-2.0-py3-none-any.whl": hashlib.sha256(cached).hexdigest()})
    path = FileCache(tmp_path / "cache").path_for(hashlib.sha256(cached).hexdigest())
    path.parent.mkdir(parents=True)
    path.write_bytes(cached)
    write_lock(tmp_path / "l.lock.yaml", lock)
    argv = ["lock", "export", str(tmp_path / "l.lock.yaml"), "--format", "pylock", "--offline"]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 0
    data = tomllib.loads(capsys.readouterr().out)
    Pylock.from_dict(data)
    files = {
        f["name"]: f for p in data["packages"] for f in [*p.get("wheels", ()), *([p["sdist"]] if "sdist" in p else [])]
    }
    assert files["beta_pkg-2.0-py3-none-any.whl"]["size"] == len(cached)
    assert {name for name, f in files.items() if "size" in f} == {"beta_pkg-2.0-py3-none-any.whl"}
    assert all(f["path"] == f"files/{name}" and "url" not in f for name, f in files.items())


def test_pylock_sizes_from_the_cache_over_the_index(tmp_path: Path) -> None:
    """Online, a file's size is its cached copy's, else the one the index states (PEP 700) for the lock's
    sha256; none for a file the index lists under another sha256, whose stated size is of other bytes."""
    dists = tmp_path / "dists"
    dists.mkdir()
    names = [make_wheel(dists, name, "1.0").name for name in ("cached", "stated", "rehashed")]
    with PyIndex(dists) as index:
        for name in names:
            index.state_size(name, 999)
        index.rehash(names[2], "f" * 64)
        packages = tuple(Package(n.split("-")[0], "1.0", files=(PackageFile(n, index.sha256(n)),)) for n in names)
        cache = FileCache(tmp_path / "cache")
        cache.path_for(index.sha256(names[0])).parent.mkdir(parents=True)
        cache.path_for(index.sha256(names[0])).write_bytes((dists / names[0]).read_bytes())
        lock = Lock(version=2, name="sizes", index=index.url, sources=(), packages=packages)
        found = package_file_locations(lock, cache_dir=tmp_path / "cache")
    assert {name: at.size for name, at in found.items()} == {
        names[0]: (dists / names[0]).stat().st_size,
        names[1]: 999,
        names[2]: None,
    }
    assert all(at.url == f"{index.url.removesuffix('/simple')}/files/{name}" for name, at in found.items())


def test_an_online_pylock_export_fails_where_the_index_cannot_say_where_a_file_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once it wrote `path = "files/…"` for every file and exited 0, which fails only where it is installed.
    An index out of reach, or one that no longer lists a pinned file, is exit 1, nothing written."""
    dists = tmp_path / "dists"
    dists.mkdir()
    wheel = make_wheel(dists, "kept", "1.0").name
    with PyIndex(dists) as index:
        gone = Package(
            "kept", "1.0", files=(PackageFile(wheel, index.sha256(wheel)), PackageFile("kept-1.0.tar.gz", "3" * 64))
        )
        write_lock(
            tmp_path / "gone.lock.yaml", Lock(version=2, name="gone", index=index.url, sources=(), packages=(gone,))
        )
        argv = [
            "lock",
            "export",
            str(tmp_path / "gone.lock.yaml"),
            "--format",
            "pylock",
            "-o",
            str(tmp_path / "p.toml"),
        ]
        assert main([*argv, "--cache-dir", str(tmp_path / "c")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(
            f"envbuild: error: {index.url} no longer lists kept-1.0.tar.gz of kept 1.0, which the lock"
        )
        assert err.count("\n") == 1 and not (tmp_path / "p.toml").exists()
    # The index gone: the same, naming it.
    assert main([*argv, "--cache-dir", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert index.url.split("/simple")[0] in err and "(`--offline` refers to every file as files/<name>)" in err
    assert main([*argv, "--offline", "--cache-dir", str(tmp_path / "c")]) == 0  # the way it says
    assert tomllib.loads((tmp_path / "p.toml").read_text())["packages"][0]["wheels"][0]["path"] == f"files/{wheel}"


def test_pylock_escapes_strings() -> None:
    lock = parse_lock(
        'version: 1\nname: q\nsources: []\nindex: "https://example.org/a%22b"\n'
        'packages: [{name: a, version: "1", files: [{filename: a-1-py3-none-any.whl, sha256: "' + "0" * 64 + '"}]}]\n'
    )
    url = 'https://x/"q"\\\u00e9'
    data = tomllib.loads(export_pylock(lock, files={"a-1-py3-none-any.whl": FileLocation(url)}))
    assert data["packages"][0]["wheels"][0]["url"] == url


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


def test_output_into_a_directory_that_does_not_exist_names_the_file_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-o nodir/out.repos` said 'error: /…/nodir/.out.repos._60t1xz7.tmp: No such file or directory', a name the
    user never gave; now the file asked for, and nothing is left behind."""
    lock = tmp_path / "l.lock.yaml"
    lock.write_text("version: 2\nname: x\nsources: []\n")
    output = tmp_path / "nodir" / "out.repos"
    assert main(["lock", "export", str(lock), "--format", "repos", "-o", str(output)]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"envbuild: error: {output}: No such file or directory\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.lock.yaml"]
