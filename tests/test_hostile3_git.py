"""Issue 42's git rows, on real repositories served by ``git daemon`` on 127.0.0.1 and the real CLI run as a
subprocess (a hang fails within its timeout):

- row 2: submodules that nest their own repository, wide and deep. A tree that is wide and deep but made of
  few (repository, commit) pairs is read once per pair, and `lock update` and `lock verify` run a bounded
  number of gits; a tree of more records than the bound is refused in one line, exit 2, nothing written;
- row 3: a host or user beginning with '-' (``ssh://-oProxyCommand=…/x`` and its kin) is refused wherever a
  git URL is read: a source's repo, an index, ``.gitmodules``, a mirror rule;
- row 10: a SHA-256 repository is named as one, not taken for a repository without the ref.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from envbuild.git.gitmodules import MAX_SUBMODULE_RECORDS
from envbuild.git.treeexport import TreeExporter, export_tree
from envbuild.lock import read_lock
from envbuild.lock.model import walk_submodules
from tests.lib.gitrepos import Repo, Served, git
from tests.lib.tinylock import MINIMAL_LOCK, branch_lock

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "import sys; from envbuild.cli import main; sys.exit(main(sys.argv[1:]))"
_counter = iter(range(10**6))


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str
    gits: int  # gits started, when counted

    def one_line(self) -> str:
        lines = self.err.splitlines()
        assert len(lines) == 1, self.err[-3000:]
        return lines[0]


def envbuild(tmp_path: Path, *argv: str, timeout: float = 120, count_git: bool = False) -> Run:
    """``envbuild ARGV`` run as a user would; a run still going after ``timeout`` seconds fails the test.
    ``count_git``: git is reached through a wrapper that counts the gits started."""
    path = os.environ["PATH"]
    log = tmp_path / "gits.log"
    if count_git:
        wrapper = tmp_path / "bin" / "git"
        wrapper.parent.mkdir(exist_ok=True)
        wrapper.write_text(f'#!/bin/sh\necho x >> "{log}"\nexec "{shutil.which("git")}" "$@"\n')
        wrapper.chmod(0o755)
        path = f"{wrapper.parent}:{path}"
    log.write_text("")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, *argv],
            cwd=REPO,
            env={"PYTHONPATH": str(REPO), "PATH": path, "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"envbuild {' '.join(argv[:2])} was still running after {timeout} s")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return Run(proc.returncode, proc.stdout, proc.stderr, len(log.read_text().splitlines()))


# -- row 2: a tree of submodules that nests its own repository ----------------------------------------------


def self_nested(served: Served, width: int, depth: int) -> tuple[str, str]:
    """(URL, commit) of one repository whose commit at level N has ``width`` submodules, each its own commit
    at level N-1, by the repository's own URL: ``width + width**2 + … + width**depth`` records from ``depth + 1``
    commits of one repository."""
    name = f"h3nest{next(_counter)}"
    repo = served.repo(name)
    url = served.url(name, "daemon-filter")
    commit = repo.commit("the leaf", files={"leaf.txt": "leaf\n"})
    for level in range(1, depth + 1):
        links = {f"m{i}": commit for i in range(width)}
        commit = repo.commit_gitlinks(f"level {level}", links, {f"m{i}": (f"m{i}", url) for i in range(width)})
    return url, commit


def records(width: int, depth: int) -> int:
    return sum(width**level for level in range(1, depth + 1))


@pytest.mark.gitdaemon
def test_a_wide_deep_tree_of_few_commits_is_read_once_per_commit(served: Served, tmp_path: Path) -> None:
    width, depth = 8, 3
    assert records(width, depth) == 584 <= MAX_SUBMODULE_RECORDS
    url, commit = self_nested(served, width, depth)
    lock, cache = tmp_path / "nest.lock.yaml", str(tmp_path / "cache")
    lock.write_text(branch_lock("nest", url, commit))
    run = envbuild(tmp_path, "lock", "update", str(lock), "--cache-dir", cache, "-q", count_git=True)
    assert run.code == 0, run.err[-2000:]
    (source,) = read_lock(lock).lock.sources
    walked = list(walk_submodules(source.submodules))
    assert len(walked) == 584
    assert {sub.repo for _, sub in walked} == {url} and all(sub.tree for _, sub in walked)
    # Four commits of one repository, each read once (a few gits each), not once per record (~4 gits each).
    assert run.gits < 100, f"lock update: {run.gits} gits for 584 records of 4 distinct commits"

    run = envbuild(tmp_path, "lock", "verify", str(lock), "--cache-dir", cache, "-q", count_git=True)
    assert run.code == 0, run.err[-2000:]
    assert run.gits < 100, f"lock verify: {run.gits} gits for 584 records of 4 distinct commits"

    # The build's export writes each of the 584 trees at its path, from one archive per commit.
    dest = tmp_path / "dest"
    dest.mkdir()
    assert export_tree(source, dest, TreeExporter(Path(cache))) == source.tree
    assert (dest / "m7/m7/m7/leaf.txt").read_text() == "leaf\n"
    assert not list(tmp_path.glob(".envbuild-export-*"))  # the archives are gone


@pytest.mark.gitdaemon
def test_a_tree_of_more_records_than_the_bound_is_refused_in_one_line(served: Served, tmp_path: Path) -> None:
    width, depth = 8, 5  # the issue's: 37,448 records of six commits
    assert records(width, depth) > MAX_SUBMODULE_RECORDS
    url, commit = self_nested(served, width, depth)
    lock = tmp_path / "nest.lock.yaml"
    lock.write_text(branch_lock("nest", url, commit))
    before = lock.read_bytes()
    run = envbuild(tmp_path, "lock", "update", str(lock), "--cache-dir", str(tmp_path / "cache"), "-q", timeout=60)
    assert run.code == 2, run.err[-2000:]
    line = run.one_line()
    assert line.startswith("envbuild: error: nest: ") and f"more than {MAX_SUBMODULE_RECORDS}" in line, line
    assert "skip" in line, line  # the way out: skip a submodule by path in the lock
    assert lock.read_bytes() == before


@pytest.mark.gitdaemon
def test_a_lock_written_with_more_records_than_the_bound_is_refused_before_they_are_read(
    served: Served, tmp_path: Path
) -> None:
    """A lock someone wrote by hand (or an older envbuild) with too many records: verify, and fetch and the
    build (which verify first), refuse it in one line before any record is read."""
    url, commit = self_nested(served, 1, 1)
    entry = f"{{path: m0, repo: {json.dumps(url)}, commit: {commit}}}"
    many = "\n".join(f"      - {entry.replace('m0', f'd{i}')}" for i in range(MAX_SUBMODULE_RECORDS + 1))
    lock = tmp_path / "many.lock.yaml"
    lock.write_text(branch_lock("many", url, commit) + "    submodules:\n" + many + "\n")
    for command in ("verify", "fetch"):
        run = envbuild(tmp_path, "lock", command, str(lock), "--cache-dir", str(tmp_path / "c"), "-q", count_git=True)
        assert run.code == 2, run.err[-2000:]
        line = run.one_line()
        assert f"{MAX_SUBMODULE_RECORDS + 1} submodule records" in line and "many" in line, line
        assert run.gits < 10, f"{run.gits} gits"  # the source's listing, not ~10 per record (3,011 before)


# -- row 3: a host or user that git or ssh would read as an option ------------------------------------------

DASHED = [
    "ssh://-oProxyCommand=sh/x",  # the host
    "ssh://git@-oProxyCommand=sh/x",  # the host, after a user
    "ssh://-oProxyCommand@github.com/x",  # the user
    "ssh://%2DoProxyCommand=sh/x",  # git decodes a URL's '%' before ssh sees the host
    "git@-oProxyCommand:x",  # scp-like, the host
    "-oProxyCommand=sh:x",  # scp-like, the host at the start
    "git://-host/x.git",
    "https://-host/x.git",
]


@pytest.mark.parametrize("url", DASHED)
def test_a_dashed_host_or_user_in_a_lock_repo_is_refused(url: str, tmp_path: Path) -> None:
    lock = tmp_path / "l.yaml"
    lock.write_text(MINIMAL_LOCK.replace("https://example.org/lib.git", json.dumps(url)))
    run = envbuild(tmp_path, "lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "c"))
    assert run.code == 2, run.err
    line = run.one_line()
    assert line.startswith(f"envbuild: error: {lock}:5: sources[0].repo: ") and "'-'" in line, line
    assert not (tmp_path / "c").exists()


def test_a_dashed_host_in_an_index_or_a_mirror_is_refused(tmp_path: Path) -> None:
    lock = tmp_path / "l.yaml"
    lock.write_text(MINIMAL_LOCK + "index: https://-oProxy/simple\n")
    run = envbuild(tmp_path, "lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "c"))
    assert run.code == 2, run.err
    line = run.one_line()
    assert line.startswith(f"envbuild: error: {lock}:") and ": index: " in line and "'-'" in line, line

    lock.write_text(MINIMAL_LOCK)
    mirror = "https://example.org/=ssh://-oProxyCommand=sh/"
    run = envbuild(tmp_path, "lock", "verify", str(lock), "--offline", "--mirror", mirror)
    assert run.code == 2, run.err
    line = run.one_line()
    assert line.startswith("envbuild: error: --mirror: ") and "'-'" in line, line

    config = tmp_path / "config.yaml"
    config.write_text(f"mirrors:\n  https://example.org/: {mirror.split('=', 1)[1]}\n")
    run = envbuild(tmp_path, "lock", "verify", str(lock), "--offline", "--config", str(config))
    assert run.code == 2, run.err
    line = run.one_line()
    assert line.startswith(f"envbuild: error: {config}:2: mirrors: ") and "'-'" in line, line


@pytest.mark.gitdaemon
@pytest.mark.parametrize(
    "url", ["ssh://-oProxyCommand=touch${IFS}pwned/x", "ssh://-oProxyCommand@example.org/x", "git@-oProxy:x"]
)
def test_a_dashed_gitmodules_url_refuses_the_update(url: str, served: Served, tmp_path: Path) -> None:
    name = f"h3dash{next(_counter)}"
    repo = served.repo(name)
    leaf = repo.commit("leaf")
    commit = repo.commit_gitlinks("a dashed submodule", {"sub": leaf}, {"sub": ("sub", url)})
    lock = tmp_path / "d.lock.yaml"
    lock.write_text(branch_lock("dash", served.url(name, "daemon-filter"), commit))
    before = lock.read_bytes()
    run = envbuild(tmp_path, "lock", "update", str(lock), "--cache-dir", str(tmp_path / "c"), "-q")
    assert run.code == 2, run.err
    line = run.one_line()
    assert line.startswith("envbuild: error: dash/sub: .gitmodules url ") and "'-'" in line, line
    assert lock.read_bytes() == before
    assert not (tmp_path / "pwned").exists()


# -- row 10: a SHA-256 repository ----------------------------------------------------------------------------

SHA256_WORDS = "is a SHA-256 repository; envbuild pins SHA-1 commits (not supported yet)"


@pytest.mark.gitdaemon
def test_a_sha256_repository_is_named_as_one(served: Served, tmp_path: Path) -> None:
    name = f"h3sha{next(_counter)}"
    path = served.base / name
    path.mkdir()
    git("init", "-q", "--object-format=sha256", "-b", "main", str(path))
    repo = Repo(path)
    head = repo.commit("sha256")
    assert len(head) == 64
    url = served.url(name, "daemon-filter")
    lock = tmp_path / "s.lock.yaml"
    lock.write_text(branch_lock("sha", url, "0" * 40))
    before = lock.read_bytes()

    run = envbuild(tmp_path, "lock", "update", str(lock), "--cache-dir", str(tmp_path / "c"), "-q")
    assert run.code == 1, run.err
    assert run.one_line() == f"envbuild: error: source sha: {url} {SHA256_WORDS}"
    assert lock.read_bytes() == before

    run = envbuild(tmp_path, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "c"), "--json", "-q")
    assert run.code == 1, run.err
    (result,) = [r for r in json.loads(run.out)["results"] if r["kind"] == "source"]
    assert (result["status"], result["detail"]) == ("unreachable", f"{url} {SHA256_WORDS}")

    # A submodule in it: fetched by its commit, where git says "mismatched algorithms".
    parent_name = f"h3shaparent{next(_counter)}"
    parent = served.repo(parent_name)
    commit = parent.commit_gitlinks("a SHA-256 submodule", {"sub": "1" * 40}, {"sub": ("sub", url)})
    lock.write_text(branch_lock("parent", served.url(parent_name, "daemon-filter"), commit))
    run = envbuild(tmp_path, "lock", "update", str(lock), "--cache-dir", str(tmp_path / "c"), "-q")
    assert run.code == 0, run.err
    (source,) = read_lock(lock).lock.sources
    assert source.submodules_unknown is not None and SHA256_WORDS in source.submodules_unknown
