"""The resolver: tag selection (pure), uv against a local index (offline), and PyPI (network)."""

from __future__ import annotations

import dataclasses
import hashlib
import socket
from pathlib import Path

import pytest

from envbuild.errors import InputError
from envbuild.index.client import IndexClient, IndexFile
from envbuild.lock import Lock, Package, PackageFile, Platform, Source
from envbuild.lock.model import Install, Provides, Waiver
from envbuild.lock.platform import uv_platform
from envbuild.update.resolve import (
    ResolutionError,
    parse_pins,
    pin_files,
    resolve_packages,
    select_files,
)
from envbuild.update.roots import source_roots
from tests.lib.pyindex import PyIndex, Route, make_sdist, make_wheel, wheel_metadata

ARM = Platform(os="linux", arch="aarch64", python="3.12")
X86 = Platform(os="linux", arch="x86_64", python="3.12")


def files(*names: str) -> list[IndexFile]:
    return [IndexFile(filename=n, url=f"https://x/{n}", sha256="0" * 64, yanked=False) for n in names]


NUMPYISH = files(
    "np-2.0-cp312-cp312-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    "np-2.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "np-2.0-cp312-cp312-manylinux_2_34_aarch64.whl",  # needs a newer glibc than the lock promises
    "np-2.0-cp312-cp312-musllinux_1_2_aarch64.whl",
    "np-2.0-cp311-cp311-manylinux_2_28_aarch64.whl",
    "np-2.0-cp39-abi3-manylinux_2_28_aarch64.whl",
    "np-2.0-cp312-cp312-linux_aarch64.whl",
    "np-2.0-cp312-cp312-macosx_11_0_arm64.whl",
    "np-2.0-cp312-cp312-win_arm64.whl",
    "np-2.0.tar.gz",
    "np-1.9-cp312-cp312-manylinux_2_28_aarch64.whl",
)


def test_select_keeps_exactly_the_platforms_wheels() -> None:
    assert [f.filename for f in select_files(NUMPYISH, "np", "2.0", ARM)] == [
        "np-2.0-cp312-cp312-linux_aarch64.whl",
        "np-2.0-cp312-cp312-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
        "np-2.0-cp39-abi3-manylinux_2_28_aarch64.whl",
    ]
    assert [f.filename for f in select_files(NUMPYISH, "np", "2.0", X86)] == [
        "np-2.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    ]


def test_select_falls_back_to_sdist_only_without_a_wheel() -> None:
    only = files("vllm_ascend-0.23.0.tar.gz", "vllm_ascend-0.22.0-py3-none-any.whl")
    assert [f.filename for f in select_files(only, "vllm-ascend", "0.23.0", ARM)] == ["vllm_ascend-0.23.0.tar.gz"]
    pure = files("six-1.16.0-py2.py3-none-any.whl", "six-1.16.0.tar.gz")
    assert [f.filename for f in select_files(pure, "six", "1.16.0", ARM)] == ["six-1.16.0-py2.py3-none-any.whl"]


def test_select_leaves_yanked_files_out_while_one_that_is_not_will_do() -> None:
    """PEP 592. Once the yanked wheel was locked beside an sdist that was not, and verify failed the lock."""
    wheel, sdist = files("six-1.16.0-py2.py3-none-any.whl", "six-1.16.0.tar.gz")
    yanked = wheel._replace(yanked=True, yanked_reason="broken wheel")
    assert select_files([yanked, sdist], "six", "1.16.0", ARM) == [sdist]
    assert select_files([yanked], "six", "1.16.0", ARM) == [yanked]  # all there is: locked, and verify says so
    other = files("np-2.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")  # not for ARM
    assert select_files([yanked, *other], "six", "1.16.0", ARM) == [yanked]


def test_select_skips_files_without_sha256() -> None:
    nohash = [IndexFile(filename="a-1-py3-none-any.whl", url="u", sha256=None, yanked=False)]
    assert select_files(nohash, "a", "1", ARM) == []


def test_uv_platform() -> None:
    assert uv_platform(ARM) == "aarch64-manylinux_2_28" and uv_platform(X86) == "x86_64-manylinux_2_28"


def test_parse_pins() -> None:
    text = "# comment\n--index-url https://x\nA_b==1.0\ncharset-normalizer==3.5.3 ; python_version >= '3'\n\n"
    assert parse_pins(text) == [("A_b", "1.0"), ("charset-normalizer", "3.5.3")]
    with pytest.raises(ResolutionError, match="not an exact pin"):
        parse_pins("a>=1\n")


def test_lock_without_platform_is_an_input_error() -> None:
    with pytest.raises(InputError, match="has no platform"):
        resolve_packages(Lock(version=1, name="p", sources=(), requirements=("a",)))


@pytest.fixture()
def index_dir(tmp_path: Path) -> Path:
    root = tmp_path / "dists"
    root.mkdir()
    make_wheel(root, "app", "1.0", requires=["native>=1", "pure"])
    make_wheel(root, "native", "1.1", tag="cp312-cp312-manylinux_2_28_aarch64")
    make_wheel(root, "native", "1.1", tag="cp312-cp312-manylinux_2_28_x86_64")
    make_sdist(root, "native", "1.1")
    make_wheel(root, "pure", "0.5")
    make_sdist(root, "pure", "0.5")
    make_wheel(root, "pure", "0.4")
    return root


def test_resolves_closure_with_uv_against_local_index(
    index_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}/simple"
    dead.close()
    with PyIndex(index_dir) as index:
        kept = Package(name="special", version="3.2.2", index=dead_url)
        lock = Lock(
            version=1,
            name="r",
            sources=(),
            platform=ARM,
            index=index.url,
            requirements=("app==1.0", "special==3.2.2"),
            packages=(kept,),
        )
        said: list[str] = []
        packages = resolve_packages(lock, progress=said.append)
        sha = index.sha256
        ranged = {name for name, _ in index.ranges}
    by_name = {p.name: p for p in packages}
    assert list(by_name) == ["app", "native", "pure", "special"]
    native = "native-1.1-cp312-cp312-manylinux_2_28_aarch64.whl"
    assert by_name["native"].files == (PackageFile(native, sha(native), metadata_pin(index_dir / native)),)
    pure = "pure-0.5-py3-none-any.whl"
    assert by_name["pure"] == Package(
        name="pure", version="0.5", files=(PackageFile(pure, sha(pure), metadata_pin(index_dir / pure)),)
    )
    assert {native, pure} <= ranged  # read from the zip by range requests: nothing downloaded whole
    assert by_name["special"] is kept
    assert any(f"keeping special 3.2.2 as locked: index {dead_url} out of reach: connection refused" in m for m in said)


def metadata_pin(path: Path) -> str:
    return hashlib.sha256(wheel_metadata(path)).hexdigest()


def test_metadata_pins_come_from_pep658_and_a_kept_pin_is_not_read_again(index_dir: Path, tmp_path: Path) -> None:
    pure = "pure-0.5-py3-none-any.whl"
    with PyIndex(index_dir, metadata=True) as index:
        client = IndexClient()
        [listed] = [f for f in client.project(index.url, "pure").files if f.filename == pure]
        [first] = pin_files([listed], client, index.url, {})
        assert f"/files/{pure}.metadata" in index.requests and not index.ranges
        index.requests.clear()
        [again] = pin_files([listed], client, index.url, {(pure, index.sha256(pure)): "f" * 64})
        assert index.requests == []
    assert first == PackageFile(pure, index.sha256(pure), metadata_pin(index_dir / pure))
    assert again.metadata_sha256 == "f" * 64


def test_a_wheel_whose_metadata_cannot_be_read_is_locked_without_the_pin(index_dir: Path) -> None:
    pure = "pure-0.5-py3-none-any.whl"
    with PyIndex(index_dir) as index:
        client = IndexClient()
        [listed] = [f for f in client.project(index.url, "pure").files if f.filename == pure]
        index.route(f"/files/{pure}", Route(status=500))
        said: list[str] = []
        [file] = pin_files([listed], IndexClient(retries=1), index.url, {}, said.append)
    assert file == PackageFile(pure, index.sha256(pure))
    assert said == [f"warning: {pure}: its METADATA is not pinned: {listed.url}: HTTP 500 to a range request"]


def test_own_index_package_is_relisted_when_reachable(index_dir: Path, tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    make_wheel(own, "special", "3.2.2", tag="cp312-cp312-manylinux_2_28_aarch64")
    make_wheel(own, "special", "3.2.2", tag="cp312-cp312-manylinux_2_28_x86_64")
    with PyIndex(own) as index:
        lock = Lock(
            version=1,
            name="r",
            sources=(),
            platform=ARM,
            packages=(Package(name="special", version="3.2.2", index=index.url),),
        )
        [special] = resolve_packages(lock)
    assert special.index == index.url
    assert [f.filename for f in special.files] == ["special-3.2.2-cp312-cp312-manylinux_2_28_aarch64.whl"]


def test_unsatisfiable_requirements_carry_uvs_reason(
    index_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    with PyIndex(index_dir) as index:
        lock = Lock(version=1, name="r", sources=(), platform=ARM, index=index.url, requirements=("pure==9",))
        with pytest.raises(ResolutionError, match=r"uv could not resolve pure==9 for aarch64-manylinux_2_28") as info:
            resolve_packages(lock)
    assert "pure" in str(info.value).split("\n", 1)[1]


def source(name: str, **fields: object) -> Source:
    return Source(
        name=name, repo=f"https://example.org/{name}.git", ref="main", ref_type="branch", commit="1" * 40, **fields
    )  # type: ignore[arg-type]


def test_what_the_sources_declare_is_resolved_in_and_a_waiver_is_not(
    index_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    sources = (
        # builds with native; asks core (another source) for its `old` extra; waives what no index has.
        source(
            "svc",
            build_requires=("native",),
            requires=("core-dist[old]", "cuda-only-thing==1.0", "app; sys_platform == 'win32'"),
            waive=(Waiver("cuda-only-thing", "CUDA-only; not used on Ascend"),),
        ),
        source("core", provides=Provides(name="core-dist"), requires=("app==1.0", 'pure<0.5; extra == "old"')),
        source("files", install=Install(mode="none"), requires=("never-resolved",)),
    )
    lock = Lock(version=1, name="r", sources=sources, platform=ARM)
    assert [r.requirement for r in source_roots(lock)] == ["native", "app==1.0", "pure<0.5"]
    with PyIndex(index_dir) as index:
        said: list[str] = []
        packages = resolve_packages(dataclasses.replace(lock, index=index.url), progress=said.append)
    assert [(p.name, p.version) for p in packages] == [("app", "1.0"), ("native", "1.1"), ("pure", "0.4")]
    assert any("resolving 3 requirement(s) (3 from the sources)" in line for line in said)


def test_a_packages_waivers_are_kept_and_left_out_of_the_resolution(
    index_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """app waives pure (the way torch's CUDA libraries are waived on Ascend): an update keeps the waiver on
    app and does not resolve pure back in."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    waive = (Waiver("Pure", "provided by the base image"),)
    with PyIndex(index_dir) as index:
        lock = Lock(
            version=1,
            name="r",
            sources=(),
            platform=ARM,
            index=index.url,
            requirements=("app==1.0",),
            packages=(Package(name="app", version="1.0", waive=waive),),
        )
        packages = resolve_packages(lock)
        again = resolve_packages(dataclasses.replace(lock, packages=()))
    assert [(p.name, p.waive) for p in packages] == [("app", waive), ("native", ())]
    assert [p.name for p in again] == ["app", "native", "pure"]  # without the waiver, pure is resolved


def test_a_refusal_names_the_source_behind_each_package_uv_names(
    index_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    with PyIndex(index_dir) as index:
        lock = Lock(
            version=1,
            name="r",
            sources=(source("svc", requires=("pure>=9", "app==1.0")),),
            platform=ARM,
            index=index.url,
            requirements=("native",),
        )
        with pytest.raises(ResolutionError) as info:
            resolve_packages(lock)
    message = str(info.value)
    assert "what the sources ask for" in message and "  svc requires pure>=9" in message
    assert "svc requires app==1.0" not in message  # uv did not name it


@pytest.mark.network
@pytest.mark.slow
def test_resolves_requests_for_aarch64_from_pypi() -> None:
    lock = Lock(version=1, name="r", sources=(), platform=ARM, requirements=("requests==2.32.3",))
    packages = {p.name: p for p in resolve_packages(lock)}
    assert {"requests", "charset-normalizer", "idna", "urllib3", "certifi"} <= set(packages)
    assert packages["requests"].version == "2.32.3"
    assert [f.filename for f in packages["requests"].files] == ["requests-2.32.3-py3-none-any.whl"]
    charset = [f.filename for f in packages["charset-normalizer"].files]
    assert charset and all("aarch64" in f or f.endswith("none-any.whl") for f in charset)
    assert any("aarch64" in f for f in charset)
    assert not any("x86_64" in f or "macosx" in f or "win" in f or "musllinux" in f for f in charset)
    assert all(len(f.sha256) == 64 for p in packages.values() for f in p.files)
