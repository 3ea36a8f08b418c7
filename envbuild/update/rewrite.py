"""`lock update` on a lock file: the update, its change report, and the new text written over the old.

The new text keeps the file's comments and layout where it can (:mod:`envbuild.lock.roundtrip`), and it is
checked by the lock's own reader before anything is replaced (:func:`.roundtrip.text_over`), on a dry run too:
a dry run shows what a real run would write, refusal included."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envbuild.fileio import write_atomic
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.lock.diff import Change, render_markdown
from envbuild.lock.io import LockFile, replace_lock_file
from envbuild.lock.model import Lock
from envbuild.lock.roundtrip import text_over
from envbuild.progress import Progress, silent
from envbuild.update.report import change_report
from envbuild.update.update import Moves, update_lock


@dataclass(frozen=True)
class LockUpdate:
    """What ``lock update`` made of a lock file: the new lock, its changes from the old one, whether the
    file's comments and layout were kept (False: its new text is the canonical form), and whether it was
    written."""

    lock: Lock
    changes: list[Change]
    layout_kept: bool
    written: bool  # the file was replaced: its text changed (pins moved, or an older version rewritten)


def update_lock_file(
    read: LockFile,
    moves: Moves,
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    jobs: int = 8,
    report: Path | None = None,
    dry_run: bool = False,
    progress: Progress = silent,
) -> LockUpdate:
    """:func:`update_lock` on the lock at ``read.path``, the change report written to ``report`` (Markdown,
    on a dry run too), and the new text written over the file unless ``dry_run``; ``jobs`` package pages
    listed at once. Raises :class:`~envbuild.lock.io.LockWriteRefused` when the lock's reader would refuse
    the new text, or the file changed since ``read`` (another update ran meanwhile): then nothing is
    written, the report neither."""
    new = update_lock(read.lock, moves, cache, mirrors=mirrors, jobs=jobs, progress=progress)
    changes = change_report(read.lock, new, cache, mirrors=mirrors)
    text, kept, changed = text_over(read, new)  # nothing at all changed: the file's own text, however written
    # Before the lock: a failed report leaves the lock as it was, never a lock moved with no report.
    if report is not None:
        write_atomic(report, render_markdown(changes, f"envbuild lock update: {read.path}"))
    written = not dry_run and changed
    if written:
        replace_lock_file(read, text)
    return LockUpdate(new, changes, kept, written)
