"""Object checking on every fetch into the verify cache (``fetch.fsckObjects``): history git's own fsck
finds malformed is refused at the fetch, with git's reason, as ``unreachable`` naming the source; a
partial-clone server (which sends no trees) and one without filter support both keep working."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.git.cache import GitCache
from envbuild.lock.model import Source
from envbuild.verify.sources import verify_source
from tests.lib.gitrepos import MALFORMED_TREES, Served, commit_malformed

pytestmark = pytest.mark.gitdaemon

TRANSPORTS = ("daemon-filter", "daemon-nofilter", "file")
_counter = iter(range(10**6))


def upstream_with(served: Served, kind: str) -> tuple[str, str, str]:
    """(name, the last good commit, the malformed commit on top of it)."""
    name = f"fsck-{kind}-{next(_counter)}"
    repo = served.repo(name)
    good = repo.commit()
    return name, good, commit_malformed(repo.path, kind)


def objects_of(repo: Path) -> set[str]:
    out = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "--batch-all-objects", "--batch-check=%(objectname)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", sorted(MALFORMED_TREES))
def test_a_malformed_tree_is_refused_where_trees_are_fetched(
    served: Served, tmp_path: Path, kind: str, transport: str
) -> None:
    name, good, bad = upstream_with(served, kind)
    url = served.url(name, transport)
    cache = GitCache(tmp_path / "git")
    result = verify_source(Source(name="lib", repo=url, ref="main", ref_type="branch", commit=good), cache)
    if transport == "daemon-filter":
        # Partial clone: commits only, the malformed tree never arrives; checking does not get in the way.
        assert (result.status, result.facts["ahead"]) == ("behind", 1)
        return
    assert result.status == "unreachable" and result.name == "lib" and result.facts["url"] == url
    assert result.detail.startswith(f"malformed object refused by git's fsck: {kind}: ")
    assert "\n" not in result.detail
    repo = cache.repo(url).path
    assert bad not in objects_of(repo) and good not in objects_of(repo)  # nothing of the refused pack kept
    assert not list(repo.rglob("tmp_*")) and not list(repo.rglob("incoming-*"))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_malformed_commit_is_refused_even_by_a_partial_fetch(served: Served, tmp_path: Path, transport: str) -> None:
    name, good, _ = upstream_with(served, "badTimezone")
    url = served.url(name, transport)
    result = verify_source(
        Source(name="lib", repo=url, ref="main", ref_type="branch", commit=good), GitCache(tmp_path / "git")
    )
    assert result.status == "unreachable"
    assert result.detail.startswith("malformed object refused by git's fsck: badTimezone: "), result.detail


def test_verify_names_the_source_in_one_line(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, good, bad = upstream_with(served, "duplicateEntries")
    lock = tmp_path / "fsck.lock.yaml"
    url = served.url(name, "daemon-nofilter")
    lock.write_text(
        f"version: 1\nname: fsck\nsources:\n  - {{name: lib, repo: '{url}', ref: main, ref_type: branch, commit: {good}}}\n"
    )
    code = main(["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "-q"])
    out, _ = capsys.readouterr()
    assert code == 1
    [line] = [line for line in out.splitlines() if line.startswith("source ")]
    assert line.split()[:3] == ["source", "lib", "unreachable"]
    assert "malformed object refused by git's fsck: duplicateEntries: contains duplicate file entries" in line
