"""Source trees exported once and kept, ``<cache_dir>/image/trees/``: what every build of a commit reads.

A build context holds each source's exact tree; exporting it (``git archive``, written without
following links, its tree hash checked) and copying it into the docker CLI's sync directory read every
file three to four times per build: 1.2 s for a tree of 4,000 files and 55 MB, the size of Megatron-LM
at ``core_v0.18.0`` (2,749 files, 55 MB), which the real lock holds twice (itself, and inside
Megatron-Bridge). A kept tree is made once per commit (and submodule commits) and linked from then on:

- ``<key>/`` holds the source's files as a context holds them: directories and executables 0755, other
  files 0644, the commit in ``.envbuild-commit``, and every file's mtime made from its sha256
  (:func:`~envbuild.fileio.content_mtime_ns`), so the sync directory hard-links the files and the
  CLI sends only those whose content changed. No mtime here reaches a layer (every ``RUN`` sets its own).
- ``<key>.json``: what the export checked (the tree of the written files, each submodule's, the file
  list for the in-image check); written before ``<key>/`` is renamed into place, so a kept tree is
  complete or absent. ``key`` hashes the commit and each submodule written (path, commit).

Every build still compares what was checked with the lock's pins (a lock may pin a wrong tree), and the
in-image check recomputes every tree inside the image, so a kept tree changed on disk fails that check
(and is dropped, :meth:`TreeStore.forget`). A kept tree unused for :data:`KEEP_UNUSED` (its record's
mtime says when a build last read it) goes after a build
(:func:`prune`), unless another build holds the store (a shared ``flock`` on ``trees/.lock`` while a
build reads kept trees; pruning takes it exclusively, without waiting). Two builds making one kept tree
at once each export into a scratch directory of their own; the second rename finds the first's in place
and its scratch goes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import EnvbuildError
from envbuild.fileio import content_mtime_ns, settle_tree, sha256_file, write_atomic
from envbuild.git import treehash
from envbuild.image.inimage_probe import COMMIT_MARKER  # the commit, for people; the check recomputes trees
from envbuild.image.plan import SourcePlan
from envbuild.lock.model import Source
from envbuild.locking import file_lock

FORMAT = 1  # what a kept tree holds and how; a change makes every key new
KEEP_UNUSED = 14 * 86400  # seconds: a kept tree no build used for this long is removed
DIR_MTIME = 315532800  # every directory's (1980-01-01): no mtime here reaches a layer
_SCRATCH = ".scratch-"

ExportSource = Callable[[Source, Path], None]


class StoreError(EnvbuildError):
    """A source's tree cannot be exported and kept (the message names the source)."""


@dataclass(frozen=True)
class KeptTree:
    """A source's exported files and what the export found: the tree of the written files, each written
    submodule's ({path: tree}), every file (for the in-image check), entries that are not files."""

    path: Path
    tree: str
    submodule_trees: dict[str, str]
    files: tuple[str, ...]
    unreadable: tuple[str, ...]


def tree_key(source: SourcePlan) -> str:
    """What a kept tree's files are made of: the commit and every submodule written, by path."""
    written = sorted((s.path, s.commit or "") for s in source.submodules if s.skip is None)
    return hashlib.sha256(json.dumps([FORMAT, source.commit, written]).encode()).hexdigest()[:32]


class TreeStore:
    def __init__(self, cache_dir: Path) -> None:
        self.root = Path(cache_dir) / "image" / "trees"

    def kept(self, source: SourcePlan, export: ExportSource) -> KeptTree:
        """The source's kept tree, exported (and kept) first when there is none."""
        key = tree_key(source)
        found = self._read(key)
        if found is not None:
            os.utime(self.root / f"{key}.json")  # used (its record's mtime): pruning keeps it
            return found
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{_SCRATCH}{key}-", dir=self.root))
        try:
            files = scratch / "files"
            files.mkdir()
            try:
                export(source.source, files)
            except EnvbuildError as exc:  # the export names the source
                what = str(exc) if str(exc).startswith("source ") else f"source {source.name}: {exc}"
                raise StoreError(what) from None
            record = _checked(source, files)
            (files / COMMIT_MARKER).write_text(source.commit + "\n", encoding="ascii")
            _settle(files)
            write_atomic(self.root / f"{key}.json", json.dumps(record, sort_keys=True))
            try:
                files.rename(self.root / key)
            except OSError:  # another build kept it first: theirs is the same files
                if self._read(key) is None:
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        kept = self._read(key)
        if kept is None:
            raise StoreError(f"source {source.name}: {self.root / key} went while this build made it; build again")
        return kept

    def _read(self, key: str) -> KeptTree | None:
        path = self.root / key
        try:
            record = json.loads((self.root / f"{key}.json").read_text(encoding="utf-8"))
            if not path.is_dir():
                return None
            return KeptTree(
                path,
                str(record["tree"]),
                {str(k): str(v) for k, v in record["submodule_trees"].items()},
                tuple(str(f) for f in record["files"]),
                tuple(str(f) for f in record["unreadable"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def forget(self, source: SourcePlan) -> None:
        """Drop a source's kept tree (the in-image check found other files in the image): the next build
        exports it again."""
        key = tree_key(source)
        (self.root / f"{key}.json").unlink(missing_ok=True)
        shutil.rmtree(self.root / key, ignore_errors=True)

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """Held (shared) while a build reads kept trees: pruning waits for no one and skips a busy store."""
        self.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.root / ".lock", shared=True):
            yield

    def prune(self, keep: set[str], now: float | None = None) -> int:
        """Remove the kept trees no build used for :data:`KEEP_UNUSED` but those in ``keep`` (keys), and
        the scratch a killed build left; the number removed. Nothing when another build holds the store."""
        if not self.root.is_dir():
            return 0
        now = time.time() if now is None else now
        removed = 0
        with file_lock(self.root / ".lock", blocking=False) as held:
            if not held:
                return 0
            for path in self.root.iterdir():
                name = path.name
                if name.startswith(_SCRATCH):  # a killed build's: no build holds the store now
                    shutil.rmtree(path, ignore_errors=True)
                elif path.is_dir() and name not in keep and now - _last_used(path) > KEEP_UNUSED:
                    (self.root / f"{name}.json").unlink(missing_ok=True)
                    shutil.rmtree(path, ignore_errors=True)
                    removed += 1
        return removed


def _last_used(path: Path) -> float:
    """When a build last used a kept tree: its record's mtime (the tree's own stays fixed); a tree without
    its record is no kept tree: never used."""
    try:
        return path.with_name(f"{path.name}.json").stat().st_mtime
    except OSError:
        return 0.0


def _checked(source: SourcePlan, files: Path) -> dict[str, object]:
    """What the written files are: the trees (source and each written submodule), the file list."""
    listed = treehash.list_files(str(files))
    gitlinks = {sub.path: sub.commit for sub in source.submodules if sub.commit is not None}
    written = {sub.path for sub in source.submodules if sub.skip is None}
    found, unreadable = treehash.git_trees(str(files), listed, gitlinks, written)
    return {
        "tree": found[""],
        "submodule_trees": {p: t for p, t in found.items() if p},
        "files": listed,
        "unreadable": unreadable,
    }


def _settle(root: Path) -> None:
    """Fixed modes (0755 directories and executables, 0644 other files) and mtimes: each file's from its
    content, every directory's :data:`DIR_MTIME`."""
    settle_tree(root, dir_ns=DIR_MTIME * 10**9, file_ns=lambda path: content_mtime_ns(bytes.fromhex(sha256_file(path))))
