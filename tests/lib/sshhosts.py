"""Hosts reached over real OpenSSH: an ``sshd`` of Debian's openssh-server per host, on its own loopback
port, whose sessions reach that host's own dockerd; and an ssh client home made for the test run.

- **A host** (:class:`SshHost`) is an extra dockerd (:mod:`tests.lib.engines`) and an sshd on
  127.0.0.1:<free port> with a host key of its own, key authentication only, and
  ``SetEnv DOCKER_HOST=unix://<that dockerd>``: ``docker system dial-stdio`` over its sessions reaches
  that engine and no other. Its files live under ``/run/envbuild-test-sshd/<random>/``: sshd's
  ``StrictModes`` refuses an ``authorized_keys`` under a world-writable directory such as ``/tmp``.
- **The client's home** (:class:`SshClient`): ssh reads ``~/.ssh/config`` and ``known_hosts`` from the
  passwd entry's home, not ``$HOME``, so the test gives root a home of its own through Debian's
  ``libnss-wrapper`` (``LD_PRELOAD`` and ``NSS_WRAPPER_PASSWD`` in the environment the ssh client
  inherits). Each host is a ``Host`` alias there (``node-0`` → 127.0.0.1 and its port): the cluster file
  says ``ssh://root@node-0`` as a user's says ``ssh://root@node-001``, and only the user's config knows the
  port. Its host key is in ``known_hosts`` (a test can leave it out, or write another), and the client's
  key is ``~/.ssh/id_ed25519``.

Everything is stopped by its PID: sshd and the sessions it forked (its descendants), ssh-agent, dockerd; sshd and
dockerd by the next run's start where an interrupted run could not (:mod:`tests.lib.leftovers`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
import pytest

from tests.lib.engines import ExtraEngine, start_engine
from tests.lib.leftovers import Entry, register

SSHD = "/usr/sbin/sshd"
NSS_WRAPPER = "libnss_wrapper.so"
SERVER_DIR = Path("/run/envbuild-test-sshd")
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it
START_TIMEOUT = 20.0


def keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair at ``path`` (no passphrase); its public line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (sshd forks one per connection, and a session's command below that)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class SshHost:
    """One host: its own dockerd (None: an engine that is down), reached only through its own sshd."""

    alias: str  # the Host entry of the client's ssh config
    root: Path  # sshd's files
    port: int
    engine: ExtraEngine | None
    host_key: str  # the public line of sshd's host key
    process: subprocess.Popen[bytes] | None = None
    entry: Entry | None = None  # sshd's, in the ledger of what an interrupted run leaves

    @property
    def url(self) -> str:
        return f"ssh://root@{self.alias}"

    @property
    def known_host_line(self) -> str:
        kind, key = self.host_key.split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {key}"

    def client(self, timeout: int = 600) -> docker.DockerClient:
        """The test's own view of the host's engine (its socket, not ssh): to check what envrun did."""
        assert self.engine is not None, f"{self.alias} has no engine"
        return self.engine.client(timeout)

    def start_sshd(self) -> None:
        log = open(self.root / "sshd.log", "ab")
        try:
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()
        self.entry = register(self.process.pid, f"sshd of {self.alias} on port {self.port}", remove=[self.root])
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.process.poll() is None, f"sshd exited: {(self.root / 'sshd.log').read_text()[-2000:]}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            assert time.monotonic() < deadline, f"sshd did not listen on {self.port}"
            time.sleep(0.05)

    def stop_sshd(self) -> None:
        """sshd and every session it serves, gone: the host is out of reach until :meth:`start_sshd`."""
        if self.process is None:
            return
        _kill([*descendants(self.process.pid), self.process.pid])
        self.process.wait()
        self.process = None
        if self.entry is not None:
            self.entry.forget()

    def stop(self) -> None:
        self.stop_sshd()
        if self.engine is not None:
            self.engine.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def sshd_files(alias: str, authorized: str, docker_host: str | None = None) -> tuple[Path, int, str]:
    """(root, port, host key) of an sshd for ``alias`` on a free loopback port that lets in the key
    ``authorized``, its sessions given ``DOCKER_HOST=docker_host`` (None: a socket under root nothing listens
    on, as on a node whose engine is down); written, not started."""
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    SERVER_DIR.mkdir(mode=0o755, exist_ok=True)
    root = SERVER_DIR / secrets.token_hex(6)
    root.mkdir(mode=0o700)
    host_key = keygen(root / "host_ed25519", f"{alias} host key")
    (root / "authorized_keys").write_text(authorized + "\n")
    port = free_port()
    (root / "sshd_config").write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {root / 'host_ed25519'}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes yes",
                "LogLevel VERBOSE",
                f"SetEnv DOCKER_HOST={docker_host or f'unix://{root}/engine.sock'}",
                "",
            ]
        )
    )
    return root, port, host_key


def start_host(alias: str, tmp: Path, authorized: str) -> SshHost:
    """A dockerd under ``tmp`` and an sshd in front of it that lets in the key ``authorized``."""
    engine = start_engine(tmp)
    root = None
    try:
        root, port, host_key = sshd_files(alias, authorized, engine.host)
        host = SshHost(alias, root, port, engine, host_key)
        host.start_sshd()
    except BaseException:
        engine.stop()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
        raise
    return host


@dataclass
class SshClient:
    """root's ssh home, made for the run: config, known_hosts and key; ``env`` makes ssh use it."""

    home: Path
    key: Path
    public_key: str
    hosts: list[SshHost] = field(default_factory=list)
    extra_config: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": NSS_WRAPPER,
            "NSS_WRAPPER_PASSWD": str(self.home.parent / "passwd"),
            "NSS_WRAPPER_GROUP": str(self.home.parent / "group"),
        }

    def write(self, known: list[str] | None = None) -> None:
        """The config (a Host alias per host) and known_hosts (every host's key, or ``known``)."""
        ssh = self.home / ".ssh"
        entries = []
        for host in self.hosts:
            entries += [f"Host {host.alias}", "  HostName 127.0.0.1", f"  Port {host.port}", ""]
        (ssh / "config").write_text("\n".join([*self.extra_config, *entries]))
        lines = [h.known_host_line for h in self.hosts] if known is None else known
        (ssh / "known_hosts").write_text("".join(line + "\n" for line in lines))

    @contextmanager
    def known_hosts(self, lines: list[str]) -> Iterator[None]:
        """known_hosts holding ``lines`` instead, for one test."""
        self.write(known=lines)
        try:
            yield
        finally:
            self.write()


def make_client(base: Path) -> SshClient:
    """An ssh home under ``base`` (a directory only root can write: ssh checks the config's owner and mode)."""
    home = base / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    home.chmod(0o700)
    passwd = []
    for line in Path("/etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == "root":
            fields[5] = str(home)
        passwd.append(":".join(fields))
    (base / "passwd").write_text("\n".join(passwd) + "\n")
    shutil.copyfile("/etc/group", base / "group")
    key = home / ".ssh" / "id_ed25519"
    return SshClient(home, key, keygen(key, "envbuild test client"))


@contextmanager
def ssh_hosts(count: int, tmp: pytest.TempPathFactory) -> Iterator[tuple[SshClient, list[SshHost]]]:
    """``count`` hosts behind sshd and a client home that knows them, its environment set while in use."""
    client = make_client(tmp.mktemp("sshclient"))
    started: list[SshHost] = []
    patch = pytest.MonkeyPatch()
    try:
        for index in range(count):
            started.append(start_host(f"node-{index}", tmp.mktemp(f"sshhost{index}"), client.public_key))
        client.hosts = started
        client.write()
        for name, value in client.env.items():
            patch.setenv(name, value)
        yield client, started
    finally:
        patch.undo()
        for host in started:
            host.stop()


@contextmanager
def ssh_agent(key: Path, env: dict[str, str]) -> Iterator[str]:
    """An ssh-agent of the test's own holding ``key``; its socket (the ``SSH_AUTH_SOCK`` to set)."""
    sock = SERVER_DIR / f"agent-{secrets.token_hex(6)}.sock"
    SERVER_DIR.mkdir(mode=0o755, exist_ok=True)
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not sock.exists():
            assert agent.poll() is None and time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.02)
        subprocess.run(["ssh-add", "-q", str(key)], env={**os.environ, **env, "SSH_AUTH_SOCK": str(sock)}, check=True)
        yield str(sock)
    finally:
        agent.terminate()
        agent.wait()
        sock.unlink(missing_ok=True)
