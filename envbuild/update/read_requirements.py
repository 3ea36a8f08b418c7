"""`lock update`'s reading of each source's declared requirements from its pinned tree, into its lock entry.

The files come through the verify cache (:class:`envbuild.git.files.PinnedTree`: only the objects read
are fetched), the reading is :func:`envbuild.update.declared.read_declared` (no upstream code runs).
A tree that cannot be read leaves the source's requirements unknown, with the reason, unless the lock
already records them for this very commit: then they stay, and a warning says why they were not re-read.
"""

from __future__ import annotations

import dataclasses

from envbuild.errors import RemoteError
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.lock.model import Source, check_source_requirement
from envbuild.progress import Progress, silent
from envbuild.update.declared import Declared, read_declared
from envbuild.update.read_submodules import reason_text, source_tree

_READ = ("provides", "build_requires", "requires", "requires_unknown")  # what is read into a source's entry


def read_source_requirements(
    source: Source,
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    previous: Source | None = None,
    progress: Progress = silent,
) -> Source:
    """``source`` with ``provides``, ``build_requires``, ``requires`` and ``requires_unknown`` read from
    its pinned tree. ``previous`` is the entry before the update (kept when the tree cannot be read and
    the commit did not move). A source the build does not install (``install: none``) is left as it is."""
    if not source.installed:
        return source
    try:
        declared = read_declared(source_tree(source, cache, mirrors).read, source.requires_files)
    except RemoteError as exc:
        if previous is not None and previous.commit == source.commit and _recorded(previous):
            progress(
                f"warning: {source.name}: requirements kept as recorded for {source.commit[:12]}; cannot re-read: {exc}"
            )
            return dataclasses.replace(source, **{key: getattr(previous, key) for key in _READ})
        declared = Declared(None, None, None, f"the pinned tree cannot be read: {exc}")
    for note in declared.notes:
        progress(f"{source.name}: {note}")
    declared = _checked(declared)
    if declared.unknown:
        progress(f"warning: {source.name}: {declared.unknown}")
    counts = [
        f"{len(v)} {k}"
        for k, v in (("build", declared.build_requires), ("runtime", declared.requires))
        if v is not None
    ]
    if counts:
        progress(f"{source.name}: read {' and '.join(counts)} requirement(s) from {source.commit[:12]}")
    return dataclasses.replace(
        source,
        provides=declared.provides or (previous.provides if previous is not None else source.provides),
        build_requires=declared.build_requires,
        requires=declared.requires,
        requires_unknown=None if declared.unknown is None else reason_text(declared.unknown),
    )


def _checked(declared: Declared) -> Declared:
    """What the lock's reader would refuse (a requirement over its length limit) is not recorded."""
    problems = [
        f"{text!r}: {problem}"
        for text in (*(declared.build_requires or ()), *(declared.requires or ()))
        if (problem := check_source_requirement(text)) is not None
    ]
    if not problems:
        return declared
    return Declared(declared.provides, None, None, f"unrecordable requirements: {'; '.join(problems)}", declared.notes)


def _recorded(source: Source) -> bool:
    return source.requires is not None or source.build_requires is not None
