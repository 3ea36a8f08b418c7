"""The lock's installer: what the lock accepts as one, and the uv binary read out of its wheel, checked
against the wheel's own RECORD (hostile and broken wheels refused, naming the file) and kept. The sources'
steps that run it are tests/test_image_render.py's; the build with the real uv wheel is
tests/test_image_build.py's; pinning it, tests/test_update_minimal.py's."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import stat
import textwrap
import zipfile
from pathlib import Path

import pytest

from envbuild.errors import InputError, LockfileError
from envbuild.image.installer import uv_binary, uv_binary_file
from envbuild.image.plan import FilePlan, plan_context
from envbuild.lock import Package, PackageFile, parse_lock
from tests.lib.tinylock import MINIMAL_SHA, tiny_lock

VERSION = "0.13.9"
WHEEL = f"uv-{VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
MEMBER = f"uv-{VERSION}.data/scripts/uv"


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_uv_wheel(
    path: Path, binary: bytes = b"\x7fELF uv", recorded: bytes | None = None, member: str = MEMBER
) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, binary)
        record = f"{MEMBER},{_hash(binary if recorded is None else recorded)},{len(binary)}\n"
        archive.writestr(f"uv-{VERSION}.dist-info/RECORD", record)
    return path


def plan_file(wheel: Path) -> FilePlan:
    package = Package(name="uv", version=VERSION, files=(PackageFile(wheel.name, "0" * 64),))
    return FilePlan("uv", VERSION, wheel.name, "0" * 64, f"installer/{wheel.name}", (package, package.files[0]))


def truncated(path: Path) -> Path:
    make_uv_wheel(path)
    path.write_bytes(path.read_bytes()[:40])
    return path


def test_the_binary_is_read_and_checked_against_the_wheel_record(tmp_path: Path) -> None:
    wheel = make_uv_wheel(tmp_path / WHEEL)
    assert uv_binary(wheel, plan_file(wheel)) == b"\x7fELF uv"


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda p: make_uv_wheel(p, recorded=b"other"), "does not match the wheel's RECORD"),
        (lambda p: make_uv_wheel(p, member=f"uv-{VERSION}.data/scripts/uvx"), "has no uv-0.13.9.data/scripts/uv:"),
        (truncated, "cannot read the wheel"),
    ],
)
def test_a_wheel_that_is_not_uv_s_is_refused_naming_the_file(tmp_path: Path, build, words: str) -> None:  # type: ignore[no-untyped-def]
    wheel = build(tmp_path / WHEEL)
    with pytest.raises(InputError) as raised:
        uv_binary(wheel, plan_file(wheel))
    assert f"installer uv {VERSION}: {WHEEL}" in str(raised.value) and words in str(raised.value), raised.value
    assert "\n" not in str(raised.value)


def _installer(name: str, filename: str) -> str:
    return textwrap.dedent(f"""\
        version: 2
        name: tiny
        sources:
          - {{name: lib, repo: "https://example.org/lib.git", ref: main, ref_type: branch, commit: "{MINIMAL_SHA}"}}
        installer:
          name: {name}
          version: "{VERSION}"
          files:
            - {{filename: {filename}, sha256: "{"a" * 64}"}}
        """)


@pytest.mark.parametrize(
    ("name", "filename", "words"),
    [
        ("pip", "pip-0.13.9-py3-none-any.whl", "installer.name: 'pip': the only installer envbuild runs is uv"),
        (
            "uv",
            f"uv-{VERSION}.tar.gz",
            "installer.files[0].filename: uv-0.13.9.tar.gz: the installer is run from its wheel",
        ),
        ("uv", "uv-0.14.0-py3-none-any.whl", "installer.files[0].filename"),
    ],
)
def test_the_lock_accepts_uv_wheels_only_as_its_installer(name: str, filename: str, words: str) -> None:
    with pytest.raises(LockfileError) as raised:
        parse_lock(_installer(name, filename), "t.lock.yaml")
    assert any(words in str(p) for p in raised.value.problems), raised.value.problems


def test_a_version_1_lock_cannot_name_an_installer() -> None:
    with pytest.raises(LockfileError) as raised:
        parse_lock(_installer("uv", WHEEL).replace("version: 2", "version: 1", 1), "t.lock.yaml")
    assert any("installer" in str(p) and "version 2" in str(p) for p in raised.value.problems), raised.value.problems


def test_the_plan_takes_the_platform_s_wheel_or_refuses_naming_the_command() -> None:
    arm = "uv-0.13.9-py3-none-manylinux_2_28_aarch64.whl"
    installer = Package(name="uv", version=VERSION, files=(PackageFile(arm, "b" * 64), PackageFile(WHEEL, "c" * 64)))
    plan = plan_context(tiny_lock(installer=installer), lock_sha256="0" * 64)  # the tiny lock is x86_64
    assert plan.installer is not None and (plan.installer.filename, plan.installer.sha256) == (WHEEL, "c" * 64)
    assert plan.requirements.startswith("# envbuild: installed with uv pip")
    only_arm = Package(name="uv", version=VERSION, files=(PackageFile(arm, "b" * 64),))
    with pytest.raises(InputError, match=r"installer uv 0.13.9 has no wheel for the lock's platform .*--installer"):
        plan_context(tiny_lock(installer=only_arm), lock_sha256="0" * 64)


def test_the_binary_is_kept_by_the_wheel_s_sha256_read_only_and_read_once(tmp_path: Path) -> None:
    wheel = make_uv_wheel(tmp_path / WHEEL)
    kept = uv_binary_file(wheel, plan_file(wheel), tmp_path / "kept")
    assert kept == tmp_path / "kept" / ("0" * 64) / "uv" and kept.read_bytes() == b"\x7fELF uv"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o555
    wheel.unlink()  # a later build links the kept file: the wheel is not read again
    assert uv_binary_file(wheel, plan_file(wheel), tmp_path / "kept") == kept
    (tmp_path / "broken").mkdir()
    broken = make_uv_wheel(tmp_path / "broken" / WHEEL, recorded=b"other")
    with pytest.raises(InputError, match="does not match the wheel's RECORD"):
        uv_binary_file(broken, dataclasses.replace(plan_file(broken), sha256="1" * 64), tmp_path / "kept")
    assert not (tmp_path / "kept" / ("1" * 64)).exists()  # nothing kept of a wheel that failed its check
