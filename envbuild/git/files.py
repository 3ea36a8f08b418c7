"""Read a few files of a pinned commit through the verify cache, fetching only what is read.

The verify cache holds commits only (``--filter=tree:0``). Reading ``pyproject.toml`` of a pinned commit
fetches the commit's root tree (one object) and then the file's blob (one object); a file deeper down
costs one tree object per directory on its path. Objects are asked for by ID (protocol v2 serves a want
by ID, as a lazy fetch from a promisor remote does), all the paths of one call at once, one fetch per
directory depth, under the repository's lock (:meth:`GitCache.fetch_objects`). Nothing else of the tree
is fetched: reading two files of a repository whose blobs weigh gigabytes moves kilobytes, and a server
that lost some large blobs (a partial snapshot) still answers for the files that are there.

Reads never fetch behind our back: what the cache holds is found by walking the trees it holds
(``rev-list --missing=print``, which never fetches), and what it lacks is fetched explicitly, with the
real URL given to that one command. ``offline``: nothing is fetched; what the cache lacks raises
:class:`NotCached`.

Submodules: :meth:`PinnedTree.gitlinks` needs every tree of the commit (one fetch of the trees, no
blob: a few MB for a large repository), :meth:`PinnedTree.gitmodules` reads ``.gitmodules`` as git
reads it, and :meth:`PinnedTree.entry` the entry at one path (the trees on its way).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from envbuild.git.cache import GitCache
from envbuild.git.process import IncomingTooLarge
from envbuild.git.remote import GitError, TreeEntry

MAX_FILE = 1 << 20  # a pyproject.toml or a requirements file; anything larger is not one
# What a pack may add to a blob's bytes: headers, and zlib's few bytes per 16 KiB of data it cannot shrink.
PACK_SLACK = 64 << 10
READ_NS = "refs/envbuild/read/"
OFFLINE_MISS = "offline and not in cache"


class NotCached(GitError):
    """Offline, and the cache lacks an object the read needs."""

    def __init__(self) -> None:
        super().__init__("fetch", OFFLINE_MISS)


@dataclass(frozen=True)
class TreeFile:
    """One path of the pinned tree: its bytes, or why there are none (``absent``, ``a symbolic link``…)."""

    path: str
    data: bytes | None
    problem: str | None = None


class PinnedTree:
    """The files of ``commit`` of the repository at ``url`` (already mirror-rewritten), read through ``cache``.

    ``refspec`` is fetched when the server will not send the commit by ID (it names the ref the commit is
    pinned on, as verify fetches it)."""

    def __init__(
        self,
        cache: GitCache,
        url: str,
        commit: str,
        *,
        refspec: str | None = None,
        offline: bool = False,
    ) -> None:
        self.cache, self.url, self.commit, self.refspec, self.max_size = cache, url, commit, refspec, MAX_FILE
        self.offline = offline
        self._repo = cache.repo(url).path
        self._root: str | None = None
        self._listed: dict[str, list[TreeEntry]] = {}

    def root(self) -> str:
        """The commit's tree, fetching the commit (commits only) when the cache lacks it."""
        if self._root is None:
            trees = self.cache.commit_trees(self.url, [self.commit])
            if self.commit not in trees:
                if self.offline:
                    raise NotCached()
                try:
                    self.cache.fetch(self.url, [f"+{self.commit}:{READ_NS}{self.commit}"], wanted=[self.commit])
                except GitError:
                    if self.refspec is None:
                        raise
                    self.cache.fetch(self.url, [self.refspec], wanted=[self.commit])
                trees = self.cache.commit_trees(self.url, [self.commit])
            if self.commit not in trees:
                where = f" (neither by ID nor with {self.refspec.split(':')[0].lstrip('+')})" if self.refspec else ""
                raise GitError("fetch", f"the upstream repository does not hold commit {self.commit}{where}")
            self._root = trees[self.commit]
        return self._root

    def read(self, paths: Sequence[str]) -> dict[str, TreeFile]:
        """Each of ``paths`` ('/'-separated, relative to the tree's root) with its bytes or its problem."""
        results: dict[str, TreeFile] = {}
        blobs: dict[str, str] = {}
        frontier = {path: (self.root(), path.split("/")) for path in dict.fromkeys(paths)}
        while frontier:
            self._list(tree for tree, _ in frontier.values())
            deeper: dict[str, tuple[str, list[str]]] = {}
            for path, (tree, parts) in frontier.items():
                entry = next((e for e in self._listed[tree] if e.name == parts[0]), None)
                if entry is None or (len(parts) > 1 and entry.kind != "tree"):
                    results[path] = TreeFile(path, None, "absent")
                elif len(parts) > 1:
                    deeper[path] = (entry.oid, parts[1:])
                elif entry.kind == "tree":
                    results[path] = TreeFile(path, None, "a directory")
                elif entry.kind != "blob":
                    results[path] = TreeFile(path, None, "a submodule")
                elif entry.mode == "120000":
                    results[path] = TreeFile(path, None, "a symbolic link")
                else:
                    blobs[path] = entry.oid
            frontier = deeper
        large = self._too_large(blobs)
        for path, oid in blobs.items():
            data = None if path in large else self.cache.git.read_blob(self._repo, oid)
            results[path] = TreeFile(path, data, large.get(path))
        return {path: results[path] for path in dict.fromkeys(paths)}

    def entry(self, path: str) -> TreeEntry | None:
        """The tree entry at ``path`` ('/'-separated), fetching the trees on its way; None when absent."""
        tree, parts = self.root(), path.split("/")
        for depth, part in enumerate(parts):
            self._list([tree])
            found = next((e for e in self._listed[tree] if e.name == part), None)
            if found is None or depth == len(parts) - 1:
                return found
            if found.kind != "tree":
                return None
            tree = found.oid
        return None

    def gitlinks(self) -> dict[str, str]:
        """{path: commit} of every gitlink in the commit's tree, fetching its trees (no blob) if needed."""
        root = self.root()
        try:
            return self.cache.git.gitlinks(self._repo, root)
        except GitError:
            if self.offline:
                raise NotCached() from None
        self.cache.fetch_objects(self.url, self.commit, [root], trees=True)
        return self.cache.git.gitlinks(self._repo, root)

    def gitmodules(self) -> list[tuple[str, str | None]] | str:
        """``.gitmodules`` of the tree's root as ``git config --no-includes --blob`` reads it, as records;
        [] when there is none; a string saying why it cannot be read (a symlink, too large, malformed)."""
        entry = self.entry(".gitmodules")
        if entry is None:
            return []
        if entry.kind != "blob" or entry.mode == "120000":
            return "is not a regular file (git does not read it then)"
        if large := self._too_large({".gitmodules": entry.oid}):
            return f"is {large['.gitmodules']}"
        try:
            return self.cache.git.config_blob(self._repo, entry.oid)
        except GitError as exc:
            return f"is not readable as git config: {exc.reason}"

    def _list(self, trees: Iterable[str]) -> None:
        wanted = set(trees) - self._listed.keys()
        self._ensure(wanted)
        for tree in sorted(wanted):
            self._listed[tree] = self.cache.git.ls_tree(self._repo, tree)

    def _too_large(self, blobs: dict[str, str]) -> dict[str, str]:
        """{path: why} of the blobs of ``blobs`` ({path: oid}) over ``max_size``, the rest fetched."""
        large = {
            path: f"more than the {self.max_size} bytes read (its fetch was stopped there)"
            for path in self._fetch_bounded(blobs)
        }
        sizes = self.cache.git.object_sizes(self._repo, [oid for path, oid in blobs.items() if path not in large])
        for path, oid in blobs.items():
            if path not in large and sizes[oid] > self.max_size:
                large[path] = f"{sizes[oid]} bytes, more than the {self.max_size} read"
        return large

    def _fetch_bounded(self, blobs: dict[str, str]) -> list[str]:
        """Fetch the blobs of ``blobs`` ({path: oid}) the cache lacks, none over ``max_size``: the server's
        answer is cut once it passes what blobs of that size can take. When it is cut, each blob is asked
        for alone, so the one too large is named; returns the paths whose blob was too large."""
        bound = self.max_size + PACK_SLACK
        try:
            self._ensure(blobs.values(), max_bytes=bound * len(set(blobs.values())))
            return []
        except IncomingTooLarge:
            if len(set(blobs.values())) == 1:
                return list(blobs)
        large = []
        for path, oid in blobs.items():
            try:
                self._ensure([oid], max_bytes=bound)
            except IncomingTooLarge:
                large.append(path)
        return large

    def _ensure(self, oids: Iterable[str], max_bytes: int | None = None) -> None:
        oids = set(oids)
        if not oids or oids <= self.cache.present_objects(self.url, self.commit):
            return
        if self.offline:
            raise NotCached()
        self.cache.fetch_objects(self.url, self.commit, oids, max_bytes=max_bytes)
        missing = oids - self.cache.present_objects(self.url, self.commit)
        if missing:
            raise GitError("fetch", f"{self.url} did not send object {sorted(missing)[0]} of commit {self.commit}")
