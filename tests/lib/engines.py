"""Extra docker engines for tests: a fresh ``dockerd`` with its own socket, data root and exec root.

A test that must start where a new user starts (an engine that holds none of the lock's images), or one
that needs two hosts (a multi-node cluster on one machine), starts its own engine here. Each one:

- runs with ``--bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false``
  (it never touches the host's network or firewall; containers use ``--network none`` or host);
- has its own unix socket, ``--exec-root`` (where its containerd keeps state), ``--pidfile`` and
  ``--data-root``, all under one directory the caller owns, and an empty config file, so nothing
  under ``/etc/docker`` leaks in;
- is stopped by its PID (TERM, then KILL), with its containerd, and its data removed with
  :meth:`ExtraEngine.stop`, or by the next run's start where an interrupted run could not
  (:mod:`tests.lib.leftovers`); what its containerd writes to ``$TMPDIR`` (a stack dump when dockerd gives up
  waiting for it) lands in that directory too.

Unix socket paths are limited to 108 bytes, so the socket lives under ``/run/envbuild-test-engines``
with a short random name rather than under a deep ``tmp_path``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests

from tests.lib.leftovers import Entry, register, start_time, terminate, unmount_below

SOCKET_DIR = Path("/run/envbuild-test-engines")
SAFE_FLAGS = ("--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false")
START_TIMEOUT = 60.0


def storage_driver() -> str:
    """The driver that worked for the suite's own engine on this machine (scripts/services records it)."""
    recorded = Path(os.environ.get("ENVBUILD_TEST_DOCKER_DATA_ROOT", "/var/lib/envbuild-test/docker")).parent
    try:
        return (recorded / "storage-driver").read_text().strip() or "overlay2"
    except OSError:
        return "overlay2"


@dataclass
class ExtraEngine:
    """A running dockerd of our own; ``host`` is its ``DOCKER_HOST`` URL."""

    root: Path
    socket: Path
    process: subprocess.Popen[bytes]
    entry: Entry  # in the ledger of what an interrupted run leaves (tests/lib/leftovers.py)

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def client(self, timeout: int = 600) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, version="auto", timeout=timeout)

    def containerd_pid(self) -> int | None:
        try:
            return int((self.root / "exec" / "containerd" / "containerd.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self, remove_data: bool = True) -> None:
        """Stop dockerd (and the containerd it started) by PID; remove its data root unless asked not to."""
        containerd = self.containerd_pid()
        if self.process.poll() is None:  # not reaped: its PID is still this process's
            terminate(self.process.pid, start_time(self.process.pid))
        self.process.wait()
        if containerd is not None:
            terminate(containerd, start_time(containerd))
        unmount_below(self.root)  # dockerd leaves its data root bind-mounted, and a netns file
        self.socket.unlink(missing_ok=True)
        if remove_data:
            shutil.rmtree(self.root, ignore_errors=True)
        self.entry.forget()


def start_engine(root: Path, *, driver: str | None = None) -> ExtraEngine:
    """Start a fresh dockerd whose state lives under ``root`` (created); wait until it answers."""
    root.mkdir(parents=True, exist_ok=True)
    SOCKET_DIR.mkdir(parents=True, exist_ok=True)
    sock = SOCKET_DIR / f"{secrets.token_hex(6)}.sock"
    (root / "daemon.json").write_text("{}\n")
    log = open(root / "dockerd.log", "ab")
    argv = [
        "dockerd",
        "--config-file", str(root / "daemon.json"),
        "--host", f"unix://{sock}",
        "--data-root", str(root / "data"),
        "--exec-root", str(root / "exec"),
        "--pidfile", str(root / "dockerd.pid"),
        "--storage-driver", driver or storage_driver(),
        *SAFE_FLAGS,
        "--userland-proxy=false",
    ]  # fmt: skip
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            # The containerd dockerd starts inherits this; dockerd asks it for a stack dump (SIGUSR1) before it
            # kills one that does not stop in time, and containerd writes it to $TMPDIR: beside the engine's
            # log, removed with it, rather than a containerd.<pid>.stacks.log in the machine's /tmp.
            env={**os.environ, "TMPDIR": str(root)},
        )
    finally:
        log.close()
    entry = register(
        process.pid,
        f"dockerd {sock}",
        markers=[str(root / "exec")],  # its containerd's command line names its state directory
        pidfiles=[root / "exec" / "containerd" / "containerd.pid"],
        unmount=[root],
        remove=[sock, root],
    )
    engine = ExtraEngine(root, sock, process, entry)
    try:
        _wait_until_it_answers(engine)
    except BaseException:
        engine.stop(remove_data=False)  # whatever went wrong, no dockerd of ours is left running
        raise
    return engine


def _wait_until_it_answers(engine: ExtraEngine) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if engine.process.poll() is not None:
            code = engine.process.returncode
            raise AssertionError(f"dockerd exited with {code}; log: {_tail(engine.root / 'dockerd.log')}")
        try:
            with closing(engine.client(timeout=5)) as client:
                client.ping()
            return
        except (docker.errors.DockerException, requests.RequestException):
            if time.monotonic() > deadline:
                log = _tail(engine.root / "dockerd.log")
                raise AssertionError(f"dockerd did not answer in {START_TIMEOUT:g} s; log: {log}") from None
            time.sleep(0.2)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
