"""What a node says of its network, and the all-pairs connect, run on the nodes (standard library and Ray).

- :func:`network_facts`: the node's interfaces and addresses (:mod:`envrun.cluster.netifs`) and the
  variables that choose what HCCL and Gloo use (the node's own, from its container; the job's own ride in
  the spec and are laid over them by the verdicts, as Ray lays a job's ``env_vars`` over a node's).
- :func:`reach`: every node tried from every other, not assumed: a short-lived actor on each node listens
  on the first port of that node's HCCL host range, at the address Ray advertises for it (a port another
  process holds is found here, before HCCL fails to bind it), then each node connects to every other's
  listener, Ray node manager and object manager, and to the head's GCS. A connect is given
  :data:`CONNECT_SECONDS`; all run at once.
"""

from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envrun.cluster.netifs import interfaces

# What chooses the interface, the address and the ports of HCCL and Gloo on a node.
NET_VARS = (
    "HCCL_IF_IP",
    "HCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "HCCL_IF_BASE_PORT",
    "HCCL_HOST_SOCKET_PORT_RANGE",
    "HCCL_NPU_SOCKET_PORT_RANGE",
)
NOSET = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
HCCL_DEFAULT_PORT = 60000  # HCCL's first host port when nothing sets one (it takes 16 from there)
CONNECT_SECONDS = 3.0
WAIT_SECONDS = 120.0  # for every node's actor to start and answer


def network_facts() -> dict[str, Any]:
    return {
        "interfaces": interfaces(),
        "env": {name: os.environ[name] for name in (*NET_VARS, NOSET) if name in os.environ},
        "hostname": socket.gethostname(),
    }


def first_host_port(env: dict[str, str]) -> int | None:
    """The first port of the HCCL host range ``env`` gives (None: ``auto``, the OS chooses; or unreadable)."""
    ranges = env.get("HCCL_HOST_SOCKET_PORT_RANGE", "").strip()
    if ranges:
        first = ranges.split(",")[0].split("-")[0].strip()
        return int(first) if first.isascii() and first.isdigit() else None
    base = env.get("HCCL_IF_BASE_PORT", "").strip()
    if base:
        return int(base) if base.isascii() and base.isdigit() else None
    return HCCL_DEFAULT_PORT


class Peer:
    """One node's side of the all-pairs connect (a Ray actor, pinned to its node)."""

    def __init__(self) -> None:
        self.listener: socket.socket | None = None

    def listen(self, ip: str, job_env: dict[str, str]) -> dict[str, Any]:
        port = first_host_port({**os.environ, **job_env})
        if port is None:
            port = 0  # the OS picks HCCL's ports: any free one stands in for them
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.bind((ip, port))
            listener.listen(128)
        except OSError as exc:
            listener.close()
            return {"port": port, "error": f"cannot listen on {ip} port {port}: {exc.strerror or exc}"}
        self.listener = listener
        return {"port": listener.getsockname()[1], "error": None}

    def connect(self, targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
        def one(target: dict[str, Any]) -> dict[str, Any]:
            try:
                with socket.create_connection((target["ip"], target["port"]), timeout=CONNECT_SECONDS):
                    return {**target, "error": None}
            except OSError as exc:
                return {**target, "error": exc.strerror or str(exc) or type(exc).__name__}

        if not targets:
            return []
        with ThreadPoolExecutor(max_workers=min(64, len(targets))) as pool:
            return list(pool.map(one, targets))

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


def _targets(nodes: list[dict[str, Any]], me: str, ports: dict[str, int], gcs: tuple[str, int] | None) -> list[Any]:
    found = []
    for node in nodes:
        if node["NodeID"] == me:
            continue
        name, ip = node.get("NodeName") or node["NodeManagerAddress"], node["NodeManagerAddress"]
        found.append({"to": name, "ip": ip, "port": node["NodeManagerPort"], "what": "Ray's node manager"})
        found.append({"to": name, "ip": ip, "port": node["ObjectManagerPort"], "what": "Ray's object manager"})
        if node["NodeID"] in ports:
            found.append({"to": name, "ip": ip, "port": ports[node["NodeID"]], "what": "the HCCL host port"})
    if gcs is not None:
        head = next((n for n in nodes if n["NodeManagerAddress"] == gcs[0] and n["NodeID"] != me), None)
        if head is not None:
            found.append({"to": head.get("NodeName") or gcs[0], "ip": gcs[0], "port": gcs[1], "what": "the GCS"})
    return found


def reach(nodes: list[dict[str, Any]], job_env: dict[str, str], gcs: str | None) -> dict[str, dict[str, Any]]:
    """Each node's listener and connects, by Ray node ID."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor: Any = ray.remote(num_cpus=0, max_restarts=0)(Peer)
    peers: dict[str, Any] = {
        n["NodeID"]: actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in nodes
    }
    try:
        asked = [peers[n["NodeID"]].listen.remote(n["NodeManagerAddress"], job_env) for n in nodes]
        listening = dict(zip(peers, ray.get(asked, timeout=WAIT_SECONDS)))
        ports = {node: found["port"] for node, found in listening.items() if not found["error"]}
        gcs_address = None
        if gcs and ":" in gcs:
            host, port = gcs.rsplit(":", 1)
            gcs_address = (host.strip("[]"), int(port)) if port.isdigit() else None
        pending = {
            n["NodeID"]: peers[n["NodeID"]].connect.remote(_targets(nodes, n["NodeID"], ports, gcs_address))
            for n in nodes
        }
        connects = dict(zip(pending, ray.get(list(pending.values()), timeout=WAIT_SECONDS)))
        return {node: {"listen": listening[node], "connects": connects[node]} for node in peers}
    finally:
        for peer in peers.values():
            ray.kill(peer)
