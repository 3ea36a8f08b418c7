"""With :mod:`.cli_build` (the docker CLI, for builds), the only code that talks to the container engine: the
docker SDK against ``DOCKER_HOST``. :class:`Engine` is one object made of four parts, each a module of
its own (as the SDK's own ``APIClient`` is made of mixins): :mod:`.builds` (the engine's BuildKit, no
network), :mod:`.images` (and the engine's storage), :mod:`.containers` (short-lived ones, files read
from an image), :mod:`.jobs` (long-lived containers and volumes); :mod:`.calls` is how each call is made.

Long transfers say how far they are, one line at most every few seconds and one at the end: the
context sent, a ``docker save`` read, a ``docker load`` sent, each layer of a push. Every failure of the
engine or of the connection to it becomes a one-line :class:`EngineError`; registry credentials come
from the docker config (the SDK reads it) and are never printed.
"""

from __future__ import annotations

import math

import docker
import docker.errors
import requests

from envbuild.data.urls import redact_password, redact_urls
from envbuild.engine.builds import Builds
from envbuild.engine.calls import CONNECT_TIMEOUT, TIMEOUT, engine_address, reason
from envbuild.engine.containers import Containers
from envbuild.engine.images import Images
from envbuild.engine.jobs import Jobs
from envbuild.engine.ssh import SshLink, SshTarget, ssh_docker_client
from envbuild.errors import EngineError, InputError
from envbuild.escape import for_terminal


class Engine(Builds, Images, Containers, Jobs):
    """A docker engine. ``Engine.connect()`` checks that one answers."""

    def __init__(self, client: docker.DockerClient, address: str | None = None, link: SshLink | None = None) -> None:
        self.client = client
        self.api = client.api
        self.address = address or engine_address()
        self._link = link

    @classmethod
    def connect(cls, address: str | None = None, *, connect_timeout: float = CONNECT_TIMEOUT) -> Engine:
        """The engine at ``DOCKER_HOST``, or at ``address``: ``unix:///path``, ``tcp://host:port`` or
        ``ssh://[user@]host[:port]`` (through the system's ssh client: :mod:`.ssh`). ``connect_timeout``
        bounds reaching it and its first answer."""
        url = address or engine_address()
        link = SshLink(SshTarget.parse(url), connect_timeout=connect_timeout) if url.startswith("ssh://") else None
        try:
            client = cls._client(url, address, link, connect_timeout)
        except BaseException:
            if link is not None:
                link.close()
            raise
        client.api.timeout = TIMEOUT  # a host that does not answer is found out fast; a long build is not cut
        return cls(client, address, link)

    @staticmethod
    def _client(url: str, address: str | None, link: SshLink | None, connect_timeout: float) -> docker.DockerClient:
        try:
            if link is not None:
                link.open()
                client = ssh_docker_client(link, connect_timeout)
                client.api._version = client.api._retrieve_server_version()
            elif address is None:
                client = docker.from_env(version="auto", timeout=math.ceil(connect_timeout))
            else:
                client = docker.DockerClient(base_url=address, version="auto", timeout=math.ceil(connect_timeout))
            client.ping()
        except ValueError as exc:  # docker-py parsing the address (a port that is no number) or its config file
            if problem := _docker_config_problem():
                raise InputError(problem) from None
            where = "DOCKER_HOST" if address is None else "engine address"
            raise InputError(
                f"{where} {for_terminal(redact_password(url))!r}: not an address docker can reach ({exc})"
            ) from None
        except (docker.errors.DockerException, requests.RequestException) as exc:
            said = link.problem() if link is not None else None
            hint = "start dockerd or set DOCKER_HOST" if address is None else "is dockerd running there, and reachable?"
            detail = redact_urls(said or f"{reason(exc)} ({hint})")
            raise EngineError(f"no container engine answers at {redact_password(url)}: {detail}") from None
        return client

    def close(self) -> None:
        self.client.close()
        if self._link is not None:
            self._link.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _docker_config_problem() -> str | None:
    """Why docker-py cannot read the docker config file (an ``auths`` entry whose ``auth`` is not base64 of
    ``user:password``, which the docker CLI only warns about), or None: the SDK reads it whole whenever it
    makes a client, so no engine can be reached until it is fixed."""
    from docker.auth import load_config
    from docker.utils.config import find_config_file

    try:
        load_config()
    except ValueError as exc:
        where = find_config_file() or "the docker config file"
        return (
            f"{where}: docker's SDK cannot read it ({exc}): an `auths` entry's `auth` must be base64 of user:password"
        )
    return None
