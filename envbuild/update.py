"""`lock update`: move pins to what their refs name upstream now, and re-resolve the package closure."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from envbuild.errors import InputError
from envbuild.git.cache import GitCache
from envbuild.lock.model import Lock, Source
from envbuild.mirrors import Mirrors
from envbuild.resolve import resolve_packages
from envbuild.sources import resolve_ref

Progress = Callable[[str], None]


def update_lock(lock: Lock, names: Sequence[str], cache: GitCache, *, mirrors: Mirrors = Mirrors(),
                packages: bool | None = None, progress: Progress | None = None) -> Lock:
    """A new lock: the named sources (all when none are named) moved to their ref's current commit and
    tree, and, when no source was named (or ``packages`` is True), the package closure re-resolved."""
    known = {s.name for s in lock.sources}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"{unknown[0]}: no such source in lock {lock.name!r} (sources: {', '.join(sorted(known))})")
    selected = set(names) or known
    sources = tuple(_update_source(s, cache, mirrors, progress) if s.name in selected else s for s in lock.sources)
    updated = dataclasses.replace(lock, sources=sources)
    if packages if packages is not None else not names:
        if lock.requirements or lock.packages:
            updated = dataclasses.replace(updated, packages=resolve_packages(updated, progress=progress))
    return updated


def _update_source(source: Source, cache: GitCache, mirrors: Mirrors, progress: Progress | None) -> Source:
    if progress:
        progress(f"resolving {source.name} {source.ref_type} {source.ref}")
    resolved = resolve_ref(source, cache, mirrors=mirrors)
    return dataclasses.replace(source, ref_type=resolved.ref_type, commit=resolved.commit, tree=resolved.tree)
