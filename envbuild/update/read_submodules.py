"""`lock update`'s reading of each source's submodules from its pinned tree, level by level, into the lock.

For each tree (the source's, then each submodule's that the image gets): its gitlinks (every tree of the
commit is fetched into the verify cache, no blob) and its ``.gitmodules`` (one blob), paired by
:func:`envbuild.git.gitmodules.pair_submodules`. A submodule the lock skips is recorded from the
parent alone (path, URL, commit): nothing of it is fetched. One the image gets is read in its own
repository, through the mirrors: its commit (commits only), its tree SHA and its own submodules.

Each (repository, commit) is read once however many paths pin it (:class:`Walked`, shared by every source
of one update): ``.gitmodules`` may name the repository's own URL at other commits, and a few commits then
make thousands of paths. The records are counted, every level of every source, and the walk stops past
:data:`~envbuild.git.gitmodules.MAX_SUBMODULE_RECORDS`.

What the trees say that the lock cannot record (a gitlink ``.gitmodules`` does not name, an entry without
a gitlink, a URL that fails the lock's URL rules, before or after the mirrors, more records than the
bound, a tree git's object checks refuse, which no later fetch or build would take) refuses the update,
every problem at once, each naming the path or the source (:class:`SubmodulesRefused`, exit 2, nothing
written: the way out is in the lock, a skip by path). A tree that cannot be read (an upstream that does
not answer) is not guessed at: ``submodules_unknown`` says why, a warning says so, and what the lock
records for that very commit stays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from envbuild.data.urls import redact_url
from envbuild.errors import InputError, RemoteError, problem_lines
from envbuild.git.cache import GitCache
from envbuild.git.files import PinnedTree
from envbuild.git.gitmodules import pair_submodules, parse_gitmodules, too_many_records
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError, ref_refspec
from envbuild.lock.model import REASON_MAX, Source, Submodule, check_repo_url, walk_submodules
from envbuild.progress import Progress, silent

MAX_DEPTH = 8  # submodules of submodules; the lock's reader allows 32 levels of YAML, two per level
MAX_PER_TREE = 256  # each one the image gets is a repository to read: a tree naming thousands is refused


class SubmodulesRefused(InputError):
    """The pinned trees hold submodules the lock cannot record as they are; every problem names the path."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = sorted(problems)
        super().__init__(problem_lines(self.problems))


class _Unreadable(Exception):
    """A tree below the source's own cannot be read; its message names it, ``error`` is git's."""

    def __init__(self, message: str, error: RemoteError) -> None:
        super().__init__(message)
        self.error = error


def _malformed(exc: RemoteError | _Unreadable) -> bool:
    """git's object checks refused the tree: no later read, fetch or build gets it, so the lock cannot pin it
    (a tree an upstream that does not answer keeps from us is unknown until it answers)."""
    error = exc.error if isinstance(exc, _Unreadable) else exc
    return isinstance(error, GitError) and error.malformed


@dataclasses.dataclass(frozen=True)
class _Tree:
    """What one commit of one repository says of its submodules."""

    root: str
    gitlinks: dict[str, str]
    gitmodules: list[tuple[str, str | None]] | str  # the records, or why they cannot be read


@dataclasses.dataclass(frozen=True)
class _TreesFailed:
    """The commit was fetched, and its trees could not be read."""

    error: RemoteError


@dataclasses.dataclass
class Walked:
    """What one `lock update` has read of submodules, shared by its sources: each (repository as the lock
    names it, commit, the ref fetched when the server will not send the commit by ID: a source's) read once,
    whatever it gave (a failure too), and the records made so far."""

    trees: dict[tuple[str, str, str], _Tree | RemoteError | _TreesFailed] = dataclasses.field(default_factory=dict)
    records: int = 0
    over: bool = False  # past the bound: nothing more is read


def source_tree(source: Source, cache: GitCache, mirrors: Mirrors) -> PinnedTree:
    """The pinned tree of ``source`` in the verify cache (its ref fetched when the server will not send the
    commit by ID)."""
    refspec = ref_refspec(source.ref_type, source.ref)
    return PinnedTree(cache, mirrors.rewrite(source.repo), source.commit, refspec=refspec)


def read_source_submodules(
    source: Source,
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    previous: Source | None = None,
    progress: Progress = silent,
    problems: list[str] | None = None,
    walked: Walked | None = None,
) -> Source:
    """``source`` with ``submodules`` and ``submodules_unknown`` read from its pinned tree. ``previous`` is
    its entry before the update: its skips are kept by path, and its records stay when the tree cannot be
    read and the commit did not move. Refusals are appended to ``problems`` when given (so every source's
    are reported together), else raised as :class:`SubmodulesRefused`. ``walked``: what the other sources
    of the same lock read and counted (each source its own when not given)."""
    before = previous if previous is not None else source
    found: list[str] = []
    unknown: list[str] = []
    reader = _Reader(cache, mirrors, progress, found, unknown, walked if walked is not None else Walked(), source.name)
    try:
        tree = reader.tree(source.repo, source.commit, source.name, source_tree(source, cache, mirrors))
        records = reader.level(tree, source.repo, before.submodules, source.name, depth=1)
    except (RemoteError, _Unreadable) as exc:
        if _malformed(exc):  # refused below, as what the lock cannot record is
            found.append(str(exc) if isinstance(exc, _Unreadable) else f"{source.name}: {exc}")
        elif (
            previous is None
            or previous.commit != source.commit
            or not (previous.submodules or previous.submodules_unknown)
        ):
            reason = str(exc) if isinstance(exc, _Unreadable) else f"the pinned tree cannot be read: {exc}"
            progress(f"warning: {source.name}: submodules unknown: {reason}")  # as a submodule's unknown is said
            return dataclasses.replace(source, submodules=(), submodules_unknown=reason_text(reason))
        elif reader.count(previous.submodules):
            # What the lock says of this very commit stays true, its reason for not knowing included.
            progress(
                f"warning: {source.name}: submodules kept as recorded for {source.commit[:12]}; cannot re-read: {exc}"
            )
            return dataclasses.replace(
                source, submodules=previous.submodules, submodules_unknown=previous.submodules_unknown
            )
        records = ()  # refused: git refused the tree, or past the bound (here, or by the source that passed it)
    if found:
        if problems is None:
            raise SubmodulesRefused(found)
        problems += found
        return source
    if unknown:
        progress(f"warning: {source.name}: {'; '.join(unknown)}")
    return dataclasses.replace(
        source, submodules=records, submodules_unknown=reason_text("; ".join(unknown)) if unknown else None
    )


@dataclasses.dataclass
class _Reader:
    cache: GitCache
    mirrors: Mirrors
    say: Callable[[str], None]
    problems: list[str]
    unknown: list[str]
    walked: Walked
    source: str  # the source's name, which the bound's refusal names

    def tree(self, repo: str, commit: str, where: str, pinned: PinnedTree | None = None) -> _Tree:
        """What ``commit`` of ``repo`` says of its submodules, read once (:class:`Walked`). Raises
        :class:`RemoteError` when the commit cannot be fetched, :class:`_Unreadable` when its trees cannot be
        read."""
        tree = pinned or PinnedTree(self.cache, self.mirrors.rewrite(repo), commit)
        key = (repo, commit, tree.refspec or "")
        if key not in self.walked.trees:
            self.walked.trees[key] = _read(tree)
        found = self.walked.trees[key]
        if isinstance(found, RemoteError):
            raise found.with_traceback(None)
        if isinstance(found, _TreesFailed):
            raise _Unreadable(f"{where}: the tree of {commit} cannot be read: {found.error}", found.error)
        return found

    def count(self, records: tuple[Submodule, ...]) -> bool:
        """Count ``records`` (every level) against the bound; False once it is passed (said once)."""
        if self.walked.over:
            return False
        self.walked.records += sum(1 for _ in walk_submodules(records))
        if (problem := too_many_records(self.walked.records, self.source, counted_all=False)) is not None:
            self.walked.over = True
            self.problems.append(problem)
            return False
        return True

    def level(
        self, tree: _Tree, parent_repo: str, previous: tuple[Submodule, ...], where: str, depth: int
    ) -> tuple[Submodule, ...]:
        """The records of ``tree``'s submodules, each one the image gets read in its own repository."""
        if isinstance(tree.gitmodules, str):
            if tree.gitlinks:
                self.problems.append(f"{where}: .gitmodules {tree.gitmodules}")
            return ()
        paired = pair_submodules(tree.gitlinks, parse_gitmodules(tree.gitmodules), parent_repo, previous, where)
        self.problems += paired.problems
        for note in paired.notes:
            self.say(f"warning: {note}")
        if paired.records and depth > MAX_DEPTH:
            self.problems.append(f"{where}: submodules nested deeper than {MAX_DEPTH} levels")
            return ()
        if len(paired.records) > MAX_PER_TREE:
            self.problems.append(f"{where}: {len(paired.records)} submodules in one tree, more than {MAX_PER_TREE}")
            return ()
        if not self.count(paired.records):
            return ()
        before = {s.path: s for s in previous}
        return tuple(
            self.one(record, before.get(record.path), f"{where}/{record.path}", depth) for record in paired.records
        )

    def one(self, record: Submodule, previous: Submodule | None, name: str, depth: int) -> Submodule:
        if record.skipped:
            self.say(f"{name}: {record.commit[:12] if record.commit else '(no gitlink)'} skipped: {record.skip}")
            return record
        assert record.repo is not None and record.commit is not None
        if self.walked.over:
            return record  # the update is refused: nothing more is read
        url = self.mirrors.rewrite(record.repo)
        if url != record.repo and (problem := check_repo_url(url)) is not None:
            self.problems.append(f"{name}: repo {problem} (after mirror rewriting of {redact_url(record.repo)!r})")
            return record
        try:
            tree = self.tree(record.repo, record.commit, name)
            nested = self.level(tree, record.repo, previous.submodules if previous else (), name, depth + 1)
        except (RemoteError, _Unreadable) as exc:
            reason = (
                str(exc)
                if isinstance(exc, _Unreadable)
                else f"{name}: cannot read {record.commit} of {record.repo}: {exc}"
            )
            if _malformed(exc):
                self.problems.append(reason)
                return record
            if previous is not None and previous.commit == record.commit and previous.tree is not None:
                self.say(f"warning: {name}: kept as recorded for {record.commit[:12]}; cannot re-read: {reason}")
                self.count(previous.submodules)
                return dataclasses.replace(record, tree=previous.tree, submodules=previous.submodules)
            self.unknown.append(reason)
            return record
        own = f", {len(nested)} submodule{'s' * (len(nested) != 1)} of its own" if nested else ""
        self.say(f"{name}: {record.commit[:12]} of {record.repo}, tree {tree.root[:12]}{own}")
        return dataclasses.replace(record, tree=tree.root, submodules=nested)


def _read(tree: PinnedTree) -> _Tree | RemoteError | _TreesFailed:
    try:
        root = tree.root()
    except RemoteError as exc:
        return exc
    try:
        return _Tree(root, tree.gitlinks(), tree.gitmodules())
    except RemoteError as exc:
        return _TreesFailed(exc)


def reason_text(text: str) -> str:
    """``text`` as the lock records a reason: one line, at most ``REASON_MAX`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 1] + "…"
