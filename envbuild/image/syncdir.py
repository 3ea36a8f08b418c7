"""A build context as a stable directory, for the docker CLI's session transport (:mod:`envbuild.engine.cli_build`).

``<cache>/image/contexts/<lock name>/packages`` and ``…/image`` hold the entries :mod:`.stream` makes for
the two builds of a lock, kept from one build of the lock to the next, so that the CLI's file sync sends
only what changed since (the CLI keys what the engine kept by the directory's path). Written only while
the build holds the lock name's lock (:func:`envbuild.image.buildcache.lock_name_held`), so two builds
of one lock never write one directory at once; every file is put in place by a rename, so an
interrupted build leaves each file whole, old or new, and the next build brings the rest up to date.

The file sync compares a file's size and mtime with what it sent last time, never its content, so the
directory's mtimes are not the tar's fixed ones (a same-size edit at the same epoch would not be sent,
and the build would use the old file: measured): each file's mtime is made from its content's identity
(:attr:`Entry.identity`: a package file's sha256, a source's pin), the same content always the same
time, other content another. No mtime of the context reaches a layer either way (every RUN that reads
the context sets the times of what it writes), so the image is the same bytes through both
transports (tested). Package files are hard links into the file cache (read-only, named by their
sha256), so their mtime is the cache file's: the assembly of a scratch context sets it to the epoch, and
bringing this directory up to date sets it back from the sha256, which the file sync then finds as it
was.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from envbuild.engine.transfer import SyncedContext
from envbuild.image.stream import Entry, complete, stream

STAMP_BASE = 315_532_800 * 10**9  # 1980-01-01, in ns: mtimes made from identities start here
STAMP_SPAN = 10**17  # ns (about three years) they spread over


def stable_context_dir(cache_dir: Path, lock_name: str) -> Path:
    """Where the lock name's build contexts stay between builds."""
    return cache_dir / "image" / "contexts" / lock_name


def stamp(identity: str) -> int:
    """The mtime (ns) of a file whose content is ``identity`` (a hex digest)."""
    return STAMP_BASE + int(identity[:16], 16) % STAMP_SPAN


@dataclass(frozen=True)
class Synced:
    written: int  # files (and links) put in place
    kept: int  # files (and links) already as they should be
    removed: int  # entries that were there and are not in the context


def synced_context(entries: list[Entry], directory: Path) -> SyncedContext:
    """The entries for either transport: a tar, or ``directory`` brought up to date."""

    def bring_up_to_date() -> Path:
        sync_directory(entries, directory)
        return directory

    return SyncedContext(lambda: stream(entries), bring_up_to_date, sum(e.size for e in entries))


def sync_directory(entries: list[Entry], dest: Path) -> Synced:
    """Make ``dest`` hold exactly ``entries`` (and their parent directories), each file's mtime made from
    its identity; what is already so is left alone."""
    wanted = {e.name: e for e in complete(entries)}
    staging = dest.with_name(dest.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted build left half-written
    dest.mkdir(parents=True, exist_ok=True)
    removed = _remove_unwanted(dest, wanted)
    staging.mkdir()
    written = kept = 0
    try:
        for name, entry in wanted.items():  # sorted: a directory before what is in it
            path = dest / name
            if entry.kind == "dir":
                path.mkdir(exist_ok=True)
                path.chmod(entry.mode)
            elif _is_current(path, entry):
                kept += 1
            else:
                _put(entry, path, staging / str(written))
                written += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    dest.chmod(0o755)
    return Synced(written, kept, removed)


def _identity(entry: Entry) -> str:
    if not entry.identity:
        raise ValueError(f"{entry.name}: an entry of a synced context needs its content's identity")
    return entry.identity


def _is_current(path: Path, entry: Entry) -> bool:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    if info.st_mtime_ns != stamp(_identity(entry)):
        return False
    if entry.kind == "symlink":
        return stat.S_ISLNK(info.st_mode) and str(path.readlink()) == entry.target
    return stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == entry.mode and info.st_size == entry.size


def _put(entry: Entry, path: Path, staged: Path) -> None:
    """Write the entry at ``staged`` (same file system), set its mode and mtime, rename it into place."""
    if entry.kind == "symlink":
        staged.symlink_to(entry.target)
    elif entry.data is not None:
        staged.write_bytes(entry.data)
    else:
        assert entry.path is not None
        try:
            os.link(entry.path, staged)  # a package file of the cache, a source file of the scratch export
        except OSError:
            shutil.copyfile(entry.path, staged)
    if entry.kind != "symlink":
        staged.chmod(entry.mode)
    when = stamp(_identity(entry))
    os.utime(staged, ns=(when, when), follow_symlinks=False)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    staged.replace(path)


def _remove_unwanted(dest: Path, wanted: dict[str, Entry]) -> int:
    """Remove what is under ``dest`` and not an entry of that kind; how many entries went."""
    removed = 0
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            entry = wanted.get(path.relative_to(dest).as_posix())
            info = path.lstat()
            kind = "symlink" if stat.S_ISLNK(info.st_mode) else "dir" if stat.S_ISDIR(info.st_mode) else "file"
            if entry is not None and entry.kind == kind:
                continue
            removed += 1
            if kind == "dir":
                shutil.rmtree(path)
                dirnames.remove(name)
            else:
                path.unlink()
    return removed
