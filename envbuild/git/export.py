"""Write the exact tree of a pinned commit into a directory, for the image build context.

The verify cache (:mod:`envbuild.git.cache`) holds commits only (``--filter=tree:0``), so exports come
from a second cache of bare repositories beside it, ``<cache_dir>/git-export/``, keyed like the first
and guarded by the same locks and atomic creation (:class:`~envbuild.git.cache.GitCache`). Into it each
pinned commit is fetched once, whole but without history (``--depth=1`` of the commit itself; protocol
v2 servers such as GitHub and ``git daemon`` accept a want by SHA), under a ref
``refs/envbuild/export/<commit>`` so it stays. A server that refuses wants by SHA gets a fetch of the
ref's full history instead.

Fetches run with ``fetch.fsckObjects``: a tree git itself calls malformed (duplicate entries, ``.git``
names) is refused before it reaches the cache. The export is ``git archive`` with every content-changing
attribute neutralised (``export-subst``, ``export-ignore``, eol conversion, filters, ``ident``) through
the repository's ``info/attributes``, written by :mod:`envbuild.git.treewriter` (which never follows a
link, so a hostile tree cannot write outside the destination), and the result is checked: the git tree SHA of the written files must equal the commit's tree (and the
lock's ``tree`` where recorded). Submodules (gitlinks) are not exported; a tree holding one fails
that check, naming it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from envbuild.errors import EnvbuildError
from envbuild.git.cache import CachedRepo, GitCache
from envbuild.git.remote import NO_LAZY_FETCH_URL, GitError
from envbuild.git.treewriter import TreeWriteError, write_tar_tree
from envbuild.image import inimage_probe
from envbuild.lock.model import Source
from envbuild.mirrors import Mirrors

EXPORT_NS = "refs/envbuild/export/"
# Highest-precedence attributes: git archive then writes blobs byte for byte.
NEUTRAL_ATTRIBUTES = "* -export-subst -export-ignore -text -eol -filter -ident -crlf\n"


class ExportError(EnvbuildError):
    """A source's pinned commit cannot be exported as its exact tree."""


def _fetch_config(url: str) -> dict[str, str]:
    """The real URL for this one command, and git's object checks on what it receives: a tree git
    itself calls malformed (duplicate entries, ``.git`` names, ``.gitmodules`` tricks) is refused at the
    fetch, before anything is written."""
    return {f"url.{url}.insteadOf": NO_LAZY_FETCH_URL, "fetch.fsckObjects": "true"}


class TreeExporter:
    """Exports pinned commits from ``<cache_dir>/git-export``; safe to share between threads and processes."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        mirrors: Mirrors = Mirrors(),
        offline: bool = False,
        verify_cache: GitCache | None = None,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.cache = GitCache(Path(cache_dir) / "git-export")
        self.verify_cache = verify_cache or GitCache(Path(cache_dir) / "git")
        self.mirrors, self.offline = mirrors, offline

    def __call__(self, source: Source, dest: Path) -> None:
        export_tree(source, dest, self)


def _complete(exporter: TreeExporter, repo: CachedRepo, commit: str) -> str | None:
    """The commit's tree when the export repository holds the commit with every object of its tree."""
    git = exporter.cache.git
    if commit not in git.commit_trees(repo.path, [commit]):
        return None
    out = git.run(["rev-list", "--objects", "--no-walk", "--missing=print", commit, "--"], repo=repo.path)
    if any(line.startswith("?") for line in out.splitlines()):
        return None
    return git.commit_trees(repo.path, [commit])[commit]


def has_commit(exporter: TreeExporter, source: Source) -> bool:
    """Does the export cache hold the commit with every object of its tree (no network)?"""
    repo = exporter.cache.repo(exporter.mirrors.rewrite(source.repo))
    return repo.exists() and _complete(exporter, repo, source.commit) is not None


def fetch_commit(exporter: TreeExporter, source: Source) -> CachedRepo:
    """Make the export repository for ``source`` hold its commit and the whole tree of it."""
    url = exporter.mirrors.rewrite(source.repo)
    repo = exporter.cache.repo(url)
    if repo.exists() and _complete(exporter, repo, source.commit):
        return repo
    if exporter.offline:
        raise ExportError(
            f"source {source.name}: the files of {source.commit} are not in the cache "
            f"({exporter.cache.root}) and --offline forbids fetching them; run `envbuild lock fetch LOCKFILE` "
            "where the upstream is reachable"
        )
    git = exporter.cache.git
    with exporter.cache.locked(url) as repo:
        if _complete(exporter, repo, source.commit):
            return repo  # another build fetched it while we waited for the lock
        base = [
            "fetch",
            "--no-filter",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-gc",
            "--no-recurse-submodules",
            "--quiet",
        ]
        try:
            git.run(
                [*base, "--depth=1", "origin", "--", f"+{source.commit}:{EXPORT_NS}{source.commit}"],
                repo=repo.path,
                config=_fetch_config(url),
                timeout=git.network_timeout,
            )
        except GitError as first:
            # The server refuses wants by SHA: fetch the ref's whole history, which holds the commit.
            space = "tags" if source.ref_type == "tag" else "heads"
            unshallow = ["--unshallow"] if (repo.path / "shallow").exists() else []
            try:
                git.run(
                    [
                        *base,
                        *unshallow,
                        "origin",
                        "--",
                        f"+refs/{space}/{source.ref}:refs/envbuild/ref/{space}/{source.ref}",
                    ],
                    repo=repo.path,
                    config=_fetch_config(url),
                    timeout=git.network_timeout,
                )
            except GitError as second:
                raise ExportError(
                    f"source {source.name}: cannot fetch the files of {source.commit} from {url}: "
                    f"{first.reason}; {second.reason}"
                ) from None
            if source.commit in git.commit_trees(repo.path, [source.commit]):
                git.run(["update-ref", f"{EXPORT_NS}{source.commit}", source.commit], repo=repo.path)
        attributes = repo.path / "info" / "attributes"
        attributes.parent.mkdir(exist_ok=True)
        if not attributes.exists() or attributes.read_text(encoding="utf-8") != NEUTRAL_ATTRIBUTES:
            attributes.write_text(NEUTRAL_ATTRIBUTES, encoding="utf-8")
        if not _complete(exporter, repo, source.commit):
            raise ExportError(f"source {source.name}: {url} did not send the files of {source.commit}")
    return repo


def export_tree(source: Source, dest: Path, exporter: TreeExporter) -> str:
    """Write the exact tree of ``source.commit`` into ``dest`` (an existing, empty directory) and
    return its tree SHA, after checking it against the commit, the verify cache and ``source.tree``."""
    repo = fetch_commit(exporter, source)
    git = exporter.cache.git
    tree = git.commit_trees(repo.path, [source.commit])[source.commit]
    problems = []
    if source.tree is not None and tree != source.tree:
        problems.append(f"the commit's tree is {tree}, the lock pins tree {source.tree}")
    verified = exporter.verify_cache.commit_trees(exporter.mirrors.rewrite(source.repo), [source.commit])
    if source.commit in verified and verified[source.commit] != tree:
        problems.append(f"the verify cache records tree {verified[source.commit]} for the commit")
    if problems:
        raise ExportError(f"source {source.name}: {'; '.join(problems)}")

    fd, archive = tempfile.mkstemp(prefix=".envbuild-export-", suffix=".tar", dir=dest.parent)
    os.close(fd)
    try:
        git.run(["archive", "--format=tar", f"--output={archive}", source.commit], repo=repo.path)
        with open(archive, "rb") as stream:
            write_tar_tree(stream, dest)
    except TreeWriteError as exc:
        raise ExportError(
            f"source {source.name}: the tree of {source.commit} cannot be written safely: {exc}"
        ) from None
    finally:
        os.unlink(archive)
    files = inimage_probe.list_files(str(dest))
    written, unreadable = inimage_probe.git_tree_sha(str(dest), files)
    if written != tree or unreadable:
        gitlinks = _gitlinks(exporter, repo, source.commit)
        why = f" (submodules are not exported: {', '.join(gitlinks[:5])})" if gitlinks else ""
        raise ExportError(
            f"source {source.name}: the exported files of {source.commit} have tree {written}, "
            f"the commit has tree {tree}{why}"
        )
    return tree


def _gitlinks(exporter: TreeExporter, repo: CachedRepo, commit: str) -> list[str]:
    out = exporter.cache.git.run(["ls-tree", "-r", "-z", "--full-tree", commit, "--"], repo=repo.path)
    return sorted(entry.split("\t", 1)[1] for entry in out.split("\0") if entry.startswith("160000 "))


def commit_dates(cache: GitCache, url: str, commits: Iterable[str]) -> dict[str, int]:
    """{commit: committer date (Unix seconds)} for the commits the verify cache holds (no network)."""
    repo = cache.repo(url)
    shas = sorted(set(commits))
    if not repo.exists() or not shas:
        return {}
    out = cache.git.run(
        ["rev-list", "--missing=allow-any", "--ignore-missing", "--no-walk", "--format=%H %ct", "--stdin"],
        repo=repo.path,
        stdin="".join(f"{s}\n" for s in shas),
    )
    dates: dict[str, int] = {}
    for line in out.splitlines():
        commit, _, date = line.partition(" ")
        if commit != "commit" and len(commit) == 40 and date.isdigit():
            dates[commit] = int(date)
    return dates
