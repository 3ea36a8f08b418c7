"""`lock update` reads each source's declared requirements from its pinned tree: real repositories served by a
real git daemon, read through the verify cache, fetching only the objects read."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from envbuild.git.cache import GitCache
from envbuild.git.files import PinnedTree
from envbuild.lock import Lock, Source
from envbuild.lock.model import Install, Provides, Waiver
from envbuild.update.read_requirements import read_source_requirements
from envbuild.update.update import Moves, update_lock
from tests.lib.gitrepos import Served, free_port, git

pytestmark = pytest.mark.gitdaemon

STATIC = """\
[build-system]
requires = ["setuptools>=40", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "req-static"
version = "1.0"
dependencies = ["tinyone>=1.0", "tinytwo; sys_platform == 'win32'"]
optional-dependencies = {dev = ["pytest"]}
"""

DYNAMIC = """\
[build-system]
requires = ["setuptools>=64"]

[project]
name = "req-dynamic"
dynamic = ["version", "dependencies"]

[tool.setuptools.dynamic]
version = {attr = "req_dynamic.__version__"}
dependencies = {file = ["requirements/run.txt"]}
"""


@pytest.fixture(scope="module")
def upstream(served: Served) -> dict[str, tuple[str, str]]:
    """{name: (url, commit)} of three served repositories: static, dynamic-file and setup.py-only."""
    static = served.repo("req-static")
    dynamic = served.repo("req-dynamic")
    setuppy = served.repo("req-setuppy")
    commits = {
        "req-static": static.commit(files={"pyproject.toml": STATIC, "req_static/__init__.py": ""}),
        "req-dynamic": dynamic.commit(
            files={
                "pyproject.toml": DYNAMIC,
                "req_dynamic/__init__.py": '__version__ = "2.5"\n',
                "requirements/run.txt": "-r base.txt\ntinytwo>=2.0  # the second\n",
                "requirements/base.txt": "tinyone\n",
            }
        ),
        "req-setuppy": setuppy.commit(
            files={
                "setup.py": "from setuptools import setup\nsetup(install_requires=open('deps.txt').read().split())\n",
                "deps.txt": "tinyone\n",
            }
        ),
    }
    return {name: (served.url(name, "daemon-filter"), commit) for name, commit in commits.items()}


def source(name: str, url: str, commit: str, **changes: object) -> Source:
    pinned = Source(name=name, repo=url, ref="main", ref_type="branch", commit=commit, install=Install())
    return dataclasses.replace(pinned, **changes)


def test_update_records_static_dynamic_and_unreadable_requirements(
    upstream: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    lock = Lock(version=1, name="reqs", sources=tuple(source(n, *upstream[n]) for n in upstream))
    said: list[str] = []
    updated = update_lock(lock, Moves(packages=False), GitCache(tmp_path / "git"), progress=said.append)
    static, dynamic, setuppy = updated.sources

    assert static.provides == Provides(name="req-static", version="1.0")
    assert static.build_requires == ("setuptools>=40", "wheel")
    assert static.requires == ("tinyone>=1.0", 'tinytwo; sys_platform == "win32"', 'pytest; extra == "dev"')
    assert static.requires_unknown is None

    assert dynamic.provides == Provides(name="req-dynamic", version="2.5")
    assert dynamic.requires == ("tinyone", "tinytwo>=2.0")

    assert setuppy.build_requires == ("setuptools>=40.8.0",)
    assert setuppy.requires is None
    assert setuppy.requires_unknown is not None and "computed by setup.py" in setuppy.requires_unknown
    assert any("warning: req-setuppy:" in line for line in said)

    # The lock names the file that setup.py reads: now it is known.
    named = dataclasses.replace(
        lock, sources=(source("req-setuppy", *upstream["req-setuppy"], requires_files=("deps.txt",)),)
    )
    [known] = update_lock(named, Moves(packages=False), GitCache(tmp_path / "git")).sources
    assert known.requires == ("tinyone",) and known.requires_unknown is None


def test_reading_a_file_fetches_only_the_objects_read(served: Served, tmp_path: Path) -> None:
    repo = served.repo("req-big")
    big = os.urandom(3 << 20)  # a blob the reading must never fetch
    (repo.path / "data").mkdir()
    (repo.path / "data" / "weights.bin").write_bytes(big)
    commit = repo.commit(files={"pyproject.toml": STATIC, "deep/er/still/reqs.txt": "six\n"})
    cache = GitCache(tmp_path / "git")
    url = served.url("req-big", "daemon-filter")

    files = PinnedTree(cache, url, commit).read(["pyproject.toml", "deep/er/still/reqs.txt", "data", "nope.txt"])
    assert files["pyproject.toml"].data == STATIC.encode()
    assert files["deep/er/still/reqs.txt"].data == b"six\n"
    assert (files["data"].problem, files["nope.txt"].problem) == ("a directory", "absent")

    big_oid = git("rev-parse", f"{commit}:data/weights.bin", cwd=repo.path)
    present = cache.present_objects(url, commit)
    assert big_oid not in present
    # The commit, the root tree, deep/, deep/er/, deep/er/still/ and the two blobs read: nothing else.
    assert len(present) == 7
    packs = sum(p.stat().st_size for p in (cache.repo(url).path / "objects" / "pack").glob("*.pack"))
    assert packs < 64 << 10

    # A server that does not allow partial clone sends more, and the answer is the same.
    plain = GitCache(tmp_path / "plain")
    again = PinnedTree(plain, served.url("req-big", "daemon-nofilter"), commit).read(["deep/er/still/reqs.txt"])
    assert again["deep/er/still/reqs.txt"].data == b"six\n"


def test_an_unreadable_tree_is_unknown_with_the_reason_and_a_recorded_one_is_kept(
    upstream: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    url, commit = upstream["req-static"]
    cache = GitCache(tmp_path / "git")
    gone = source("req-static", url, "0" * 40)
    unknown = read_source_requirements(gone, cache)
    assert unknown.requires is None and unknown.build_requires is None
    assert unknown.requires_unknown is not None and unknown.requires_unknown.startswith(
        "the pinned tree cannot be read"
    )

    # The upstream is out of reach, but the lock already records the requirements of this very commit.
    dead = f"git://127.0.0.1:{free_port()}/req-static"
    recorded = source("req-static", dead, commit, requires=("tinyone>=1.0",), build_requires=("setuptools",))
    said: list[str] = []
    kept = read_source_requirements(recorded, GitCache(tmp_path / "cold"), previous=recorded, progress=said.append)
    assert (kept.requires, kept.build_requires) == (("tinyone>=1.0",), ("setuptools",))
    assert any("kept as recorded" in line for line in said)


def test_waivers_and_a_source_that_is_not_installed_are_left_alone(
    upstream: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    url, commit = upstream["req-static"]
    waived = source("req-static", url, commit, waive=(Waiver("tinyone", "provided elsewhere"),))
    read = read_source_requirements(waived, GitCache(tmp_path / "git"))
    assert read.waive == waived.waive and read.requires is not None  # recorded in full; the waiver is the lock's
    files_only = source("req-static", url, commit, install=Install(mode="none"))
    assert read_source_requirements(files_only, GitCache(tmp_path / "git")) == files_only


def test_the_cache_answers_a_second_read_without_the_network(
    upstream: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    url, commit = upstream["req-dynamic"]
    network: list[str] = []
    cache = GitCache(tmp_path / "git")
    read_source_requirements(source("req-dynamic", url, commit), cache)
    cache.git.observer = lambda command, where: network.append(command)
    again = read_source_requirements(source("req-dynamic", url, commit), cache)
    assert again.requires == ("tinyone", "tinytwo>=2.0") and network == []


def test_an_oversized_blob_is_cut_off_in_its_fetch_not_fetched_whole(served: Served, tmp_path: Path) -> None:
    """The issue's case: a requirements file of hundreds of MB cost its whole size in time, memory and cache
    before its size was checked. The fetch is now stopped once the server has sent more than the limit."""
    repo = served.repo("req-huge")
    (repo.path / "requirements").mkdir()
    (repo.path / "requirements" / "huge.txt").write_bytes(os.urandom(24 << 20))  # incompressible
    commit = repo.commit(files={"pyproject.toml": STATIC, "requirements/small.txt": "six\n"})
    cache = GitCache(tmp_path / "git")
    url = served.url("req-huge", "daemon-filter")

    files = PinnedTree(cache, url, commit).read(["requirements/huge.txt", "requirements/small.txt"])
    assert files["requirements/huge.txt"].problem == "more than the 1048576 bytes read (its fetch was stopped there)"
    assert files["requirements/small.txt"].data == b"six\n"  # the other file of the same read is still read
    pack_dir = cache.repo(url).path / "objects" / "pack"
    kept = sum(p.stat().st_size for p in pack_dir.iterdir())
    assert kept < 1 << 20, kept  # nothing of the large blob stays in the cache
    assert not list(pack_dir.glob("tmp_*"))
