"""The whole-closure check: every requirement of the lock's roots, sources and packages met by the lock or
waived by name, from core metadata read off a real local index (range requests, PEP 658, the caches)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.errors import RemoteError
from envbuild.index.client import IndexClient
from envbuild.index.filecache import FileCache
from envbuild.lock import Lock, Package, PackageFile, Source, write_lock
from envbuild.lock.model import Install, Platform, Provides, Waiver
from envbuild.verify.closure import PackageMetadata, check_closure
from envbuild.verify.metadata import MetadataError, MetadataReader, _requires, read_metadata
from envbuild.verify.render import render_verify
from envbuild.verify.results import VerifyReport
from tests.lib.gitrepos import make_repo
from tests.lib.pyindex import PyIndex, make_sdist, make_wheel, wheel_metadata, write_file_index

ARM = Platform(os="linux", arch="aarch64", python="3.12")


@pytest.fixture()
def dists(tmp_path: Path) -> Path:
    root = tmp_path / "dists"
    root.mkdir()
    make_wheel(
        root,
        "app",
        "1.0",
        requires=[
            "dep>=2",
            "missing-dep",
            "winonly; sys_platform == 'win32'",
            "plugin[fast]",
            "old; python_version < '3.9'",
        ],
    )
    make_wheel(root, "dep", "1.5")
    make_wheel(root, "plugin", "1.0", requires=["speedup; extra == 'fast'", "slowpath; extra == 'slow'"])
    make_wheel(root, "speedup", "1.0rc1")
    return root


def locked(index: PyIndex, name: str, version: str, *, files: tuple[str, ...] = (), pin: bool = True) -> Package:
    """The package as `lock update` pins it: each file by sha256 and, with ``pin``, a wheel's METADATA too."""
    names = files or (f"{name}-{version}-py3-none-any.whl",)
    return Package(name=name, version=version, files=tuple(pinned_file(index, f, pin) for f in names))


def pinned_file(index: PyIndex, filename: str, pin: bool = True) -> PackageFile:
    digest = None
    if pin and filename.endswith(".whl"):
        digest = hashlib.sha256(wheel_metadata(index.root / filename)).hexdigest()
    return PackageFile(filename, index.sha256(filename), metadata_sha256=digest)


def closure_lock(index: PyIndex, *sources: Source) -> Lock:
    return Lock(
        version=2,
        name="whole",
        platform=ARM,
        index=index.url,
        sources=sources,
        requirements=("app==1.0",),
        packages=tuple(
            locked(index, n, v) for n, v in (("app", "1.0"), ("dep", "1.5"), ("plugin", "1.0"), ("speedup", "1.0rc1"))
        ),
    )


def in_file_cache(cache_dir: Path, wheel: Path, sha256: str) -> None:
    """``wheel`` put in the file cache of ``cache_dir`` as a download puts it (checked by ``sha256``)."""
    FileCache(cache_dir).fetch(wheel.as_uri(), sha256, wheel.name, lambda url, out: out.write(wheel.read_bytes()))


def src(name: str, **fields: object) -> Source:
    return Source(
        name=name, repo=f"https://example.org/{name}.git", ref="main", ref_type="branch", commit="1" * 40, **fields
    )  # type: ignore[arg-type]


def statuses(results: list) -> list[tuple[str, str | None, bool, str]]:
    return [(r.name, r.facts["requirement"], r.facts["build"], r.status) for r in results]


def test_every_requirement_is_judged_for_the_locks_platform(dists: Path, tmp_path: Path) -> None:
    with PyIndex(dists) as index:
        lock = closure_lock(index)
        reader = MetadataReader(tmp_path / "cache", IndexClient())
        results = check_closure(lock, read_metadata(lock, reader))
    assert statuses(results) == [
        ("whole", "app==1.0", False, "ok"),
        ("app", "dep>=2", False, "conflict"),
        ("app", "missing-dep", False, "unmet"),
        ("app", "plugin[fast]", False, "ok"),
        ("plugin", 'speedup; extra == "fast"', False, "ok"),  # the extra app asks for; not "slow"
    ]
    conflict, unmet = results[1], results[2]
    assert conflict.detail == "requires dep>=2: dep 1.5 is locked, outside >=2"
    assert unmet.detail == "requires missing-dep: no package or source in the lock provides missing-dep"
    assert results[4].detail.endswith(": speedup 1.0rc1 is locked")  # pre-releases count, as pip check does
    assert not VerifyReport("l", tuple(results)).ok


def test_metadata_is_read_by_range_requests_and_cached_by_its_pinned_sha256(dists: Path, tmp_path: Path) -> None:
    with PyIndex(dists) as index:
        lock = closure_lock(index)
        first = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient()))
        file_requests = [r for r in index.requests if r.startswith("/files/")]
        ranged = len(index.ranges)
        index.requests.clear()
        warm = MetadataReader(tmp_path / "cache", IndexClient())
        second = read_metadata(lock, warm)
    assert first == second and first["app"].requires is not None
    assert ranged == len(file_requests) > 0  # no file was downloaded whole
    assert index.requests == [] and warm.network_reads == 0  # warm: not one request
    assert sorted(p.name for p in (tmp_path / "cache/metadata/sha256").iterdir()) == sorted(
        f.metadata_sha256 for p in lock.packages for f in p.files if f.metadata_sha256
    )


def test_pep_658_metadata_is_used_where_the_index_serves_it_and_checked(dists: Path, tmp_path: Path) -> None:
    with PyIndex(dists, metadata=True) as index:
        lock = closure_lock(index)
        found = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient()))
        assert found["app"].requires is not None
        assert index.ranges == [] and "/files/app-1.0-py3-none-any.whl.metadata" in index.requests
        # The metadata file no longer matches the sha256 the page announces for it: not believed.
        index.answer(
            "dep",
            json.dumps(
                {
                    "meta": {"api-version": "1.1"},
                    "name": "dep",
                    "files": [
                        {
                            "filename": "dep-1.5-py3-none-any.whl",
                            "url": "/files/dep-1.5-py3-none-any.whl",
                            "hashes": {"sha256": index.sha256("dep-1.5-py3-none-any.whl")},
                            "core-metadata": {"sha256": "0" * 64},
                        }
                    ],
                }
            ).encode(),
        )
        bad = read_metadata(lock, MetadataReader(tmp_path / "other", IndexClient()))
    assert bad["dep"].requires is None and "does not match" in bad["dep"].detail


def test_each_wheel_s_metadata_is_parsed_once_whichever_cache_answers(
    dists: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild reads the closure from the caches: one parse of each METADATA, from the pinned-metadata
    cache and from a wheel in the file cache alike (a second parse, for the name alone, was half the
    closure check at 226 packages); the name and version are still checked on that one parse."""
    import envbuild.verify.metadata as module

    parses: list[bytes] = []
    real = module._parse
    monkeypatch.setattr(module, "_parse", lambda data: parses.append(data) or real(data))
    with PyIndex(dists) as index:
        lock = closure_lock(index)
        unpinned = dataclasses.replace(
            lock, packages=tuple(locked(index, p.name, p.version, pin=False) for p in lock.packages)
        )
        for name, case in (("pinned", lock), ("unpinned", unpinned)):
            cache = tmp_path / name
            for package in case.packages:
                in_file_cache(cache, dists / package.files[0].filename, package.files[0].sha256)
            read_metadata(case, MetadataReader(cache, IndexClient()))  # fills the metadata caches
            parses.clear()
            again = read_metadata(case, MetadataReader(cache, IndexClient(), offline=True))
            assert len(parses) == len(case.packages), case.packages[0].files[0]
            assert all(m.requires is not None for m in again.values())
    (dists / "dep-1.5-py3-none-any.whl").unlink()
    make_wheel(dists, "dep", "2.0")
    shutil.move(dists / "dep-2.0-py3-none-any.whl", dists / "dep-1.5-py3-none-any.whl")  # a 2.0 under 1.5's name
    with PyIndex(dists) as index:
        wheel = dists / "dep-1.5-py3-none-any.whl"
        cache = tmp_path / "named-wrong"
        in_file_cache(cache, wheel, index.sha256(wheel.name))
        for pin in (True, False):  # checked before the pinned cache keeps it, and on the one parse without a pin
            lock = closure_lock(index)
            lock = dataclasses.replace(
                lock, packages=tuple(locked(index, p.name, p.version, pin=pin) for p in lock.packages)
            )
            found = read_metadata(lock, MetadataReader(cache, IndexClient(), offline=True))
            assert found["dep"].requires is None and "its metadata is for dep 2.0, not dep 1.5" in found["dep"].detail
            assert not (cache / "metadata" / "sha256").exists() or not any((cache / "metadata" / "sha256").iterdir())


def test_offline_reads_the_caches_only(dists: Path, tmp_path: Path) -> None:
    with PyIndex(dists) as index:
        lock = closure_lock(index)
        wheel = dists / "dep-1.5-py3-none-any.whl"
        in_file_cache(tmp_path / "cache", wheel, index.sha256(wheel.name))
        offline = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient(), offline=True))
        assert index.requests == []
    assert offline["dep"].requires == ()  # from the file cache
    assert offline["app"].requires is None
    assert offline["app"].detail.endswith("offline, and neither its metadata nor the file is in the cache")
    [unknown] = [r for r in check_closure(lock, offline) if r.name == "app"]
    assert (unknown.status, unknown.facts["requirement"]) == ("unknown", None)
    assert VerifyReport("l", (unknown,)).ok and not VerifyReport("l", (unknown,), strict=True).ok


def test_metadata_that_names_another_release_is_not_believed(dists: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    shutil.move(make_wheel(other, "dep", "2.0"), dists / "dep-1.5-py3-none-any.whl")  # a 2.0 under 1.5's name
    with PyIndex(dists) as index:
        found = read_metadata(closure_lock(index), MetadataReader(tmp_path / "cache", IndexClient()))
    assert found["dep"].requires is None and "its metadata is for dep 2.0, not dep 1.5" in found["dep"].detail


def test_an_index_without_ranges_is_read_whole_only_when_small(dists: Path, tmp_path: Path) -> None:
    with PyIndex(dists, ranges=False) as index:
        lock = closure_lock(index)
        small = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient()))
        client = IndexClient()
        with pytest.raises(Exception, match="does not serve byte ranges"):
            client.open_ranges(f"{index.url.rsplit('/simple', 1)[0]}/files/app-1.0-py3-none-any.whl", max_bytes=100)
    assert small["app"].requires is not None


def test_sdist_requirements_where_its_metadata_settles_them(tmp_path: Path) -> None:
    root = tmp_path / "dists"
    root.mkdir()
    make_sdist(root, "modern", "1.0", metadata_version="2.2", requires=["six>=1"])
    make_sdist(root, "eggy", "1.0", egg_info_requires="six\n\n[fast]\nspeedup\n\n[:sys_platform == 'win32']\nwinonly\n")
    make_sdist(root, "legacy", "1.0", requires=["six"])
    with PyIndex(root) as index:
        lock = Lock(
            version=1,
            name="s",
            platform=ARM,
            index=index.url,
            sources=(),
            packages=tuple(locked(index, n, "1.0", files=(f"{n}-1.0.tar.gz",)) for n in ("modern", "eggy", "legacy")),
        )
        found = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient()))
    assert found["modern"].requires == ("six>=1",)
    assert found["eggy"].requires == ("six", 'speedup; extra == "fast"', 'winonly; sys_platform == "win32"')
    assert found["legacy"].requires is None and "decided when it is built" in found["legacy"].detail


def test_sources_waivers_extras_and_what_is_not_recorded() -> None:
    lock = Lock(
        version=1,
        name="whole",
        platform=ARM,
        sources=(
            src(
                "svc",
                build_requires=("setuptools>=99",),
                requires=("lib-dist[extra1]", "lib-dist>=1", "flashinfer-python==0.6.8.post1", "app"),
                waive=(Waiver("flashinfer-python", "CUDA-only; not used on Ascend"),),
            ),
            src("lib", provides=Provides(name="lib-dist"), requires=('app>=2; extra == "extra1"',), build_requires=()),
            src("other"),
            src("data", install=Install(mode="none")),
        ),
        packages=(Package(name="app", version="1.0"),),
    )
    metadata = {"app": PackageMetadata("app", ())}
    results = check_closure(lock, metadata)
    assert statuses(results) == [
        ("svc", "setuptools>=99", True, "unmet"),
        ("svc", "lib-dist[extra1]", False, "ok"),
        ("svc", "lib-dist>=1", False, "unknown"),
        ("svc", "flashinfer-python==0.6.8.post1", False, "waived"),
        ("svc", "app", False, "ok"),
        ("lib", 'app>=2; extra == "extra1"', False, "conflict"),  # the extra svc asks of lib
        ("other", None, True, "unknown"),
        ("other", None, False, "unknown"),
    ]
    assert results[0].detail == "builds with setuptools>=99: no package or source in the lock provides setuptools"
    assert results[1].detail == "requires lib-dist[extra1]: source lib provides lib-dist"
    assert "version is not declared statically" in results[2].detail
    assert results[3].detail == (
        "requires flashinfer-python==0.6.8.post1: waived: CUDA-only; not used on Ascend "
        "(unmet: no package or source in the lock provides flashinfer-python)"
    )


def test_a_package_waives_its_own_requirements_by_name_and_no_one_elses() -> None:
    """torch from PyPI for x86_64 requires CUDA libraries; a lock that installs it for the CPU waives them
    on torch, by name, with the reason. The waiver is torch's: another package's same requirement fails."""
    lock = Lock(
        version=1,
        name="whole",
        platform=ARM,
        sources=(),
        packages=(
            Package(name="torch", version="2.9.1", waive=(Waiver("NVIDIA_cublas-cu12", "CUDA-only; never on a GPU"),)),
            Package(name="app", version="1.0"),
        ),
    )
    metadata = {
        "torch": PackageMetadata("torch", ("nvidia-cublas-cu12==12.8.4.1", "triton==3.5.1")),
        "app": PackageMetadata("app", ("nvidia-cublas-cu12",)),
    }
    results = check_closure(lock, metadata)
    assert statuses(results) == [
        ("app", "nvidia-cublas-cu12", False, "unmet"),
        ("torch", "nvidia-cublas-cu12==12.8.4.1", False, "waived"),
        ("torch", "triton==3.5.1", False, "unmet"),
    ]
    assert results[1].detail == (
        "requires nvidia-cublas-cu12==12.8.4.1: waived: CUDA-only; never on a GPU "
        "(unmet: no package or source in the lock provides nvidia-cublas-cu12)"
    )


def test_verify_reports_requirements_in_json_and_groups_them_in_the_table(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_repo(tmp_path / "upstream")
    commit = repo.commit(files={"pyproject.toml": '[project]\nname = "svc"\nversion = "1"\n'})
    with PyIndex(dists) as index:
        lock = closure_lock(
            index,
            Source(
                name="svc",
                repo=repo.path.as_uri(),
                ref="main",
                ref_type="branch",
                commit=commit,
                requires=("dep", "gone"),
                waive=(Waiver("gone", "provided by the base image"),),
            ),
        )
        write_lock(tmp_path / "whole.lock.yaml", lock)
        code = main(
            ["lock", "verify", str(tmp_path / "whole.lock.yaml"), "--cache-dir", str(tmp_path / "c"), "--json", "-q"]
        )
        data = json.loads(capsys.readouterr().out)
        table = render_verify(VerifyReport(data["lock"], ()))  # rendering an empty report works too
        main(["lock", "verify", str(tmp_path / "whole.lock.yaml"), "--cache-dir", str(tmp_path / "c"), "-q"])
        text = capsys.readouterr().out
    assert code == 1 and data["ok"] is False
    requirement = [r for r in data["results"] if r["kind"] == "requirement"]
    assert set(requirement[0]) == {"kind", "name", "requirement", "build", "status", "detail"}
    assert [(r["name"], r["requirement"], r["build"], r["status"]) for r in requirement if r["name"] == "svc"] == [
        ("svc", None, True, "unknown"),
        ("svc", "dep", False, "ok"),
        ("svc", "gone", False, "waived"),
    ]
    assert "nothing to check" in table
    lines = text.splitlines()
    first_requirement = next(i for i, line in enumerate(lines) if line.startswith("requirement"))
    assert lines[first_requirement].split()[2] == "conflict"  # problems first …
    assert any(line.split()[:4] == ["requirement", "(4", "more)", "ok"] for line in lines)  # … a count of the rest
    assert "requirements 1 conflict, 4 ok, 1 unknown, 1 unmet, 1 waived" in text


def test_a_file_index_is_read_in_place(dists: Path, tmp_path: Path) -> None:
    url = write_file_index(tmp_path, dists)  # the files inside the index directory
    with PyIndex(dists) as served:
        lock = dataclasses.replace(closure_lock(served), index=url)
    found = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient()))
    assert found["app"].requires is not None and found["plugin"].requires == (
        'speedup; extra == "fast"',
        'slowpath; extra == "slow"',
    )
    with pytest.raises(RemoteError, match="read only from the file:// index that lists it"):
        IndexClient().open_ranges(
            (dists / "app-1.0-py3-none-any.whl").as_uri(), index=(tmp_path / "elsewhere").as_uri()
        )


def test_a_requirement_that_cannot_be_read_is_refused_not_dropped() -> None:
    """Core metadata is read with packaging's raw parser: a Requires-Dist that is not PEP 508, or not
    even text, refuses the file's metadata (the package's requirements become unknown, with why)."""
    package = Package(name="alpha", version="1.0")
    wheel = "alpha-1.0-py3-none-any.whl"
    good = b"Metadata-Version: 2.1\nName: Alpha\nVersion: 1.0\nRequires-Dist: beta>=1\nRequires-Dist: gamma; extra == 'x'\n"
    assert _requires(good, package, wheel, settled=True) == ["beta>=1", 'gamma; extra == "x"']
    with pytest.raises(MetadataError, match=r"Requires-Dist 'beta >>= 1' is not PEP 508"):
        _requires(good.replace(b"beta>=1", b"beta >>= 1"), package, wheel, settled=True)
    with pytest.raises(MetadataError, match="cannot be read"):
        _requires(good.replace(b"beta>=1", b"\xff\xfe"), package, wheel, settled=True)
    with pytest.raises(MetadataError, match="its metadata is for alpha 2.0, not alpha 1.0"):
        _requires(
            good.replace(b"Name: Alpha\nVersion: 1.0", b"Name: alpha\nVersion: 2.0"), package, wheel, settled=True
        )
