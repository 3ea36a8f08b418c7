"""ssh:// engines through real OpenSSH: two hosts, each an sshd on its own loopback port in front of its own
dockerd (:mod:`tests.lib.sshhosts`), reached as a user reaches theirs — a Host alias of the user's ssh
config (which alone knows the port), the user's key or agent, host keys checked against known_hosts.

What a user meets: the engine answers through ssh only (no paramiko in the environment), each host's
sessions reach that host's engine, and every refusal (an unknown or changed host key, a key the host
does not take, a host that accepts and then says nothing, sshd down) is one line naming the host and the
fix, within the connect deadline, with no ssh process left behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker.errors
import pytest

from envbuild.engine.client import Engine
from envbuild.engine.ssh import SshTarget, ssh_problem
from envbuild.engine.transfer import directory_context
from envbuild.errors import EngineError, InputError
from envrun.cli.main import main
from envrun.cluster.engines import each_connected
from tests.lib.services import PushedImage
from tests.lib.sshhosts import SshClient, SshHost, descendants, keygen, ssh_agent, ssh_hosts

pytestmark = [pytest.mark.docker, pytest.mark.sshd]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SshClient, list[SshHost]]]:
    with ssh_hosts(2, tmp_path_factory) as made:
        yield made


def ssh_children() -> list[str]:
    """This process's ssh children still running (none may outlive an engine)."""
    out = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "comm="], capture_output=True, text=True).stdout
    return [name for name in out.split() if name == "ssh"]


def test_no_paramiko_is_needed() -> None:
    assert importlib.util.find_spec("paramiko") is None  # the README's install has none: ssh:// must not need it


def test_each_host_is_reached_through_its_own_sshd_and_reaches_its_own_engine(
    hosts: tuple[SshClient, list[SshHost]],
) -> None:
    _, (first, second) = hosts
    for host in (first, second):
        with Engine.connect(host.url) as engine:
            # Two dockerds on one machine report one engine ID: the data root tells them apart.
            assert engine.client.info()["DockerRootDir"] == str(host.engine.root / "data")
            assert engine.address == host.url
        assert ssh_children() == []
    log = (first.root / "sshd.log").read_text()
    assert "Accepted publickey for root" in log  # through that sshd, with the client's key


@pytest.mark.parametrize("name", ["my tmp", "tmp%h"])
def test_a_tmpdir_ssh_would_read_otherwise_still_holds_the_connection(
    hosts: tuple[SshClient, list[SshHost]], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """ssh splits a ControlPath at a space and expands its '%h': the control socket goes elsewhere."""
    _, (first, _second) = hosts
    odd = Path(tempfile.mkdtemp(prefix=f"{name}-", dir="/tmp"))  # short: a long TMPDIR is passed over anyway
    monkeypatch.setattr(tempfile, "tempdir", str(odd))  # what TMPDIR sets (gettempdir() keeps its first answer)
    try:
        with Engine.connect(first.url, connect_timeout=10) as engine:
            assert engine.client.info()["DockerRootDir"] == str(first.engine.root / "data")
    finally:
        odd.rmdir()  # nothing left in it
    assert ssh_children() == []


def test_docker_host_may_name_an_ssh_engine(
    hosts: tuple[SshClient, list[SshHost]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, (first, _second) = hosts
    monkeypatch.setenv("DOCKER_HOST", first.url)
    with Engine.connect() as engine:
        assert engine.client.info()["DockerRootDir"] == str(first.engine.root / "data")


@pytest.mark.registry
def test_a_pull_and_a_container_run_stream_over_ssh(
    hosts: tuple[SshClient, list[SshHost]], pushed_base_image: PushedImage
) -> None:
    _, (first, _second) = hosts
    with Engine.connect(first.url) as engine:
        pulled = engine.pull(pushed_base_image.by_digest)  # a fresh engine: every layer comes from the registry
        assert pulled.layers >= 1 and pulled.fetched == pulled.layers and pulled.fetched_bytes > 1 << 20
        again = engine.pull(pushed_base_image.by_digest)
        assert (again.image_id, again.fetched, again.fetched_bytes) == (pulled.image_id, 0, 0)
        out = engine.run(pushed_base_image.by_digest, ["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (out.exit_code, out.stdout, out.stderr) == (3, "out\n", "err\n")
        assert 1 <= len(ssh_children()) <= 4  # a master and the API's few connections, not one per call
    assert ssh_children() == []


@pytest.mark.registry
def test_a_host_that_drops_mid_pull_is_one_line_naming_it(
    hosts: tuple[SshClient, list[SshHost]], pushed_base_image: PushedImage
) -> None:
    """The host's sshd ends every session while the pull's stream is open (a host rebooted, a link cut)."""
    _, (first, _second) = hosts
    with contextlib.suppress(docker.errors.ImageNotFound):
        first.client().images.remove(pushed_base_image.by_digest, force=True)  # the pull has layers to fetch
    assert first.process is not None

    def drop() -> None:
        time.sleep(0.8)  # the pull's stream is open: its one 55 MB layer takes seconds to fetch and unpack
        for pid in descendants(first.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    with Engine.connect(first.url) as engine:
        cut = threading.Thread(target=drop)
        cut.start()
        try:
            with pytest.raises(EngineError) as info:
                engine.pull(pushed_base_image.by_digest)
        finally:
            cut.join()
    message = str(info.value)
    # "the connection broke mid-answer" once the stream is open (a loaded machine may cut it a moment before)
    assert "\n" not in message and f"the container engine at {first.url} stopped answering" in message, message
    assert ssh_children() == []


def refusal(url: str, timeout: float = 10) -> str:
    with pytest.raises(EngineError) as info:
        Engine.connect(url, connect_timeout=timeout)
    message = str(info.value)
    assert "\n" not in message and message.startswith(url), message
    assert ssh_children() == []  # the master is stopped with the refusal
    return message


def test_an_unknown_host_key_is_refused_naming_the_host_and_the_fix(hosts: tuple[SshClient, list[SshHost]]) -> None:
    client, (first, second) = hosts
    with client.known_hosts([second.known_host_line]):  # first's key is not known
        message = refusal(first.url)
    assert "not in known_hosts" in message and "ssh-keyscan" in message and "node-0" in message


def test_a_changed_host_key_is_refused_with_the_line_that_removes_the_old_one(
    hosts: tuple[SshClient, list[SshHost]], tmp_path: Path
) -> None:
    client, (first, second) = hosts
    other = keygen(tmp_path / "impostor", "another host key").split()
    with client.known_hosts([f"[127.0.0.1]:{first.port} {other[0]} {other[1]}", second.known_host_line]):
        message = refusal(first.url)
    assert "not the one known_hosts holds" in message and f'-R "[127.0.0.1]:{first.port}"' in message


def test_host_keys_are_checked_though_the_users_config_says_strict_host_key_checking_no(
    hosts: tuple[SshClient, list[SshHost]], tmp_path: Path
) -> None:
    """A cluster's ssh config often says ``StrictHostKeyChecking no``: ssh then takes a changed key, and an
    unknown one, without a word. envrun takes neither, and says why it does not follow the config."""
    client, (first, second) = hosts
    other = keygen(tmp_path / "impostor", "another host key").split()
    client.extra_config = ["Host *", "  StrictHostKeyChecking no", ""]
    try:
        with client.known_hosts([f"[127.0.0.1]:{first.port} {other[0]} {other[1]}", second.known_host_line]):
            changed = refusal(first.url)
        with client.known_hosts([second.known_host_line]):
            unknown = refusal(first.url)
            assert (client.home / ".ssh" / "known_hosts").read_text() == second.known_host_line + "\n"  # none added
        with Engine.connect(first.url) as engine:  # a key known_hosts holds is taken as ever
            assert engine.client.info()["DockerRootDir"] == str(first.engine.root / "data")
    finally:
        client.extra_config = []
        client.write()
    assert "not the one known_hosts holds" in changed and "`StrictHostKeyChecking no` is not followed" in changed
    assert "not in known_hosts" in unknown and "`StrictHostKeyChecking no` is not followed" in unknown


def test_a_key_the_host_does_not_take_is_refused(hosts: tuple[SshClient, list[SshHost]], tmp_path: Path) -> None:
    client, (first, _second) = hosts
    stranger = tmp_path / "stranger"
    keygen(stranger, "a key the hosts do not take")
    client.extra_config = ["Host node-0", f"  IdentityFile {stranger}", "  IdentitiesOnly yes", ""]
    client.write()
    try:
        message = refusal(first.url)
    finally:
        client.extra_config = []
        client.write()
    assert "refused every key" in message and "Permission denied (publickey)" in message and "ssh-agent" in message


def test_the_users_agent_is_used(hosts: tuple[SshClient, list[SshHost]], monkeypatch: pytest.MonkeyPatch) -> None:
    client, (first, _second) = hosts
    # The key leaves the place ssh looks for it by default: only the agent holds it now.
    hidden = client.home / "agent-only"
    client.key.rename(hidden)
    client.key.with_suffix(".pub").rename(hidden.with_suffix(".pub"))
    try:
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        assert "refused every key" in refusal(first.url)
        with ssh_agent(hidden, client.env) as agent:
            monkeypatch.setenv("SSH_AUTH_SOCK", agent)
            with Engine.connect(first.url) as engine:
                assert engine.client.info()["DockerRootDir"] == str(first.engine.root / "data")
    finally:
        hidden.rename(client.key)
        hidden.with_suffix(".pub").rename(client.key.with_suffix(".pub"))


def test_thirty_hosts_behind_one_sshd_are_all_reached_though_it_drops_logins_beyond_ten(
    hosts: tuple[SshClient, list[SshHost]],
) -> None:
    """32 nodes behind one ProxyJump host are 32 logins to its sshd at once; beyond MaxStartups (10, then 30%
    of the rest dropped before the key exchange: Debian's default) sshd closes some, and ssh comes again."""
    client, (first, _second) = hosts
    aliases = [f"via-{index}" for index in range(30)]
    for alias in aliases:
        client.extra_config += [f"Host {alias}", "  HostName 127.0.0.1", f"  Port {first.port}", ""]
    client.write()
    try:
        with each_connected([f"ssh://root@{alias}" for alias in aliases], 20) as answers:
            failed = [str(answer) for answer in answers.values() if not isinstance(answer, Engine)]
    finally:
        client.extra_config = []
        client.write()
    assert failed == [], failed
    assert "past MaxStartups" in (first.root / "sshd.log").read_text()  # sshd did drop some: they came again
    assert ssh_children() == []


def test_the_users_interactive_settings_for_a_host_are_not_envruns(
    hosts: tuple[SshClient, list[SshHost]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Host entry made for the user's own logins: a tmux to attach, the Ray dashboard forwarded (its port
    held by the user's own login now), their agent forwarded. envrun's connection takes none of them."""
    client, (first, _second) = hosts
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    client.extra_config = [
        "Host node-0",
        "  RemoteCommand tmux new -A -s main",
        f"  LocalForward 127.0.0.1:{port} 127.0.0.1:8265",
        "  ExitOnForwardFailure yes",
        "  ForwardAgent yes",
        "",
    ]
    client.write()
    try:
        with ssh_agent(client.key, client.env) as agent:
            monkeypatch.setenv("SSH_AUTH_SOCK", agent)
            with Engine.connect(first.url, connect_timeout=10) as engine:
                assert engine.client.info()["DockerRootDir"] == str(first.engine.root / "data")
                assert engine._link is not None
                session = engine._link.session(("echo", "agent=${SSH_AUTH_SOCK:-none}"))  # the login shell expands it
                session.sock.settimeout(10)
                said = b"".join(iter(lambda: session.sock.recv(4096), b""))
                session.end()
    finally:
        held.close()
        client.extra_config = []
        client.write()
    assert said == b"agent=none\n"  # the host's root cannot use the user's keys
    assert ssh_children() == []


def test_a_build_through_the_docker_cli_goes_over_envbuilds_own_checked_connection(
    hosts: tuple[SshClient, list[SshHost]], tmp_path: Path
) -> None:
    """``envbuild image`` with ``DOCKER_HOST=ssh://…`` builds through the docker CLI where one serves: its ssh
    runs over the engine's master, so the host entry's RemoteCommand does not break it, and no second login."""
    client, (first, _second) = hosts
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\nCOPY a /a\n")
    (context / "a").write_text(f"{tmp_path}\n")  # a build of its own
    client.extra_config = ["Host node-0", "  RemoteCommand tmux new -A -s main", ""]
    client.write()
    logins = (first.root / "sshd.log").read_text().count("Accepted publickey")
    try:
        with Engine.connect(first.url, connect_timeout=10) as engine:
            assert engine.build_cli is not None  # the CLI transport is what this is about
            built = engine.buildkit_build(directory_context(context))
    finally:
        client.extra_config = []
        client.write()
    assert first.client().images.get(built.image_id).id == built.image_id  # built on that host's engine
    assert (first.root / "sshd.log").read_text().count("Accepted publickey") == logins + 1  # the master's only
    assert ssh_children() == []


@pytest.fixture()
def silent_host(hosts: tuple[SshClient, list[SshHost]]) -> Iterator[str]:
    """A host whose port accepts connections and never says a word (a wedged sshd, a black-holing proxy)."""
    client, _ = hosts
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    client.extra_config = ["Host silent", "  HostName 127.0.0.1", f"  Port {listener.getsockname()[1]}", ""]
    client.write()
    try:
        yield "ssh://root@silent"
    finally:
        client.extra_config = []
        client.write()
        done.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


def test_a_host_that_accepts_and_then_hangs_is_given_up_on_at_the_deadline(silent_host: str) -> None:
    started = time.monotonic()
    message = refusal(silent_host, timeout=2)
    assert time.monotonic() - started < 20  # not ssh's nor the kernel's default: the deadline asked for
    assert "no ssh answer within 2 s" in message


def test_a_host_whose_sshd_is_down_is_refused_at_once(hosts: tuple[SshClient, list[SshHost]]) -> None:
    _, (first, _second) = hosts
    first.stop_sshd()
    try:
        assert "connection refused" in refusal(first.url)
    finally:
        first.start_sshd()


def test_cluster_up_refuses_a_host_it_cannot_trust_and_starts_nothing(
    hosts: tuple[SshClient, list[SshHost]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client, (first, second) = hosts
    spec = tmp_path / "c.yaml"
    spec.write_text(f"name: trust\nnodes:\n  - engine: {first.url}\n  - engine: {second.url}\n")
    with client.known_hosts([first.known_host_line]):
        code = main(["cluster", "up", str(spec), "--image", "example/none:1", "--cache-dir", str(tmp_path / "state")])
    assert code == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("envrun: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert second.url in errors[0] and "not in known_hosts" in errors[0]
    assert not (tmp_path / "state" / "clusters" / "trust.json").exists()
    assert ssh_children() == []


@pytest.mark.parametrize(
    "url",
    [
        "ssh://-oProxyCommand=touch%20x/",
        "ssh://-oProxyCommand=x",
        "ssh://-l@host",
        "ssh://root:pw@host",
        "ssh://",
        "ssh://root@node-0?x=1",  # dropped: the host would be reached, the query ignored
        "ssh://root@node-0#x",
        "ssh://root@node-0:0",
    ],
)
def test_an_ssh_url_that_is_not_a_destination_is_refused(url: str) -> None:
    with pytest.raises(InputError):
        SshTarget.parse(url)


def test_the_destination_names_only_what_the_url_names() -> None:
    # No -p 22 and no -l when the URL has none: the user's ssh config decides (docker-py's -p 22 overrides it).
    assert SshTarget.parse("ssh://node-001").args() == ["--", "node-001"]
    assert SshTarget.parse("ssh://root@node-001:2222").args() == ["-l", "root", "-p", "2222", "--", "node-001"]
    assert str(SshTarget.parse("ssh://root@[::1]:2222")) == "ssh://root@[::1]:2222"  # said as written


def test_what_ssh_says_becomes_one_clause() -> None:
    target = SshTarget.parse("ssh://root@node-001")
    assert "connection refused" in ssh_problem("ssh: connect to host x port 22: Connection refused\n", 30, target)
    assert "within 30 s" in ssh_problem("Connection timed out during banner exchange\n", 30, target)
    assert "resolve" in ssh_problem("ssh: Could not resolve hostname node-001: Name or service not known\n", 30, target)
    dropped = "kex_exchange_identification: Connection closed by remote host\nConnection closed by UNKNOWN port 65535\n"
    assert "MaxStartups" in ssh_problem(dropped, 30, target)
    assert ssh_problem("Warning: Permanently added x\nbash: docker: command not found\n", 30, target) == (
        "ssh: bash: docker: command not found"
    )


def test_down_by_file_with_a_host_out_of_reach_names_the_command_that_finishes_it(
    hosts: tuple[SshClient, list[SshHost]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, (first, second) = hosts
    spec = tmp_path / "c.yaml"
    spec.write_text(f"name: gone\nnodes:\n  - engine: {first.url}\n  - engine: {second.url}\n")
    first.stop_sshd()
    try:
        assert main(["cluster", "down", str(spec), "--cache-dir", str(tmp_path / "state")]) == 1
    finally:
        first.start_sshd()
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("envrun: error: ")]
    assert first.url in error and "connection refused" in error and second.url not in error
    # No state was ever written: only the file names the hosts, so the advice is to run it again with it.
    assert "run the same `envrun cluster down` again once it answers" in error and "state is kept" not in error
