"""Starting a lock: an empty one (`lock init`), and a source added to one by its repository and ref
(`lock add`), pinned by the same code `lock update` pins with (the ref's type, commit and tree from
upstream, the requirements and submodules read from the pinned tree)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from envbuild.errors import InputError, LockfileError
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.lock.io import dump_lock, parse_lock
from envbuild.lock.model import LOCK_VERSION, BaseImage, Install, Lock, Platform, Source
from envbuild.progress import Progress, silent
from envbuild.update.update import Moves, update_lock

UNPINNED = "0" * 40  # what a source's commit is until it is pinned: `lock update` accepts it too


def new_lock(
    name: str,
    *,
    platform: Platform | None = None,
    base_image: str | None = None,
    index: str | None = None,
    file: str = "<new lock>",
) -> Lock:
    """An empty lock, checked by the lock's reader (a bad name or platform is a LockfileError, exit 2)."""
    lock = Lock(
        version=LOCK_VERSION,
        name=name,
        sources=(),
        platform=platform,
        base_image=BaseImage(name=base_image) if base_image else None,
        index=index,
    )
    return parse_lock(dump_lock(lock), file)


def add_source(
    lock: Lock,
    name: str,
    repo: str,
    ref: str,
    cache: GitCache,
    *,
    install: Install | None = None,
    mirrors: Mirrors = Mirrors(),
    file: str = "<lock>",
    progress: Progress = silent,
) -> Lock:
    """``lock`` with source ``name`` added: ``repo`` at ``ref`` (a branch or a tag, as upstream says now),
    pinned and read as `lock update NAME` does. The new entry is checked by the lock's reader before
    anything is fetched."""
    if any(s.name == name for s in lock.sources):
        raise InputError(f"{file}: a source named {name!r} is already in the lock (`envbuild lock update` moves it)")
    source = Source(name=name, repo=repo, ref=ref, ref_type="branch", commit=UNPINNED, install=install or Install())
    candidate = dataclasses.replace(lock, sources=(*lock.sources, source))
    try:  # the name, the URL and the ref, as a lock may hold them
        parse_lock(dump_lock(candidate), file)
    except LockfileError as exc:
        raise InputError("\n".join(f"{file}: {p.field}: {p.message}" for p in exc.problems)) from None
    return update_lock(candidate, Moves(names=(name,), packages=False), cache, mirrors=mirrors, progress=progress)


def repo_url(repo: str) -> str:
    """``repo`` as the lock records it: a URL as given; a local repository (a directory, as git clone and
    vcstool take one) as its ``file://`` URL."""
    if "://" not in repo and ":" not in repo.split("/", 1)[0] and Path(repo).is_dir():
        return Path(repo).resolve().as_uri()
    return repo
