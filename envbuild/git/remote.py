"""The only module that runs git.

Every command runs with a hardened environment (no prompts, only https/ssh/git/file transports, no
inherited ``GIT_DIR``-style redirections), in its own process group so a timeout kills git *and* the
helpers it spawned (``git-remote-https``, ``index-pack``), and with user-controlled values placed
where git cannot read them as options.

Cache repositories are partial clones whose ``remote.origin.url`` is deliberately unusable
(:data:`NO_LAZY_FETCH_URL`): git 2.39 would otherwise fetch any missing object from the promisor
remote behind our back. The real URL is supplied only to the commands that are meant to touch the
network, as ``url.<real>.insteadOf=<unusable>`` through ``GIT_CONFIG_COUNT`` (an environment
channel, so a URL containing ``=`` or spaces cannot be misparsed). Reads additionally use
``rev-list --missing=allow-any``, which turns lazy fetching off for that command.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.errors import RemoteError

ALLOWED_PROTOCOLS = "https:ssh:git:file"
# A transport git refuses at once (it is not in GIT_ALLOW_PROTOCOL and no helper of that name exists).
NO_LAZY_FETCH_URL = "envbuild-no-lazy-fetch://cache-only"
UPSTREAM_NS = "refs/upstream/"
FILTER = "tree:0"
NETWORK_TIMEOUT = 600.0
LOCAL_TIMEOUT = 120.0

# Variables that would point our commands at another repository or inject configuration.
_SCRUBBED_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG",
    "GIT_QUARANTINE_PATH",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE",
    "GIT_SHALLOW_FILE",
    "GIT_COMMON_DIR",
    "GIT_CONFIG_COUNT",
)

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


class GitError(RemoteError):
    """A git command failed; ``reason`` is one line a user can act on (usually git's own words)."""

    def __init__(self, command: str, reason: str, returncode: int | None = None) -> None:
        self.command = command
        self.reason = reason
        self.returncode = returncode
        super().__init__(f"git {command}: {reason}")


def last_error_line(stderr: str) -> str:
    """git's most telling line: the last ``fatal:``/``error:`` line, with a trailing detail line if any."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "failed without a message"
    errors = [i for i, line in enumerate(lines) if line.startswith(("fatal:", "error:"))]
    if not errors:
        return lines[-1]
    first = lines[errors[-1]].split(":", 1)[1].strip()
    # "unable to access 'URL/': Could not resolve host: x" — the URL is in the result already; keep the cause.
    first = re.sub(r"^unable to access '[^']*': ", "", first)
    # git daemon failures put the actual errno on the line after "fatal: unable to connect to host:".
    if errors[-1] + 1 < len(lines) and first.endswith(":"):
        return f"{first} {lines[errors[-1] + 1]}"
    return first


@dataclass(frozen=True)
class RefListing:
    """What ``git ls-remote`` advertised: branch heads, and tags peeled to what they point at."""

    heads: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    refs: Mapping[str, str] = field(default_factory=dict)  # {'heads/x' | 'tags/x': sha}, tags unpeeled
    raw: str = ""

    @classmethod
    def parse(cls, text: str) -> "RefListing":
        heads: dict[str, str] = {}
        tags: dict[str, str] = {}
        peeled: dict[str, str] = {}
        refs: dict[str, str] = {}
        for line in text.splitlines():
            sha, _, ref = line.partition("\t")
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
        return cls(heads, tags, refs, text)

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
    local_timeout: float = LOCAL_TIMEOUT
    observer: Observer | None = None
    executable: str = "git"

    def environment(self, config: Mapping[str, str] | None = None) -> dict[str, str]:
        config = config or {}
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUBBED_ENV and not k.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))
        }
        env.update(GIT_TERMINAL_PROMPT="0", GIT_ALLOW_PROTOCOL=ALLOWED_PROTOCOLS, LC_ALL="C", LANGUAGE="C")
        if "GIT_SSH_COMMAND" not in env and "GIT_SSH" not in env:
            env["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"  # never wait for a password
        env["GIT_CONFIG_COUNT"] = str(len(config))
        for i, (key, value) in enumerate(config.items()):
            env[f"GIT_CONFIG_KEY_{i}"] = key
            env[f"GIT_CONFIG_VALUE_{i}"] = value
        return env

    def run(
        self,
        args: Sequence[str],
        *,
        repo: Path | None = None,
        stdin: str | None = None,
        config: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> str:
        """Run ``git [-C repo] args``; return stdout, raise :class:`GitError` on failure or timeout."""
        return self.run_full(args, repo=repo, stdin=stdin, config=config, timeout=timeout)[0]

    def run_full(
        self,
        args: Sequence[str],
        *,
        repo: Path | None = None,
        stdin: str | None = None,
        config: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[str, str]:
        """Like :meth:`run`, returning (stdout, stderr)."""
        argv = [self.executable, *(["-C", str(repo)] if repo is not None else []), *args]
        timeout = self.local_timeout if timeout is None else timeout
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # A path in a hostile tree need not be UTF-8: keep its bytes rather than fail to decode.
                encoding="utf-8",
                errors="surrogateescape",
                env=self.environment(config),
                start_new_session=True,
            )
        except OSError as exc:
            raise GitError(args[0], f"cannot run git: {exc.strerror}") from None
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise GitError(args[0], f"timed out after {timeout:g} s") from None
        except BaseException:
            _kill_group(proc)
            raise
        if proc.returncode != 0:
            raise GitError(args[0], last_error_line(err), proc.returncode)
        return out, err

    def run_bytes(self, args: Sequence[str], *, repo: Path | None = None, timeout: float | None = None) -> bytes:
        """Like :meth:`run` (same environment, same process group), returning stdout's bytes exactly as git
        wrote them: a blob's content, with no newline translation."""
        argv = [self.executable, *(["-C", str(repo)] if repo is not None else []), *args]
        timeout = self.local_timeout if timeout is None else timeout
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.environment(),
                start_new_session=True,
            )
        except OSError as exc:
            raise GitError(args[0], f"cannot run git: {exc.strerror}") from None
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise GitError(args[0], f"timed out after {timeout:g} s") from None
        except BaseException:
            _kill_group(proc)
            raise
        if proc.returncode != 0:
            raise GitError(args[0], last_error_line(err.decode("utf-8", "replace")), proc.returncode)
        return out

    # -- network -------------------------------------------------------------------------------

    def ls_remote(self, repo: Path, url: str) -> RefListing:
        self._observe("ls-remote", url)
        out = self.run(
            ["ls-remote", "--heads", "--tags", "--", "origin"],
            repo=repo,
            config=_real_url(url),
            timeout=self.network_timeout,
        )
        return RefListing.parse(out)

    def fetch(self, repo: Path, url: str, refspecs: Sequence[str], *, prune: bool = False) -> bool:
        """Fetch commits (no trees, no blobs) for ``refspecs``; return False when the server ignored
        the filter and sent a full pack (git falls back by itself and says so on stderr)."""
        self._observe("fetch", url)
        args = [
            "fetch",
            f"--filter={FILTER}",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-gc",
            "--no-recurse-submodules",
            "--quiet",
            *(["--prune"] if prune else []),
            "origin",
            "--",
            *refspecs,
        ]
        _, err = self.run_full(args, repo=repo, config=_real_url(url), timeout=self.network_timeout)
        return "filtering not recognized by server" not in err

    def fetch_objects(self, repo: Path, url: str, oids: Sequence[str]) -> None:
        """Fetch exactly these objects (trees or blobs of a pinned tree, by ID) and nothing they reach:
        what a lazy fetch from the promisor remote would do, asked for explicitly. Objects a want names are
        sent whatever the filter; ``tree:0`` keeps out everything else. The noop negotiation sends no haves:
        a want by ID has no history to negotiate."""
        self._observe("fetch", url)
        args = [
            "fetch",
            f"--filter={FILTER}",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-gc",
            "--no-recurse-submodules",
            "--quiet",
            "origin",
            "--",
            *sorted(set(oids)),
        ]
        config = {**_real_url(url), "fetch.negotiationAlgorithm": "noop"}
        self.run(args, repo=repo, config=config, timeout=self.network_timeout)

    def _observe(self, command: str, url: str) -> None:
        if self.observer is not None:
            self.observer(command, url)

    # -- local reads: never reach the network (--missing=allow-any disables lazy fetching) -----

    def init_bare(self, path: Path) -> None:
        self.run(["init", "--quiet", "--bare", "--", str(path)])
        (path / "config").write_text(CACHE_REPO_CONFIG, encoding="utf-8")

    def commit_trees(self, repo: Path, shas: Iterable[str]) -> dict[str, str]:
        """{commit: its tree} for those of ``shas`` that are commits present in ``repo``."""
        shas = sorted(set(shas))
        if not shas:
            return {}
        out = self.run(
            ["rev-list", "--missing=allow-any", "--ignore-missing", "--no-walk", "--format=%H %T", "--stdin"],
            repo=repo,
            stdin="".join(f"{s}\n" for s in shas),
        )
        trees: dict[str, str] = {}
        for line in out.splitlines():
            commit, _, tree = line.partition(" ")
            if commit != "commit" and len(commit) == 40 and len(tree) == 40:
                trees[commit] = tree
        return trees

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

    def read_blob(self, repo: Path, oid: str) -> bytes:
        """The bytes of one blob present in ``repo``."""
        return self.run_bytes(["cat-file", "blob", oid], repo=repo)

    def count_range(self, repo: Path, old: str, new: str) -> int:
        return int(self.run(["rev-list", "--missing=allow-any", "--count", f"{old}..{new}", "--"], repo=repo))


def _real_url(url: str) -> dict[str, str]:
    return {f"url.{url}.insteadOf": NO_LAZY_FETCH_URL}


def _kill_group(proc: "subprocess.Popen[str] | subprocess.Popen[bytes]") -> None:
    """Kill git and every helper it started: they share the process group we created for it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()
