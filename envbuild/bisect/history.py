"""The commits a moved source passed over, read from the verify cache of bare repositories: what a bisect
tries between its two pins.

The branch's history is fetched as verify and update fetch it (commits only, :class:`~envbuild.git.upstream.Upstream`),
then listed from the cache: ``git rev-list --first-parent --reverse OLD..NEW`` (or every commit, parents
before children, with ``first_parent`` off). Only a source that stays in its repository on a branch is
bisected by commit: a commit between two tags is on no tag, so a candidate pinning it under the tag
would fail verify; such a unit, like one whose repository changed, is one state, and its note says why.

A branch rewritten between the locks (GOOD's commit is not an ancestor of BAD's: a force-push) is said,
and its commits are bisected from the merge base of the two, which stands for GOOD's pin in every
state (verify refuses GOOD's own commit, on the branch no more); GOOD's commit that upstream dropped
is looked for among every upstream ref, then in the cache, where an earlier verify or build left it.
"""

from __future__ import annotations

import dataclasses

from envbuild.bisect.steps import Rewrite, Unit
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError, ref_refspec
from envbuild.git.upstream import Offline, Upstream
from envbuild.lock.model import Source
from envbuild.progress import Progress, silent


def with_history(
    unit: Unit,
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    offline: bool = False,
    first_parent: bool = True,
    progress: Progress = silent,
) -> Unit:
    """``unit`` with its commits (a moved source on a branch), or with the note that says why not."""
    old, new = unit.before, unit.after
    if unit.kind != "source" or not isinstance(old, Source) or not isinstance(new, Source):
        return unit
    if old.commit == new.commit:
        return unit
    if old.repo != new.repo:
        return dataclasses.replace(unit, note="its repository changed: its commits are not bisected")
    if new.ref_type != "branch":
        return dataclasses.replace(
            unit,
            note=f"BAD pins tag {new.ref}: a commit between two tags is on no tag, so its commits are not bisected",
        )
    url = mirrors.rewrite(new.repo)
    up = Upstream(cache, url, offline=offline, progress=progress)
    try:
        present = up.commits([old.commit], need=[new.commit], refspecs=[ref_refspec("branch", new.ref)], name=new.name)
        if old.commit not in present and not offline:
            up.on_any_ref(old.commit, new.name)  # every upstream ref fetched: GOOD's commit may be on another
            present = cache.commit_trees(url, [old.commit, new.commit])
    except Offline:
        return dataclasses.replace(unit, note="its history is not in the cache (offline): its commits are not bisected")
    except GitError as exc:
        return dataclasses.replace(
            unit, note=f"its history cannot be read ({exc.reason}): its commits are not bisected"
        )
    if new.commit not in present:
        return dataclasses.replace(unit, note=f"BAD's commit is not on branch {new.ref}: its commits are not bisected")
    repo = cache.repo(url).path
    start: str | None = old.commit
    rewrite = None
    if old.commit not in present or cache.left_right(url, old.commit, new.commit)[0]:
        start = cache.git.merge_base(repo, old.commit, new.commit) if old.commit in present else None
        rewrite = Rewrite(old.commit, new.commit, start)
    # GOOD's commit off BAD's line after a change of ref is no sign of a force-push: say which happened.
    if (old.ref_type, old.ref) == ("branch", new.ref):
        moved = f"branch {new.ref} was rewritten"
    else:
        moved = f"the pin moved from {old.ref_type} {old.ref} to branch {new.ref}"
    if start is None:
        if old.commit in present:
            where = "their histories share no commit"
        else:
            where = "it is not in the cache (offline)" if offline else "it is gone upstream and not in the cache"
        note = f"{moved}: GOOD's commit is not an ancestor of BAD's, and {where}"
        return dataclasses.replace(unit, note=note, rewrite=rewrite)
    commits = tuple(cache.git.ancestry(repo, start, new.commit, first_parent=first_parent))
    if not commits:
        return dataclasses.replace(
            unit, note="BAD's commit is an ancestor of GOOD's (the pin moved back): its commits are not bisected"
        )
    trees = cache.commit_trees(url, [start, *commits])
    if rewrite is None:
        return dataclasses.replace(unit, commits=commits, trees=trees)
    note = (
        f"{moved}: GOOD's commit {old.commit} is not an ancestor of BAD's; the commits "
        f"after their merge base {start} are bisected, the merge base standing for GOOD's pin"
    )
    base = dataclasses.replace(new, commit=start, tree=trees[start])
    return dataclasses.replace(unit, before=base, commits=commits, trees=trees, note=note, rewrite=rewrite)
