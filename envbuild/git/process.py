"""Running one git command, hardened and bounded; :mod:`envbuild.git.remote` says which commands.

Every command runs with a hardened environment (no prompts, only https/ssh/git/file transports, no
inherited ``GIT_DIR``-style redirections) and in its own process group, so a timeout kills git *and*
the helpers it spawned (``git-remote-https``, ``index-pack``).

Network commands cannot outlive envbuild: they start through ``setpriv --pdeathsig KILL`` (util-linux),
so the kernel kills git when the thread that started it dies, however envbuild dies (``kill -9``
included). That thread waits for git, so a worker thread of verify's pool is as good a parent as the
main one. Helpers git started then die of the closed pipe; a fetch also inherits the cache lock's
descriptor (``hold``), so the lock stays held until the last of them is gone.

What a server sends is bounded: stdout by ``max_output``, git's own memory by ``max_memory`` (git holds
a whole ref advertisement before it prints a line, and has no limit of its own), stderr by its tail,
every command by its timeout. Bytes that are not UTF-8 are kept (``surrogateescape``), and control
characters and such bytes in git's messages are escaped, so nothing a server sends reaches a terminal raw.
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
from collections.abc import Mapping, Sequence
from pathlib import Path

from envbuild.errors import RemoteError
from envbuild.escape import for_terminal

ALLOWED_PROTOCOLS = "https:ssh:git:file"
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


class GitError(RemoteError):
    """A git command failed; ``reason`` is one line a user can act on (usually git's own words)."""

    def __init__(self, command: str, reason: str, returncode: int | None = None, *, stderr: str = "") -> None:
        self.reason = reason
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"git {command}: {reason}")

    @property
    def malformed(self) -> bool:
        """git's object checks refused what the upstream sent: its objects are what they are, so no later
        fetch reads them (not a passing fault, as a dropped connection is)."""
        return self.reason.startswith(MALFORMED)

    @property
    def no_space(self) -> bool:
        """git could not write because the disk (or the quota) is full."""
        return any(message in self.stderr for message in _NO_SPACE)


MALFORMED = "malformed object refused by git's fsck"  # how a reason from git's object checks begins
# What envbuild says of a repository whose object names are SHA-256 (``git init --object-format=sha256``).
SHA256_UNSUPPORTED = "is a SHA-256 repository; envbuild pins SHA-1 commits (not supported yet)"
# git's words when a SHA-1 repository (every cache's) fetches from a SHA-256 one.
_MISMATCHED_ALGORITHMS = re.compile(r"mismatched algorithms: client sha1; server sha256")


def last_error_line(stderr: str) -> str:
    """git's most telling line, safe to print: an object check's verdict, else the last ``fatal:`` or
    ``error:`` line with a trailing detail line if any; control characters a server sent are escaped."""
    line = _telling_line(stderr)
    return for_terminal(line[:300]) + ("…" if len(line) > 300 else "")


def _telling_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "failed without a message"
    if any(_MISMATCHED_ALGORITHMS.search(line) for line in lines):
        return f"the upstream repository {SHA256_UNSUPPORTED}"
    for line in lines:
        if fsck := _FSCK_LINE.fullmatch(line):  # git's own reason, not "index-pack failed" after it
            return f"{MALFORMED}: {fsck[2]} (object {fsck[1]})"
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


def git_environment(config: Mapping[str, str] | None = None) -> dict[str, str]:
    """The hardened environment, with ``config`` passed through ``GIT_CONFIG_COUNT`` (no parsing)."""
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


def run_git(
    argv: Sequence[str],
    *,
    command: str,
    env: Mapping[str, str],
    timeout: float,
    stdin: str | None = None,
    network: bool = False,
    hold: Sequence[int] = (),
    max_output: int | None = None,
    max_memory: int | None = None,
    max_incoming: tuple[Path, int] | None = None,
) -> tuple[bytes, str]:
    """Run ``argv`` (git and its arguments); (stdout's bytes as git wrote them, stderr), or :class:`GitError`
    naming ``command`` on failure, timeout or a passed bound. ``max_output`` and ``max_memory`` need
    ``stdin=None``; ``max_incoming`` (a pack directory, a size): the temporary packs a fetch writes there may
    not pass that many bytes (:class:`IncomingTooLarge`)."""
    prefix = _tied_to_parent() if network else ()
    try:
        proc = subprocess.Popen(
            [*prefix, *argv],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
            pass_fds=tuple(hold),
        )
    except OSError as exc:
        raise GitError(command, f"cannot run git: {exc.strerror}") from None
    try:
        if stdin is None:
            out, err = _collect(proc, timeout, max_output, max_memory, max_incoming)
        else:
            out, err = proc.communicate(stdin.encode("utf-8", "surrogateescape"), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise GitError(command, f"timed out after {timeout:g} s") from None
    except _TooLarge as refused:
        _kill_group(proc)
        raise IncomingTooLarge(command, f"{refused}; refused") from None
    except _Refused as refused:
        _kill_group(proc)
        raise GitError(command, f"{refused}; refused") from None
    except BaseException:
        _kill_group(proc)
        raise
    errors = err.decode("utf-8", "surrogateescape")
    if proc.returncode != 0:
        raise GitError(command, last_error_line(errors), proc.returncode, stderr=errors)
    return out, errors


class _Refused(Exception):
    """A command passed a bound; the message says which."""


class _TooLarge(_Refused):
    """A fetch received more than it may."""


class IncomingTooLarge(GitError):
    """A fetch was stopped: what the server sent passed the bound on what it may send."""


def _collect(
    proc: subprocess.Popen[bytes],
    timeout: float,
    max_output: int | None,
    max_memory: int | None,
    max_incoming: tuple[Path, int] | None = None,
) -> tuple[bytes, bytes]:
    """(stdout, the tail of stderr) of a command without input, within ``timeout`` seconds; raises
    :class:`_Refused` as soon as stdout passes ``max_output`` bytes or git's resident memory passes
    ``max_memory`` (looked at twice a second), and :class:`_TooLarge` when the temporary packs in
    ``max_incoming``'s directory pass its size (looked at every 20 ms: loopback moves ~20 MB in that)."""
    poll = 0.02 if max_incoming is not None else 0.5
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
            for key, _ in selector.select(min(left, poll)):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(data)
                if key.data is out and max_output is not None and len(out) > max_output:
                    raise _Refused(f"the server sent more than {max_output} bytes")
                if key.data is err and len(err) > 2 * STDERR_TAIL:
                    del err[:-STDERR_TAIL]
            if max_memory is not None and _resident(proc.pid) > max_memory:
                raise _Refused(f"git grew past {max_memory >> 20} MiB reading what the server sent")
            if max_incoming is not None and _incoming(max_incoming[0]) > max_incoming[1]:
                raise _TooLarge(f"the server sent more than {max_incoming[1]} bytes")
    proc.wait(max(0.0, deadline - time.monotonic()))
    return bytes(out), bytes(err)


def _incoming(pack_dir: Path) -> int:
    """Bytes of the temporary packs a running fetch is writing into ``pack_dir``."""
    total = 0
    for path in pack_dir.glob("tmp_pack_*"):
        try:
            total += path.stat().st_size
        except OSError:
            continue  # renamed into place or removed since the listing
    return total


def _resident(pid: int) -> int:
    """Resident memory of ``pid`` in bytes (0 where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@functools.cache
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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill git and every helper it started: they share the process group we created for it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()
