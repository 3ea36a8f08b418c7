"""The git commands envbuild runs; :mod:`envbuild.git.process` starts them (hardened, bounded, tied
to envbuild's lifetime) and is the only code that starts git.

User-controlled values are placed where git cannot read them as options. Network commands are bounded
in memory and a ref listing by :data:`MAX_LISTING`; every fetch has git check the objects it receives
(:data:`FSCK_CONFIG`) and inherits the lock of the cache repository it writes into.

Cache repositories are partial clones whose ``remote.origin.url`` is deliberately unusable
(:data:`NO_LAZY_FETCH_URL`): git 2.39 would otherwise fetch any missing object from the promisor
remote behind our back. The real URL is supplied only to the commands that are meant to touch the
network, as ``url.<real>.insteadOf=<unusable>`` through ``GIT_CONFIG_COUNT`` (an environment
channel, so a URL containing ``=`` or spaces cannot be misparsed). Reads additionally use
``rev-list --missing=allow-any``, which turns lazy fetching off for that command.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.data.urls import redact_url
from envbuild.git.process import SHA256_UNSUPPORTED, GitError, git_environment, last_error_line, run_git
from envbuild.lock.moves import SUBJECT_CHARS

__all__ = ["GitError", "GitRunner", "RefListing", "UnsupportedRepository", "last_error_line"]

# A transport git refuses at once (it is not in GIT_ALLOW_PROTOCOL and no helper of that name exists).
NO_LAZY_FETCH_URL = "envbuild-no-lazy-fetch://cache-only"
UPSTREAM_NS = "refs/upstream/"
FILTER = "tree:0"
NETWORK_TIMEOUT = 600.0
LOCAL_TIMEOUT = 120.0
# Object checking on every fetch: a tree or commit git's fsck finds malformed (duplicate entries, `.git`
# names, a symlinked .gitmodules, …) refuses the fetch. Fetch-time checks run in strict mode, where
# git's warnings are errors too. The export fetch uses the same key.
FSCK_CONFIG = {"fetch.fsckObjects": "true"}
# The ls-remote output we accept: ~700,000 refs, far more than any real repository advertises.
MAX_LISTING = 64 << 20
# The memory a network git may grow to. git holds a server's whole ref advertisement before it prints
# a line (and has no limit of its own), so an advertisement without end grows git until the timeout:
# ~3 bytes per byte sent. Real listings and fetches stay far below (index-pack, the heavy part, is a
# child and not counted).
MAX_MEMORY = 2 << 30
# Where git cuts a commit subject it prints (display columns): past SUBJECT_CHARS, so the cut that shows is
# ours, and short enough that the output of a few commits stays small whatever their messages hold.
SUBJECT_COLUMNS = 1024

# Written by GitCache on creation; the url is never the real one (see the module docstring).
CACHE_REPO_CONFIG = f"""\
[core]
\trepositoryformatversion = 1
\tfilemode = true
\tbare = true
\tlogAllRefUpdates = false
[extensions]
\tpartialClone = origin
[remote "origin"]
\turl = {NO_LAZY_FETCH_URL}
\tpromisor = true
\tpartialclonefilter = {FILTER}
[gc]
\tauto = 0
[maintenance]
\tauto = false
[fetch]
\twriteCommitGraph = false
\tshowForcedUpdates = false
"""

Observer = Callable[[str, str], None]


class UnsupportedRepository(GitError):
    """The repository is one envbuild cannot pin (its object names are SHA-256)."""


@dataclass(frozen=True)
class RefListing:
    """What ``git ls-remote`` advertised: branch heads, and tags peeled to what they point at.
    ``object_format``: ``sha256`` when the names are 64 hex digits (``git init --object-format=sha256``;
    its refs are kept out of ``heads`` and ``tags``, which hold 40-hex names only)."""

    heads: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    refs: Mapping[str, str] = field(default_factory=dict)  # {'heads/x' | 'tags/x': sha}, tags unpeeled
    raw: str = ""
    object_format: str = "sha1"

    @classmethod
    def parse(cls, text: str) -> RefListing:
        heads: dict[str, str] = {}
        tags: dict[str, str] = {}
        peeled: dict[str, str] = {}
        refs: dict[str, str] = {}
        object_format = "sha1"
        for line in text.splitlines():
            sha, _, ref = line.partition("\t")
            if len(sha) == 64 and all(c in "0123456789abcdef" for c in sha):
                object_format = "sha256"
            if len(sha) != 40:
                continue
            if ref.startswith("refs/heads/"):
                heads[ref[len("refs/heads/") :]] = sha
                refs[ref[len("refs/") :]] = sha
            elif ref.startswith("refs/tags/"):
                name = ref[len("refs/tags/") :]
                if name.endswith("^{}"):
                    peeled[name[:-3]] = sha
                else:
                    tags[name] = sha
                    refs[ref[len("refs/") :]] = sha
        # An annotated tag is advertised twice; the peeled (^{}) line names the commit.
        tags.update({name: sha for name, sha in peeled.items() if name in tags})
        return cls(heads, tags, refs, text, object_format)

    def tips(self) -> set[str]:
        return set(self.heads.values()) | set(self.tags.values())


@dataclass(frozen=True)
class TreeEntry:
    """One line of ``git ls-tree``: mode, object type, object ID and name."""

    mode: str
    kind: str  # blob | tree | commit (a gitlink)
    oid: str
    name: str


@dataclass
class GitRunner:
    """Runs git. ``observer(command, url)`` is called before every network command (for progress
    accounting and for tests that must prove a warm cache stays off the network)."""

    network_timeout: float = NETWORK_TIMEOUT
    observer: Observer | None = None
    max_listing: int = MAX_LISTING
    max_memory: int = MAX_MEMORY

    def run(
        self,
        args: Sequence[str],
        *,
        repo: Path | None = None,
        stdin: str | None = None,
        config: Mapping[str, str] | None = None,
        timeout: float | None = None,
        network: bool = False,
        hold: Sequence[int] = (),
    ) -> str:
        """Run ``git [-C repo] args``; return stdout, raise :class:`GitError` on failure or timeout.
        ``network`` and ``hold`` as for :meth:`run_full`."""
        return self.run_full(args, repo=repo, stdin=stdin, config=config, timeout=timeout, network=network, hold=hold)[
            0
        ]

    def run_full(
        self,
        args: Sequence[str],
        *,
        repo: Path | None = None,
        stdin: str | None = None,
        config: Mapping[str, str] | None = None,
        timeout: float | None = None,
        network: bool = False,
        hold: Sequence[int] = (),
        max_output: int | None = None,
        max_incoming: tuple[Path, int] | None = None,
    ) -> tuple[str, str]:
        """Like :meth:`run`, returning (stdout, stderr). ``network``: a command that talks to a server,
        tied to our lifetime and bounded in memory (see the module docstring); ``hold``: descriptors
        git inherits (a cache lock); ``max_output``: stdout beyond this many bytes kills git and fails
        (no ``stdin`` then)."""
        out, errors = run_git(
            ["git", *(["-C", str(repo)] if repo is not None else []), *args],
            command=args[0],
            env=git_environment(config),
            stdin=stdin,
            timeout=LOCAL_TIMEOUT if timeout is None else timeout,
            network=network,
            hold=hold,
            max_output=max_output,
            max_memory=self.max_memory if network else None,
            max_incoming=max_incoming,
        )
        # A path in a hostile tree or a ref name need not be UTF-8: keep its bytes (os.fsencode gives them
        # back) rather than fail to decode; what reaches a message is escaped by last_error_line.
        return out.decode("utf-8", "surrogateescape"), errors

    # -- network -------------------------------------------------------------------------------

    def ls_remote(self, repo: Path, url: str) -> RefListing:
        self._observe("ls-remote", url)
        out = self.run_full(
            ["ls-remote", "--heads", "--tags", "--", "origin"],
            repo=repo,
            config=_real_url(url),
            timeout=self.network_timeout,
            network=True,
            max_output=self.max_listing,
        )[0]
        listing = RefListing.parse(out)
        if listing.object_format != "sha1":
            # Not "no branch named main": its refs are there, under names a 40-hex pin cannot hold.
            raise UnsupportedRepository("ls-remote", f"{redact_url(url)} {SHA256_UNSUPPORTED}")
        return listing

    def fetch(
        self, repo: Path, url: str, refspecs: Sequence[str], *, prune: bool = False, hold: int | None = None
    ) -> bool:
        """Fetch commits (no trees, no blobs) for ``refspecs``, every object checked; return False when
        the server ignored the filter and sent a full pack (git falls back by itself and says so on
        stderr). ``hold``: the cache lock's descriptor, which git and its helpers keep while alive."""
        self._observe("fetch", url)
        _, err = self.run_full(
            fetch_args(*(["--prune"] if prune else []), "origin", "--", *refspecs),
            repo=repo,
            config=fetch_config(url),
            timeout=self.network_timeout,
            network=True,
            hold=() if hold is None else (hold,),
        )
        return "filtering not recognized by server" not in err

    def fetch_objects(
        self,
        repo: Path,
        url: str,
        oids: Sequence[str],
        *,
        hold: Sequence[int] = (),
        trees: bool = False,
        max_bytes: int | None = None,
    ) -> None:
        """Fetch exactly these objects (trees or blobs of a pinned tree, by ID) and nothing they reach:
        what a lazy fetch from the promisor remote would do, asked for explicitly. Objects a want names are
        sent whatever the filter; ``tree:0`` keeps out everything else. ``trees``: every tree below the
        wanted trees as well, and no blob (``blob:none``); ``--refetch``, because git sends no want for an
        object it holds, and a wanted tree read before (for one file) is held without the trees below it.
        The noop negotiation sends no haves: a want by ID has no history to negotiate. ``max_bytes``: the
        fetch is stopped once the server has sent that many bytes (:class:`IncomingTooLarge`); a filter
        cannot do it (a wanted blob is sent whatever its size), so the pack is written as it arrives
        (``fetch.unpackLimit=1``: never held in memory as loose objects are) and its size watched."""
        self._observe("fetch", url)
        wants = ("--refetch", "origin", "--", *sorted(set(oids))) if trees else ("origin", "--", *sorted(set(oids)))
        args = fetch_args(*wants, filter="blob:none" if trees else FILTER)
        config = {**fetch_config(url), "fetch.negotiationAlgorithm": "noop"}
        if max_bytes is not None:
            config["fetch.unpackLimit"] = "1"
        incoming = (repo / "objects" / "pack", max_bytes) if max_bytes is not None else None
        self.run_full(
            args, repo=repo, config=config, timeout=self.network_timeout, network=True, hold=hold, max_incoming=incoming
        )

    def _observe(self, command: str, url: str) -> None:
        if self.observer is not None:
            self.observer(command, url)

    # -- local reads: never reach the network (--missing=allow-any disables lazy fetching) -----

    def init_bare(self, path: Path) -> None:
        self.run(["init", "--quiet", "--bare", "--", str(path)])
        (path / "config").write_text(CACHE_REPO_CONFIG, encoding="utf-8")

    def commit_trees(self, repo: Path, shas: Iterable[str]) -> dict[str, str]:
        """{commit: its tree} for those of ``shas`` that are commits present in ``repo``."""
        return {commit: tree for commit, tree in self.commit_fields(repo, shas, "%T").items() if len(tree) == 40}

    def commit_fields(self, repo: Path, shas: Iterable[str], fmt: str) -> dict[str, str]:
        """{commit: what ``fmt`` (``--format``'s placeholders, such as ``%T``) prints} for those of ``shas``
        that are commits present in ``repo``."""
        shas = sorted(set(shas))
        if not shas:
            return {}
        out = self.run(
            ["rev-list", "--missing=allow-any", "--ignore-missing", "--no-walk", f"--format=%H {fmt}", "--stdin"],
            repo=repo,
            stdin="".join(f"{s}\n" for s in shas),
        )
        found: dict[str, str] = {}
        for line in out.splitlines():
            commit, _, value = line.partition(" ")
            if commit != "commit" and len(commit) == 40:
                found[commit] = value
        return found

    def left_right(self, repo: Path, commit: str, head: str) -> tuple[int, int]:
        """(commits only ``commit`` reaches, commits only ``head`` reaches); (0, n) means ``commit`` is
        on ``head``'s history and ``head`` is n commits ahead."""
        out = self.run(
            ["rev-list", "--missing=allow-any", "--left-right", "--count", f"{commit}...{head}", "--"], repo=repo
        )
        left, right = out.split()
        return int(left), int(right)

    def reachable_from_any(self, repo: Path, commit: str, tips: Iterable[str]) -> bool:
        """Is ``commit`` an ancestor of (or equal to) one of ``tips``? All must be present commits."""
        tips = sorted(set(tips))
        if commit in tips:
            return True
        if not tips:
            return False
        # Commits reachable from `commit` but from none of the tips: zero iff some tip reaches it.
        stdin = f"{commit}\n" + "".join(f"^{t}\n" for t in tips)
        out = self.run(["rev-list", "--missing=allow-any", "--count", "--stdin"], repo=repo, stdin=stdin)
        return int(out.strip()) == 0

    def ancestry(self, repo: Path, old: str, new: str, *, first_parent: bool = True) -> list[str]:
        """The commits of ``new``'s history that ``old``'s does not hold, oldest first: its first-parent line
        (the branch's own commits and merges), or every one, parents before children. Bounded as a ref
        listing is (40 hex a commit)."""
        order = "--first-parent" if first_parent else "--topo-order"
        out = self.run_full(
            ["rev-list", "--missing=allow-any", "--reverse", order, f"{old}..{new}", "--"],
            repo=repo,
            max_output=self.max_listing,
        )[0]
        return out.split()

    def merge_base(self, repo: Path, one: str, other: str) -> str | None:
        """The best common ancestor of two present commits; None when their histories share none."""
        try:
            out = self.run(["merge-base", one, other, "--"], repo=repo)
        except GitError as exc:
            if exc.returncode == 1 and not exc.stderr.strip():  # git's answer for unrelated histories
                return None
            raise
        return out.strip() or None

    def namespace_refs(self, repo: Path) -> dict[str, str]:
        """{'heads/x' | 'tags/x': sha} under the cache's upstream namespace (tags as stored, unpeeled)."""
        out = self.run(["for-each-ref", "--format=%(objectname) %(refname)", "--", UPSTREAM_NS], repo=repo)
        refs: dict[str, str] = {}
        for line in out.splitlines():
            sha, _, ref = line.partition(" ")
            refs[ref[len(UPSTREAM_NS) :]] = sha
        return refs

    def present_objects(self, repo: Path, commit: str) -> set[str]:
        """The objects of ``commit``'s tree that ``repo`` holds, found by walking the trees it holds
        (``--missing=print`` marks the rest and turns lazy fetching off: ``cat-file`` would fetch)."""
        out = self.run(["rev-list", "--objects", "--no-walk", "--missing=print", commit, "--"], repo=repo)
        return {line.split(" ", 1)[0] for line in out.splitlines() if line and not line.startswith("?")}

    def object_sizes(self, repo: Path, oids: Iterable[str]) -> dict[str, int]:
        """{oid: size in bytes} of objects ``repo`` holds (only ask for present ones: see above)."""
        oids = sorted(set(oids))
        if not oids:
            return {}
        out = self.run(
            ["cat-file", "--batch-check=%(objectname) %(objectsize)"], repo=repo, stdin="".join(f"{o}\n" for o in oids)
        )
        sizes: dict[str, int] = {}
        for line in out.splitlines():
            oid, _, size = line.partition(" ")
            if size.isdigit():
                sizes[oid] = int(size)
        return sizes

    def ls_tree(self, repo: Path, tree: str) -> list[TreeEntry]:
        """The entries of one tree object present in ``repo`` (the objects they name need not be)."""
        out = self.run(["ls-tree", "-z", "--full-tree", tree, "--"], repo=repo)
        entries = []
        for record in out.split("\0"):
            if not record:
                continue
            head, _, name = record.partition("\t")
            mode, kind, oid = head.split(" ")
            entries.append(TreeEntry(mode, kind, oid, name))
        return entries

    def gitlinks(self, repo: Path, tree: str) -> dict[str, str]:
        """{path: commit} of every gitlink (mode 160000) anywhere below ``tree``; every tree below it must be
        present (a missing one fails: lazy fetching is off in a cache repository)."""
        out = self.run_full(["ls-tree", "-r", "-z", "--full-tree", tree, "--"], repo=repo, max_output=MAX_LISTING)[0]
        links: dict[str, str] = {}
        for record in out.split("\0"):
            head, _, path = record.partition("\t")
            if head.startswith("160000 "):
                links[path] = head.split(" ")[2]
        return links

    def config_blob(self, repo: Path, oid: str) -> list[tuple[str, str | None]]:
        """A config-format blob (a ``.gitmodules``) as git reads it: (key, value) in order, value None for a
        key written without '='. ``--no-includes``: git never follows ``include.path`` in ``.gitmodules``
        (and ``config --blob`` would, reading any file of this machine)."""
        out = self.run(["config", "--no-includes", f"--blob={oid}", "-z", "--list"], repo=repo)
        records: list[tuple[str, str | None]] = []
        for record in out.split("\0"):
            if record:
                key, newline, value = record.partition("\n")
                records.append((key, value if newline else None))
        return records

    def read_blob(self, repo: Path, oid: str) -> bytes:
        """The bytes of one blob present in ``repo``, exactly as git wrote them (no newline translation)."""
        argv = ["git", "-C", str(repo), "cat-file", "blob", oid]
        return run_git(argv, command="cat-file", env=git_environment(), timeout=LOCAL_TIMEOUT)[0]

    def logged_commits(self, repo: Path, shas: Iterable[str]) -> dict[str, tuple[str, str]]:
        """{commit: (author date in ISO 8601, subject)} of present commits (40 hex each). git cuts a subject
        at :data:`SUBJECT_COLUMNS` columns, so what it prints is bounded whatever an upstream wrote; the
        subject is then held to :data:`~envbuild.lock.moves.SUBJECT_CHARS` characters, bytes that are not
        UTF-8 replaced (it is shown, never matched)."""
        shas = sorted(set(shas))
        if not shas:
            return {}
        placeholders = f"--format=%H %aI %<({SUBJECT_COLUMNS},trunc)%s"
        out = self.run_full(
            ["rev-list", "--missing=allow-any", "--no-walk", placeholders, *shas, "--"],
            repo=repo,
            max_output=len(shas) * (SUBJECT_COLUMNS * 4 + 200),
        )[0]
        logged: dict[str, tuple[str, str]] = {}
        for line in out.split("\n"):  # not splitlines(): a subject may hold \r, \f or U+2028
            commit, _, rest = line.partition(" ")
            if commit in shas and line.count(" ") >= 2:
                date, _, subject = rest.partition(" ")
                logged[commit] = (date, _subject(subject))
        return logged


def _subject(text: str) -> str:
    """A subject as a report shows it: git's padding gone, no stray surrogate (JSON and terminals take only
    text), at most SUBJECT_CHARS characters."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace").rstrip(" ")
    return text if len(text) <= SUBJECT_CHARS else text[: SUBJECT_CHARS - 1] + "…"


def fetch_args(*rest: str, filter: str | None = FILTER) -> list[str]:
    """``git fetch`` into a cache repository: commits only (``tree:0``, unless ``filter`` says otherwise;
    None: everything, ``--no-filter``), nothing it was not asked for (no tags, no FETCH_HEAD, no gc, no
    submodules), quietly; ``rest`` is the remote and what to fetch."""
    return [
        "fetch",
        "--no-filter" if filter is None else f"--filter={filter}",
        "--no-tags",
        "--no-write-fetch-head",
        "--no-auto-gc",
        "--no-recurse-submodules",
        "--quiet",
        *rest,
    ]


def fetch_config(url: str) -> dict[str, str]:
    """The real URL for this one command (see the module docstring), and git's checks on the objects
    it receives (:data:`FSCK_CONFIG`)."""
    return {**_real_url(url), **FSCK_CONFIG}


def ref_refspec(ref_type: str, ref: str, namespace: str = UPSTREAM_NS) -> str:
    """The refspec that fetches one branch or tag (``ref_type`` "branch" or "tag") into ``namespace`` of a
    cache repository: :data:`UPSTREAM_NS`, what verify reads, or the tree export's own."""
    space = "tags" if ref_type == "tag" else "heads"
    return f"+refs/{space}/{ref}:{namespace}{space}/{ref}"


def _real_url(url: str) -> dict[str, str]:
    return {f"url.{url}.insteadOf": NO_LAZY_FETCH_URL}
