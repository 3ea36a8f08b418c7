"""What a node says of its network, and the all-pairs connect, run on the nodes (standard library and Ray).

- :func:`network_facts`: the node's interfaces and addresses (:mod:`envrun.cluster.netifs`) and the
  variables that choose what HCCL and Gloo use (the node's own, from its container; the job's own ride in
  the spec and are laid over them by the verdicts, as Ray lays a job's ``env_vars`` over a node's).
- :func:`reach`: every node tried from every other, not assumed: one task on each node (:func:`meet`, the
  node check's own workers: no process is started for it) listens on the first port of that node's HCCL
  host range, at the address Ray advertises for it (a port another process holds is found here, before
  HCCL fails to bind it), and connects to every other's listener, Ray node manager and object manager,
  and to the head's GCS, trying a peer that does not listen yet again until :data:`MEET_SECONDS`. A
  connect is given :data:`CONNECT_SECONDS`; all run at once.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
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
MEET_SECONDS = 15.0  # for every node to listen, connect to the others, and be connected to
RETRY_SECONDS = 0.2
WAIT_SECONDS = 120.0  # for every node's task to start and answer


def network_facts() -> dict[str, Any]:
    return {
        "interfaces": interfaces(),
        "env": {name: os.environ[name] for name in (*NET_VARS, NOSET) if name in os.environ},
        "hostname": socket.gethostname(),
    }


def parse_ports(value: str) -> list[range] | None:
    """HCCL's port syntax (``60000-60050``, ``56000,56005,60100-60110``) as ranges; None for ``auto``.
    Raises ValueError for anything else."""
    text = value.strip()
    if text.lower() == "auto":
        return None
    ranges = []
    for item in text.split(","):
        low, dash, high = item.strip().partition("-")
        if not (low.isascii() and low.isdigit() and (not dash or (high.isascii() and high.isdigit()))):
            raise ValueError(item)
        first, last = int(low), int(high or low)
        if not 1 <= first <= last <= 65535:
            raise ValueError(item)
        ranges.append(range(first, last + 1))
    return ranges


def host_ports(env: Mapping[str, str]) -> list[range] | None:
    """The host ports HCCL binds with ``env`` (None: ``auto``, the OS picks them): its range, else 16 from
    its base port, else HCCL's default. Raises ValueError if the variable is not HCCL's syntax."""
    if "HCCL_HOST_SOCKET_PORT_RANGE" in env:
        return parse_ports(env["HCCL_HOST_SOCKET_PORT_RANGE"])
    base = env.get("HCCL_IF_BASE_PORT")
    if base is not None:
        first = parse_ports(base)
        if not first or len(first) != 1 or len(first[0]) != 1:
            raise ValueError(base)
        return [range(first[0].start, first[0].start + 16)]
    return [range(HCCL_DEFAULT_PORT, HCCL_DEFAULT_PORT + 16)]


def first_host_port(env: Mapping[str, str]) -> int | None:
    """The first port of the HCCL host range ``env`` gives (None: the OS chooses, or the value is unreadable,
    which the verdicts say)."""
    try:
        ranges = host_ports(env)
    except ValueError:
        return None
    return ranges[0].start if ranges else None


def _connect(target: dict[str, Any], deadline: float) -> dict[str, Any]:
    """One connect; a refusal is tried again until ``deadline`` (the peer may not listen yet)."""
    while True:
        try:
            with socket.create_connection((target["ip"], target["port"]), timeout=CONNECT_SECONDS):
                return {**target, "error": None}
        except ConnectionRefusedError as exc:
            if time.monotonic() + RETRY_SECONDS > deadline:
                return {**target, "error": exc.strerror or "connection refused"}
            time.sleep(RETRY_SECONDS)
        except OSError as exc:
            return {**target, "error": exc.strerror or str(exc) or type(exc).__name__}


def meet(ip: str, port: int | None, targets: list[dict[str, Any]], peers: int, node_id: str) -> dict[str, Any]:
    """This node's side of the all-pairs connect, as one task: listen on HCCL's first host port at ``ip``
    (None: the OS picks HCCL's ports, and any free one stands in), connect to every target (a peer not
    yet listening is tried again), and keep listening until ``peers`` have connected or the time is up."""
    deadline = time.monotonic() + MEET_SECONDS
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    # The last check's connections to this port linger in TIME_WAIT; a port another socket listens on is
    # still refused (Linux's SO_REUSEADDR does not share a listening port).
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    accepted: list[str] = []
    try:
        listener.bind((ip, port or 0))
        listener.listen(128)
        listened: dict[str, Any] = {"port": listener.getsockname()[1], "error": None}
    except OSError as exc:
        listener.close()
        listened = {"port": port, "error": f"cannot listen on {ip} port {port}: {exc.strerror or exc}"}
    if listened["error"] is None:

        def accept() -> None:
            listener.settimeout(0.2)
            while len(accepted) < peers and time.monotonic() < deadline:
                try:
                    connection, address = listener.accept()
                except OSError:
                    continue
                accepted.append(str(address[0]))
                connection.close()

        accepting = threading.Thread(target=accept, daemon=True)
        accepting.start()
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(targets)))) as pool:
        connects = list(pool.map(lambda target: _connect(target, deadline), targets))
    if listened["error"] is None:
        accepting.join(max(0.0, deadline - time.monotonic()))
        listener.close()
    return {"listen": listened, "connects": connects, "accepted": len(accepted)}


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


def reach(
    nodes: list[dict[str, Any]], node_env: dict[str, dict[str, str]], job_env: dict[str, str], gcs: str | None
) -> dict[str, dict[str, Any]]:
    """Each node's listener and connects, by Ray node ID (``node_env``: each node's own variables, as its
    answer gave them; the job's are laid over them). One task per node, all at once: each listens, then
    connects to the others, each waiting for the others' listeners as it goes."""
    ports = {}
    for node in nodes:
        port = first_host_port({**node_env.get(node["NodeID"], {}), **job_env})
        if port is not None:
            ports[node["NodeID"]] = port
    gcs_address = None
    if gcs and ":" in gcs:
        host, port_text = gcs.rsplit(":", 1)
        gcs_address = (host.strip("[]"), int(port_text)) if port_text.isascii() and port_text.isdigit() else None
    return on_each(
        nodes,
        meet,
        lambda n: (
            n["NodeManagerAddress"],
            ports.get(n["NodeID"]),
            _targets(nodes, n["NodeID"], ports, gcs_address),
            len(nodes) - 1 if n["NodeID"] in ports else 0,  # every other node connects to its HCCL port
        ),
    )


def on_each(nodes: list[dict[str, Any]], function: Any, args: Any) -> dict[str, Any]:
    """``function(*args(node), node_id)`` as a task pinned to each node, all at once; results by node ID.
    No CPU is asked (a busy node still answers), so the node check's task workers are reused."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=0)(function)
    pending = {
        n["NodeID"]: remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            *args(n), n["NodeID"]
        )
        for n in nodes
    }
    return dict(zip(pending, ray.get(list(pending.values()), timeout=WAIT_SECONDS)))
