"""ssh:// engines (:mod:`envbuild.engine.ssh`) at the edges tests/test_engine_ssh.py does not reach: an address
whose port is no port, a machine without OpenSSH's client, a host whose sshd lets the user in while its
engine is down, a login that stalls after the handshake (an ssh-agent that never answers, as one waiting
for a hardware key's touch does), and a session whose command does not end when its input does.

The host is a real sshd of Debian's openssh-server on a loopback port (:mod:`tests.lib.sshhosts`' pieces),
with no dockerd behind it: its ``DOCKER_HOST`` names a socket nothing listens on, as on a node whose
engine has stopped. Every ssh process is this test's child; none may outlive what started it."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.engine.client import Engine
from envbuild.engine.ssh import SshLink, SshTarget
from envbuild.errors import EngineError, InputError
from tests.lib.sshhosts import SERVER_DIR, SshClient, SshHost, make_client, sshd_files


def ssh_children() -> list[int]:
    """This process's ssh children still running."""
    out = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "pid=,comm="], capture_output=True, text=True)
    return [int(pid) for pid, name in (line.split() for line in out.stdout.splitlines()) if name == "ssh"]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SshClient, SshHost]]:
    """A host that lets the client's key in, whose engine is down; the client's home knows it as node-down."""
    client = make_client(tmp_path_factory.mktemp("sshclient"))
    root, port, host_key = sshd_files("node-down", client.public_key)  # no dockerd behind it: the engine is down
    down = SshHost("node-down", root, port, engine=None, host_key=host_key)
    patch = pytest.MonkeyPatch()
    try:
        down.start_sshd()
        client.hosts = [down]
        client.write()
        for name, value in client.env.items():
            patch.setenv(name, value)
        patch.delenv("SSH_AUTH_SOCK", raising=False)  # the client's key file, not whatever agent runs here
        yield client, down
    finally:
        patch.undo()
        down.stop_sshd()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("url", ["ssh://node-001:99999", "ssh://root@node-001:ssh"])
def test_an_ssh_address_whose_port_is_no_port_is_bad_input(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the cluster file's check says of its own addresses; here from ``DOCKER_HOST``, before any ssh."""
    monkeypatch.setenv("DOCKER_HOST", url)
    with pytest.raises(InputError) as caught:
        Engine.connect()
    assert str(caught.value) == f"{url}: not an ssh://[user@]host[:port] address"
    assert ssh_children() == []


def test_no_openssh_client_is_one_line_saying_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine (a slim CI image) without ``ssh``: the fix is named, and the link's private directory goes."""
    empty = Path(tempfile.mkdtemp(prefix="eb-", dir="/tmp"))
    try:
        monkeypatch.setenv("PATH", str(empty))
        monkeypatch.setattr(tempfile, "tempdir", str(empty))  # where the link makes its directory
        with pytest.raises(EngineError) as caught:
            Engine.connect("ssh://root@node-001", connect_timeout=5)
        assert str(caught.value) == (
            "ssh://root@node-001: no `ssh` on PATH: ssh:// engines use the system's OpenSSH client "
            "(Debian: apt-get install openssh-client)"
        )
        assert list(empty.iterdir()) == []
    finally:
        empty.rmdir()


@pytest.mark.sshd
def test_a_host_whose_engine_is_down_is_said_in_the_words_of_the_host(host: tuple[SshClient, SshHost]) -> None:
    """ssh lets the user in; ``docker system dial-stdio`` there finds no engine. What it said on the host
    is the reason, not the docker SDK's view of a connection that closed."""
    _, down = host
    with pytest.raises(EngineError) as caught:
        Engine.connect(down.url, connect_timeout=10)
    assert str(caught.value) == (
        f"no container engine answers at {down.url}: ssh: failed to open the raw stream connection: "
        f"dial unix {down.root}/engine.sock: connect: no such file or directory"
    )
    assert ssh_children() == []


@pytest.fixture()
def stalled_agent() -> Iterator[str]:
    """An ssh-agent socket that takes connections and never answers (gpg-agent waiting on a pinentry, a
    hardware key waiting for a touch, a forwarded agent whose far end hangs)."""
    path = SERVER_DIR / f"agent-{secrets.token_hex(6)}.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    held: list[socket.socket] = []

    def hold() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        yield str(path)
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join()
        for conn in held:
            conn.close()
        path.unlink()


@pytest.mark.sshd
def test_a_login_that_stalls_after_the_handshake_is_given_up_on_at_the_deadline_blaming_no_one_wrongly(
    host: tuple[SshClient, SshHost], stalled_agent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ssh's own ConnectTimeout covers the connect and the banner only: a login stalled past them (here the
    agent asked for the key) ends at the deadline, with the master stopped. The host answered: the message
    must not say it did not."""
    _, down = host
    monkeypatch.setenv("SSH_AUTH_SOCK", stalled_agent)
    started = time.monotonic()
    with pytest.raises(EngineError) as caught:
        Engine.connect(down.url, connect_timeout=1)
    assert time.monotonic() - started < 10
    assert str(caught.value) == (
        f"{down.url}: no ssh answer within 1 s (ssh did not log in and said nothing: the host's name lookup, its "
        "sshd, or the ssh-agent holding the key did not answer); is the host up and sshd answering, and does the "
        "agent answer (a key waiting for a touch)?"
    )
    assert ssh_children() == []


@pytest.mark.sshd
def test_a_session_whose_command_outlives_its_input_is_stopped(host: tuple[SshClient, SshHost]) -> None:
    """Ending a session closes its socket and gives its ssh a moment to end with the command; a command
    that does not end on its input's end (a stuck ``dial-stdio``) does not keep it: its ssh is stopped."""
    _, down = host
    link = SshLink(SshTarget.parse(down.url), connect_timeout=10)
    try:
        link.open()
        (master,) = ssh_children()
        session = link.session(("sleep", "60"))
        assert sorted(ssh_children()) == sorted([master, session.process.pid])
        started = time.monotonic()
        session.end()
        assert time.monotonic() - started < 8  # SESSION_END, then SIGTERM; not the command's 60 s
        assert session.process.returncode is not None and ssh_children() == [master]
    finally:
        link.close()
    assert ssh_children() == []
