"""Is a commit in the export cache whole? One `git rev-list --objects`, read by `complete_tree`, on real
repositories: a whole commit gives its tree (and its date), a commit whose blobs a partial clone left out
gives none, and so does a commit the repository lacks."""

from __future__ import annotations

import subprocess
from pathlib import Path

from envbuild.git.treeexport import _COMPLETE, complete_tree


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def upstream(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "up"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    git("config", "uploadpack.allowFilter", "true", cwd=repo)
    (repo / "pkg").mkdir()
    (repo / "pkg" / "a.py").write_text("A = 1\n")
    (repo / "top.txt").write_text("top\n")
    git("add", ".", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "one", cwd=repo)
    return repo, git("rev-parse", "HEAD", cwd=repo), git("rev-parse", "HEAD^{tree}", cwd=repo)


def listing(repo: Path, commit: str) -> str:
    return git(*_COMPLETE, commit, "--", cwd=repo)


def test_a_whole_commit_gives_its_tree_and_date(tmp_path: Path) -> None:
    repo, commit, tree = upstream(tmp_path)
    date = int(git("log", "-1", "--format=%ct", commit, cwd=repo))
    assert complete_tree(listing(repo, commit), commit) == (tree, date)


def test_a_commit_missing_blobs_gives_none(tmp_path: Path) -> None:
    repo, commit, _ = upstream(tmp_path)
    partial = tmp_path / "partial.git"
    subprocess.run(
        ["git", "clone", "-q", "--bare", "--filter=blob:none", f"file://{repo}", str(partial)],
        check=True,
        capture_output=True,
    )
    assert "?" in listing(partial, commit)  # git itself says what is missing, and fetches nothing
    assert complete_tree(listing(partial, commit), commit) is None


def test_an_absent_commit_gives_none(tmp_path: Path) -> None:
    repo, commit, _ = upstream(tmp_path)
    absent = "1" * 40
    assert listing(repo, absent) == ""
    assert complete_tree(listing(repo, absent), absent) is None
    assert complete_tree(listing(repo, commit), absent) is None  # another commit's listing proves nothing
