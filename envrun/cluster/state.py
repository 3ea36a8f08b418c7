"""Where a cluster's state lives: labels on its containers, and a state file naming its hosts.

Two halves, because each answers a question the other cannot:

- **Labels are the truth on each host.** Every container ``up`` starts carries
  ``io.envbuild.cluster.name=<name>`` (with its node index and role, and the lock digest), so ``down``
  asks each host's engine for exactly that cluster's containers and removes them by ID — whatever the
  state file says, however ``up`` ended (killed half-way, a host lost and back), and without ever
  touching a container it did not start.
- **The state file says which hosts to ask.** A name alone does not say where its engines are, and an
  engine cannot be asked about a cluster it is not part of. ``<cache_dir>/clusters/<name>.json`` records
  the engines, the job API address, the image (by digest) and the lock digest. It is written before
  the first container starts (so an interrupted ``up`` is still found by ``down NAME``) and completed
  once every node has joined; ``down`` removes it when every host is done. Without it,
  ``down CLUSTER.yaml`` asks the file's hosts.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from envbuild.data.jsonout import fields_json
from envbuild.errors import CacheError, InputError
from envbuild.fileio import write_atomic
from envbuild.lock.model import NAME_MAX, SAFE_NAME

CLUSTER_LABEL = "io.envbuild.cluster.name"
NODE_LABEL = "io.envbuild.cluster.node"  # the node's index in the cluster file
NODE_ROLE_LABEL = "io.envbuild.cluster.role"  # head | worker
STATE_VERSION = 1
Phase = Literal["starting", "up"]
# The name is the state file's name, less its ".json": one path component, never a path.
CLUSTER_NAME_MAX = NAME_MAX - len(".json")
CLUSTER_NAME = "a cluster name: lowercase letters, digits, '.', '_', '-', starting with a letter or digit"


def cluster_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a cluster's (it names the state file: a path would escape the state directory)."""
    if not re.fullmatch(SAFE_NAME, name):
        return f"{name!r} is not {CLUSTER_NAME}"
    if len(name) > CLUSTER_NAME_MAX:
        return f"{len(name)} characters; a cluster name has at most {CLUSTER_NAME_MAX}"
    return None


def container_name(cluster: str, index: int) -> str:
    """Node ``index``'s container, and its Ray node name."""
    return f"envrun-{cluster}-{index}"


@dataclass(frozen=True)
class ClusterState:
    name: str
    phase: Phase
    image: str  # repository@sha256:… — what every node runs
    lock_sha256: str
    engines: tuple[str, ...]  # one per node, in the cluster file's order; the first is the head's
    address: str | None = None  # the job API URL, once the head is up
    connect_timeout: int = 30  # the cluster file's: seconds to reach each host's engine
    ips: tuple[str | None, ...] = ()  # the cluster file's `ip` of each node (None: Ray's choice)

    def expected_ips(self) -> dict[str, str]:
        """The address each node must advertise, by its node name (its container's)."""
        return {container_name(self.name, i): ip for i, ip in enumerate(self.ips) if ip}

    def to_json(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **fields_json(self)}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> ClusterState:
        address = document.get("address")
        if address is not None and not isinstance(address, str):
            raise TypeError("address")
        if document.get("phase") not in ("starting", "up"):
            raise TypeError("phase")
        return cls(
            name=_text(document, "name"),
            phase=document["phase"],
            image=_text(document, "image"),
            lock_sha256=_text(document, "lock_sha256"),
            engines=_texts(document.get("engines"), "engines"),
            address=address,
            connect_timeout=_seconds(document.get("connect_timeout", 30)),
            ips=_addresses(document.get("ips", [])),
        )


def _text(document: dict[str, Any], key: str) -> str:
    value = document[key]
    if not isinstance(value, str):
        raise TypeError(key)
    return value


def _texts(value: object, key: str) -> tuple[str, ...]:
    """A list of strings (a string is not one: iterated, it would give one engine per character)."""
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise TypeError(key)
    return tuple(value)


def _seconds(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TypeError("connect_timeout")
    return value


def _addresses(value: object) -> tuple[str | None, ...]:
    if not isinstance(value, list) or not all(ip is None or isinstance(ip, str) for ip in value):
        raise TypeError("ips")
    return tuple(value)


# What takes a cluster down when its state cannot be read: the file it was brought up from names its hosts.
_DOWN_BY_FILE = "; take the cluster down with its file (`envrun cluster down CLUSTER.yaml`), which asks its hosts"


def state_path(cache_dir: Path, name: str) -> Path:
    if problem := cluster_name_problem(name):  # the callers check first; never a path outside the directory
        raise InputError(f"cluster name: {problem}")
    return Path(cache_dir) / "clusters" / f"{name}.json"


def load_state(cache_dir: Path, name: str) -> ClusterState | None:
    path = state_path(cache_dir, name)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CacheError(f"{path}: unreadable cluster state ({exc}){_DOWN_BY_FILE}") from None
    if not isinstance(document, dict) or document.get("version") != STATE_VERSION:
        raise CacheError(f"{path}: not a cluster state of version {STATE_VERSION}{_DOWN_BY_FILE}")
    try:
        return ClusterState.from_json(document)
    except KeyError as exc:
        raise CacheError(f"{path}: incomplete cluster state (no {exc}){_DOWN_BY_FILE}") from None
    except TypeError as exc:
        raise CacheError(f"{path}: cluster state with a wrong {exc}{_DOWN_BY_FILE}") from None


def save_state(cache_dir: Path, state: ClusterState) -> None:
    path = state_path(cache_dir, state.name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise CacheError(f"{path}: cannot write the cluster state: {exc.strerror or exc}") from None


def claim_state(cache_dir: Path, state: ClusterState) -> int:
    """Record ``state`` (a cluster starting) where no state of its name is: the file appears whole, and only
    if none was there (a hard link of a finished file, which fails on an existing name), so of two runs of ``up``
    of one name one records it and the other is refused. Its inode, for :func:`remove_state`."""
    path = state_path(cache_dir, state.name)
    text = json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            os.link(tmp.name, path)
    except FileExistsError:
        raise InputError(
            f"cluster {state.name} is already recorded ({path}); `envrun cluster down {state.name}` first"
        ) from None
    except OSError as exc:
        raise CacheError(f"{path}: cannot write the cluster state: {exc.strerror or exc}") from None
    return path.stat().st_ino


def remove_state(cache_dir: Path, name: str, inode: int | None = None) -> None:
    """Remove the cluster's state; with ``inode``, only while it is that file (an ``up`` rolling back
    removes the state it recorded, never another's)."""
    path = state_path(cache_dir, name)
    try:
        if inode is not None and path.stat().st_ino != inode:
            return
    except FileNotFoundError:
        return
    path.unlink(missing_ok=True)


def require_state(cache_dir: Path, name: str) -> ClusterState:
    state = load_state(cache_dir, name)
    if state is None:
        raise InputError(
            f"no cluster {name} is up (no {state_path(cache_dir, name)}); start it with `envrun cluster up`"
        )
    return state
