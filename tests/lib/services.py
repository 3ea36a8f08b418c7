"""The real services ``scripts/services`` starts, as plain helpers: probes, the CI rule, a push helper.

The pytest side (the markers' rule, the ``docker_client``/``registry``/``base_image``/``pushed_base_image``
fixtures) lives in ``tests/conftest.py``; benchmarks import from here, never from a pytest plugin.
When a service is missing, a test that needs it FAILS if ``CI`` is set (a missing service in CI is a
broken CI, never a skip) and is skipped with the reason otherwise.

The engine runs with ``--bridge=none``: containers need ``network_mode="none"`` (or ``"host"``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests

PUSHED_REPOSITORY = "envbuild-test/base"

_HOW_TO_START = "run the tests with scripts/test, or `scripts/services start` and source /run/envbuild-test/env"
FIXTURE_MARKERS = {
    "docker_client": ("docker",),
    "base_image": ("docker",),
    "registry": ("registry",),
    "pushed_base_image": ("docker", "registry"),
    "fresh_engine": ("docker",),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@dataclass(frozen=True)
class Probe:
    ok: bool
    detail: str  # where the service is, or why it is not usable


def _probe_docker() -> Probe:
    host = os.environ.get("DOCKER_HOST")
    if not host:
        return Probe(False, f"DOCKER_HOST is not set; {_HOW_TO_START}")
    try:
        client = docker.DockerClient(base_url=host, version="auto", timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        return Probe(False, f"no docker engine answers at DOCKER_HOST={host}: {exc}; {_HOW_TO_START}")
    return Probe(True, host)


def _probe_registry() -> Probe:
    address = os.environ.get("ENVBUILD_TEST_REGISTRY")
    if not address:
        return Probe(False, f"ENVBUILD_TEST_REGISTRY is not set; {_HOW_TO_START}")
    url = f"http://{address}/v2/"
    try:
        response = requests.get(url, timeout=5)
    except requests.RequestException as exc:
        return Probe(False, f"no registry answers at {url}: {exc}; {_HOW_TO_START}")
    if response.status_code != 200:
        return Probe(False, f"GET {url} answered {response.status_code}, not 200; {_HOW_TO_START}")
    return Probe(True, address)


def _probe_sshd() -> Probe:
    """The programs tests/lib/sshhosts.py starts hosts with (each test starts its own sshd)."""
    missing = [p for p in ("/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/ssh-keygen") if not os.access(p, os.X_OK)]
    wrapper = [Path(d) / "libnss_wrapper.so" for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu")]
    if not any(p.exists() for p in wrapper):
        missing.append("libnss_wrapper.so")
    if missing:
        return Probe(
            False, f"missing {', '.join(missing)}: run scripts/install-test-deps (openssh-server, libnss-wrapper)"
        )
    return Probe(True, "/usr/sbin/sshd")


SLURM_NODES = ("n1", "n2")
_UP = ("idle", "mix", "alloc")  # sinfo's short states of a node that takes jobs


def _probe_slurm() -> Probe:
    """The Slurm at ``SLURM_CONF``: both nodes up (idle, or running jobs), and srun able to hear back."""
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        return Probe(False, f"SLURM_CONF is not set; {_HOW_TO_START}")
    if not Path(conf).is_file():  # sinfo would look for a controller in DNS, for half a minute
        return Probe(False, f"SLURM_CONF={conf} is no file; {_HOW_TO_START}")
    # Node-oriented (-N), by node name (%N): %n is each node's NodeHostname, localhost for both. A
    # controller that is down takes sinfo 9 s to give up on.
    try:
        listed = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe(False, f"sinfo with SLURM_CONF={conf} failed: {exc}; {_HOW_TO_START}")
    if listed.returncode != 0:
        said = (listed.stderr.strip().splitlines() or [f"exit status {listed.returncode}"])[-1]
        return Probe(False, f"sinfo with SLURM_CONF={conf} failed: {said}; {_HOW_TO_START}")
    states = {node: state for node, _, state in (line.partition(" ") for line in listed.stdout.splitlines())}
    down = [f"{node} ({states.get(node, 'missing')})" for node in SLURM_NODES if states.get(node) not in _UP]
    if down:
        return Probe(False, f"the Slurm at SLURM_CONF={conf} has nodes not up: {', '.join(down)}; {_HOW_TO_START}")
    # srun listens where this machine's name resolves (CommunicationParameters=NoInAddrAny), and the nodes
    # call it back at the address it reached them from, 127.0.0.1: anywhere else, srun waits for ever.
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError as exc:
        address = str(exc)
    if address != "127.0.0.1":
        return Probe(
            False, f"this machine's name {name} resolves to {address}, not 127.0.0.1: srun cannot hear its tasks"
        )
    return Probe(True, conf)


PROBES = {"docker": _probe_docker, "registry": _probe_registry, "sshd": _probe_sshd, "slurm": _probe_slurm}


class ServiceState:
    """Probes each service once per session."""

    def __init__(self) -> None:
        self._results: dict[str, Probe] = {}

    def probe(self, service: str) -> Probe:
        if service not in self._results:
            self._results[service] = PROBES[service]()
        return self._results[service]


@dataclass(frozen=True)
class PushedImage:
    """The base image as the local registry holds it."""

    repository: str  # "127.0.0.1:5000/envbuild-test/base"
    tag: str
    digest: str  # manifest digest, "sha256:<64 hex>", as the engine reported it after the push

    @property
    def by_digest(self) -> str:
        return f"{self.repository}@{self.digest}"


def push_as(client: docker.DockerClient, source: str, repository: str, tag: str) -> str:
    """Tag ``source`` as ``repository:tag`` and push it through envbuild's engine; the manifest digest.
    One such push at a time across the test workers, by a lock keyed by the registry: two workers pushing
    one image at once (each session pushes the base) left docker-registry 2.8 answering 500 to every later
    push of the repository ("invalid checksum digest format"); pushed one after the other, the second
    finds the blobs there."""
    from envbuild.engine.client import Engine

    client.images.get(source).tag(repository, tag)
    key = hashlib.sha256(repository.partition("/")[0].encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"envbuild-test-push-{key}.lock", "a") as pushing:
        fcntl.flock(pushing, fcntl.LOCK_EX)  # released when the file closes
        return Engine(client).push(f"{repository}:{tag}")


def remove_lock_images(client: docker.DockerClient, *names: str, all_images: bool = False) -> None:
    """Remove every image built from a lock of these names (by envbuild's name label), intermediate ones
    too with ``all_images``: what a module built, for the engine outlives the run. An image already gone
    or still used by a container is left."""
    for name in names:
        for image in client.images.list(all=all_images, filters={"label": f"io.envbuild.lock.name={name}"}):
            try:
                client.images.remove(image.id, force=True)
            except docker.errors.APIError:
                pass
