"""The registry client's answers to a registry that is not the well-behaved one of test_registry_pin.py: a
docker config as people leave it (``username``/``password`` entries, a broken ``auth``, not an object), a
registry that asks for HTTP Basic (distribution with htpasswd), one that answers 401 with no challenge it
can meet, one whose answers are not what they claim (a digest that disagrees with the bytes, a config named
by another algorithm, a body cut short or without end, a token answer with no token), one that is not
there (404 from the real local registry), one whose certificate nobody here trusts, and a token service
that does not answer. Real HTTP on this machine: a small server that answers each path as it is told."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import Lock, read_lock, write_lock
from envbuild.lock.model import BaseImage, Platform
from envbuild.registry.auth import Credentials, Found, find_credentials, parse_challenge
from envbuild.registry.client import MAX_BYTES, OCI_MANIFEST, RegistryError, ServedManifest, served_manifest
from tests.lib.gitrepos import free_port

MANIFEST_PATH = "/v2/team/app/manifests/1"
LOGIN_ADVICE = "log in with `docker login {host}` (envbuild reads the docker config's `auths`)"


def sha(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    length: int | None = None  # the Content-Length said, when it is not the body's (a body cut short)


@dataclass
class Registry:
    """A registry and its token service (``/token``) on this machine, answering each path as ``answers``
    says and 404 for any other. With ``login`` set, a ``/v2/`` request whose Authorization is not ``login``
    gets ``challenge`` instead. What was asked, and with which Authorization, is kept in ``seen``."""

    answers: dict[str, Answer] = field(default_factory=dict)
    login: str | None = None
    challenge: Answer = field(default_factory=lambda: Answer(401))
    seen: list[tuple[str, str]] = field(default_factory=list)

    def __enter__(self) -> Registry:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.partition("?")[0]
                given = self.headers.get("Authorization", "")
                registry.seen.append((path, given))
                if path.startswith("/v2/") and registry.login is not None and given != registry.login:
                    answer = registry.challenge
                else:
                    answer = registry.answers.get(path, Answer(404, b'{"errors": []}'))
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body) if answer.length is None else answer.length))
                self.end_headers()
                try:
                    self.wfile.write(answer.body)
                except OSError:
                    pass  # the client stopped reading (a body over its bound): what the test is about

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def reference(self) -> str:
        return f"{self.host}/team/app:1"

    def serve_image(self, arch: str = "arm64", said_digest: str | None = None) -> tuple[bytes, bytes]:
        """A single-platform image at ``team/app:1``: (manifest bytes, config bytes)."""
        config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(config.encode())},
                "layers": [],
            }
        ).encode()
        headers = {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": said_digest or sha(manifest)}
        self.answers[MANIFEST_PATH] = Answer(body=manifest, headers=headers)
        self.answers[f"/v2/team/app/blobs/{sha(config.encode())}"] = Answer(body=config.encode())
        return manifest, config.encode()


@pytest.fixture(autouse=True)
def direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request goes straight to this machine's servers, trusting only the system's CAs."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "ENVBUILD_INDEX_DEADLINE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture()
def hostile() -> Iterator[Registry]:
    with Registry() as served:
        yield served


def write_config(tmp_path: Path, content: object) -> Path:
    path = tmp_path / "docker" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))
    return path


def refused(reference: str, config: Path) -> str:
    with pytest.raises(RegistryError) as info:
        served_manifest(reference, docker_config=config)
    return str(info.value)


# --- the docker config -------------------------------------------------------------------------------


HOST = "registry.example:5000"


@pytest.mark.parametrize(
    ("content", "found"),
    [
        ([{"auths": {}}], Found()),  # not an object: holds nothing, as for an unreadable one
        ({"auths": {HOST: {"username": "me", "password": "p:w"}}}, Found(Credentials("me", "p:w"))),
        ({"auths": {f"https://{HOST}": {"username": "me", "password": ""}}}, Found(Credentials("me", ""))),
        ({"auths": {HOST: {"username": "me"}}}, Found()),  # no password: no credentials
        ({"auths": {HOST: {"email": "me@example.org"}}}, Found()),  # an entry without credentials
        ({"auths": {HOST: {"auth": "bWU6cHc=="}}}, Found()),  # not base64 (padding past its end)
        ({"auths": {HOST: {"auth": "not base64!"}}}, Found()),
        ({"auths": {HOST: {"auth": base64.b64encode(b"\xffme:pw").decode()}}}, Found()),  # not UTF-8
        # a broken `auth` is not read past to the username/password beside it (docker refuses such a config)
        ({"auths": {HOST: {"auth": "%%%", "username": "me", "password": "pw"}}}, Found()),
        ({"auths": {HOST: {"auth": "%%%"}}, "credsStore": "pass"}, Found(helper="pass")),
    ],
)
def test_the_docker_config_gives_what_its_entry_holds_and_nothing_from_a_broken_one(
    tmp_path: Path, content: object, found: Found
) -> None:
    config = write_config(tmp_path, content)
    expected = found if not isinstance(content, dict) else Found(found.credentials, found.helper, config)
    assert find_credentials(HOST, config) == expected


@pytest.mark.parametrize("header", [None, "", "Negotiate", 'Digest realm="registry", nonce="1"', "Bearer"])
def test_a_401_without_a_challenge_envbuild_can_answer_is_said_as_that(
    hostile: Registry, tmp_path: Path, header: str | None
) -> None:
    hostile.login = "Bearer never"
    hostile.challenge = Answer(401, headers={} if header is None else {"WWW-Authenticate": header})
    if header and header != "Bearer":
        assert parse_challenge(header) is None
    message = refused(hostile.reference, tmp_path / "none.json")
    if header == "Bearer":  # a Bearer challenge without a realm: no realm to ask
        assert message == f"{hostile.reference}: {hostile.host} names a token realm that has no host: ''"
    else:
        assert message == (
            f"{hostile.reference}: {hostile.host} answered 401 without a usable WWW-Authenticate challenge"
        )
    assert [path for path, _ in hostile.seen] == [MANIFEST_PATH]  # asked once, nothing sent to anyone else


# --- HTTP Basic, as distribution's htpasswd asks for it ----------------------------------------------


def test_a_basic_challenge_is_answered_with_the_username_and_password_of_the_docker_config(
    hostile: Registry, tmp_path: Path
) -> None:
    login = "Basic " + base64.b64encode(b"me:pa:ss word").decode()
    hostile.login = login
    hostile.challenge = Answer(401, headers={"WWW-Authenticate": 'Basic realm="Registry Realm"'})
    manifest, _ = hostile.serve_image("arm64")
    config = write_config(tmp_path, {"auths": {hostile.host: {"username": "me", "password": "pa:ss word"}}})
    assert served_manifest(hostile.reference, docker_config=config) == ServedManifest(sha(manifest), ("linux/arm64",))
    blob = next(path for path in hostile.answers if "/blobs/" in path)
    assert hostile.seen == [(MANIFEST_PATH, ""), (MANIFEST_PATH, login), (blob, login)]


@pytest.mark.parametrize(
    ("content", "advice"),
    [
        ({}, LOGIN_ADVICE),
        (
            {"auths": {"{host}": {"auth": "%%%"}}, "credHelpers": {"{host}": "secretservice"}},
            "the docker config names credential helper 'secretservice' for it, which envbuild does not run: "
            "put the credentials in its `auths` (`docker login {host}` with no helper configured)",
        ),
    ],
)
def test_a_basic_challenge_without_credentials_says_how_to_give_them(
    hostile: Registry, tmp_path: Path, content: dict[str, object], advice: str
) -> None:
    hostile.login = "Basic " + base64.b64encode(b"me:pw").decode()
    hostile.challenge = Answer(401, headers={"WWW-Authenticate": 'Basic realm="Registry Realm"'})
    hostile.serve_image()
    config = write_config(tmp_path, json.loads(json.dumps(content).replace("{host}", hostile.host)))
    assert refused(hostile.reference, config) == (
        f"{hostile.reference}: {hostile.host} needs credentials; {advice.format(host=hostile.host)}"
    )
    assert hostile.seen == [(MANIFEST_PATH, "")]  # nothing more asked without credentials


# --- answers that are not what they claim ------------------------------------------------------------


def _not_json(registry: Registry) -> str:
    registry.answers[MANIFEST_PATH] = Answer(body=b"<html>Service Unavailable</html>")
    return f"the manifest {registry.host} serves is not JSON"


def _a_list(registry: Registry) -> str:
    registry.answers[MANIFEST_PATH] = Answer(body=b'[{"mediaType": "x"}]')
    return f"the manifest {registry.host} serves is not a JSON object"


def _schema1(registry: Registry) -> str:
    media_type = "application/vnd.docker.distribution.manifest.v1+prettyjws"
    body = json.dumps({"schemaVersion": 1, "name": "team/app", "tag": "1", "fsLayers": []}).encode()
    registry.answers[MANIFEST_PATH] = Answer(body=body, headers={"Content-Type": f"{media_type}; charset=utf-8"})
    return f"{registry.host} serves a manifest without a config ({media_type})"


def _config_not_an_object(registry: Registry) -> str:
    registry.answers[MANIFEST_PATH] = Answer(body=b'{"schemaVersion": 2, "config": "sha256:00"}')
    return f"{registry.host} serves a manifest without a config (no media type)"


def _digest_disagrees(registry: Registry) -> str:
    manifest, _ = registry.serve_image(said_digest="sha256:" + "0" * 64)
    return f"{registry.host} says the manifest is sha256:{'0' * 64}, but its bytes are {sha(manifest)}"


def _config_by_sha512(registry: Registry) -> str:
    config = b'{"architecture": "arm64", "os": "linux"}'
    digest = "sha512:" + hashlib.sha512(config).hexdigest()
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {"digest": digest}}).encode()
    registry.answers[MANIFEST_PATH] = Answer(body=body)
    registry.answers[f"/v2/team/app/blobs/{digest}"] = Answer(body=config)
    return f"{registry.host} names a config by {digest!r}, not a sha256"


def _config_swapped(registry: Registry) -> str:
    _, config = registry.serve_image("arm64")
    registry.answers[f"/v2/team/app/blobs/{sha(config)}"] = Answer(body=config.replace(b"arm64", b"amd64"))
    return f"the config {registry.host} serves does not match its digest {sha(config)}"


def _config_not_json(registry: Registry) -> str:
    _, config = registry.serve_image()
    garbage = b"\x00 not json"
    served = registry.answers[MANIFEST_PATH]
    served.body = served.body.replace(sha(config).encode(), sha(garbage).encode())
    served.headers.pop("Docker-Content-Digest")
    registry.answers[f"/v2/team/app/blobs/{sha(garbage)}"] = Answer(body=garbage)
    return f"the image config {registry.host} serves is not JSON"


def _config_missing(registry: Registry) -> str:
    _, config = registry.serve_image()
    del registry.answers[f"/v2/team/app/blobs/{sha(config)}"]
    return f"{registry.host} has no such manifest or blob (404 for /blobs/{sha(config)})"


def _forbidden(registry: Registry) -> str:
    registry.answers[MANIFEST_PATH] = Answer(403, b'{"errors": [{"code": "DENIED"}]}')
    return f"{registry.host} refused access (403); {LOGIN_ADVICE.format(host=registry.host)}"


def _token_of_no_use(registry: Registry) -> str:
    """The token service hands a token, the registry still says 401 (a scope it does not grant)."""
    registry.serve_image()
    realm = f"http://{registry.host}/token"
    registry.login = "Bearer the-one-it-wants"
    registry.challenge = Answer(401, headers={"WWW-Authenticate": f'Bearer realm="{realm}",service="test"'})
    registry.answers["/token"] = Answer(body=b'{"token": "another-one"}')
    return f"{registry.host} refused access (401); {LOGIN_ADVICE.format(host=registry.host)}"


def _failing(registry: Registry) -> str:
    registry.answers[MANIFEST_PATH] = Answer(500, b'{"errors": [{"code": "UNKNOWN"}]}')
    return f"{registry.host} answered 500 for /manifests/1"


def _overloaded(registry: Registry) -> str:
    """A 503 with Retry-After (a load balancer's): its status, not a registry out of reach, and no wait."""
    registry.answers[MANIFEST_PATH] = Answer(503, b"upstream connect error", {"Retry-After": "1"})
    return f"{registry.host} answered 503 for /manifests/1"


def _rate_limited(registry: Registry) -> str:
    """A 429 with Retry-After an hour away (a pull rate limit): said at once, not slept through."""
    registry.answers[MANIFEST_PATH] = Answer(429, b'{"errors": [{"code": "TOOMANYREQUESTS"}]}', {"Retry-After": "3600"})
    return f"{registry.host} answered 429 for /manifests/1"


def _without_end(registry: Registry) -> str:
    registry.answers[MANIFEST_PATH] = Answer(body=b" " * (MAX_BYTES + 1))
    return f"{registry.host} sends more than 4 MiB for /manifests/1"


def _token_answer_without_token(registry: Registry) -> str:
    realm = f"http://{registry.host}/token"
    registry.login = "Bearer never"
    registry.challenge = Answer(401, headers={"WWW-Authenticate": f'Bearer realm="{realm}",service="test"'})
    registry.answers["/token"] = Answer(body=b'{"expires_in": 300, "token": 12345}')
    return f"the answer of {registry.host}'s token service holds no token"


@pytest.mark.parametrize(
    "case",
    [
        _not_json,
        _a_list,
        _schema1,
        _config_not_an_object,
        _digest_disagrees,
        _config_by_sha512,
        _config_swapped,
        _config_not_json,
        _config_missing,
        _forbidden,
        _token_of_no_use,
        _failing,
        _overloaded,
        _rate_limited,
        _without_end,
        _token_answer_without_token,
    ],
    ids=lambda case: case.__name__.strip("_"),
)
def test_an_answer_that_is_not_a_manifest_is_refused_in_one_line_naming_the_image(
    hostile: Registry, tmp_path: Path, case: Callable[[Registry], str]
) -> None:
    said = case(hostile)
    assert refused(hostile.reference, tmp_path / "none.json") == f"{hostile.reference}: {said}"


def test_a_body_cut_short_is_said_as_a_read_that_failed(hostile: Registry, tmp_path: Path) -> None:
    hostile.answers[MANIFEST_PATH] = Answer(body=b'{"schema', length=100)
    message = refused(hostile.reference, tmp_path / "none.json")
    assert message == (
        f"{hostile.reference}: {hostile.host}: reading /manifests/1: the answer was cut short: 8 bytes read, "
        "92 more expected"
    )


@pytest.mark.registry
def test_a_tag_the_real_registry_does_not_have_is_a_404_naming_it(registry: str, tmp_path: Path) -> None:
    reference = f"{registry}/envbuild-gaps/never-pushed:absent"
    assert refused(reference, tmp_path / "none.json") == (
        f"{reference}: {registry} has no such manifest or blob (404 for /manifests/absent)"
    )


# --- registries and token services out of reach ------------------------------------------------------


def test_a_token_service_out_of_reach_is_said_in_plain_words(hostile: Registry, tmp_path: Path) -> None:
    realm = f"http://127.0.0.1:{free_port()}/token"
    hostile.login = "Bearer never"
    hostile.challenge = Answer(401, headers={"WWW-Authenticate": f'Bearer realm="{realm}",service="test"'})
    assert refused(hostile.reference, tmp_path / "none.json") == (
        f"{hostile.reference}: cannot reach {hostile.host}'s token service {realm}: connection refused"
    )


# --- the CLI -----------------------------------------------------------------------------------------


def test_update_base_refuses_a_digest_the_registry_misstates_and_writes_nothing(
    hostile: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    manifest, _ = hostile.serve_image("arm64", said_digest="sha256:" + "0" * 64)
    lock = tmp_path / "pin.lock.yaml"
    old = BaseImage(name=hostile.reference, digest="sha256:" + "a" * 64)
    platform = Platform(os="linux", arch="aarch64", python="3.11")
    write_lock(lock, Lock(version=2, name="pin", sources=(), platform=platform, base_image=old))
    before = lock.read_bytes()
    assert main(["lock", "update", str(lock), "--base", "--cache-dir", str(tmp_path / "cache")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"envbuild: error: base image {hostile.reference} not pinned: {hostile.reference}: {hostile.host} says "
        f"the manifest is sha256:{'0' * 64}, but its bytes are {sha(manifest)}"
    ), err
    assert "Traceback" not in err
    assert lock.read_bytes() == before and read_lock(lock).lock.base_image == old
