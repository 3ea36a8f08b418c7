"""What a bisect learns of a moved source's history (:func:`envbuild.bisect.history.with_history`): its
commits, or the note that says why they are not bisected. Real repositories served by a git daemon on
127.0.0.1, a real cache in ``tmp_path``; no engine.

A source's upstream, ``lib``, is shaped per test: a branch moved on, moved back, rewritten onto an
unrelated history, force-pushed so GOOD's commit is gone, or left for another branch; and the cache starts
empty, or holds what an earlier fetch left, or is all there is (offline)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from envbuild.bisect.history import with_history
from envbuild.bisect.steps import Rewrite, Unit
from envbuild.git.cache import GitCache
from envbuild.git.remote import ref_refspec
from envbuild.lock.model import Source
from tests.lib.gitrepos import Repo, Served, git


def _unit(url: str, good: str, bad: str, *, good_ref: str = "main", **bad_changes: str) -> Unit:
    before = Source(name="lib", repo=url, ref=good_ref, ref_type="branch", commit=good)
    return Unit("source", "lib", before, dataclasses.replace(before, **{"ref": "main", "commit": bad, **bad_changes}))


def _upstream(served: Served, name: str, commits: int = 3) -> tuple[Repo, str, list[str]]:
    """A served repository whose branch main holds ``commits`` commits: (repo, its URL, the commits)."""
    repo = served.repo(f"history-{name}")
    return repo, served.url(f"history-{name}", "daemon-filter"), [repo.commit() for _ in range(commits)]


def _fetch_main(cache: GitCache, url: str) -> None:
    """What an earlier verify of the branch leaves in the cache: its commits."""
    cache.fetch(url, [ref_refspec("branch", "main")])


def _not_bisected(unit: Unit, note: str) -> None:
    assert unit.note == note
    assert unit.commits == () and unit.trees == {}


def test_a_source_whose_repository_changed_is_one_state(tmp_path: Path) -> None:
    unit = _unit("https://example.invalid/lib.git", "1" * 40, "2" * 40, repo="https://example.invalid/fork.git")
    note = "its repository changed: its commits are not bisected"
    _not_bisected(with_history(unit, GitCache(tmp_path / "git")), note)
    assert not (tmp_path / "git").exists()  # decided from the pins: nothing fetched


def test_bad_pinning_a_tag_is_one_state(tmp_path: Path) -> None:
    unit = _unit("https://example.invalid/lib.git", "1" * 40, "2" * 40, ref="v2", ref_type="tag")
    note = "BAD pins tag v2: a commit between two tags is on no tag, so its commits are not bisected"
    _not_bisected(with_history(unit, GitCache(tmp_path / "git")), note)
    assert not (tmp_path / "git").exists()


@pytest.mark.gitdaemon
def test_a_source_moved_on_its_branch_has_its_commits(served: Served, tmp_path: Path) -> None:
    repo, url, commits = _upstream(served, "moved", commits=4)
    unit = with_history(_unit(url, commits[0], commits[-1]), GitCache(tmp_path / "git"))
    assert (unit.note, unit.rewrite, unit.commits) == (None, None, tuple(commits[1:]))
    assert unit.trees == {c: repo.tree(c) for c in commits}


@pytest.mark.gitdaemon
def test_offline_without_the_history_in_the_cache(served: Served, tmp_path: Path) -> None:
    _, url, commits = _upstream(served, "offline")
    unit = with_history(_unit(url, commits[0], commits[-1]), GitCache(tmp_path / "git"), offline=True)
    _not_bisected(unit, "its history is not in the cache (offline): its commits are not bisected")
    assert not (tmp_path / "git").exists()  # offline: nothing was asked of the daemon


@pytest.mark.gitdaemon
def test_an_upstream_that_cannot_be_read_is_said(served: Served, tmp_path: Path) -> None:
    url = served.url("history-never-made", "daemon-filter")  # the daemon serves no such repository
    unit = with_history(_unit(url, "1" * 40, "2" * 40), GitCache(tmp_path / "git"))
    reason = "remote error: no such repository: /history-never-made"  # git daemon's --informative-errors
    _not_bisected(unit, f"its history cannot be read ({reason}): its commits are not bisected")


@pytest.mark.gitdaemon
def test_bad_commit_off_the_branch_is_said(served: Served, tmp_path: Path) -> None:
    repo, url, commits = _upstream(served, "offbranch")
    repo.checkout("side", create_at=commits[0])
    aside = repo.commit("only on side")
    unit = with_history(_unit(url, commits[0], aside), GitCache(tmp_path / "git"))
    _not_bisected(unit, "BAD's commit is not on branch main: its commits are not bisected")


@pytest.mark.gitdaemon
def test_a_branch_rewritten_onto_an_unrelated_history(served: Served, tmp_path: Path) -> None:
    repo, url, commits = _upstream(served, "unrelated")
    cache = GitCache(tmp_path / "git")
    _fetch_main(cache, url)  # GOOD's commits stay in the cache after the force-push
    git("checkout", "-q", "--orphan", "restart", cwd=repo.path)
    restart = repo.commit("a new root")
    repo.force_branch("main", restart)
    unit = with_history(_unit(url, commits[-1], restart), cache)
    note = "branch main was rewritten: GOOD's commit is not an ancestor of BAD's, and their histories share no commit"
    _not_bisected(unit, note)
    assert unit.rewrite == Rewrite(commits[-1], restart, None)


def _force_pushed(served: Served, name: str) -> tuple[str, str, str]:
    """main moved back to its first commit and on with a new one, the old ones collected: (URL, GOOD's
    commit, now gone upstream, BAD's)."""
    repo, url, commits = _upstream(served, name)
    repo.force_branch("main", commits[0])
    return url, commits[-1], repo.commit("after the force-push")


@pytest.mark.gitdaemon
def test_good_commit_gone_upstream_and_not_in_the_cache(served: Served, tmp_path: Path) -> None:
    url, good, bad = _force_pushed(served, "gone")
    unit = with_history(_unit(url, good, bad), GitCache(tmp_path / "git"))
    note = "branch main was rewritten: GOOD's commit is not an ancestor of BAD's, and it is gone upstream and not in the cache"
    _not_bisected(unit, note)
    assert unit.rewrite == Rewrite(good, bad, None)


@pytest.mark.gitdaemon
def test_good_commit_not_in_the_cache_offline(served: Served, tmp_path: Path) -> None:
    url, good, bad = _force_pushed(served, "gone-offline")
    cache = GitCache(tmp_path / "git")
    _fetch_main(cache, url)  # the rewritten branch only: BAD's history, not GOOD's commit
    unit = with_history(_unit(url, good, bad), cache, offline=True)
    note = "branch main was rewritten: GOOD's commit is not an ancestor of BAD's, and it is not in the cache (offline)"
    _not_bisected(unit, note)
    assert unit.rewrite == Rewrite(good, bad, None)


@pytest.mark.gitdaemon
def test_a_pin_moved_back_is_said(served: Served, tmp_path: Path) -> None:
    _, url, commits = _upstream(served, "back")
    unit = with_history(_unit(url, commits[-1], commits[0]), GitCache(tmp_path / "git"))
    _not_bisected(unit, "BAD's commit is an ancestor of GOOD's (the pin moved back): its commits are not bisected")
    assert unit.rewrite is None


@pytest.mark.gitdaemon
def test_a_pin_moved_to_another_branch_is_not_called_a_rewrite(served: Served, tmp_path: Path) -> None:
    repo, url, commits = _upstream(served, "rebranched")
    repo.checkout("release", create_at=commits[0])
    released = repo.commit("only on release")
    unit = with_history(_unit(url, released, commits[-1], good_ref="release"), GitCache(tmp_path / "git"))
    assert unit.note == (
        f"the pin moved from branch release to branch main: GOOD's commit {released} is not an ancestor of BAD's; "
        f"the commits after their merge base {commits[0]} are bisected, the merge base standing for GOOD's pin"
    )
    assert unit.commits == tuple(commits[1:]) and unit.rewrite == Rewrite(released, commits[-1], commits[0])
