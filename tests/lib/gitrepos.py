"""Test helpers: real git repositories built in tmp_path, served by real ``git daemon`` processes on
127.0.0.1 (one allowing partial clone, one not), and a throttling TCP proxy to catch a fetch halfway.

Fixtures here are imported explicitly by the test modules that use them (no conftest.py). Every
process started here is stopped by its PID (daemons by their own process group) in a finalizer.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tests.lib.leftovers import Entry, register

_IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


def git(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> str:
    """Run git for test setup (never envbuild's code path), failing loudly."""
    env = {**os.environ, **_IDENTITY}
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode().strip()


@dataclass
class Repo:
    """A non-bare upstream repository with helpers to shape its history."""

    path: Path
    _n: int = 0

    def commit(self, message: str | None = None, *, files: dict[str, str] | None = None) -> str:
        self._n += 1
        for name, text in (files or {f"file{self._n}.txt": f"content {self._n}\n"}).items():
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            (self.path / name).write_text(text)
        git("add", "-A", cwd=self.path)
        git("commit", "-q", "-m", message or f"commit {self._n}", cwd=self.path)
        return self.rev("HEAD")

    def commit_gitlinks(
        self, message: str, links: dict[str, str], gitmodules: dict[str, tuple[str, str]] | None = None, **files: str
    ) -> str:
        """Commit gitlinks ({path: commit}) as ``git submodule add`` would leave them, without cloning
        anything: each gitlink in the index, and ``.gitmodules`` with ``gitmodules`` ({name: (path, url)});
        ``files`` are written too ({name with '/' as '__': text})."""
        if gitmodules is not None:
            text = "".join(f'[submodule "{n}"]\n\tpath = {p}\n\turl = {u}\n' for n, (p, u) in gitmodules.items())
            (self.path / ".gitmodules").write_text(text)
        for name, text in files.items():
            target = self.path / name.replace("__", "/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        git("add", "-A", cwd=self.path)
        for path, commit in links.items():
            git("update-index", "--add", "--cacheinfo", f"160000,{commit},{path}", cwd=self.path)
            (self.path / path).mkdir(parents=True, exist_ok=True)  # an empty directory: `add -A` keeps the gitlink
        git("commit", "-q", "-m", message, cwd=self.path)
        return self.rev("HEAD")

    def rev(self, expr: str) -> str:
        return git("rev-parse", "--verify", expr, cwd=self.path)

    def tree(self, commit: str) -> str:
        return self.rev(f"{commit}^{{tree}}")

    def checkout(self, branch: str, *, create_at: str | None = None) -> None:
        if create_at:
            git("checkout", "-q", "-b", branch, create_at, cwd=self.path)
        else:
            git("checkout", "-q", branch, cwd=self.path)

    def tag(self, name: str, at: str, *, annotated: bool = False) -> None:
        git("tag", *(["-a", "-m", name] if annotated else []), name, at, cwd=self.path)

    def force_branch(self, branch: str, at: str) -> None:
        """What a force-push does upstream: move the branch, then collect the abandoned commits."""
        git("checkout", "-q", "--detach", cwd=self.path)
        git("branch", "-f", branch, at, cwd=self.path)
        git("checkout", "-q", branch, cwd=self.path)
        git("reflog", "expire", "--expire=now", "--all", cwd=self.path)
        git("gc", "-q", "--prune=now", cwd=self.path)


# Trees git's fsck refuses, by its message id: the entries (mode, name) of a one-level tree.
MALFORMED_TREES = {
    "duplicateEntries": [(b"100644", b"a"), (b"100644", b"a")],
    "hasDotgit": [(b"100644", b".git")],
    "hasDotdot": [(b"100644", b"..")],
    "gitmodulesSymlink": [(b"120000", b".gitmodules")],
}


def commit_malformed(repo: Path, kind: str, *, branch: str = "main") -> str:
    """Put a commit on ``branch`` that git's fsck refuses: a tree of :data:`MALFORMED_TREES` ``kind``,
    or (``kind="badTimezone"``) a commit whose author has an impossible time zone. Written with
    ``hash-object --literally``, which skips the checks; returns the commit."""
    parent = git("rev-parse", "--verify", branch, cwd=repo)
    if kind == "badTimezone":
        tree = git("rev-parse", f"{parent}^{{tree}}", cwd=repo)
        person = "Test <test@example.invalid> 1700000000"
        body = f"tree {tree}\nparent {parent}\nauthor {person} +99999\ncommitter {person} +0000\n\nbad zone\n"
        commit = git("hash-object", "-t", "commit", "-w", "--literally", "--stdin", cwd=repo, stdin=body.encode())
    else:
        blob = bytes.fromhex(git("hash-object", "-w", "--stdin", cwd=repo, stdin=b"x\n"))
        data = b"".join(mode + b" " + name + b"\0" + blob for mode, name in MALFORMED_TREES[kind])
        tree = git("hash-object", "-t", "tree", "-w", "--literally", "--stdin", cwd=repo, stdin=data)
        commit = git("commit-tree", tree, "-p", parent, "-m", kind, cwd=repo)
    git("update-ref", f"refs/heads/{branch}", commit, cwd=repo)
    return commit


def make_repo(path: Path) -> Repo:
    path.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(path))
    return Repo(path)


def fast_import_repo(
    path: Path, *, commits: int, files: int, seed: int = 1, touch: int = 5, lines: int = 40, tag_every: int = 500
) -> Path:
    """A long history made fast with ``git fast-import``, shaped like source code: ``files`` files of
    ``lines`` lines in the first commit, then each commit edits a few lines of ``touch`` files (so
    packs delta-compress as real histories do); annotated tags every ``tag_every`` commits; a branch
    ``side`` with one commit of its own off the middle of ``main``."""
    rng = random.Random(seed)
    words = [f"w{rng.randrange(10**6):06d}" for _ in range(4096)]

    def line() -> str:
        return " ".join(rng.choices(words, k=rng.randint(3, 12)))

    def data(payload: bytes) -> bytes:
        return b"data %d\n" % len(payload) + payload + b"\n"

    content = [[line() for _ in range(lines)] for _ in range(files)]
    path.mkdir(parents=True)
    git("init", "-q", "--bare", "-b", "main", str(path))
    proc = subprocess.Popen(
        ["git", "fast-import", "--quiet"], cwd=path, stdin=subprocess.PIPE, env={**os.environ, **_IDENTITY}
    )
    assert proc.stdin is not None
    out = proc.stdin
    when = 1_700_000_000
    for n in range(1, commits + 1):
        when += 60
        out.write(b"commit refs/heads/main\nmark :%d\n" % n)
        out.write(b"committer Test <test@example.invalid> %d +0000\n" % when + data(b"commit %d" % n))
        if n > 1:
            out.write(b"from :%d\n" % (n - 1))
        changed = range(files) if n == 1 else rng.sample(range(files), min(touch, files))
        for f in changed:
            if n > 1:
                for _ in range(rng.randint(1, 3)):
                    content[f][rng.randrange(lines)] = line()
            blob = ("\n".join(content[f]) + "\n").encode()
            out.write(b"M 100644 inline dir%d/file%d.txt\n" % (f % 50, f) + data(blob))
        if n % tag_every == 0:
            out.write(
                b"tag v%d\nfrom :%d\ntagger Test <test@example.invalid> %d +0000\n" % (n, n, when)
                + data(b"release %d" % n)
            )
    out.write(
        b"commit refs/heads/side\ncommitter Test <test@example.invalid> %d +0000\n" % when
        + data(b"side work")
        + b"from :%d\n" % max(1, commits // 2)
        + b"M 100644 inline side.txt\n"
        + data(b"side\n")
    )
    out.close()
    assert proc.wait(timeout=600) == 0
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


def stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process we started in its own session, and its children, by its PID."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    else:
        # The daemon is gone, but a forked per-connection child may still be running in its group.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class GitDaemon:
    """``git daemon --export-all --base-path=base`` on 127.0.0.1, with or without partial clone."""

    base: Path
    allow_filter: bool
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    entry: Entry | None = None  # in the ledger of what an interrupted run leaves (tests/lib/leftovers.py)

    def start(self) -> GitDaemon:
        self.port = free_port()
        config = ["-c", f"uploadpack.allowFilter={'true' if self.allow_filter else 'false'}"]
        self.proc = subprocess.Popen(
            [
                "git",
                *config,
                "daemon",
                "--export-all",
                "--reuseaddr",
                "--informative-errors",
                f"--base-path={self.base}",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                str(self.base),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **_IDENTITY},
        )
        self.entry = register(self.proc.pid, f"git daemon on port {self.port}")
        wait_for_port(self.port)
        return self

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)
        if self.entry is not None:
            self.entry.forget()


@dataclass
class Served:
    """One directory of upstream repositories served three ways."""

    base: Path
    filtering: GitDaemon
    plain: GitDaemon

    def repo(self, name: str) -> Repo:
        return make_repo(self.base / name)

    def url(self, name: str, transport: str) -> str:
        if transport == "daemon-filter":
            return self.filtering.url(name)
        if transport == "daemon-nofilter":
            return self.plain.url(name)
        if transport == "file":
            return (self.base / name).as_uri()
        raise ValueError(transport)


class LoopbackServer:
    """A TCP server on 127.0.0.1 for tests: accepts in a daemon thread and hands each client to ``_serve``;
    ``close()`` stops accepting and closes every socket it holds (``_sockets``)."""

    port: int
    _server: socket.socket | None
    _sockets: list[socket.socket]

    def start(self: _Server) -> _Server:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._sockets.append(client)
            self._serve(client)

    def _serve(self, client: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for sock in self._sockets:
            sock.close()


_Server = TypeVar("_Server", bound=LoopbackServer)


@dataclass
class ThrottlingProxy(LoopbackServer):
    """A TCP proxy to a local port that forwards server-to-client bytes slowly while ``delay`` > 0, so
    a test can catch a fetch halfway. Runs in daemon threads; ``close()`` stops accepting."""

    target_port: int
    delay: float = 0.05
    chunk: int = 16384
    port: int = 0
    _server: socket.socket | None = None
    _sockets: list[socket.socket] = field(default_factory=list)

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        self._sockets.append(upstream)
        relay_both_ways(client, upstream, self.chunk, lambda: self.delay)


def relay_both_ways(
    client: socket.socket, upstream: socket.socket, chunk: int = 65536, pause: Callable[[], float] = lambda: 0.0
) -> None:
    """Bytes pumped both ways between two connected sockets, in daemon threads, until either end closes
    (then both are shut down); after each chunk to ``client``, a sleep of ``pause()`` seconds (read each
    time, so a test can slow or free a stream halfway)."""
    threading.Thread(target=_pump, args=(client, upstream, chunk, lambda: 0.0), daemon=True).start()
    threading.Thread(target=_pump, args=(upstream, client, chunk, pause), daemon=True).start()


def _pump(source: socket.socket, target: socket.socket, chunk: int, pause: Callable[[], float]) -> None:
    try:
        while data := source.recv(chunk):
            target.sendall(data)
            if delay := pause():
                time.sleep(delay)
    except OSError:
        pass
    finally:
        for end in (source, target):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc), to find the git a subprocess started."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, …), to follow git's helpers too."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = child_pids(frontier.pop())
        found += children
        frontier += children
    return found


def is_running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def command_line(pid: int) -> str:
    """``pid``'s arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def open_files(pid: int) -> set[str]:
    """What ``pid``'s descriptors point at (empty once it is gone)."""
    targets = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            targets.add(os.readlink(fd))
        except OSError:
            pass
    return targets


def pkt_line(payload: bytes) -> bytes:
    """One pkt-line of git's wire protocol: four hex digits of length, then the payload."""
    return b"%04x" % (len(payload) + 4) + payload


@dataclass
class HostileGitServer(LoopbackServer):
    """A git:// server on 127.0.0.1 that answers every request as ``mode`` says (protocol v0):

    - ``refs``: advertises ``refs`` (``(sha, name)`` pairs, names as raw bytes), then ends;
    - ``endless``: advertises refs without end (``refs/heads/bNNNNNNNNN``);
    - ``drip``: one valid ref every ``drip_interval`` seconds, never ending, never silent for long;
    - ``garbage``: bytes that are no pkt-line at all.

    Runs in daemon threads; ``sent`` counts the bytes written; ``close()`` stops it."""

    mode: str
    refs: list[tuple[str, bytes]] = field(default_factory=list)
    drip_interval: float = 0.2
    port: int = 0
    sent: int = 0
    _server: socket.socket | None = None
    _sockets: list[socket.socket] = field(default_factory=list)

    def url(self, name: str = "repo.git") -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def _serve(self, client: socket.socket) -> None:
        threading.Thread(target=self._answer, args=(client,), daemon=True).start()

    def _answer(self, client: socket.socket) -> None:
        try:
            length = int(client.recv(4), 16)  # the request: git-upload-pack /path\0host=…\0
            client.recv(length - 4)
            for chunk in self._chunks():
                client.sendall(chunk)
                self.sent += len(chunk)
            client.recv(1 << 16)  # the client's flush or its wants; then hang up
        except (OSError, ValueError):
            pass
        finally:
            client.close()

    def _chunks(self) -> Iterator[bytes]:
        sha = b"1" * 40
        if self.mode == "garbage":
            yield b"HTTP/1.1 200 OK\r\n\r\n\x00\xff not a pkt-line" * 4
        elif self.mode == "refs":
            for i, (commit, name) in enumerate(self.refs):
                caps = b"\0multi_ack side-band-64k ofs-delta" if i == 0 else b""
                yield pkt_line(commit.encode() + b" " + name + caps + b"\n")
            yield b"0000"
        elif self.mode in ("endless", "drip"):
            yield pkt_line(sha + b" refs/heads/main\0side-band-64k ofs-delta\n")
            for n in itertools.count():
                batch = 1 if self.mode == "drip" else 1000
                yield b"".join(pkt_line(sha + b" refs/heads/b%09d\n" % (n * batch + i)) for i in range(batch))
                if self.mode == "drip":
                    time.sleep(self.drip_interval)
        else:
            raise ValueError(self.mode)
