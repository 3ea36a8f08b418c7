"""verify_packages against a real local PEP 691 index, one test per status, and once against PyPI."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import requests

from envbuild.fetch import package_file_locations
from envbuild.index.client import IndexClient
from envbuild.lock import Lock, Package, PackageFile, parse_lock
from envbuild.verify.packages import verify_packages
from envbuild.verify.results import PackageStatus
from tests.lib.pyindex import PyIndex, dead_port_url, make_sdist, make_wheel

WHEEL = "alpha-1.0-py3-none-any.whl"
SDIST = "alpha-1.0.tar.gz"


@pytest.fixture()
def dists(tmp_path: Path) -> Path:
    root = tmp_path / "dists"
    root.mkdir()
    make_wheel(root, "alpha", "1.0")
    make_sdist(root, "alpha", "1.0")
    make_wheel(root, "beta", "2.0", requires=["alpha==1.0"])
    return root


def locked(index: PyIndex, name: str, version: str, *filenames: str, own_index: str | None = None) -> Package:
    return Package(
        name=name, version=version, index=own_index, files=tuple(PackageFile(f, index.sha256(f)) for f in filenames)
    )


def lock_of(*packages: Package, index: str | None = None) -> Lock:
    return Lock(version=1, name="t", sources=(), index=index, packages=packages)


def test_ok_and_lock_order(dists: Path) -> None:
    with PyIndex(dists) as index:
        lock = lock_of(
            locked(index, "beta", "2.0", "beta-2.0-py3-none-any.whl"),
            locked(index, "alpha", "1.0", WHEEL, SDIST),
            index=index.url,
        )
        seen: list[str] = []
        results = verify_packages(lock, progress=seen.append)
    assert [(r.kind, r.name, r.status) for r in results] == [("package", "beta", "ok"), ("package", "alpha", "ok")]
    assert results[1].facts["index"] == index.url and "2 file(s) match" in results[1].detail
    assert seen == [f"checking 2 packages on 1 index(es): {index.url}"]  # ok packages are not listed one by one


def test_missing_file(dists: Path) -> None:
    with PyIndex(dists) as index:
        lock = lock_of(locked(index, "alpha", "1.0", WHEEL, SDIST), index=index.url)
        index.hide(SDIST)
        [result] = verify_packages(lock)
    assert result.status == "missing-file"
    assert result.detail == f"{SDIST} is no longer listed by {index.url}"


def test_project_gone_from_index(dists: Path) -> None:
    with PyIndex(dists) as index:
        gone = Package(name="gamma", version="1.0", files=(PackageFile("gamma-1.0.tar.gz", "0" * 64),))
        [result] = verify_packages(lock_of(gone, index=index.url))
    assert result.status == "missing-file" and "does not know gamma at all" in result.detail


def test_hash_mismatch_gives_both_hashes(dists: Path) -> None:
    with PyIndex(dists) as index:
        lock = lock_of(locked(index, "alpha", "1.0", WHEEL, SDIST), index=index.url)
        expected = index.sha256(WHEEL)
        index.rehash(WHEEL, "f" * 64)
        index.hide(SDIST)  # both problems: the verdict is the worse one, the detail lists both
        [result] = verify_packages(lock)
    assert result.status == "hash-mismatch"
    assert result.facts["expected"] == expected and result.facts["upstream"] == "f" * 64
    assert f"lock has sha256 {expected}, index lists {'f' * 64}" in result.detail
    assert "no longer listed" in result.detail
    assert [p["status"] for p in result.facts["problems"]] == ["hash-mismatch", "missing-file"]


@pytest.mark.parametrize(("reason", "said"), [("bad build", "bad build"), (True, "no reason given")])
def test_yanked_gives_reason(dists: Path, reason: str | bool, said: str) -> None:
    with PyIndex(dists) as index:
        lock = lock_of(locked(index, "alpha", "1.0", WHEEL), index=index.url)
        index.yank(WHEEL, reason)
        [result] = verify_packages(lock)
    assert result.status == "yanked" and result.detail == f"{WHEEL} is yanked: {said}"


def test_unresolved_when_no_files_recorded(dists: Path) -> None:
    with PyIndex(dists) as index:
        [result] = verify_packages(lock_of(Package(name="alpha", version="1.0"), index=index.url))
    assert result.status == "unresolved"
    assert "records no files for alpha 1.0 (the index lists 2 file(s) for that version)" in result.detail


def test_unreachable_index_is_named_plainly() -> None:
    dead = dead_port_url()
    lock = lock_of(
        Package(name="triton-ascend", version="3.2.2", index=dead),
        Package(name="alpha", version="1.0", files=(PackageFile(WHEEL, "0" * 64),), index=dead),
    )
    results = verify_packages(lock)
    assert [r.status for r in results] == ["unreachable", "unreachable"]
    assert results[0].detail == f"index {dead} out of reach: connection refused (while fetching triton-ascend)"
    assert results[0].facts["index"] == dead


def test_per_package_index_overrides_lock_index(dists: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    make_wheel(other, "special", "3.2.2", tag="cp312-cp312-manylinux_2_28_aarch64")
    with PyIndex(dists) as main, PyIndex(other) as own:
        lock = lock_of(
            locked(main, "alpha", "1.0", WHEEL),
            locked(own, "special", "3.2.2", "special-3.2.2-cp312-cp312-manylinux_2_28_aarch64.whl", own_index=own.url),
            index=main.url,
        )
        results = verify_packages(lock)
    assert [r.status for r in results] == ["ok", "ok"]
    assert main.requests == ["/simple/alpha/"] and own.requests == ["/simple/special/"]


def test_malformed_index_answer_is_unreachable_not_a_traceback(dists: Path) -> None:
    with PyIndex(dists) as index:
        index.answer("alpha", b"<<garbage")
        [result] = verify_packages(lock_of(locked(index, "alpha", "1.0", WHEEL), index=index.url))
    assert result.status == "unreachable"
    assert result.detail.startswith(f"index {index.url} answered a malformed page for alpha: not JSON")


def test_every_status_is_documented() -> None:
    assert set(typing.get_args(PackageStatus)) == {
        "ok",
        "cached",
        "missing-file",
        "hash-mismatch",
        "yanked",
        "unresolved",
        "unreachable",
    }


def test_one_request_per_package_in_parallel(dists: Path) -> None:
    with PyIndex(dists) as index:
        lock = lock_of(
            locked(index, "alpha", "1.0", WHEEL),
            locked(index, "beta", "2.0", "beta-2.0-py3-none-any.whl"),
            index=index.url,
        )
        client = IndexClient()
        verify_packages(lock, client=client)
        found = package_file_locations(lock, client=client)  # served from the same run's cache
    assert sorted(index.requests) == ["/simple/alpha/", "/simple/beta/"]
    assert found[WHEEL].url == f"{index.url.rsplit('/simple', 1)[0]}/files/{WHEEL}"


SIX_WHEEL = "six-1.16.0-py2.py3-none-any.whl"
SIX_SHA = "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"


@pytest.mark.network
def test_against_pypi() -> None:
    text = f"""
version: 1
name: pypi-check
sources: []
packages:
  - name: six
    version: 1.16.0
    files:
      - {{filename: {SIX_WHEEL}, sha256: {SIX_SHA}}}
"""
    lock = parse_lock(text)
    [ok] = verify_packages(lock, session=requests.Session())
    assert ok.status == "ok", ok.detail
    wrong = lock_of(Package(name="six", version="1.16.0", files=(PackageFile(SIX_WHEEL, "0" * 64),)))
    [bad] = verify_packages(wrong)
    assert bad.status == "hash-mismatch" and bad.facts["upstream"] == SIX_SHA
