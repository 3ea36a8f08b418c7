"""A full disk under the caches, for real: each test mounts its own small tmpfs as the cache directory
(root needed; outside CI the tests skip without it) and unmounts it in a finalizer.

Whatever runs out of space (creating a cache repository, writing the ref listing, a fetch, a package
download) ends in one line, ``no space left in the cache (PATH)``, exit status 1; what the failed write
left is removed at once; and the next run succeeds once there is space again."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.errors import CacheError
from envbuild.git.cache import GitCache
from envbuild.index.client import IndexClient
from envbuild.index.filecache import FileCache
from envbuild.lock.model import Source
from envbuild.verify.sources import verify_source
from tests.lib.gitrepos import Served, fast_import_repo, git
from tests.lib.pyindex import PyIndex, make_wheel
from tests.lib.tmpfs import KiB, MiB, Tmpfs, leftovers, mounted_tmpfs


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Tmpfs]:
    with mounted_tmpfs(tmp_path / "cache", 1 * MiB) as mounted:
        yield mounted


def verify(capsys: pytest.CaptureFixture[str], lock: Path, cache: Path) -> tuple[int, str, str]:
    code = main(["lock", "verify", str(lock), "--cache-dir", str(cache), "-q"])
    out, err = capsys.readouterr()
    return code, out, err


def write_lock(path: Path, url: str, commit: str) -> Path:
    path.write_text(
        textwrap.dedent(f"""\
            version: 1
            name: full
            sources:
              - {{name: big, repo: "{url}", ref: main, ref_type: branch, commit: {commit}}}
            """)
    )
    return path


@pytest.fixture(scope="module")
def big(served: Served) -> str:
    """A history whose full pack (several MB) cannot fit a 1 MiB cache."""
    fast_import_repo(served.base / "full-disk.git", commits=800, files=100, touch=2, tag_every=400)
    return "full-disk.git"


@pytest.mark.gitdaemon
def test_a_fetch_that_fills_the_disk(
    served: Served, big: str, disk: Tmpfs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = served.plain.url(big)  # no partial clone: the whole history comes
    old = git("rev-parse", "main~3", cwd=served.base / big)
    lock = write_lock(tmp_path / "full.lock.yaml", url, old)
    code, out, err = verify(capsys, lock, disk.path)
    assert (code, err) == (1, f"envbuild: error: no space left in the cache ({disk.path / 'git'})\n")
    assert out == ""
    repo = GitCache(disk.path / "git").repo(url).path
    assert leftovers(disk.path) == []
    assert disk.free() > 512 * KiB  # the half-received pack is gone, not just renamed

    disk.resize(64 * MiB)  # there is space again
    code, out, err = verify(capsys, lock, disk.path)
    assert code == 0 and "behind" in out, (out, err)
    assert leftovers(disk.path) == []
    fsck = subprocess.run(["git", "-C", str(repo), "fsck", "--connectivity-only", "--no-progress"], capture_output=True)
    assert fsck.returncode == 0, fsck.stderr


@pytest.mark.gitdaemon
def test_a_ref_listing_that_does_not_fit(
    served: Served, disk: Tmpfs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream = served.repo("many-refs")
    head = upstream.commit()
    refs = "".join(f"create refs/tags/release-{n:05d} {head}\n" for n in range(3000))
    git("update-ref", "--stdin", cwd=upstream.path, stdin=refs.encode())
    lock = write_lock(tmp_path / "refs.lock.yaml", served.filtering.url("many-refs"), head)
    cache = GitCache(disk.path / "git")
    cache.ensure(served.filtering.url("many-refs"))  # the repository fits; its listing (~170 KB) will not
    filler = disk.fill(leave=32 * KiB)

    code, out, err = verify(capsys, lock, disk.path)
    assert (code, out, err) == (1, "", f"envbuild: error: no space left in the cache ({disk.path / 'git'})\n")
    assert leftovers(disk.path) == []

    filler.unlink()
    code, out, err = verify(capsys, lock, disk.path)
    assert code == 0 and " ok " in out, (out, err)


@pytest.mark.gitdaemon
def test_a_pack_a_killed_fetch_left_on_a_full_disk_is_cleared_by_the_next_run(
    served: Served, disk: Tmpfs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream = served.repo("after-kill")
    first = upstream.commit()
    upstream.commit()
    url = served.filtering.url("after-kill")
    lock = write_lock(tmp_path / "kill.lock.yaml", url, first)
    repo = GitCache(disk.path / "git").ensure(url).path
    # What `kill -9` of envbuild and its git in mid-fetch leaves: a half-received pack that fills the disk.
    pack = repo / "objects" / "pack" / "tmp_pack_AbCdEf"
    pack.parent.mkdir(parents=True, exist_ok=True)
    disk.fill(leave=0).rename(pack)

    code, out, err = verify(capsys, lock, disk.path)
    assert code == 0 and "behind" in out, (out, err)
    assert not pack.exists() and leftovers(disk.path) == []


def test_a_cold_cache_on_a_full_disk(disk: Tmpfs, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    filler = disk.fill(leave=0)
    source = Source(name="x", repo="git://127.0.0.1:9/x.git", ref="main", ref_type="branch", commit="ab" * 20)
    with pytest.raises(CacheError) as info:
        verify_source(source, GitCache(disk.path / "git"))
    assert str(info.value) == f"no space left in the cache ({disk.path / 'git'})"
    assert [p.name for p in (disk.path / "git").iterdir()] == []  # no half-made repository
    filler.unlink()
    assert GitCache(disk.path / "git").ensure(source.repo).exists()


def test_a_download_that_does_not_fit(disk: Tmpfs, tmp_path: Path) -> None:
    dists = tmp_path / "dists"
    dists.mkdir()
    wheel = dists / "big-1.0-py3-none-any.whl"
    wheel.write_bytes(os.urandom(2 * MiB))
    cache = FileCache(disk.path)
    with PyIndex(dists) as index:
        client = IndexClient()
        listed = client.project(index.url, "big").file(wheel.name)
        assert listed is not None
        with pytest.raises(CacheError) as info:
            cache.fetch(listed.url, index.sha256(wheel.name), wheel.name, client.download)
        assert str(info.value) == f"no space left in the cache ({cache.dir})"
        assert cache.temporary_files() == [] and cache.get(index.sha256(wheel.name)) is None
        assert disk.free() > 900 * KiB  # the partial download was removed

        disk.resize(8 * MiB)
        path = cache.fetch(listed.url, index.sha256(wheel.name), wheel.name, client.download)
    assert path.read_bytes() == wheel.read_bytes()


def test_metadata_a_full_cache_cannot_keep_does_not_end_the_verify(
    disk: Tmpfs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wheel's METADATA kept in the cache only saves a later read: once the first one that did not fit
    ended `lock verify` in `error: No space left on device`, naming no cache and with no table."""
    from tests.test_metadata_pin import real_metadata, sha, write  # its lock of two wheels, one pinned

    root = tmp_path / "dists"
    root.mkdir()
    make_wheel(root, "app", "1.0", requires=["dep>=1"])
    make_wheel(root, "dep", "1.0")
    filler = disk.fill(leave=0)
    with PyIndex(root) as index:
        lock = write(tmp_path, index, sha(real_metadata(root)))
        code = main(["lock", "verify", str(lock), "--cache-dir", str(disk.path), "--json", "-q"])
    out, err = capsys.readouterr()
    results = json.loads(out)["results"]
    assert (code, err) == (0, ""), err
    assert {(r["kind"], r["status"]) for r in results} == {("package", "ok"), ("requirement", "ok")}
    assert leftovers(disk.path) == []  # no temporary file of a write that did not fit
    filler.unlink()
