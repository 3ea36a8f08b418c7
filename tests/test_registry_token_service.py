"""A registry's token service, hostile: a realm judged parsed, never by its text (the docker config's
credentials go to the realm, so a realm whose text looks like this machine's but whose host is another,
``http://localhost:1@host/``, must never be asked), and a token that is no bearer token. Real HTTP on
127.0.0.1: a registry that answers 401 naming a realm, and a "token service" which records whatever reaches
it and answers with the token it is given."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envbuild.registry.client import RegistryError, realm_problem, served_manifest


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]]
    realm = ""
    token = "t"

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self.seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
        if self.path.startswith("/v2/"):  # the registry: a token is needed, from the realm it names
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Bearer realm="{self.realm}",service="test"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"token": self.token}).encode()  # the other host: takes the credentials, hands a token
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def servers() -> Iterator[tuple[ThreadingHTTPServer, ThreadingHTTPServer]]:
    started = []
    for _ in range(2):
        handler = type("Handler", (_Recorder,), {"seen": []})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append(server)
    try:
        yield started[0], started[1]
    finally:
        for server in started:
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("user_part", ["localhost:1@", "[::1]@", "127.0.0.1:1@", "user:pw@"])
def test_a_realm_with_a_user_part_never_gets_the_credentials(
    servers: tuple[ThreadingHTTPServer, ThreadingHTTPServer], tmp_path: Path, user_part: str
) -> None:
    registry, other = servers
    registry.RequestHandlerClass.realm = f"http://{user_part}127.0.0.1:{other.server_address[1]}/token"  # type: ignore[attr-defined]
    host = f"127.0.0.1:{registry.server_address[1]}"
    secret = base64.b64encode(b"me:s3cret").decode()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {host: {"auth": secret}}}))
    with pytest.raises(RegistryError) as info:
        served_manifest(f"{host}/team/app:1", docker_config=config)
    assert other.RequestHandlerClass.seen == []  # type: ignore[attr-defined]  # nothing reached the other host
    message = str(info.value)
    assert "names a token realm that has a user part" in message and "s3cret" not in message and "pw" not in message


@pytest.mark.parametrize(
    ("realm", "problem"),
    [
        ("https://auth.example/token", None),
        ("http://127.0.0.1:5001/token", None),
        ("http://[::1]:5001/token", None),
        ("http://localhost/token", None),
        ("http://localhost:1@evil.example/token", "has a user part"),
        ("http://[::1]@evil.example/token", "has a user part"),
        ("http://evil.example/token", "is not https"),
        ("http://127.0.0.1.evil.example/token", "is not https"),
        ("ftp://auth.example/token", "is not https"),
        ("https:///token", "has no host"),
        ("http://[::1/token", "is not a URL"),
    ],
)
def test_the_realm_is_judged_by_its_parsed_host(realm: str, problem: str | None) -> None:
    found = realm_problem(realm)
    assert (found is None) if problem is None else (found is not None and problem in found), found


@pytest.mark.parametrize("token", ["\u2603-snowman", "a b", "abc\r\nX-Injected: 1", "=abc"])
def test_a_token_that_is_no_bearer_token_is_refused_in_one_line(
    servers: tuple[ThreadingHTTPServer, ThreadingHTTPServer], tmp_path: Path, token: str
) -> None:
    registry, tokens = servers
    registry.RequestHandlerClass.realm = f"http://127.0.0.1:{tokens.server_address[1]}/token"  # type: ignore[attr-defined]
    tokens.RequestHandlerClass.token = token  # type: ignore[attr-defined]
    host = f"127.0.0.1:{registry.server_address[1]}"
    with pytest.raises(RegistryError) as info:
        served_manifest(f"{host}/team/app:1", docker_config=tmp_path / "none.json")
    message = str(info.value)
    assert "sent a token that is not an RFC 6750 bearer token" in message and "\n" not in message
    assert token not in message  # a token is a secret: its length is said, not its text


@pytest.mark.parametrize("token", ["\u2603-snowman", "two words", "line\nbreak"])
def test_a_ray_token_that_is_no_bearer_token_is_refused_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    """The same rule for the token envrun sends to a Ray cluster (from the user's file or environment)."""
    from envbuild.errors import InputError
    from envrun.ray_api import auth_headers

    (tmp_path / "token").write_text(token + "\n")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    with pytest.raises(InputError, match="the Ray token file: not an RFC 6750 bearer token") as info:
        auth_headers()
    assert token.strip() not in str(info.value)
    (tmp_path / "token").write_text("0123456789abcdef" * 2 + "\n")
    assert auth_headers() == {"Authorization": "Bearer " + "0123456789abcdef" * 2}
