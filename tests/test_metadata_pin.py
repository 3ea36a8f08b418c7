"""The lock pins each wheel's METADATA (``metadata_sha256``), so the closure check trusts no metadata an
index forges: an index serving the real wheel but PEP 658 metadata (with a matching announced hash) that
leaves out a Requires-Dist is reported by name, `metadata-mismatch`, exit 1, nothing cached; a lock whose
pin an index forged at update time is caught by `lock fetch`, which compares each hash-checked wheel's own
METADATA with the pin and drops the forged cache entry; and a lock without pins never caches what an index
alone said, so the real wheel in the cache answers once fetched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import Lock, Package, PackageFile, write_lock
from envbuild.lock.model import Platform
from tests.lib.pyindex import PyIndex, make_wheel, wheel_metadata

WHEEL = "app-1.0-py3-none-any.whl"
ARM = Platform(os="linux", arch="aarch64", python="3.12")


@pytest.fixture()
def dists(tmp_path: Path) -> Path:
    root = tmp_path / "dists"
    root.mkdir()
    make_wheel(root, "app", "1.0", requires=["dep>=1"])
    make_wheel(root, "dep", "1.0")
    return root


def real_metadata(dists: Path, filename: str = WHEEL) -> bytes:
    return wheel_metadata(dists / filename)


def forged(dists: Path) -> bytes:
    return real_metadata(dists).replace(b"Requires-Dist: dep>=1\n", b"")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(tmp_path: Path, index: PyIndex, app_pin: str | None) -> Path:
    dep = "dep-1.0-py3-none-any.whl"
    lock = Lock(
        version=2,
        name="pinned",
        platform=ARM,
        index=index.url,
        sources=(),
        requirements=("app",),
        packages=(
            Package("app", "1.0", (PackageFile(WHEEL, index.sha256(WHEEL), metadata_sha256=app_pin),)),
            Package("dep", "1.0", (PackageFile(dep, index.sha256(dep), sha(real_metadata(index.root, dep))),)),
        ),
    )
    path = tmp_path / "pinned.lock.yaml"
    write_lock(path, lock)
    return path


def verify(lock: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, dict]]:
    code = main(["lock", "verify", str(lock), "--cache-dir", str(cache), "--json", "-q"])
    out = json.loads(capsys.readouterr().out)
    return code, {f"{r['name']}:{r['requirement']}": r for r in out["results"] if r["kind"] == "requirement"}


def cached_metadata(cache: Path) -> dict[str, bytes]:
    folder = cache / "metadata"
    return {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


def test_forged_pep658_metadata_is_reported_by_name_and_not_cached(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with PyIndex(dists, metadata=True) as index:
        index.forge_metadata(WHEEL, forged(dists))
        lock = write(tmp_path, index, sha(real_metadata(dists)))
        code, results = verify(lock, tmp_path / "cache", capsys)
    assert code == 1
    app = results["app:None"]
    assert app["status"] == "metadata-mismatch"
    assert app["detail"] == (
        f"{WHEEL}: the index served METADATA with sha256 {sha(forged(dists))}, not the "
        f"{sha(real_metadata(dists))} the lock pins"
    )
    assert forged(dists) not in cached_metadata(tmp_path / "cache").values()


def test_the_pinned_metadata_is_believed_and_cached_by_its_digest(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with PyIndex(dists, metadata=True) as index:
        lock = write(tmp_path, index, sha(real_metadata(dists)))
        code, results = verify(lock, tmp_path / "cache", capsys)
    assert code == 0
    assert results["app:dep>=1"]["status"] == "ok"
    assert cached_metadata(tmp_path / "cache")[sha(real_metadata(dists))] == real_metadata(dists)


def test_without_a_pin_an_index_s_word_is_not_cached_and_the_fetched_wheel_answers(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case on a lock written before pins: the forgery cannot be told from the index alone,
    but it is not kept, so once `lock fetch` put the real wheel in the cache, the real metadata answers."""
    cache = tmp_path / "cache"
    with PyIndex(dists, metadata=True) as index:
        index.forge_metadata(WHEEL, forged(dists))
        lock = write(tmp_path, index, None)
        _, before = verify(lock, cache, capsys)
        assert "app:dep>=1" not in before  # the forgery, believed this once: nothing says otherwise
        assert forged(dists) not in cached_metadata(cache).values()
        assert main(["lock", "fetch", str(lock), "--cache-dir", str(cache), "-q"]) == 0
        capsys.readouterr()
        _, after = verify(lock, cache, capsys)
    assert after["app:dep>=1"]["status"] == "ok"  # read from the hash-checked wheel


def test_a_fetched_wheel_s_metadata_is_read_from_it_once_then_kept_by_its_sha256(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lock without pins, its wheel in the file cache: its METADATA is read from the zip once and kept by
    the wheel's sha256 (the wheel cannot change), so the next verify reads what was kept, not the zip."""
    cache = tmp_path / "cache"
    with PyIndex(dists, metadata=True) as index:
        lock = write(tmp_path, index, None)
        assert main(["lock", "fetch", str(lock), "--cache-dir", str(cache), "-q"]) == 0
        capsys.readouterr()
        _, first = verify(lock, cache, capsys)
        kept = cache / "metadata" / "wheel" / index.sha256(WHEEL)
        assert kept.read_bytes() == real_metadata(dists)
        kept.write_bytes(forged(dists))  # what is kept answers: here, without the requirement on dep
        _, verdict = verify(lock, cache, capsys)  # the closure's verdict, kept for this lock, answers first
        for entry in (cache / "verify" / "closure").iterdir():
            entry.unlink()
        _, second = verify(lock, cache, capsys)
    assert first["app:dep>=1"]["status"] == "ok" and verdict == first
    assert "app:dep>=1" not in second


def test_lock_fetch_catches_a_pin_the_index_forged_at_update_time(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    with PyIndex(dists, metadata=True) as index:
        index.forge_metadata(WHEEL, forged(dists))
        lock = write(tmp_path, index, sha(forged(dists)))  # what `lock update` pinned from the lying index
        code, results = verify(lock, cache, capsys)
        assert code == 0 and "app:dep>=1" not in results  # the index agrees with the pin it forged
        assert cached_metadata(cache)[sha(forged(dists))] == forged(dists)
        code = main(["lock", "fetch", str(lock), "--cache-dir", str(cache), "-q"])
        err = capsys.readouterr().err
    assert code == 1
    assert (
        f"package app 1.0: {WHEEL}: its own METADATA has sha256 {sha(real_metadata(dists))}, not the "
        f"{sha(forged(dists))} the lock pins"
    ) in err
    assert forged(dists) not in cached_metadata(cache).values()  # nothing forged stays in the cache


def test_what_the_caches_answer_is_known_before_any_is_read(tmp_path: Path, dists: Path) -> None:
    """read_metadata reads what the caches answer in the caller's thread and pools only the rest: a
    package is answered by its kept METADATA (only bytes the lock pins are kept) or by its file in the
    file cache, never by what an index said alone."""
    from envbuild.lock.io import read_lock
    from envbuild.verify.metadata import MetadataReader, read_metadata

    cache = tmp_path / "cache"
    with PyIndex(dists) as index:
        path = write(tmp_path, index, app_pin=None)
        lock = read_lock(path).lock
        app, dep = lock.packages
        reader = MetadataReader(cache)
        assert not reader.in_cache(app) and not reader.in_cache(dep)  # an empty cache: the index answers
        found = read_metadata(lock, reader)
        assert reader.network_reads == 2 and found["app"].requires == ("dep>=1",)
        assert reader.in_cache(dep) and not reader.in_cache(app)  # dep's pinned METADATA kept; app's unpinned
        assert main(["lock", "fetch", str(path), "--cache-dir", str(cache)]) == 0  # the wheels, hash-checked
        again = MetadataReader(cache)
        assert again.in_cache(app) and again.in_cache(dep)
        assert read_metadata(lock, again) == found and again.network_reads == 0
