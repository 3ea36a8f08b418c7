"""What a registry serves for a tag now, over the OCI distribution API, with no container engine.

One ``GET /v2/<repository>/manifests/<tag>`` (Accept: the OCI and docker manifest and index types): its
digest is the sha256 of the bytes served (a ``Docker-Content-Digest`` that disagrees is refused), its
platforms are an index's entries or, for a single manifest, its config's ``os``/``architecture``. A
``401`` is answered once, as docker answers it: a ``Bearer`` challenge by asking its ``realm`` for a
token (with the docker config's credentials for the registry, when it has some), a ``Basic`` one with
those credentials (:mod:`envbuild.registry.auth`).

Registries on loopback (``localhost``, ``127.0.0.0/8``, ``::1``) are asked over plain HTTP, as docker
treats them as insecure by default; every other one over HTTPS. What a registry sends is bounded before
it is parsed (a manifest or config at most 4 MiB, distribution's own limit). Every failure is a
:class:`RegistryError` (a :class:`~envbuild.errors.RemoteError`) naming the image and the registry.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from urllib3.util.retry import Retry

from envbuild.data.reference import split_domain, split_tag
from envbuild.data.tokens import bearer_problem
from envbuild.data.urls import redact_url
from envbuild.deadline import Deadline, deadline_adapter, deadline_from_env
from envbuild.errors import RemoteError
from envbuild.httpreason import TLS_ADVICE, TLS_UNTRUSTED, reason
from envbuild.registry.auth import DOCKER_HUB, Challenge, find_credentials, parse_challenge

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MAX_BYTES = 4 << 20  # distribution refuses manifests over 4 MiB itself
TIMEOUT = (10.0, 30.0)


class RegistryError(RemoteError):
    """A registry could not be reached, refused us, or answered with something that is not a manifest."""


@dataclass(frozen=True)
class ServedManifest:
    """What a tag names now: the manifest digest (an index's, for a multi-platform image) and the platforms
    it has images for (``linux/arm64``, …)."""

    digest: str
    platforms: tuple[str, ...]


def registry_and_repository(name: str) -> tuple[str, str]:
    """docker's reading of an image name: ``host[:port]/path`` → (host[:port], path); a name without a
    registry is on Docker Hub, a one-component one under ``library/``."""
    domain, path = split_domain(name)
    return (domain, path) if domain is not None else (DOCKER_HUB, path if "/" in path else f"library/{path}")


def served_manifest(
    reference: str, *, session: requests.Session | None = None, docker_config: Path | None = None
) -> ServedManifest:
    """The manifest ``reference`` (``[registry/]path[:tag]``) names in its registry now."""
    name, tag = split_tag(reference)
    host, repository = registry_and_repository(name)
    client = _Client(reference, host, repository, session or _session(), docker_config)
    body, digest, media_type = client.manifest(tag)
    document = _json(body, f"{reference}: the manifest {host} serves")
    media_type = media_type or str(document.get("mediaType") or "")
    if media_type in INDEX_TYPES or "manifests" in document:
        return ServedManifest(digest, _index_platforms(document))
    config = document.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("digest"), str):
        raise RegistryError(f"{reference}: {host} serves a manifest without a config ({media_type or 'no media type'})")
    image = _json(client.blob(config["digest"]), f"{reference}: the image config {host} serves")
    return ServedManifest(digest, (_platform(image),) if _platform(image) else ())


def _index_platforms(index: dict[str, Any]) -> tuple[str, ...]:
    found = []
    for entry in index.get("manifests") or ():
        if isinstance(entry, dict) and isinstance(entry.get("platform"), dict):
            platform = _platform(entry["platform"])
            if platform and not platform.startswith("unknown/"):  # buildx attestations
                found.append(platform)
    return tuple(dict.fromkeys(found))


def _platform(data: dict[str, Any]) -> str:
    os_, arch = data.get("os"), data.get("architecture")
    return f"{os_}/{arch}" if isinstance(os_, str) and isinstance(arch, str) else ""


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise RegistryError(f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise RegistryError(f"{what} is not a JSON object")
    return data


def _is_loopback(host: str) -> bool:
    """A registry's ``host[:port]`` (from an image reference, which holds no user part) is this machine's."""
    hostname = host[1:].partition("]")[0] if host.startswith("[") else host.rpartition(":")[0] or host
    return _is_loopback_name(hostname)


def realm_problem(realm: str) -> str | None:
    """Why the token realm a registry names may not be asked (None: it may): parsed, never judged by its
    text. The docker config's credentials go to it, so it must be https (http only to this machine's
    loopback) and carry no user part — ``http://localhost:1@evil.example/`` is evil.example's, not
    localhost's."""
    # The authority's text first: Python versions disagree on whether `[::1]@host` even parses (Debian's
    # 3.11.2 refuses it, 3.11.7 reads a user part), and a user part is refused either way.
    authority = realm.partition("//")[2]
    for end in "/?#":
        authority = authority.partition(end)[0]
    if "@" in authority:
        return "has a user part (the credentials would go to another host than its text shows)"
    try:
        parts = urlsplit(realm)
        hostname, _ = parts.hostname, parts.port
    except ValueError:
        return "is not a URL"
    if not hostname:
        return "has no host"
    if parts.scheme == "https" or (parts.scheme == "http" and _is_loopback_name(hostname)):
        return None
    return "is not https"


def _is_loopback_name(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def _session() -> requests.Session:
    """A session whose requests each :class:`Deadline` can cut (directly or through an HTTP proxy)."""
    session = requests.Session()
    # raise_on_status=False: a 429 or 503 with Retry-After, which urllib3 counts as a status retry (none
    # allowed), is the registry's answer, said as its status, not as a registry out of reach.
    retry = Retry(total=2, connect=2, read=0, status=0, backoff_factor=0.5, raise_on_status=False)
    adapter = deadline_adapter(retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class _Client:
    """One repository of one registry, authenticated once when it first asks."""

    def __init__(
        self, reference: str, host: str, repository: str, session: requests.Session, docker_config: Path | None
    ) -> None:
        self.reference, self.host, self.repository, self.session = reference, host, repository, session
        self.docker_config = docker_config
        self.base = f"{'http' if _is_loopback(host) else 'https'}://{host}/v2/{repository}"
        self.authorization: str | None = None
        self.challenged = False

    def manifest(self, tag: str) -> tuple[bytes, str, str]:
        """(bytes, digest, media type) of the manifest the tag names."""
        response, body = self._get(f"/manifests/{tag}", ACCEPT)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        said = response.headers.get("Docker-Content-Digest")
        if said and said != digest:
            raise self._error(f"{self.host} says the manifest is {said}, but its bytes are {digest}")
        return body, digest, response.headers.get("Content-Type", "").partition(";")[0].strip()

    def blob(self, digest: str) -> bytes:
        if not digest.startswith("sha256:"):
            raise self._error(f"{self.host} names a config by {digest!r}, not a sha256")
        _, body = self._get(f"/blobs/{digest}", "*/*")
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise self._error(f"the config {self.host} serves does not match its digest {digest}")
        return body

    def _get(self, path: str, accept: str) -> tuple[requests.Response, bytes]:
        """GET ``path`` (authenticating once if challenged): a total deadline on each request, its body
        included, as for an index (``$ENVBUILD_INDEX_DEADLINE``): a registry that trickles is cut."""
        while True:
            headers = {"Accept": accept, **({"Authorization": self.authorization} if self.authorization else {})}
            with self._deadline(path):
                response = self._request(self.base + path, headers=headers)
                if response.status_code == 401 and not self.challenged:
                    self.challenged = True
                    response.close()
                    challenge = parse_challenge(response.headers.get("WWW-Authenticate", ""))
                else:
                    return self._answer(response, path)
            self.authorization = self._authenticate(challenge)

    @contextmanager
    def _deadline(self, what: str) -> Iterator[None]:
        """A request cut at its deadline is a :class:`RegistryError` like any other unanswered one."""
        try:
            with Deadline(f"{self.reference}: {self.host} {what}", seconds=deadline_from_env()):
                yield
        except RegistryError:
            raise
        except RemoteError as exc:
            raise RegistryError(str(exc)) from None

    def _answer(self, response: requests.Response, path: str) -> tuple[requests.Response, bytes]:
        with response:
            if response.status_code in (401, 403):
                raise self._error(f"{self.host} refused access ({response.status_code}); {self._login_advice()}")
            if response.status_code == 404:
                raise self._error(f"{self.host} has no such manifest or blob (404 for {path})")
            if response.status_code != 200:
                raise self._error(f"{self.host} answered {response.status_code} for {path}")
            return response, self._bounded(response, path)

    def _request(self, url: str, **kwargs: Any) -> requests.Response:
        try:
            return self.session.get(url, timeout=TIMEOUT, stream=True, **kwargs)
        except requests.RequestException as exc:
            said = reason(exc)
            if said == TLS_UNTRUSTED:
                said += f" ({TLS_ADVICE})"
            raise self._error(f"cannot reach {self.host}: {said}") from None

    def _bounded(self, response: requests.Response, what: str) -> bytes:
        body = b""
        try:
            for chunk in response.iter_content(65536):
                body += chunk
                if len(body) > MAX_BYTES:
                    raise self._error(f"{self.host} sends more than 4 MiB for {what}")
        except requests.RequestException as exc:
            raise self._error(f"{self.host}: reading {what}: {reason(exc)}") from None
        return body

    def _authenticate(self, challenge: Challenge | None) -> str:
        """The Authorization header that answers ``challenge``."""
        found = find_credentials(self.host, self.docker_config)
        creds = found.credentials
        if challenge is None:
            raise self._error(f"{self.host} answered 401 without a usable WWW-Authenticate challenge")
        if challenge.scheme == "basic":
            if creds is None:
                raise self._error(f"{self.host} needs credentials; {self._login_advice(found.helper)}")
            return "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode("ascii")
        realm = challenge.params.get("realm", "")
        if problem := realm_problem(realm):
            shown = redact_url(realm[:200])
            raise self._error(f"{self.host} names a token realm that {problem}: {shown!r}")
        params = {"scope": challenge.params.get("scope") or f"repository:{self.repository}:pull"}
        if "service" in challenge.params:
            params["service"] = challenge.params["service"]
        auth = (creds.username, creds.password) if creds else None
        with self._deadline(f"token service {realm[:200]}"):
            try:
                response = self.session.get(realm, params=params, auth=auth, timeout=TIMEOUT, stream=True)
            except requests.RequestException as exc:
                raise self._error(f"cannot reach {self.host}'s token service {realm}: {reason(exc)}") from None
            with response:
                if response.status_code != 200:
                    raise self._error(
                        f"{self.host}'s token service answered {response.status_code}; "
                        + self._login_advice(found.helper)
                    )
                answer = _json(self._bounded(response, "a token"), f"{self.reference}: the token {realm} sends")
        token = answer.get("token") or answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise self._error(f"the answer of {self.host}'s token service holds no token")
        if problem := bearer_problem(token):
            raise self._error(f"{self.host}'s token service sent a token that is {problem}")
        return f"Bearer {token}"

    def _error(self, message: str) -> RegistryError:
        return RegistryError(f"{self.reference}: {message}")

    def _login_advice(self, helper: str | None = None) -> str:
        if helper:
            return (
                f"the docker config names credential helper {helper!r} for it, which envbuild does not run: "
                f"put the credentials in its `auths` (`docker login {self.host}` with no helper configured)"
            )
        return f"log in with `docker login {self.host}` (envbuild reads the docker config's `auths`)"
