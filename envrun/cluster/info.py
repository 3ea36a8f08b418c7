"""What ``envrun cluster up`` and ``status`` report: the cluster's job API and, per node, where it runs,
which image and lock, its Ray node ID and its NPUs. A pure description, rendered as JSON or text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envbuild.data.jsonout import fields_json, jfield, to_jsonable
from envbuild.engine.transfer import Pulled


@dataclass(frozen=True)
class NodeInfo:
    host: str  # the engine URL of the node's host
    container: str  # full container ID ("" when there is none)
    image_id: str
    lock_sha256: str | None  # the lock label of the node's container
    ray_node_id: str | None
    head: bool
    npus: int
    # Status only: the container runs and Ray lists the node ALIVE.
    alive: bool | None = jfield(None, skip=True)
    # Status only: the container's state, "missing" or "unreachable: …".
    state: str | None = jfield(None, skip=True)
    # Up only: what the host fetched for the image (None: it had it).
    pulled: Pulled | None = jfield(None, skip=True)

    def to_json(self) -> dict[str, Any]:
        """What the command that made it knows: ``status`` says whether the node lives, ``up`` what it pulled."""
        known = {"pulled": self.pulled} if self.alive is None else {"alive": self.alive, "state": self.state}
        return {**fields_json(self), **to_jsonable(known)}


@dataclass(frozen=True)
class OtherNode:
    """An alive Ray node of the cluster that no container of ``envrun cluster up`` accounts for (joined by
    hand): a job would be refused while it runs another lock."""

    ray_node_id: str
    name: str
    ip: str


@dataclass(frozen=True)
class ClusterInfo:
    name: str
    address: str | None  # the job API URL (what `envrun grpo-glm5 --ray-address` takes)
    nodes: tuple[NodeInfo, ...]
    # Status only, and always there ([] when none); None for up, which does not ask (not shown).
    other_nodes: tuple[OtherNode, ...] | None = jfield(None, omit="none")


def render_cluster(info: ClusterInfo) -> str:
    lines = [f"cluster {info.name}: job API {info.address or '-'}"]
    for node in info.nodes:
        role = "head  " if node.head else "worker"
        live = "" if node.alive is None else (" alive" if node.alive else f" DEAD ({node.state})")
        lines.append(
            f"  {role} {node.host}  container {node.container[:12] or '-'}  ray node {node.ray_node_id or '-'}"
            f"  lock {node.lock_sha256 or '-'}  {node.npus} NPU(s){live}"
        )
    for other in info.other_nodes or ():
        lines.append(f"  other  ray node {other.ray_node_id} ({other.name}, {other.ip}): not started by envrun cluster")
    return "\n".join(lines) + "\n"
