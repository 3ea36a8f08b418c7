"""Writing to the local registry over its HTTP API (distribution's v2 API), for images no engine here can
build: another platform's variant of an image, and a multi-platform index (a manifest list) over them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import requests

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"


@dataclass(frozen=True)
class Manifest:
    digest: str
    size: int
    arch: str  # as OCI spells it: amd64, arm64


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _get_json(url: str, accept: str) -> Any:
    response = requests.get(url, headers={"Accept": accept}, timeout=60)
    response.raise_for_status()
    return response.json()


def put_blob(registry: str, repository: str, body: bytes) -> str:
    """Upload ``body`` as a blob (monolithic: POST, then PUT with the digest); its digest."""
    digest = _digest(body)
    started = requests.post(f"http://{registry}/v2/{repository}/blobs/uploads/", timeout=60)
    started.raise_for_status()
    location = started.headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    done = requests.put(
        location,
        params={"digest": digest},
        data=body,
        headers={"Content-Type": "application/octet-stream"},
        timeout=60,
    )
    done.raise_for_status()
    return digest


def put_manifest(registry: str, repository: str, tag: str, body: bytes, media_type: str) -> str:
    response = requests.put(
        f"http://{registry}/v2/{repository}/manifests/{tag}",
        data=body,
        headers={"Content-Type": media_type},
        timeout=60,
    )
    response.raise_for_status()
    return _digest(body)


def platform_variant(registry: str, repository: str, digest: str, arch: str) -> Manifest:
    """The image ``repository@digest`` again, its config saying ``arch`` (OCI spelling): same layers,
    another manifest, tagged ``variant-<arch>``."""
    manifest = _get_json(f"http://{registry}/v2/{repository}/manifests/{digest}", MANIFEST)
    config = _get_json(f"http://{registry}/v2/{repository}/blobs/{manifest['config']['digest']}", CONFIG)
    config["architecture"] = arch
    config_body = json.dumps(config, sort_keys=True).encode()
    manifest["config"] = {
        "mediaType": CONFIG,
        "size": len(config_body),
        "digest": put_blob(registry, repository, config_body),
    }
    body = json.dumps(manifest, indent=3).encode()
    return Manifest(put_manifest(registry, repository, f"variant-{arch}", body, MANIFEST), len(body), arch)


def manifest_of(registry: str, repository: str, digest: str) -> Manifest:
    response = requests.get(
        f"http://{registry}/v2/{repository}/manifests/{digest}", headers={"Accept": MANIFEST}, timeout=60
    )
    response.raise_for_status()
    config = _get_json(f"http://{registry}/v2/{repository}/blobs/{response.json()['config']['digest']}", CONFIG)
    return Manifest(digest, len(response.content), config["architecture"])


def put_index(registry: str, repository: str, tag: str, manifests: list[Manifest]) -> str:
    """A manifest list over ``manifests`` (one per platform), tagged ``tag``; its digest."""
    body = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_LIST,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "size": m.size,
                    "digest": m.digest,
                    "platform": {"architecture": m.arch, "os": "linux"},
                }
                for m in manifests
            ],
        },
        indent=3,
    ).encode()
    return put_manifest(registry, repository, tag, body, MANIFEST_LIST)


def tag_digest(registry: str, repository: str, tag: str) -> str:
    """The manifest digest ``repository:tag`` names in the registry."""
    response = requests.head(
        f"http://{registry}/v2/{repository}/manifests/{tag}", headers={"Accept": MANIFEST}, timeout=60
    )
    response.raise_for_status()
    return str(response.headers["Docker-Content-Digest"])
