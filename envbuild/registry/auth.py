"""Credentials for a registry, as `docker login` leaves them, and the challenge a registry answers with.

Read from ``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``), ``auths`` only: an entry's
``auth`` (base64 ``user:password``) or ``username`` and ``password``. Credential helpers (``credsStore``,
``credHelpers``) run a program of the user's choosing; envbuild does not run them, and says so when a
registry needs credentials that only a helper holds (``docker login`` with no helper configured, or
a ``auths`` entry, gives envbuild what it reads).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.fileio import open_regular

DOCKER_HUB = "registry-1.docker.io"
_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


@dataclass(frozen=True)
class Found:
    """What the docker config holds for a registry: its credentials, or the helper that would hold them."""

    credentials: Credentials | None = None
    helper: str | None = None
    config: Path | None = None


def find_credentials(host: str, config: Path | None = None) -> Found:
    """The docker config's credentials for ``host`` (``host[:port]``), if it has any; an unreadable or
    malformed config holds none (a build would not read it either)."""
    path = config or Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:
        with open_regular(path) as handle:  # a FIFO named as the config would wait forever
            data = json.loads(handle.read(MAX_CONFIG_BYTES + 1)[:MAX_CONFIG_BYTES])
    except (OSError, ValueError):
        return Found()
    if not isinstance(data, dict):
        return Found()
    keys = _HUB_KEYS if host == DOCKER_HUB else (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/")
    auths = _mapping(data, "auths")
    for key in keys:
        entry = auths.get(key)
        if isinstance(entry, dict) and (found := _entry_credentials(entry)) is not None:
            return Found(found, config=path)
    helpers = _mapping(data, "credHelpers")
    helper = next((helpers[k] for k in keys if isinstance(helpers.get(k), str)), None) or data.get("credsStore")
    return Found(helper=helper if isinstance(helper, str) else None, config=path)


def _mapping(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _entry_credentials(entry: dict[str, Any]) -> Credentials | None:
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, sep, password = base64.b64decode(auth, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return Credentials(user, password) if sep else None
    name, secret = entry.get("username"), entry.get("password")
    if isinstance(name, str) and isinstance(secret, str):
        return Credentials(name, secret)
    return None


@dataclass(frozen=True)
class Challenge:
    """A ``WWW-Authenticate`` answer: ``Bearer realm=…,service=…,scope=…`` or ``Basic realm=…``."""

    scheme: str  # lowercase: "bearer" or "basic"
    params: dict[str, str]


_PARAM = re.compile(r'([A-Za-z_][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


def parse_challenge(header: str) -> Challenge | None:
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() not in ("bearer", "basic"):
        return None
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _PARAM.finditer(rest)}
    return Challenge(scheme.lower(), params)
