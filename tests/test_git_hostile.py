"""A hostile git server (a fake one speaking git's wire protocol on 127.0.0.1) against source
verification: garbage, odd ref names, a ref listing without end, one that is huge, and one that
drips forever. Each ends in one line, ``unreachable`` with the reason, with no git left running."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.git.cache import GitCache
from envbuild.git.remote import GitRunner
from envbuild.lock.model import Source
from envbuild.verify.sources import verify_source
from tests.lib.gitrepos import HostileGitServer, command_line, descendants

TAGGED = "a" * 40
ODD_REFS = [
    ("1" * 40, b"refs/heads/main"),
    ("2" * 40, b"refs/heads/\xff\xfe"),  # not UTF-8
    ("3" * 40, b"refs/heads/\x1b[31mred"),  # a terminal escape
    ("4" * 40, b"refs/heads/a b"),
    ("5" * 40, b"refs/heads/-x"),
    ("6" * 40, b"refs/tags/only^{}"),  # peeled, with nothing to peel
    ("7" * 40, b"refs/tags/../../../etc"),
    ("8" * 40, b"refs/heads/a\tb"),
    ("9" * 40, b"refs/tags/v1"),
    (TAGGED, b"refs/tags/v1^{}"),
]


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[HostileGitServer]:
    server = HostileGitServer(**request.param).start()
    yield server
    server.close()


def source(server: HostileGitServer, **fields: str) -> Source:
    pin = {"name": "lib", "repo": server.url(), "ref": "main", "ref_type": "branch", "commit": "1" * 40}
    return Source(**{**pin, **fields})  # type: ignore[arg-type]


def no_git_left(cache: Path) -> bool:
    """No process of ours is still running git in ``cache``."""
    return not [pid for pid in descendants(os.getpid()) if str(cache) in command_line(pid)]


@pytest.mark.parametrize("hostile", [{"mode": "garbage"}], indirect=True)
def test_garbage_is_a_protocol_error(hostile: HostileGitServer, tmp_path: Path) -> None:
    result = verify_source(source(hostile), GitCache(tmp_path / "git"))
    assert (result.status, result.detail) == ("unreachable", "protocol error: bad line length character: HTTP")
    assert no_git_left(tmp_path)


@pytest.mark.parametrize("hostile", [{"mode": "refs", "refs": ODD_REFS}], indirect=True)
def test_odd_ref_names_are_only_names(hostile: HostileGitServer, tmp_path: Path) -> None:
    cache = GitCache(tmp_path / "git")
    pin = source(hostile, ref="v1", ref_type="tag", commit=TAGGED)
    assert verify_source(pin, cache).status == "ok"  # the listing alone answers a tag without a tree
    assert verify_source(pin, cache, offline=True).status == "ok"  # and the kept listing reads back
    listing = cache.cached_listing(hostile.url())
    assert listing is not None and listing.heads["\udcff\udcfe"] == "2" * 40  # its bytes kept, not a traceback
    missing = verify_source(source(hostile, ref="gone"), cache)
    assert (missing.status, missing.detail) == ("missing-ref", "upstream has no branch named gone")


@pytest.mark.parametrize("hostile", [{"mode": "endless"}], indirect=True)
def test_a_ref_listing_without_end_is_refused_by_memory(hostile: HostileGitServer, tmp_path: Path) -> None:
    runner = GitRunner(network_timeout=120, max_memory=96 << 20)
    result = verify_source(source(hostile), GitCache(tmp_path / "git", git=runner))
    assert (result.status, result.detail) == (
        "unreachable",
        "git grew past 96 MiB reading what the server sent; refused",
    )
    assert no_git_left(tmp_path)


HUGE = [("1" * 40, b"refs/heads/main")] + [("2" * 40, b"refs/tags/t%07d" % n) for n in range(40_000)]


@pytest.mark.parametrize("hostile", [{"mode": "refs", "refs": HUGE}], indirect=True)
def test_a_huge_ref_listing_is_refused_by_size(hostile: HostileGitServer, tmp_path: Path) -> None:
    runner = GitRunner(max_listing=1 << 20)  # 40,000 tags: ~2.3 MB of listing
    result = verify_source(source(hostile), GitCache(tmp_path / "git", git=runner))
    assert (result.status, result.detail) == ("unreachable", f"the server sent more than {1 << 20} bytes; refused")
    assert GitCache(tmp_path / "git").cached_listing(hostile.url()) is None  # nothing of it kept


@pytest.mark.parametrize("hostile", [{"mode": "drip", "drip_interval": 0.1}], indirect=True)
def test_a_listing_that_drips_forever_ends_at_the_timeout(hostile: HostileGitServer, tmp_path: Path) -> None:
    runner = GitRunner(network_timeout=2)
    result = verify_source(source(hostile), GitCache(tmp_path / "git", git=runner))
    assert (result.status, result.detail) == ("unreachable", "timed out after 2 s")
    assert hostile.sent > 0 and no_git_left(tmp_path)
