"""A local cache of bare, partial-clone repositories: one per URL a lock names.

A repository fetched through a mirror (:meth:`envbuild.git.mirrors.Mirrors.rewrite` gives a
:class:`~envbuild.git.mirrors.MirroredURL`) lands in the entry of the URL the lock names: the cache holds
what is pinned, so ``--offline`` answers from it with or without the mirror rules. (A URL no mirror
rewrote keeps the key it always had, and an entry an older envbuild filled through a mirror sits under
the mirror's URL, read only for a lock that names that URL itself, whose content it is: no migration.)

Layout under ``root`` (``<cache_dir>/git``)::

    <slug>-<sha256(url)[:24]>.git/     the bare repository (commits and tags only where the server allows)
    <slug>-<sha256(url)[:24]>.flock    the lock that serialises fetches into it
    .tmp-*/                            repositories being created (renamed into place when complete)

Consistency rests on three rules. A repository appears only complete, by an atomic rename. Every
write (a fetch, a cleanup) happens under an ``fcntl.flock`` on the ``.flock`` file, which the kernel
releases when the holder dies, so a killed verify never blocks the next one; since all writers hold
it, any ``*.lock`` or temporary pack found under it was left by a killed git and is removed. Reads take
no lock: git publishes packs and refs atomically, and upstream refs live in their own namespace
(``refs/upstream/heads/*``, ``refs/upstream/tags/*``) that only fetches write.

The last ref listing is kept beside the objects (``envbuild-ls-remote``, replaced atomically) so
``--offline`` can answer from the refs the cache last saw. A listing may be begun before it is asked for
(:meth:`GitCache.begin_listings`: a build lists its upstreams while Python loads the rest of the builder);
it answers the first ask of its URL only, as that ask would have been answered then.

A fetch's git inherits the lock's descriptor, so a git that outlived a killed verify still holds the
lock and its files are never taken for stale. A write that fails for want of space (a fetch, the
listing, a new repository) removes what it left at once and is a :class:`CacheError` (``no space left
in the cache``), not an unreachable remote; a pack a killed fetch left on a full disk is cleared by the
next listing that needs its room.

A repository whose objects are damaged (a pack cut short, as an interrupted copy of the cache to another
machine leaves it; a loose object a lost write emptied) makes git answer every later fetch with ``object
… not found`` or ``did not send all necessary objects``: it believes it holds what it cannot read. So when
a fetch fails, the repository's packs and loose objects are checked (:func:`~envbuild.git.damage.damaged_objects`: each pack's
trailer against its index, each loose object inflated whole); a damaged repository is replaced, under the
lock, by an empty one (keeping its URL and listing) and the fetch is tried once more. It is a cache: what
it held is fetched again.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from envbuild.begun import Begun
from envbuild.errors import CacheError
from envbuild.fileio import write_atomic
from envbuild.git.damage import damaged_objects
from envbuild.git.process import IncomingTooLarge
from envbuild.git.remote import GitError, GitRunner, RefListing
from envbuild.lock.moves import LoggedCommit, Moved
from envbuild.locking import cache_fault, file_lock, held_lock, is_no_space

LISTING_FILE = "envbuild-ls-remote"
URL_FILE = "envbuild-url"
# Temporary repositories older than this belong to a dead process (creation takes milliseconds).
STALE_TMP_SECONDS = 3600.0


@dataclass(frozen=True)
class CachedRepo:
    url: str
    path: Path
    lock_path: Path

    def exists(self) -> bool:
        return (self.path / "config").is_file()


def cache_key(url: str) -> str:
    """A safe directory name: a readable slug of the URL's last component plus a hash of the whole URL
    (of the URL the lock names, for a URL rewritten to a mirror)."""
    url = getattr(url, "pinned", url)
    last = url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    last = last[:-4] if last.endswith(".git") else last
    slug = re.sub(r"[^a-z0-9._-]+", "-", last.lower()).strip(".-")[:40] or "repo"
    return f"{slug}-{hashlib.sha256(url.encode('utf-8')).hexdigest()[:24]}"


class GitCache:
    """Bare repositories keyed by URL. Thread- and process-safe; see the module docstring."""

    def __init__(self, root: Path, *, git: GitRunner | None = None) -> None:
        self.root = Path(root)
        self.git = git or GitRunner()
        self._begun: Begun[str, RefListing] = Begun("envbuild-refs")

    def repo(self, url: str) -> CachedRepo:
        key = cache_key(url)
        return CachedRepo(url, self.root / f"{key}.git", self.root / f"{key}.flock")

    def ensure(self, url: str) -> CachedRepo:
        """The repository for ``url``, created (atomically) if absent."""
        repo = self.repo(url)
        if repo.exists():
            return repo
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_stale_tmp()
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{repo.path.stem}-", dir=self.root))
        except OSError as exc:
            raise cache_fault(self.root, exc) from None
        try:
            self.git.init_bare(tmp)
            (tmp / URL_FILE).write_text(getattr(url, "pinned", url) + "\n", encoding="utf-8")
        except (GitError, OSError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise self.cache_error(exc) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            Path(tmp).rename(repo.path)
        except OSError:
            # Another process created it first (rename onto a non-empty directory fails): use theirs.
            shutil.rmtree(tmp, ignore_errors=True)
            if not repo.exists():
                raise CacheError(f"{repo.path}: cannot create the cache repository") from None
        return repo

    @contextmanager
    def locked(self, url: str) -> Iterator[CachedRepo]:
        """Hold the repository's write lock; on entry, clear what a killed git left behind."""
        with self.held(url) as (repo, _):
            yield repo

    @contextmanager
    def held(self, url: str, waiting: Callable[[], None] | None = None) -> Iterator[tuple[CachedRepo, int]]:
        """:meth:`locked`, yielding ``(repo, fd)``: pass ``fd`` as ``hold`` to a git that writes into the
        repository, so the lock stays held as long as that git (or a helper of it) lives. ``waiting``: as
        :func:`~envbuild.locking.held_lock` says (called when another process held the lock first)."""
        repo = self.ensure(url)
        with held_lock(repo.lock_path, waiting=waiting) as fd:
            assert fd is not None  # a blocking lock is always held
            remove_stale_files(repo.path)
            yield repo, fd

    def renewed_if_damaged(self, repo: CachedRepo) -> bool:
        """Under ``repo``'s lock: when its objects are damaged (:func:`damaged_objects`), put an empty
        repository in its place, with its URL and last listing, and say True (the caller fetches again)."""
        if not damaged_objects(repo.path):
            return False
        try:
            fresh = Path(tempfile.mkdtemp(prefix=f".tmp-{repo.path.stem}-", dir=self.root))
            self.git.init_bare(fresh)
            for name in (URL_FILE, LISTING_FILE):
                if (repo.path / name).is_file():
                    shutil.copyfile(repo.path / name, fresh / name)
            broken = Path(tempfile.mkdtemp(prefix=f".tmp-{repo.path.stem}-damaged-", dir=self.root))
            repo.path.rename(broken / "repository")
            fresh.rename(repo.path)
        except (GitError, OSError) as exc:
            raise self.cache_error(exc) from None
        shutil.rmtree(broken, ignore_errors=True)
        return True

    def cache_error(self, exc: GitError | OSError) -> Exception:
        """A failed write into the cache as the user should see it: a full disk is the cache's fault
        (:class:`CacheError`, one line), any other git failure stays what it was."""
        if isinstance(exc, OSError):
            return cache_fault(self.root, exc)
        return CacheError(f"no space left in the cache ({self.root})") if exc.no_space else exc

    # -- refs ----------------------------------------------------------------------------------

    def begin_listings(self, urls: Iterable[str], jobs: int) -> None:
        """:meth:`list_refs` of each of ``urls`` begun now, ``jobs`` at a time (:class:`.Begun`): the next
        :meth:`list_refs` of a URL waits for its begun listing and answers with it (or its error), once; a
        later ask lists again."""
        self._begun.begin({url: functools.partial(self._list_refs, url) for url in urls}, jobs)

    def list_refs(self, url: str) -> RefListing:
        """One ``git ls-remote`` (or the one :meth:`begin_listings` began); the answer is also kept for
        ``--offline``."""
        begun = self._begun.take(url)
        return begun.result() if begun is not None else self._list_refs(url)

    def _list_refs(self, url: str) -> RefListing:
        repo = self.ensure(url)
        listing = self.git.ls_remote(repo.path, url)
        raw = listing.raw.encode("utf-8", "surrogateescape")  # the bytes git printed, UTF-8 or not
        try:
            write_atomic(repo.path / LISTING_FILE, raw)
        except OSError as exc:
            # A pack a killed fetch left may hold the space: clear it, unless a fetch is running, and retry.
            if not is_no_space(exc):
                raise cache_fault(self.root, exc) from None
            with file_lock(repo.lock_path, blocking=False) as held:
                if not (held and remove_stale_files(repo.path)):
                    raise cache_fault(self.root, exc) from None
                try:
                    write_atomic(repo.path / LISTING_FILE, raw)
                except OSError as again:
                    raise cache_fault(self.root, again) from None
        return listing

    def cached_listing(self, url: str) -> RefListing | None:
        try:
            path = self.repo(url).path / LISTING_FILE
            return RefListing.parse(path.read_text(encoding="utf-8", errors="surrogateescape"))
        except OSError:
            return None

    def namespace_refs(self, url: str) -> dict[str, str]:
        repo = self.repo(url)
        return self.git.namespace_refs(repo.path) if repo.exists() else {}

    # -- objects -------------------------------------------------------------------------------

    def commit_trees(self, url: str, shas: Iterable[str]) -> dict[str, str]:
        """{commit: tree} for the commits of ``shas`` the cache holds (no network)."""
        repo = self.repo(url)
        return self.git.commit_trees(repo.path, shas) if repo.exists() else {}

    def fetch(
        self,
        url: str,
        refspecs: Sequence[str],
        *,
        wanted: Iterable[str] = (),
        prune: bool = False,
        fresh: dict[str, str] | None = None,
    ) -> bool | None:
        """Fetch ``refspecs`` under the lock. Skipped (returns None) when, once the lock is held, every
        ``wanted`` commit is already present (another verify fetched it meanwhile) or the upstream
        namespace already equals ``fresh``. Otherwise returns whether the server honoured the filter."""
        wanted = set(wanted)
        with self.held(url) as (repo, fd):
            if fresh is not None and self.git.namespace_refs(repo.path) == fresh:
                return None
            if wanted and wanted <= set(self.git.commit_trees(repo.path, wanted)):
                return None
            for attempt in (1, 2):
                try:
                    with refused_packs_removed(repo.path):
                        return self.git.fetch(repo.path, url, refspecs, prune=prune, hold=fd)
                except GitError as exc:
                    remove_stale_files(repo.path)  # what the failed git left: a partial pack may fill the disk
                    if attempt == 1 and self.renewed_if_damaged(repo):
                        continue
                    raise self.cache_error(exc) from None
            raise AssertionError("unreachable")  # pragma: no cover

    def fetch_objects(
        self, url: str, commit: str, oids: Iterable[str], *, trees: bool = False, max_bytes: int | None = None
    ) -> bool:
        """Fetch exactly the objects of ``oids`` (trees and blobs of ``commit``'s tree) the cache lacks, under
        the lock; False when, once the lock is held, every one is there (another process fetched them).
        ``trees``: with every tree below the wanted ones too (no blobs), even when a wanted one is present."""
        oids = set(oids)
        with self.held(url) as (repo, fd):
            missing = oids if trees else oids - self.git.present_objects(repo.path, commit)
            if not missing:
                return False
            try:
                with refused_packs_removed(repo.path):
                    self.git.fetch_objects(
                        repo.path, url, sorted(missing), hold=(fd,), trees=trees, max_bytes=max_bytes
                    )
            except IncomingTooLarge:
                remove_stale_files(repo.path)
                raise
            except GitError as exc:
                remove_stale_files(repo.path)
                # A damaged repository: the objects are fetched into a new one by the next fetch of the commit.
                self.renewed_if_damaged(repo)
                raise self.cache_error(exc) from None
            return True

    def present_objects(self, url: str, commit: str) -> set[str]:
        repo = self.repo(url)
        return self.git.present_objects(repo.path, commit) if repo.exists() else set()

    def left_right(self, url: str, commit: str, head: str) -> tuple[int, int]:
        return self.git.left_right(self.repo(url).path, commit, head)

    def reachable_from_any(self, url: str, commit: str, tips: Iterable[str]) -> bool:
        return self.git.reachable_from_any(self.repo(url).path, commit, tips)

    def commit_range(self, url: str, old: str, new: str) -> Moved | None:
        """What ``new`` brings over ``old``, from the cache alone, in four gits however long the range: the
        commits (all, first-parent, and those of ``old``'s history ``new`` lacks: none exactly when ``old``
        is an ancestor of ``new``), and the oldest and newest of the first-parent line with their subjects
        and author dates. An ``old`` the cache lacks is no ancestor of ``new``, whose history the cache holds
        whole (commits are never filtered out): only that and ``new`` are said. None without ``new``."""
        held = self.commit_trees(url, [old, new])
        if new not in held:
            return None
        path = self.repo(url).path
        try:
            if old not in held:
                return Moved(ancestor=False, last=_logged(self.git.logged_commits(path, [new]), new))
            dropped, count = self.git.left_right(path, old, new)
            line = self.git.ancestry(path, old, new)  # first-parent, oldest first
            logged = self.git.logged_commits(path, [line[0], line[-1]]) if line else {}
        except GitError:
            return None
        first, last = (_logged(logged, line[0]), _logged(logged, line[-1])) if line else (None, None)
        return Moved(
            commits=count, first_parent=len(line), dropped=dropped, ancestor=dropped == 0, first=first, last=last
        )

    def _remove_stale_tmp(self) -> None:
        for entry in self.root.glob(".tmp-*"):
            if _stale(entry):
                shutil.rmtree(entry, ignore_errors=True)


def _logged(logged: dict[str, tuple[str, str]], commit: str) -> LoggedCommit | None:
    if commit not in logged:
        return None
    date, subject = logged[commit]
    return LoggedCommit(commit, subject, date)


def remove_stale_files(repo: Path) -> list[Path]:
    """Remove what a killed git leaves in a bare repository. Call only under the repository's lock:
    then no git of ours is writing, so every one of these is stale."""
    removed: list[Path] = []
    objects = repo / "objects"
    for dirpath, dirnames, filenames in os.walk(repo):
        here = Path(dirpath)
        # git's temporary objects and quarantines are only ever under objects/: under refs/, a branch may be
        # named tmp_ci or incoming-fix/x (a ref name cannot end in .lock, so that rule holds everywhere).
        in_objects = here == objects or objects in here.parents
        for name in filenames:
            # *.lock: ref, packed-refs, config and shallow locks; tmp_*: half-received packs and
            # indexes; pack-*.keep: index-pack's marker, left when fetch died before updating refs.
            if (
                name.endswith(".lock")
                or (in_objects and name.startswith("tmp_"))
                or (in_objects and name.startswith("pack-") and name.endswith(".keep"))
                or _old_listing_temporary(here / name)
            ):
                _unlink(here / name, removed)
        for name in list(dirnames):
            if in_objects and name.startswith(("incoming-", "tmp_objdir-")):  # fetch quarantine directories
                shutil.rmtree(here / name, ignore_errors=True)
                removed.append(here / name)
                dirnames.remove(name)
    return removed


def _pack_names(repo: Path) -> set[str]:
    """The packs of a bare repository, by file name (``pack-*.pack``)."""
    return {path.name for path in (repo / "objects" / "pack").glob("pack-*.pack")}


@contextmanager
def refused_packs_removed(repo: Path) -> Iterator[None]:
    """Around a fetch into ``repo``, under its lock: when git's object checks refuse what the fetch sent
    (:attr:`GitError.malformed`), every file of each pack it added is removed. git runs some checks (a
    ``.gitmodules`` that is not a file) only once the pack is written, then fails the fetch before any ref
    moves but leaves the pack, whose objects the next read or fetch would take unchecked. Only after such a
    refusal: another failure may come after refs moved onto the pack's objects."""
    before = _pack_names(repo)
    try:
        yield
    except GitError as exc:
        if exc.malformed:
            for name in _pack_names(repo) - before:
                for path in (repo / "objects" / "pack").glob(f"{name.removesuffix('.pack')}.*"):
                    path.unlink(missing_ok=True)
        raise


def _old_listing_temporary(path: Path) -> bool:
    """A listing's temporary file that a killed write left. Listings are written without the lock, so
    only age tells a dead writer's file from a live one's (a write takes milliseconds)."""
    return path.name.startswith(f".{LISTING_FILE}.") and path.name.endswith(".tmp") and _stale(path)


def _stale(path: Path) -> bool:
    """Older than :data:`STALE_TMP_SECONDS` (False when it is gone)."""
    try:
        return time.time() - path.stat().st_mtime > STALE_TMP_SECONDS
    except OSError:
        return False


def _unlink(path: Path, removed: list[Path]) -> None:
    try:
        path.unlink()
        removed.append(path)
    except FileNotFoundError:
        pass
