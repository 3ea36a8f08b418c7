"""The only module that runs git.

Every command runs with a hardened environment (no prompts, only https/ssh/git/file transports, no
inherited ``GIT_DIR``-style redirections), in its own process group so a timeout kills git *and* the
helpers it spawned (``git-remote-https``, ``index-pack``), and with user-controlled values placed
where git cannot read them as options.

Network commands cannot outlive envbuild: they start through ``setpriv --pdeathsig KILL`` (util-linux),
so the kernel kills git when the thread that started it dies, however envbuild dies (``kill -9``
included). That thread waits for git, so a worker thread of verify's pool is as good a parent as the
main one. Helpers git started then die of the closed pipe; a fetch also inherits the cache lock's
descriptor, so the lock stays held until the last of them is gone and nobody clears up under them.
What a server sends is bounded: a ref listing by :data:`MAX_LISTING`, git's messages by their tail,
every command by its timeout; and fetched objects are checked by git (``fetch.fsckObjects``).

Cache repositories are partial clones whose ``remote.origin.url`` is deliberately unusable
(:data:`NO_LAZY_FETCH_URL`): git 2.39 would otherwise fetch any missing object from the promisor
remote behind our back. The real URL is supplied only to the commands that are meant to touch the
network, as ``url.<real>.insteadOf=<unusable>`` through ``GIT_CONFIG_COUNT`` (an environment
channel, so a URL containing ``=`` or spaces cannot be misparsed). Reads additionally use
``rev-list --missing=allow-any``, which turns lazy fetching off for that command.
"""

from __future__ import annotations

import functools
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
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
# Object checking on every fetch: a tree or commit git's fsck finds malformed (duplicate entries, `.git`
# names, a symlinked .gitmodules, …) refuses the fetch. Fetch-time checks run in strict mode, where
# git's warnings are errors too. The export fetch uses the same key.
FSCK_CONFIG = {"fetch.fsckObjects": "true"}
# The ls-remote output we accept: ~700,000 refs, far more than any real repository advertises.
MAX_LISTING = 64 << 20
# git's stderr is kept only this far back: its last lines say what went wrong; a server cannot fill memory.
STDERR_TAIL = 64 << 10
_NO_SPACE = ("No space left on device", "Disk quota exceeded")
_FSCK_LINE = re.compile(r"error: object ([0-9a-f]{40,64}): (\w+: .*)")

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

    def __init__(self, command: str, reason: str, returncode: int | None = None, *, stderr: str = "") -> None:
        self.command = command
        self.reason = reason
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"git {command}: {reason}")

    @property
    def no_space(self) -> bool:
        """git could not write because the disk (or the quota) is full."""
        return any(message in self.stderr for message in _NO_SPACE)


def last_error_line(stderr: str) -> str:
    """git's most telling line, safe to print: an object check's verdict, else the last ``fatal:`` or
    ``error:`` line with a trailing detail line if any; control characters a server sent are escaped."""
    return _printable(_telling_line(stderr))


def _telling_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "failed without a message"
    for line in lines:
        if fsck := _FSCK_LINE.fullmatch(line):  # git's own reason, not "index-pack failed" after it
            return f"malformed object refused by git's fsck: {fsck[2]} (object {fsck[1]})"
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


@dataclass
class GitRunner:
    """Runs git. ``observer(command, url)`` is called before every network command (for progress
    accounting and for tests that must prove a warm cache stays off the network)."""

    network_timeout: float = NETWORK_TIMEOUT
    local_timeout: float = LOCAL_TIMEOUT
    observer: Observer | None = None
    executable: str = "git"
    max_listing: int = MAX_LISTING

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
        network: bool = False,
        hold: Sequence[int] = (),
        max_output: int | None = None,
    ) -> tuple[str, str]:
        """Like :meth:`run`, returning (stdout, stderr). ``network``: a command that talks to a server,
        tied to our lifetime (see the module docstring); ``hold``: descriptors git inherits (a cache
        lock); ``max_output``: stdout beyond this many bytes kills git and fails (no ``stdin`` then)."""
        prefix = _tied_to_parent() if network else ()
        argv = [*prefix, self.executable, *(["-C", str(repo)] if repo is not None else []), *args]
        timeout = self.local_timeout if timeout is None else timeout
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.environment(config),
                start_new_session=True,
                pass_fds=tuple(hold),
            )
        except OSError as exc:
            raise GitError(args[0], f"cannot run git: {exc.strerror}") from None
        try:
            if stdin is None:
                out, err = _collect(proc, timeout, max_output)
            else:
                out, err = proc.communicate(stdin.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise GitError(args[0], f"timed out after {timeout:g} s") from None
        except _TooMuchOutput:
            _kill_group(proc)
            raise GitError(args[0], f"the server sent more than {max_output} bytes; refused") from None
        except BaseException:
            _kill_group(proc)
            raise
        # Undecodable bytes (a hostile ref name) become U+FFFD instead of a traceback.
        text, errors = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        if proc.returncode != 0:
            raise GitError(args[0], last_error_line(errors), proc.returncode, stderr=errors)
        return text, errors

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
        return RefListing.parse(out)

    def fetch(
        self, repo: Path, url: str, refspecs: Sequence[str], *, prune: bool = False, hold: int | None = None
    ) -> bool:
        """Fetch commits (no trees, no blobs) for ``refspecs``, every object checked; return False when
        the server ignored the filter and sent a full pack (git falls back by itself and says so on
        stderr). ``hold``: the cache lock's descriptor, which git and its helpers keep while alive."""
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
        _, err = self.run_full(
            args,
            repo=repo,
            config={**_real_url(url), **FSCK_CONFIG},
            timeout=self.network_timeout,
            network=True,
            hold=() if hold is None else (hold,),
        )
        return "filtering not recognized by server" not in err

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

    def count_range(self, repo: Path, old: str, new: str) -> int:
        return int(self.run(["rev-list", "--missing=allow-any", "--count", f"{old}..{new}", "--"], repo=repo))


def _real_url(url: str) -> dict[str, str]:
    return {f"url.{url}.insteadOf": NO_LAZY_FETCH_URL}


class _TooMuchOutput(Exception):
    pass


def _collect(proc: subprocess.Popen[bytes], timeout: float, max_output: int | None) -> tuple[bytes, bytes]:
    """(stdout, the tail of stderr) of a command without input, within ``timeout`` seconds; raises
    :class:`_TooMuchOutput` as soon as stdout passes ``max_output`` bytes."""
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            for key, _ in selector.select(left):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(data)
                if key.data is out and max_output is not None and len(out) > max_output:
                    raise _TooMuchOutput()
                if key.data is err and len(err) > 2 * STDERR_TAIL:
                    del err[:-STDERR_TAIL]
    proc.wait(max(0.0, deadline - time.monotonic()))
    return bytes(out), bytes(err)


@functools.lru_cache(maxsize=None)
def _tied_to_parent() -> tuple[str, ...]:
    """The prefix that makes the kernel SIGKILL a command when the thread that started it dies
    (``PR_SET_PDEATHSIG``, set by util-linux's setpriv before it execs git). Without a working setpriv
    (not Linux, util-linux < 2.33) there is none, and only the inherited lock protects the cache."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return ()
    prefix = (setpriv, "--pdeathsig", "KILL", "--")
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return prefix if probe.returncode == 0 else ()


def _printable(text: str, limit: int = 300) -> str:
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("…" if len(text) > limit else "")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill git and every helper it started: they share the process group we created for it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()
