"""A small lock with Ray in it, images built from it by ``envbuild image``, and cluster files whose nodes
share this machine — for the ``envrun cluster`` tests.

- The lock: the test base image (Debian bookworm, python3.11) plus ``ray[default]`` at the client's own
  Ray version (so the client's job API speaks the cluster's), resolved for linux/<arch>/cp311 from PyPI
  once per machine with ``envbuild lock update`` and kept in ``/var/cache/envbuild-test/ray-cluster/``;
  each session pins it to its own registry's base image. The wheels go through envbuild's file cache
  in the same directory, so the suite downloads them once per machine.
- Images: ``envbuild image LOCK --push --json`` run as a user runs it (the console script, a subprocess).
- Cluster files: node i at 127.0.0.<i+2> (an address of this machine's loopback that Ray advertises as
  given; it replaces 127.0.0.1 with the host's own) with its own block of Ray's ports (host networking), one CPU
  and a small object store.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from envbuild.lock import Lock, write_lock
from envbuild.lock.io import read_lock
from envbuild.lock.model import BaseImage, Platform
from envrun.injob.node import port_flags
from envrun.injob.spec import NODE_PORTS  # a block of ports per node: Ray's own, then its workers'
from tests.lib.baseimage import CACHE_DIR
from tests.lib.services import PushedImage

RAY_CACHE = CACHE_DIR / "ray-cluster"
ENVBUILD_CACHE = RAY_CACHE / "envbuild-cache"  # envbuild's git and file caches: wheels once per machine
RESOLVE_REVISION = 1  # bump when the template below changes in a way its key does not show
EPOCH = 1767225600  # 2026-01-01: fixed, so the same lock always builds the same image
BIN = Path(sys.executable).parent


def ray_requirement() -> str:
    return f"ray[default]=={metadata.version('ray')}"


def _template(base: BaseImage, name: str) -> Lock:
    return Lock(
        version=1,
        name=name,
        sources=(),
        platform=Platform(os="linux", arch=platform.machine(), python="3.11", cann="9.1.0"),
        base_image=base,
        source_date_epoch=EPOCH,
        requirements=(ray_requirement(),),
    )


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # parallel sessions wait rather than resolve twice
        yield


def resolved_lock(base: PushedImage, directory: Path, name: str = "raycluster") -> Path:
    """``directory/<name>.lock.yaml``: Ray's closure (resolved once per machine) on ``base``."""
    pinned = BaseImage(name=f"{base.repository}:{base.tag}", digest=base.digest)
    key_source = json.dumps([ray_requirement(), platform.machine(), RESOLVE_REVISION]).encode()
    cached = RAY_CACHE / f"resolved-{hashlib.sha256(key_source).hexdigest()[:16]}.lock.yaml"
    RAY_CACHE.mkdir(parents=True, exist_ok=True)
    with _locked(RAY_CACHE / "resolve.lock"):
        if not cached.exists():
            scratch = RAY_CACHE / f"resolving-{os.getpid()}.lock.yaml"
            write_lock(scratch, _template(pinned, name))
            done = subprocess.run(
                [str(BIN / "envbuild"), "lock", "update", str(scratch), "--cache-dir", str(ENVBUILD_CACHE), "-q"],
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert done.returncode == 0, f"envbuild lock update failed: {done.stderr[-2000:]}"
            scratch.replace(cached)
    lock = dataclasses.replace(read_lock(cached).lock, name=name, base_image=pinned)
    path = directory / f"{name}.lock.yaml"
    write_lock(path, lock)
    return path


@dataclass(frozen=True)
class BuiltImage:
    lock: Path
    lock_sha256: str
    image_id: str
    reference: str  # registry/repository:tag, pushed


def build_and_push(lock: Path, registry: str, record_dir: Path) -> BuiltImage:
    """``envbuild image LOCK --tag REGISTRY/envbuild-test/<name>:<sha12> --push``, as a user runs it."""
    sha = read_lock(lock).sha256
    reference = f"{registry}/envbuild-test/{read_lock(lock).lock.name}:{sha[:12]}"
    done = subprocess.run(
        [str(BIN / "envbuild"), "image", str(lock), "--tag", reference, "--push", "--json", "-q"]
        + ["--cache-dir", str(ENVBUILD_CACHE), "--record-dir", str(record_dir)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, f"envbuild image failed: {done.stderr[-3000:]}"
    result = json.loads(done.stdout)
    assert result["lock_sha256"] == sha
    (pushed,) = result["pushed"]  # what --push sent: the digest `cluster up --image` pins
    assert pushed["tag"] == reference and pushed["digest"].startswith("sha256:")
    return BuiltImage(lock, sha, result["image_id"], reference)


def free_block(count: int, low: int = 24000) -> int:
    """The first port of ``count`` consecutive free ports at or above ``low`` (below Linux's ephemeral range)."""
    base = low
    while base + count < 32768:
        taken = next((p for p in range(base, base + count) if not _free(p)), None)
        if taken is None:
            return base
        base = taken + 1
    raise RuntimeError(f"no {count} consecutive free ports between {low} and 32768")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def node_args(base: int, *, head: bool) -> list[str]:
    """``ray start`` flags giving a node the ports ``base``…``base+NODE_PORTS-1`` and a small footprint."""
    return ["--num-cpus=1", "--object-store-memory=100000000", *port_flags(base, head=head)]


def node_ip(index: int) -> str:
    """Node ``index``'s address: the machine's loopback, one address per node (127.0.0.2, 127.0.0.3, …)."""
    return f"127.0.0.{index + 2}"


def cluster_file(
    path: Path,
    name: str,
    engines: list[str],
    *,
    extra: dict[int, list[str]] | None = None,
    volumes: list[dict[str, str]] | None = None,
) -> Path:
    """A cluster file: node i on ``engines[i]`` at :func:`node_ip` ``(i)``, with ports of its own; the head's
    GCS and job API ports come first. ``extra[i]`` is appended to node i's ``ray_start_args``; ``volumes``
    are the file's (every node's)."""
    base = free_block(2 + NODE_PORTS * len(engines))
    nodes = [
        {
            "engine": engine,
            "ip": node_ip(i),
            "ray_start_args": node_args(base + 2 + NODE_PORTS * i, head=i == 0) + (extra or {}).get(i, []),
        }
        for i, engine in enumerate(engines)
    ]
    document: dict[str, object] = {"name": name, "head_port": base, "dashboard_port": base + 1, "nodes": nodes}
    if volumes:
        document["volumes"] = volumes
    path.write_text(json.dumps(document, indent=2))  # JSON is YAML
    return path
