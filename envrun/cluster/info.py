"""What ``envrun cluster up`` and ``status`` report: the cluster's job API and, per node, where it runs,
which image and lock, its Ray node ID and its NPUs. A pure description, rendered as JSON or text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    alive: bool | None = None  # status only: the container runs and Ray lists the node ALIVE
    state: str | None = None  # status only: the container's state, "missing" or "unreachable: …"
    pulled: Pulled | None = None  # up only: what the host fetched for the image (None: it had it)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "host": self.host,
            "container": self.container,
            "image_id": self.image_id,
            "lock_sha256": self.lock_sha256,
            "ray_node_id": self.ray_node_id,
            "head": self.head,
            "npus": self.npus,
        }
        if self.alive is not None:
            document["alive"] = self.alive
            document["state"] = self.state
        if self.alive is None:
            document["pulled"] = None if self.pulled is None else self.pulled.to_json()
        return document


@dataclass(frozen=True)
class OtherNode:
    """An alive Ray node of the cluster that no container of ``envrun cluster up`` accounts for (joined by
    hand): a job would be refused while it runs another lock."""

    ray_node_id: str
    name: str
    ip: str

    def to_json(self) -> dict[str, str]:
        return {"ray_node_id": self.ray_node_id, "name": self.name, "ip": self.ip}


@dataclass(frozen=True)
class ClusterInfo:
    name: str
    address: str | None  # the job API URL (what `envrun grpo-glm5 --ray-address` takes)
    nodes: tuple[NodeInfo, ...]
    other_nodes: tuple[OtherNode, ...] = ()  # status only

    @property
    def all_alive(self) -> bool:
        return all(node.alive for node in self.nodes)

    def to_json(self) -> dict[str, Any]:
        document = {"name": self.name, "address": self.address, "nodes": [node.to_json() for node in self.nodes]}
        if self.other_nodes:
            document["other_nodes"] = [node.to_json() for node in self.other_nodes]
        return document


def render_cluster(info: ClusterInfo) -> str:
    lines = [f"cluster {info.name}: job API {info.address or '-'}"]
    for node in info.nodes:
        role = "head  " if node.head else "worker"
        live = "" if node.alive is None else (" alive" if node.alive else f" DEAD ({node.state})")
        lines.append(
            f"  {role} {node.host}  container {node.container[:12] or '-'}  ray node {node.ray_node_id or '-'}"
            f"  lock {node.lock_sha256 or '-'}  {node.npus} NPU(s){live}"
        )
    for other in info.other_nodes:
        lines.append(f"  other  ray node {other.ray_node_id} ({other.name}, {other.ip}): not started by envrun cluster")
    return "\n".join(lines) + "\n"
