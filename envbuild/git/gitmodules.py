"""What a pinned tree says about its submodules, read as git reads it; pure (no git, no network).

A submodule is two facts of the parent's tree: a gitlink (a tree entry of mode 160000 naming a commit)
and an entry of ``.gitmodules`` naming its path and URL. ``.gitmodules`` is read with
``git config --no-includes --blob`` (:meth:`envbuild.git.files.PinnedTree.gitmodules`): git never follows
``include.path`` in it, and neither do we. Here the two are paired, path by path:

- a gitlink that ``.gitmodules`` does not name, and a ``.gitmodules`` entry with no gitlink, are refused
  naming the path, unless the lock already skips that path by name with a reason;
- a relative URL (``./`` or ``../``) is resolved against the parent's URL exactly as git resolves it
  (:func:`resolve_url`, git's ``relative_url``), and the result must pass the lock's URL rules;
- a submodule name git's fsck would refuse (a ``..`` component) and a path the lock could not hold are
  refused;
- a ``file://`` URL under a parent that is not itself one is refused, as git refuses it
  (``protocol.file.allow=user``): an upstream's ``.gitmodules`` may not have this machine's repositories
  read into the cache and the image (a path the lock skips is kept: it is never fetched).

The parent's URL is the lock's (before mirrors), so the lock records the upstream URL and mirrors apply
to it as to any source's.

A lock holds at most :data:`MAX_SUBMODULE_RECORDS` submodule records, every level of every source counted:
``.gitmodules`` may name the repository's own URL at other commits, so a few commits of one small repository
make a tree of ``width ** depth`` records (8 wide and 5 deep: 37,448). Each walk reads a (repository,
commit) once however many paths pin it, and stops at the bound (:func:`too_many_records`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from envbuild.data.urls import redact_url
from envbuild.lock.model import Submodule, check_repo_url, check_submodule_path

# The GLM-5.2 lock records one submodule (vllm-ascend's tree would add two); pytorch, among the largest trees
# of submodules there are, names 30-40 at its top level and some tens more below them: under a hundred
# records, a tenth of this. Each record is a tree written into the image and a row of every verify; past
# the bound the lock is refused, with the way out (skip a submodule by path).
MAX_SUBMODULE_RECORDS = 1000


def too_many_records(count: int, where: str, *, counted_all: bool = True) -> str | None:
    """Why ``count`` submodule records (every level, every source) are refused, ``where`` naming the lock
    or the source where the count passed the bound; None within it. ``counted_all=False``: a walk that
    stopped at the bound, so ``count`` is only where it stopped."""
    if count <= MAX_SUBMODULE_RECORDS:
        return None
    many = f"{count}" if counted_all else f"more than {MAX_SUBMODULE_RECORDS}"
    return (
        f"{where}: {many} submodule records at every level; a lock holds at most {MAX_SUBMODULE_RECORDS}: skip "
        "a submodule the image does without by path in the lock ({path: PATH, skip: REASON})"
    )


class RelativeURLError(ValueError):
    """git would die here too: ``../`` climbs above the start of the parent's URL."""


@dataclass(frozen=True)
class GitmodulesEntry:
    """One ``[submodule "NAME"]`` section of ``.gitmodules`` (the last value of each key wins, as in git)."""

    name: str
    path: str | None
    url: str | None


def parse_gitmodules(records: list[tuple[str, str | None]]) -> dict[str, GitmodulesEntry]:
    """``git config -z --list`` records of a ``.gitmodules`` blob → its entries by name. Keys come
    lowercased but for the subsection (the name), which keeps its case and may hold dots."""
    found: dict[str, dict[str, str | None]] = {}
    for key, value in records:
        section, _, rest = key.partition(".")
        name, _, variable = rest.rpartition(".")
        if section != "submodule" or not name:
            continue
        found.setdefault(name, {})[variable] = value
    return {name: GitmodulesEntry(name, values.get("path"), values.get("url")) for name, values in found.items()}


def check_submodule_name(name: str) -> str | None:
    """git's ``check_submodule_name``: not empty, and no ``..`` path component ('/' or '\\' separated);
    git's own fsck refuses such a name (it once let a submodule write into .git, CVE-2018-11235)."""
    if not name:
        return "an empty submodule name"
    if any(part == ".." for part in re.split(r"[/\\]", name)):
        return f"submodule name {name!r} has a '..' component (git's fsck refuses it)"
    return None


def _local_not_ssh(url: str) -> bool:
    """git's ``url_is_local_not_ssh``: no ':' at all, or a '/' before the first one."""
    colon, slash = url.find(":"), url.find("/")
    return colon < 0 or (0 <= slash < colon)


def _chop_last_dir(remote: str, relative: bool) -> tuple[str, bool]:
    """git's ``chop_last_dir``: the URL without its last component; True when that was a ':' (scp-like)."""
    if "/" in remote:
        return remote[: remote.rindex("/")], False
    if ":" in remote:
        return remote[: remote.rindex(":")], True
    if relative or remote == ".":
        raise RelativeURLError(f"cannot strip one component off url {remote!r}")
    return ".", False


def resolve_url(parent: str, url: str) -> str:
    """A ``.gitmodules`` URL as git resolves it for a superproject whose remote is ``parent`` (git's
    ``relative_url`` in remote.c, POSIX separators): each leading ``../`` drops one component of the
    parent's URL (through the ':' of an scp-like one), ``./`` drops nothing. Anything else is returned
    as it is."""
    if not url.startswith(("./", "../")):
        return url
    remote = parent[:-1] if parent.endswith("/") else parent
    relative = _local_not_ssh(remote) and not remote.startswith("/")
    if relative and not remote.startswith(("./", "../")):
        remote = "./" + remote
    colon = False
    rest = url
    while rest:
        if rest.startswith("../"):
            rest = rest[3:]
            remote, chopped = _chop_last_dir(remote, relative)
            colon = colon or chopped
        elif rest.startswith("./"):
            rest = rest[2:]
        else:
            break
    out = f"{remote}{':' if colon else '/'}{rest}"
    if rest.endswith("/"):
        out = out[:-1]
    return out[2:] if out.startswith("./") else out


def repository_key(url: str) -> tuple[str, str]:
    """Two URLs name the same repository when this agrees: host (case-insensitive) and path, without a
    trailing '/' or '.git', whatever the transport (``https://h/a/b.git``, ``git@h:a/b``, ``ssh://git@h/a/b``)."""
    if "://" not in url and re.match(r"^[^/]*@?[^/:]+:", url):  # scp-like user@host:path
        host, _, path = url.partition(":")
        host = host.rpartition("@")[2]
    else:
        parts = urlsplit(url)
        host, path = (parts.hostname or ""), parts.path
    path = path.strip("/")
    path = path[:-4] if path.endswith(".git") else path
    return host.lower(), path.rstrip("/")


@dataclass(frozen=True)
class Paired:
    """One tree's submodules as ``lock update`` records them, before their own trees are read: records
    (path, repo, commit, skip; sorted by path), what refuses them (each naming the path) and notes."""

    records: tuple[Submodule, ...]
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()


def pair_submodules(
    gitlinks: dict[str, str],
    entries: dict[str, GitmodulesEntry],
    parent_repo: str,
    previous: tuple[Submodule, ...],
    where: str,
) -> Paired:
    """Pair ``gitlinks`` ({path: commit} of one tree) with ``entries`` (its ``.gitmodules``); ``previous``
    are the lock's records of this level, whose ``skip`` decisions are kept by path; ``where`` is how
    messages name the parent (``megatron-bridge``, ``vllm-ascend/csrc/third_party/catlass``)."""
    problems: list[str] = []
    skips = {s.path: s.skip for s in previous if s.skip is not None}
    by_path: dict[str, GitmodulesEntry] = {}
    refused: set[str] = set()  # paths already reported: one problem per path
    for entry in sorted(entries.values(), key=lambda e: e.name):
        named = f"{where}: .gitmodules: submodule {entry.name!r}"
        if entry.path is None:
            problems.append(f"{named} names no path")
        elif (problem := check_submodule_name(entry.name)) is not None:
            problems.append(f"{where}/{entry.path}: .gitmodules: {problem}")
            refused.add(entry.path)
        elif entry.path in by_path:
            first = by_path[entry.path].name
            problems.append(f"{where}/{entry.path}: .gitmodules names this path twice ({first!r}, {entry.name!r})")
            refused.add(entry.path)
        else:
            by_path[entry.path] = entry

    records: list[Submodule] = []
    for path in sorted((set(gitlinks) | set(by_path)) - refused):
        record, problem = _record(path, gitlinks.get(path), by_path.get(path), skips.get(path), parent_repo)
        if problem is not None:
            problems.append(f"{where}/{path}: {problem}")
        elif record is not None:
            records.append(record)
    notes = tuple(
        f"{where}/{path}: the lock's skip no longer applies (the tree has no submodule there); dropped"
        for path in sorted(skips.keys() - set(gitlinks) - set(by_path) - refused)
    )
    return Paired(tuple(records), tuple(problems), notes)


def _record(
    path: str, commit: str | None, entry: GitmodulesEntry | None, skip: str | None, parent_repo: str
) -> tuple[Submodule | None, str | None]:
    if (problem := check_submodule_path(path)) is not None:
        return None, problem
    skip_it = f"; if the image does without it, skip it by path in the lock: {{path: {path}, skip: REASON}}"
    if commit is None and skip is None:
        assert entry is not None
        return None, f".gitmodules names submodule {entry.name!r} here, but the tree has no gitlink{skip_it}"
    if entry is None or entry.url is None:
        if skip is not None:
            return Submodule(path=path, skip=skip, commit=commit), None
        if entry is None:
            return None, f"a gitlink (commit {commit}) that .gitmodules does not name, so it has no URL{skip_it}"
        return None, f".gitmodules names no url for submodule {entry.name!r}"
    try:
        repo = resolve_url(parent_repo, entry.url)
    except RelativeURLError as exc:
        return None, f".gitmodules url {redact_url(entry.url)!r}: {exc}"
    via = f" (resolved from {redact_url(entry.url)!r})" if repo != entry.url else ""
    if (problem := check_repo_url(repo)) is not None:
        return None, f".gitmodules url {problem}{via}"
    if skip is None and _on_this_machine(repo) and not _on_this_machine(parent_repo):
        # git refuses it too (protocol.file.allow=user): an upstream's tree must not read this machine's repositories.
        return None, (
            f".gitmodules url {redact_url(repo)!r}{via} names a repository on this machine, and its parent "
            f"{redact_url(parent_repo)!r} is not one (git refuses it too){skip_it}"
        )
    return Submodule(path=path, skip=skip, repo=repo, commit=commit), None


def _on_this_machine(url: str) -> bool:
    """A ``file://`` URL (the only local form a lock's URL rules allow)."""
    return urlsplit(url).scheme.lower() == "file"
