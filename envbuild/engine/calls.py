"""How every call to the container engine is made: the timeouts, the one-line :class:`EngineError` a
failure of the engine or of the connection to it becomes, and :class:`EngineBase`, what each part of
:class:`~envbuild.engine.client.Engine` talks through (the docker SDK's client, its low-level API, the
engine's address)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import requests
import urllib3.exceptions

from envbuild.errors import EngineError

if TYPE_CHECKING:
    from envbuild.engine.ssh import SshLink

TIMEOUT = 3600  # seconds for one API call: a build step or a save of a multi-GB image
CONNECT_TIMEOUT = 30  # seconds for the first answer of an engine
CHUNK = 1 << 20


class EngineBase:
    """The parts of :class:`~envbuild.engine.client.Engine` (builds, images, containers, jobs) share these."""

    client: docker.DockerClient
    api: docker.APIClient
    address: str
    _link: SshLink | None  # the ssh master of an ssh:// engine


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def reason(exc: BaseException) -> str:
    """One line a user can act on, from the SDK's or requests' nested messages."""
    text = str(exc)
    for needle, said in (
        ("No such file or directory", "no such socket"),
        ("Connection refused", "connection refused"),
        ("Permission denied", "permission denied"),
        ("timed out", "timed out"),
        ("Connection aborted", "connection aborted"),
        ("Connection broken", "the connection broke mid-answer"),
    ):
        if needle in text:
            return said
    if isinstance(exc, docker.errors.APIError):
        return str(exc.explanation or exc).splitlines()[0]
    return text.splitlines()[0][:300] if text else type(exc).__name__


@contextmanager
def engine_errors(what: str, address: str | None = None) -> Iterator[None]:
    """Any failure of the SDK or of the connection inside, as one line: ``what``, then why."""
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise EngineError(f"{what}: no such image ({reason(exc)})") from None
    except (docker.errors.DockerException, requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        # A stream the SDK reads itself (a pull's, a build's, a save's) raises urllib3's own error when the
        # connection breaks mid-answer (an ssh host dropped, dockerd killed): requests never wraps it.
        if isinstance(exc, docker.errors.APIError) and exc.response is not None:
            raise EngineError(f"{what}: {reason(exc)}") from None
        raise EngineError(
            f"{what}: the container engine at {address or engine_address()} stopped answering: {reason(exc)}"
        ) from None


def event_error(event: dict[str, Any]) -> str | None:
    """The message of an error event in a build, push or pull stream (None for any other event)."""
    if "error" not in event and "errorDetail" not in event:
        return None
    return str((event.get("errorDetail") or {}).get("message") or event.get("error") or "failed")


def chunks_of(archive: Path | Iterable[bytes]) -> Iterator[bytes]:
    if not isinstance(archive, Path):
        yield from archive
        return
    with open(archive, "rb") as data:
        yield from iter(lambda: data.read(CHUNK), b"")


def short(ref: str) -> str:
    """An image ID as docker prints it (``sha256:`` and 12 hex), a reference as it is."""
    return ref[:19] if ref.startswith("sha256:") else ref
