"""A real docker-registry (Debian's distribution 2.8) that asks for token authentication, as Docker Hub, SWR
and most hosted registries do, with the token service beside it on loopback.

The registry is configured with ``auth: token`` (realm, service, issuer and a root certificate); the token
service is a small HTTP server that answers ``GET /token?service=…&scope=…`` only for the one user and
password it is given (HTTP Basic, as docker sends them), with a JWT the registry verifies: RS256, signed by
a self-signed certificate named in the token's ``x5c`` header and trusted by the registry's
``rootcertbundle``. What the token service was asked is kept in ``requests`` so that a test can show the
credentials came from the docker config. The test itself uploads through :meth:`TokenRegistry.put`, with a
push token minted directly.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from tests.lib.gitrepos import free_port, stop_process_group, wait_for_port
from tests.lib.leftovers import register

SERVICE = "envbuild-test-registry"
ISSUER = "envbuild-test-token-issuer"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@dataclass
class TokenRegistry:
    root: Path
    user: str = "pinner"
    password: str = field(default_factory=lambda: secrets.token_hex(8))
    port: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)  # what the token service was asked

    def start(self) -> TokenRegistry:
        self.root.mkdir(parents=True, exist_ok=True)
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode("ascii")
        (self.root / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._tokens = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._tokens.serve_forever, daemon=True).start()
        self.port = free_port()
        realm = f"http://127.0.0.1:{self._tokens.server_address[1]}/token"
        (self.root / "config.yml").write_text(
            json.dumps(  # YAML reads JSON
                {
                    "version": 0.1,
                    "log": {"level": "warn", "accesslog": {"disabled": True}},
                    "storage": {"filesystem": {"rootdirectory": str(self.root / "storage")}},
                    "http": {"addr": f"127.0.0.1:{self.port}", "secret": "envbuild-test-not-a-secret"},
                    "auth": {
                        "token": {
                            "realm": realm,
                            "service": SERVICE,
                            "issuer": ISSUER,
                            "rootcertbundle": str(self.root / "cert.pem"),
                        }
                    },
                }
            )
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
        with open(self.root / "registry.log", "wb") as log:
            self._proc = subprocess.Popen(
                ["docker-registry", "serve", str(self.root / "config.yml")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env,
            )  # fmt: skip
        self._entry = register(self._proc.pid, f"docker-registry on port {self.port}")
        try:
            wait_for_port(self.port)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_process_group(self._proc)
        self._entry.forget()
        self._tokens.shutdown()
        self._tokens.server_close()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def token(self, scope: str, subject: str = "test") -> str:
        kind, name, actions = scope.split(":")
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        claims = {
            "iss": ISSUER, "sub": subject, "aud": SERVICE, "exp": now + 600, "nbf": now - 60, "iat": now,
            "jti": secrets.token_hex(8), "access": [{"type": kind, "name": name, "actions": actions.split(",")}],
        }  # fmt: skip
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self._key.sign(signing.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{_b64url(signature)}"

    def put(self, repository: str, path: str, body: bytes, content_type: str) -> str:
        """Upload a blob (``path`` ``blobs``) or a manifest (``manifests/TAG``); the digest of ``body``."""
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        auth = {"Authorization": f"Bearer {self.token(f'repository:{repository}:pull,push')}"}
        base = f"http://{self.host}/v2/{repository}"
        if path == "blobs":
            started = requests.post(f"{base}/blobs/uploads/", headers=auth, timeout=30)
            started.raise_for_status()
            location = started.headers["Location"]
            location = f"http://{self.host}{location}" if location.startswith("/") else location
            done = requests.put(location, params={"digest": digest}, data=body, timeout=30,
                                headers={**auth, "Content-Type": "application/octet-stream"})  # fmt: skip
        else:
            done = requests.put(f"{base}/{path}", data=body, headers={**auth, "Content-Type": content_type}, timeout=30)
        done.raise_for_status()
        return digest

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                given = self.headers.get("Authorization", "")
                registry.requests.append({"query": query, "authorization": given})
                expected = "Basic " + base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
                if given != expected or query.get("service") != SERVICE:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": registry.token(query.get("scope", ""), registry.user)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (http.server's name)
                pass

        return Handler
