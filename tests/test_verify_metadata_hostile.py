"""Hostile archives against the core-metadata readers (envbuild.verify.metadata): a zip whose end record
claims a central directory no download holds, read locally and by range requests, through `lock verify`
and `envbuild check`'s reader. Each ends in one line naming the file; nothing is allocated for the claim."""

from __future__ import annotations

import io
import json
import random
import shutil
import struct
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.index.client import MAX_RANGE_BYTES, IndexClient
from envbuild.lock import Lock, Package, PackageFile
from envbuild.lock.model import Platform
from envbuild.verify.metadata import MetadataError, MetadataReader, _sdist_members, read_metadata, read_wheel_metadata
from tests.lib.pyindex import PyIndex, Route, make_sdist, make_wheel, wheels_at

WHEEL = "alpha-1.0-py3-none-any.whl"


def zip64_records(at: int, size_cd: int) -> bytes:
    """A zip64 end record (at offset ``at``), its locator and the classic end record, claiming a central
    directory of ``size_cd`` bytes that would end just before the record: zipfile reads it in one read."""
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, size_cd, at - size_cd)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return record + locator + end


def zip64_claim(path: Path, size_cd: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data + zip64_records(len(data), size_cd))


@pytest.fixture()
def dists(tmp_path: Path) -> Path:
    return wheels_at(tmp_path / "dists", "alpha")


def claim_a_terabyte(index: PyIndex) -> None:
    """The file host answers the tail request with 98 bytes, saying the file is 1 TiB long, its end record
    claiming a central directory of almost all of it (the issue's 64 KiB answer)."""
    total = 1 << 40
    tail = zip64_records(total - 98, total - 4096)
    headers = {"Content-Range": f"bytes {total - len(tail)}-{total - 1}/{total}", "Content-Length": str(len(tail))}
    index.route(f"/files/{WHEEL}", Route(status=206, headers=headers, body=tail))


def test_a_range_answer_claiming_a_terabyte_is_refused_before_allocating_it(dists: Path) -> None:
    with PyIndex(dists) as index:
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        claim_a_terabyte(index)
        with pytest.raises(MetadataError) as info:
            read_wheel_metadata(client.open_ranges(listed.url), WHEEL, max_read=MAX_RANGE_BYTES)
    assert str(info.value) == (
        f"the archive asks for {(1 << 40) - 4096} bytes in one read (its central directory as its end record "
        f"states it), more than the {MAX_RANGE_BYTES} reading its metadata may take; refused"
    )


def test_a_claim_past_the_end_of_a_local_file_reads_short_and_is_refused(tmp_path: Path) -> None:
    path = make_wheel(tmp_path, "alpha", "1.0")
    zip64_claim(path, size_cd=path.stat().st_size - 10)
    with pytest.raises(MetadataError, match=r"^not a readable wheel: "):
        read_wheel_metadata(open(path, "rb"), WHEEL)


def test_a_claim_larger_than_the_budget_on_a_large_enough_file_is_refused_unread(tmp_path: Path) -> None:
    """A file as large as its claim still may not make one read above the budget (64 MiB)."""
    path = make_wheel(tmp_path, "alpha", "1.0")
    with open(path, "ab") as handle:
        handle.truncate(path.stat().st_size + (65 << 20))  # sparse: 65 MiB of zeros
    zip64_claim(path, size_cd=65 << 20)
    with pytest.raises(MetadataError) as info:
        read_wheel_metadata(open(path, "rb"), WHEEL)
    assert str(info.value) == (
        f"the archive asks for {65 << 20} bytes in one read (its central directory as its end record states "
        f"it), more than the {64 << 20} reading its metadata may take; refused"
    )


def test_lock_verify_reports_the_claim_by_package_as_json(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with PyIndex(dists) as index:
        claim_a_terabyte(index)
        lock = tmp_path / "zip64.lock.yaml"
        lock.write_text(
            textwrap.dedent(f"""\
                version: 1
                name: zip64
                index: {index.url}
                sources: []
                requirements: [alpha]
                packages:
                  - {{name: alpha, version: "1.0", files: [{{filename: {WHEEL}, sha256: "{index.sha256(WHEEL)}"}}]}}
                """)
        )
        code = main(["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "--json", "-q"])
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err  # unknown requirements fail only --strict
    unknown = [r for r in json.loads(out)["results"] if r["kind"] == "requirement" and r["status"] == "unknown"]
    assert [r["name"] for r in unknown] == ["alpha"]
    assert unknown[0]["detail"].startswith(f"{WHEEL}: the archive asks for ")
    assert not (tmp_path / "cache" / "metadata").exists() or not any((tmp_path / "cache" / "metadata").rglob("*"))


# --- sdists: members read, and the cache -------------------------------------------------------


def sdist_of(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


PKG_INFO = b"Metadata-Version: 2.2\nName: many\nVersion: 1.0\nRequires-Dist: six\n"
EMPTY = [(f"many-1.0/empty/{i}", b"") for i in range(1000)]


def test_an_sdist_is_read_up_to_the_member_that_settles_it(tmp_path: Path) -> None:
    path = sdist_of(tmp_path / "many-1.0.tar.gz", [("many-1.0/PKG-INFO", PKG_INFO), *EMPTY])
    assert _sdist_members(path, "many-1.0.tar.gz", max_members=10) == {"PKG-INFO": PKG_INFO}


def test_an_sdist_whose_metadata_comes_after_too_many_members_is_refused(tmp_path: Path) -> None:
    path = sdist_of(tmp_path / "many-1.0.tar.gz", [*EMPTY, ("many-1.0/PKG-INFO", PKG_INFO)])
    with pytest.raises(MetadataError) as info:
        _sdist_members(path, "many-1.0.tar.gz", max_members=100)
    assert str(info.value) == "more than 100 members without its metadata settling its requirements; refused"


def test_what_a_hash_checked_sdist_settles_is_cached_by_its_sha256(tmp_path: Path) -> None:
    root = tmp_path / "dists"
    root.mkdir()
    make_sdist(root, "modern", "1.0", metadata_version="2.2", requires=["six>=1"])
    make_sdist(root, "legacy", "1.0", requires=["six"])
    names = ("modern", "legacy")
    with PyIndex(root) as index:
        lock = Lock(
            version=2,
            name="s",
            platform=Platform(os="linux", arch="aarch64", python="3.12"),
            index=index.url,
            sources=(),
            packages=tuple(
                Package(n, "1.0", (PackageFile(f"{n}-1.0.tar.gz", index.sha256(f"{n}-1.0.tar.gz")),)) for n in names
            ),
        )
        first = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient()))
    shutil.rmtree(tmp_path / "cache" / "files")  # neither the sdists nor the index are there any more
    again = read_metadata(lock, MetadataReader(tmp_path / "cache", IndexClient(), offline=True))
    assert again["modern"].requires == first["modern"].requires == ("six>=1",)
    assert again["legacy"].requires is None and "decided when it is built" in again["legacy"].detail


def test_a_range_answered_whole_after_ranges_were_served_is_read_at_its_offset(tmp_path: Path) -> None:
    """A file host whose later answer ignores the range (200, the whole file: a balancer's other backend) is
    read where the range asked, not from the file's start: the METADATA past the first 64 KiB was read from
    offset 0 and the wheel said unreadable ('File name in directory … and header … differ')."""
    dists = tmp_path / "dists"
    dists.mkdir()
    metadata = b"Metadata-Version: 2.1\nName: big\nVersion: 1.0\n"
    with zipfile.ZipFile(dists / "big-1.0-py3-none-any.whl", "w") as wheel:  # stored: no member compresses
        wheel.writestr("big/first.bin", random.Random(1).randbytes(300_000))
        wheel.writestr("big-1.0.dist-info/METADATA", metadata)
        wheel.writestr("big/last.bin", random.Random(2).randbytes(300_000))
    with PyIndex(dists) as index:
        client = IndexClient()
        listed = client.project(index.url, "big").file("big-1.0-py3-none-any.whl")
        assert listed is not None
        handle = client.open_ranges(listed.url)  # the tail: a range answer
        index.serve_ranges = False  # every later request answered whole
        assert read_wheel_metadata(handle, "big-1.0-py3-none-any.whl") == metadata
    assert len(index.ranges) == 1
