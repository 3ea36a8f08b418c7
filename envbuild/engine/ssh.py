"""A host's container engine reached over ssh, through the system's OpenSSH client: the only code that runs ssh.

``ssh://[user@]host[:port]`` means what the docker CLI means by it: ``ssh … host docker system dial-stdio``,
and the engine's API spoken over that session's stdin and stdout. The system's ``ssh`` is used, not a
Python ssh library (docker-py needs paramiko for every ``ssh://`` address, even when told to use the
ssh client), so the user's ``~/.ssh/config`` (Host aliases, Port, User, ProxyJump, IdentityFile, Match),
ssh-agent and ``known_hosts`` apply exactly as they do for ``ssh host``; a port or a user is passed only
when the URL names one (docker-py's ``-p 22`` overrides the config's Port).

Host keys are ssh's to check, and always checked: ``BatchMode=yes`` means ssh never asks, so an unknown
host key is refused (unless the user's own config says ``StrictHostKeyChecking accept-new``; its ``no`` is
not followed) and a changed one always is. Each refusal is one line naming the host and the fix (:func:`ssh_problem`).

One master connection per host (``ControlMaster``, its socket in a private directory): the host is
authenticated once, and each API connection is a session multiplexed over it (milliseconds, not a
handshake); a login sshd closes before the key exchange (its ``MaxStartups``: many hosts behind one ProxyJump
host) is made again. The connect deadline bounds the master's start (TCP, banner, key exchange, authentication:
a host that accepts and then says nothing is given up on). ``ServerAliveInterval`` ends a connection
whose host died mid-call. The master and every session are this process's children, each in a session
of its own (a Ctrl-C on the terminal must not cut the connection a rollback still needs); :meth:`SshLink.close`
stops them.
"""

from __future__ import annotations

import math
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import docker
import urllib3
import urllib3.connection
import urllib3.connectionpool
from docker.transport.basehttpadapter import BaseHTTPAdapter

from envbuild.data.urls import redact_password
from envbuild.errors import EngineError, InputError

DIAL_STDIO = ("docker", "system", "dial-stdio")
# What a user's ~/.ssh/config sets for their own interactive logins, never for envrun's: a RemoteCommand (a
# tmux to attach) refuses every command; a LocalForward (the Ray dashboard's port) would be taken by envrun's
# master for the whole run, or, with ExitOnForwardFailure, fail it while the user's own login holds the port;
# an agent or X11 forwarded would be lent to every host for as long. The first value given wins in ssh.
NOT_INTERACTIVE = (
    "-o", "RemoteCommand=none", "-o", "ClearAllForwardings=yes", "-o", "PermitLocalCommand=no",
    "-o", "ForwardAgent=no", "-o", "ForwardX11=no",
)  # fmt: skip
KEEPALIVE = ("-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")  # a dead host found in ~60 s
POLL = 0.02
SESSION_END = 1.0  # seconds a session's ssh is given to exit on its own once its socket is closed
LOGIN_ATTEMPTS = 8  # a master's login tried again while sshd closes it before the key exchange (MaxStartups)
PLACEHOLDER_SOCKET = "unix:///nonexistent/envbuild-ssh-engine.sock"  # never dialled: the ssh adapter replaces it


@dataclass(frozen=True)
class SshTarget:
    """Where ``ssh`` goes: a host (or a Host alias of the user's ssh config), with the URL's user and port."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, url: str) -> SshTarget:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise InputError(f"{redact_password(url)}: not an ssh://[user@]host[:port] address") from None
        host = parts.hostname or ""
        user = parts.username
        if parts.scheme != "ssh" or not host or parts.password is not None or parts.path not in ("", "/"):
            raise InputError(f"{redact_password(url)}: not an ssh://[user@]host[:port] address")
        if "?" in url or "#" in url or port == 0:  # a query or fragment would be dropped, and the host reached
            raise InputError(
                f"{redact_password(url)}: not an ssh://[user@]host[:port] address (no query, no fragment, a port 1-65535)"
            )
        if host.startswith("-") or (user or "").startswith("-") or any(c.isspace() for c in url):
            raise InputError(
                f"{redact_password(url)}: a host or user starting with '-', or with spaces, is not an ssh destination"
            )
        return cls(host=host, user=user or None, port=port)

    def args(self) -> list[str]:
        """The destination on ssh's command line; what the URL leaves out, the user's ssh config decides."""
        found = [] if self.user is None else ["-l", self.user]
        if self.port is not None:
            found += ["-p", str(self.port)]
        return [*found, "--", self.host]

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address, as the URL wrote it
        return f"ssh://{user}{host}" + (f":{self.port}" if self.port is not None else "")


def ssh_problem(said: str, timeout: float, target: SshTarget) -> str:
    """What ssh said when it could not connect or run a command, as one clause a user can act on."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    text = " ".join(lines)
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "has changed and you have requested strict" in text:
        fix = next((line for line in lines if line.startswith("ssh-keygen ") and " -R " in line), None)
        return (
            "the host's key is not the one known_hosts holds for it (a reinstalled host, or someone in between): "
            f"refused; if the change is expected, remove the old key ({fix or 'ssh-keygen -R HOST'}) and check "
            "the new one's fingerprint"
        )
    if "Host key verification failed" in text:
        return (
            "the host's key is not in known_hosts, and ssh accepts none unasked here: check its fingerprint and "
            f"add it (`ssh {' '.join([*target.args()[:-2], target.host])} true` asks once, or ssh-keyscan into "
            "~/.ssh/known_hosts after checking what it printed)"
        )
    if "Permission denied" in text:
        denied = next((line for line in reversed(lines) if "Permission denied" in line), "Permission denied")
        return (
            f"ssh refused every key offered ({denied}): load the key into ssh-agent "
            "(ssh-add) or name it with IdentityFile in ~/.ssh/config"
        )
    if "banner exchange" in text or "timed out" in text.lower():
        return f"no ssh answer within {timeout:g} s ({lines[-1]}); is the host up and its sshd answering?"
    if _dropped_before_kex(said):
        return (
            "the host (or the ProxyJump host) closed the connection before the key exchange, every time asked: "
            "its sshd refuses logins beyond its MaxStartups (10 at once by default) or from this address; "
            f"raise MaxStartups there, or check its sshd's log ({lines[-1]})"
        )
    if "Connection refused" in text:
        return "ssh: connection refused; is sshd running there, on that port?"
    if "Could not resolve hostname" in text:
        return "ssh cannot resolve the host name; give an address, or a Host entry of ~/.ssh/config"
    meaningful = [line for line in lines if not line.startswith(("Warning:", "@"))]
    return "ssh: " + (meaningful or lines or ["ssh exited without saying why"])[-1][:300]


def _dropped_before_kex(said: str) -> bool:
    """Whether sshd (the host's, or a ProxyJump host's) closed the connection before the key exchange: what
    its MaxStartups does to the logins beyond its limit; a host key or a key refused comes later."""
    return "kex_exchange_identification" in said and "Permission denied" not in said


class SshLink:
    """One host's ssh master connection, and the sessions multiplexed over it."""

    def __init__(self, target: SshTarget, *, connect_timeout: float) -> None:
        self.target = target
        self.connect_timeout = connect_timeout
        # A unix socket path is at most 108 bytes: a short private directory, wherever TMPDIR points; and ssh
        # splits ControlPath at a space and expands its '%' and '~': such a TMPDIR is passed over for /tmp.
        base = tempfile.gettempdir()
        plain = len(base) < 60 and re.fullmatch(r"[A-Za-z0-9/._+-]+", base) is not None
        self._dir = Path(tempfile.mkdtemp(prefix="envbuild-ssh-", dir=base if plain else "/tmp"))
        self._control = self._dir / "c"
        self._master_log = self._dir / "master.log"
        self._session_log = self._dir / "sessions.log"
        self._master: subprocess.Popen[bytes] | None = None
        self._sessions: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._host_keys: tuple[str, ...] = ()  # StrictHostKeyChecking=yes where the user's config says no

    def _argv(self, *options: str) -> list[str]:
        return [
            "ssh",
            "-T",
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, math.ceil(self.connect_timeout))}",
            "-o", f"ControlPath={self._control}",
            *self._host_keys,
            *NOT_INTERACTIVE,
            *options,
        ]  # fmt: skip

    def _spawn(self, argv: list[str], log: Path, **streams: object) -> subprocess.Popen[bytes]:
        with open(log, "ab") as said:
            try:
                return subprocess.Popen(  # type: ignore[call-overload]
                    argv, stderr=said, close_fds=True, start_new_session=True, **streams
                )
            except FileNotFoundError:
                raise EngineError(
                    f"{self.target}: no `ssh` on PATH: ssh:// engines use the system's OpenSSH client "
                    "(Debian: apt-get install openssh-client)"
                ) from None

    def _checks_host_keys(self) -> bool:
        """Whether ssh, with the user's config for this host, refuses a changed host key (``ssh -G``, no network).

        ``StrictHostKeyChecking no`` (common in clusters' configs, often with ``UserKnownHostsFile /dev/null``)
        makes ssh take any key, a changed one too, without a word: the host must be checked all the same."""
        try:
            said = subprocess.run(
                ["ssh", "-G", *self.target.args()],
                capture_output=True,
                text=True,
                timeout=max(1.0, self.connect_timeout),
                stdin=subprocess.DEVNULL,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return True  # the master's own start says why ssh cannot run
        return "stricthostkeychecking false" not in said.splitlines()

    def open(self) -> None:
        """Start the master; return once the host is authenticated, or raise one line saying why not."""
        if not self._checks_host_keys():
            self._host_keys = ("-o", "StrictHostKeyChecking=yes")
        argv = self._argv("-N", "-o", "ControlMaster=yes", "-o", "ControlPersist=no", *KEEPALIVE, *self.target.args())
        self._master = self._spawn(argv, self._master_log, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + self.connect_timeout + 2  # ssh's own ConnectTimeout usually ends it first
        attempt = 0
        while not self._control.exists():  # ssh makes the control socket once the host is authenticated
            if self._master.poll() is not None:
                said = self._said(self._master_log)
                attempt += 1
                if _dropped_before_kex(said) and attempt < LOGIN_ATTEMPTS and time.monotonic() < deadline - 1:
                    # sshd's MaxStartups (10 unauthenticated at once, then a growing share dropped) closes
                    # logins beyond its limit: many hosts behind one ProxyJump, or many aliases of one host.
                    # It expects the client to come again, as a person at a terminal would.
                    time.sleep(random.uniform(0.2, 0.5) * attempt)
                    self._master_log.unlink(missing_ok=True)
                    self._master = self._spawn(
                        argv, self._master_log, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
                    )
                    continue
                problem = ssh_problem(said, self.connect_timeout, self.target)
                if self._host_keys and "known_hosts" in problem:
                    problem += (
                        " (your ssh config's `StrictHostKeyChecking no` is not followed here: envrun never takes a "
                        "host key unchecked)"
                    )
                raise EngineError(f"{self.target}: {problem}")
            if time.monotonic() > deadline:
                # ssh's ConnectTimeout ends a connect or a silent banner; what outlasts it is a login that
                # stalls: a name lookup, the host's sshd after the handshake, or the agent asked for the key.
                raise EngineError(
                    f"{self.target}: no ssh answer within {self.connect_timeout:g} s (ssh did not log in and said "
                    "nothing: the host's name lookup, its sshd, or the ssh-agent holding the key did not answer); "
                    "is the host up and sshd answering, and does the agent answer (a key waiting for a touch)?"
                )
            time.sleep(POLL)

    def client_path(self) -> str:
        """A directory holding an ``ssh`` for another program (the docker CLI) to run instead of the system's:
        its sessions go over this master, with the options every session of this link has, so they reach
        the host this link checked, and the user's RemoteCommand or forwardings do not break them."""
        real = shutil.which("ssh") or "ssh"
        bin_dir = self._dir / "bin"
        if not (bin_dir / "ssh").exists():
            bin_dir.mkdir(exist_ok=True)
            argv = " ".join(shlex.quote(arg) for arg in [real, *self._argv("-o", "ControlMaster=no")[1:]])
            (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
            (bin_dir / "ssh").chmod(0o700)
        return str(bin_dir)

    def session(self, command: tuple[str, ...] = DIAL_STDIO) -> SshSession:
        """``command`` run on the host over the master; its stdin and stdout are the returned socket."""
        mine, theirs = socket.socketpair()
        try:
            argv = self._argv("-o", "ControlMaster=no", *self.target.args(), *command)
            process = self._spawn(argv, self._session_log, stdin=theirs, stdout=theirs)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        with self._lock:
            self._sessions.add(process)
        return SshSession(self, mine, process)

    def ended(self, process: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._sessions.discard(process)

    def problem(self) -> str | None:
        """What ssh or the host's command last said, if a session failed or the master has gone."""
        said = self._said(self._session_log) or (
            self._said(self._master_log) if self._master and self._master.poll() is not None else ""
        )
        return ssh_problem(said, self.connect_timeout, self.target) if said.strip() else None

    @staticmethod
    def _said(path: Path) -> str:
        try:
            with open(path, "rb") as log:
                log.seek(max(0, os.fstat(log.fileno()).st_size - 4096))
                return log.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions), set()
        for process in [*sessions, *([self._master] if self._master else [])]:
            _stop(process)
        shutil.rmtree(self._dir, ignore_errors=True)


class SshSession:
    """A command's stdin and stdout on the host, as a socket; ending it stops its ssh."""

    def __init__(self, link: SshLink, sock: socket.socket, process: subprocess.Popen[bytes]) -> None:
        self.link = link
        self.sock = sock
        self.process = process

    def end(self) -> None:
        self.sock.close()  # the far side reads its end of input, and the session ends on its own
        try:
            self.process.wait(SESSION_END)
        except subprocess.TimeoutExpired:
            _stop(self.process)
        self.link.ended(self.process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class _SshConnection(urllib3.connection.HTTPConnection):
    def __init__(self, link: SshLink, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.link = link
        self.timeout = timeout
        self._session: SshSession | None = None

    def connect(self) -> None:
        self._session = self.link.session()
        self._session.sock.settimeout(self.timeout)
        self.sock = self._session.sock

    def close(self) -> None:
        super().close()
        session, self._session = self._session, None
        if session is not None:
            session.end()


class _SshConnectionPool(urllib3.connectionpool.HTTPConnectionPool):
    def __init__(self, link: SshLink, timeout: float, maxsize: int) -> None:
        super().__init__("localhost", timeout=timeout, maxsize=maxsize)
        self.link = link
        self.timeout = timeout  # type: ignore[assignment]  # a float, as docker-py's own pools keep it

    def _new_conn(self) -> _SshConnection:
        return _SshConnection(self.link, self.timeout)  # type: ignore[arg-type]


class SshAdapter(BaseHTTPAdapter):
    """requests' adapter for the engine API over :class:`SshLink` sessions. One pool for every URL
    (docker-py's unix adapter keeps one per URL: here each new connection is an ssh session), so an idle
    session serves the next call whatever its path."""

    __attrs__ = [*BaseHTTPAdapter.__attrs__, "timeout", "max_pool_size"]

    def __init__(self, link: SshLink, timeout: float, max_pool_size: int = 10) -> None:
        self.link = link
        self.timeout = timeout
        self.max_pool_size = max_pool_size
        self._pool = _SshConnectionPool(link, timeout, max_pool_size)
        super().__init__()

    def get_connection(self, url: str, proxies: object = None) -> _SshConnectionPool:
        return self._pool

    def request_url(self, request: object, proxies: object) -> str:
        return request.path_url  # type: ignore[attr-defined]  # no proxy: the "host" is a session

    def close(self) -> None:
        super().close()
        self._pool.close()


def ssh_docker_client(link: SshLink, timeout: float) -> docker.DockerClient:
    """A docker client whose every API connection is ``docker system dial-stdio`` over ``link``.

    docker-py builds its client from a URL only: it is built for a socket that is never dialled (with a
    version given, so nothing is asked yet), then handed the ssh adapter, mounted where docker-py mounts
    its own unix one; the caller asks the engine its API version."""
    client = docker.DockerClient(base_url=PLACEHOLDER_SOCKET, version="1.24", timeout=max(1, math.ceil(timeout)))
    adapter = SshAdapter(link, timeout)
    client.api.mount("http+docker://", adapter)
    client.api._custom_adapter = adapter
    return client
