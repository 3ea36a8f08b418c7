"""The network a multi-node job meets, set by ``envrun cluster up`` and judged before a job: pure functions.

What kills real multi-node Ascend runs before the first step (facts section 9): HCCL or Gloo on an
interface a node lacks, or one that does not carry the address Ray advertises (HCCL error codes 4/5);
two containers on one host binding the same HCCL ports; Ray counting GPUs, or setting each actor's
``ASCEND_RT_VISIBLE_DEVICES`` itself, so the job waits forever or sees the wrong NPUs.

- **Set at ``cluster up``** (:func:`node_network_env`): each node's container gets ``HCCL_IF_IP`` (its
  ``ip``), ``HCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` (the interface carrying that address on its
  host), HCCL host and device port ranges of its own (nodes sharing a host never share a port:
  :func:`port_ranges_for`), and ``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1``; its ``ray start``
  advertises that address (:func:`ray_node_flags`, in a scheduler's job too).
- **Judged before a job** (:func:`network_lines`), from each node's own answer with the job's variables
  laid over the node's (as Ray lays a job's ``env_vars`` over a node's): the interface the variables name
  exists on the node and carries the address Ray advertises; no two nodes of one host have overlapping
  HCCL ranges; every node reached every other (:mod:`envrun.cluster.onnet`); and, for a run that needs
  NPUs, Ray counts them as ``NPU`` and leaves their visibility to the job.

What this proves on a real fabric, and what not: docs/cluster.md#the-network-checked-before-a-job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from envrun.cluster.netifs import carrier, shown_interfaces
from envrun.cluster.onnet import NET_VARS, NOSET, host_ports, parse_ports
from envrun.cluster.spec import HCCL_PORTS_PER_NODE, same_address
from envrun.preflightline import PreflightLine

CHECK = "network"
PORT_BLOCK = HCCL_PORTS_PER_NODE // 2  # each of a node's two HCCL ranges (HCCL takes 16 host ports by default)


def port_ranges_for(first_port: int, slot: int) -> tuple[range, range]:
    """The HCCL host and device port ranges of the ``slot``-th node on a host (0, 1, …)."""
    start = first_port + HCCL_PORTS_PER_NODE * slot
    return range(start, start + PORT_BLOCK), range(start + PORT_BLOCK, start + 2 * PORT_BLOCK)


def shown_range(ports: range) -> str:
    return f"{ports.start}-{ports.stop - 1}"


def node_network_env(ip: str | None, interface: str | None, first_port: int, slot: int) -> dict[str, str]:
    """What a node's container is given so that HCCL, Gloo and Ray use the network the file names."""
    host, device = port_ranges_for(first_port, slot)
    env = {
        NOSET: "1",  # verl's workers choose their NPUs; Ray must not narrow each actor's view to its own
        "HCCL_HOST_SOCKET_PORT_RANGE": shown_range(host),
        "HCCL_NPU_SOCKET_PORT_RANGE": shown_range(device),
    }
    if ip:
        env["HCCL_IF_IP"] = ip
    if interface:
        env["HCCL_SOCKET_IFNAME"] = interface
        env["GLOO_SOCKET_IFNAME"] = interface
    return env


def ray_node_flags(ip: str | None, npus: int, port: int, dashboard: int, join: str | None, *, head: bool) -> list[str]:
    """``ray start``'s flags for a node, a cluster's container or a scheduler's job's: the head's, or a worker's
    joining ``join`` (``ip:port`` of the GCS); the address it advertises; its NPUs."""
    if head:
        # The job API listens on the head's advertised address when one is given; else everywhere, as
        # clients must reach it from outside the host.
        argv = ["--head", f"--port={port}", f"--dashboard-port={dashboard}", f"--dashboard-host={ip or '0.0.0.0'}"]
    else:
        argv = [f"--address={join}"]
    if ip:
        argv.append(f"--node-ip-address={ip}")
    if npus:
        argv.append("--resources=" + json.dumps({"NPU": npus}))
    return argv


@dataclass(frozen=True)
class NodeNet:
    """One node's network, as it answered, with the job's variables laid over its own."""

    name: str
    ip: str
    hostname: str
    interfaces: Mapping[str, list[str]]
    env: Mapping[str, str]

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any], job_env: Mapping[str, str]) -> NodeNet | None:
        found = answer.get("network")
        if not isinstance(found, dict):
            return None
        own = {str(k): str(v) for k, v in (found.get("env") or {}).items()}
        job = {k: v for k, v in job_env.items() if k in (*NET_VARS, NOSET)}
        return cls(
            str(answer.get("name")),
            str(answer.get("ip")),
            str(found.get("hostname") or answer.get("hostname") or ""),
            {str(k): [str(a) for a in v] for k, v in (found.get("interfaces") or {}).items()},
            {**own, **job},
        )


def _names(value: str) -> tuple[list[str], bool]:
    """An ``*_SOCKET_IFNAME`` value: its names, and whether they match exactly (``=eth0``) or as prefixes."""
    exact = value.startswith("=")
    return [name.strip() for name in value.lstrip("=").split(",") if name.strip()], exact


def interface_line(node: NodeNet, nodes: int) -> PreflightLine:
    """The interface and address HCCL and Gloo will use on ``node`` are the ones Ray advertises."""
    who = f"node {node.name} (ip {node.ip})"
    problems: list[str] = []
    said: list[str] = []
    if_ip = node.env.get("HCCL_IF_IP")
    if if_ip is not None:
        if not same_address(if_ip, node.ip):
            problems.append(f"HCCL_IF_IP={if_ip}, but the node advertises {node.ip} to Ray")
        said.append(f"HCCL_IF_IP={if_ip}")
    home = carrier(dict(node.interfaces), node.ip) if node.ip else None
    for variable in ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        value = node.env.get(variable)
        if value is None:
            continue
        said.append(f"{variable}={value}")
        if value.startswith("^"):
            continue  # an exclusion list: whatever is left may carry it
        names, exact = _names(value)
        exact = exact or variable == "GLOO_SOCKET_IFNAME"  # Gloo takes names, never prefixes
        matching = [i for i in node.interfaces if any(i == n if exact else i.startswith(n) for n in names)]
        if not matching:
            problems.append(
                f"{variable}={value} names no interface of this node (it has: {shown_interfaces(node.interfaces) or 'none'})"
            )
        elif home not in matching and not (variable == "HCCL_SOCKET_IFNAME" and if_ip is not None):
            where = f"is on {home}" if home else "is on none of its interfaces"
            problems.append(f"{variable}={value}, but the address Ray advertises ({node.ip}) {where}")
    if problems:
        fix = (
            "set them to the interface carrying the node's address (envrun cluster up does, from the cluster "
            "file's ip), or drop the --env that overrides them"
        )
        return PreflightLine(CHECK, "fail", f"{who}: {'; '.join(problems)}: {fix}", {"interfaces": node.interfaces})
    if not said:
        if nodes < 2:
            return PreflightLine(CHECK, "ok", f"{who}: one node, HCCL and Gloo stay on it")
        return PreflightLine(
            CHECK,
            "fail",
            f"{who}: nothing tells HCCL and Gloo which interface to use (HCCL_IF_IP, HCCL_SOCKET_IFNAME, "
            f"GLOO_SOCKET_IFNAME), and they pick the first they find: set them (--env) to the interface "
            f"carrying {node.ip}{f' ({home})' if home else ''}, or start the cluster with envrun cluster up",
            {"interfaces": node.interfaces},
        )
    return PreflightLine(CHECK, "ok", f"{who}: {', '.join(said)}, on {home or '?'}, which carries {node.ip}")


def _overlap(a: list[range] | None | str, b: list[range] | None | str) -> str | None:
    if a is None or b is None:
        return None  # the OS picks: never the same port twice
    if isinstance(a, str) or isinstance(b, str):
        return "HCCL's default" if a == b else None
    for first in a:
        for second in b:
            low, high = max(first.start, second.start), min(first.stop, second.stop)
            if low < high:
                return f"{low}-{high - 1}"
    return None


def port_lines(nodes: Iterable[NodeNet]) -> list[PreflightLine]:
    """No two nodes of one host (one hostname: containers with host networking share its ports) bind the
    same HCCL port."""
    by_host: dict[str, list[NodeNet]] = {}
    for node in nodes:
        by_host.setdefault(node.hostname, []).append(node)
    lines = []
    for hostname, sharing in sorted(by_host.items()):
        problems = []
        ports: dict[str, tuple[Any, Any]] = {}
        for node in sharing:
            try:
                # Device ports unset: HCCL's default ones, the same for every process of a host.
                device = node.env.get("HCCL_NPU_SOCKET_PORT_RANGE")
                ports[node.name] = (host_ports(node.env), "default" if device is None else parse_ports(device))
            except ValueError as exc:
                problems.append(f"node {node.name}: an HCCL port variable is not HCCL's port syntax ({exc})")
        for first, second in combinations(sorted(ports), 2):
            for kind, index in (("host", 0), ("device", 1)):
                clash = _overlap(ports[first][index], ports[second][index])
                if clash:
                    problems.append(f"nodes {first} and {second} share HCCL {kind} ports {clash}")
        names = ", ".join(n.name for n in sharing)
        if problems:
            lines.append(
                PreflightLine(
                    CHECK,
                    "fail",
                    f"host {hostname} ({names}): {'; '.join(problems)}: the second node's HCCL cannot bind them; "
                    "give each node of a host ranges of its own (HCCL_HOST_SOCKET_PORT_RANGE, "
                    "HCCL_NPU_SOCKET_PORT_RANGE: envrun cluster up does)",
                )
            )
        elif len(sharing) > 1:
            lines.append(PreflightLine(CHECK, "ok", f"host {hostname} ({names}): HCCL port ranges apart"))
    return lines


def reach_line(answer: Mapping[str, Any]) -> PreflightLine:
    """``answer``'s node reached every other on the ports the job needs, and could listen on its own."""
    who = f"node {answer.get('name')} (ip {answer.get('ip')})"
    found = answer.get("reach")
    if not isinstance(found, dict) or found.get("error"):
        problem = found.get("error") if isinstance(found, dict) else "no answer"
        return PreflightLine(CHECK, "fail", f"{who}: the all-pairs connect did not run: {problem}")
    problems = []
    listening = found.get("listen") or {}
    if listening.get("error"):
        problems.append(f"{listening['error']} (another process holds HCCL's port there?)")
    failed = [c for c in found.get("connects") or [] if c.get("error")]
    problems += [f"cannot reach {c['to']} at {c['ip']}:{c['port']} ({c['what']}): {c['error']}" for c in failed[:5]]
    if len(failed) > 5:
        problems.append(f"… and {len(failed) - 5} more")
    if problems:
        return PreflightLine(CHECK, "fail", f"{who}: {'; '.join(problems)}", dict(found))
    count = len(found.get("connects") or [])
    return PreflightLine(
        CHECK,
        "ok",
        f"{who}: listened on HCCL's port {listening.get('port')}; reached the other nodes on {count} port(s)",
        dict(found),
    )


def npu_line(
    answers: Sequence[Mapping[str, Any]], nodes: Sequence[NodeNet], npus_per_node: int | None
) -> PreflightLine:
    """For a run that needs NPUs: Ray counts them as NPU (not GPU), and leaves their visibility to the job."""
    if not npus_per_node:
        return PreflightLine(CHECK, "skip", "the run asks for no NPUs")
    problems = []
    for answer in answers:
        gpus, npus = float(answer.get("gpu_resource") or 0), float(answer.get("npu_resource") or 0)
        if gpus and not npus:
            problems.append(
                f"node {answer.get('name')}: Ray counts {gpus:g} GPU(s) and no NPU (start it with "
                "`--resources='{\"NPU\": N}'`; envrun cluster up does)"
            )
    for node in nodes:
        if node.env.get(NOSET) != "1":
            problems.append(
                f"node {node.name}: {NOSET} is not 1: Ray sets each actor's ASCEND_RT_VISIBLE_DEVICES to the "
                "NPUs it was given and verl's workers find the wrong ones (set it where the node's Ray starts; "
                "envrun cluster up does)"
            )
    if problems:
        return PreflightLine(CHECK, "fail", "; ".join(problems))
    return PreflightLine(
        CHECK, "ok", f"Ray counts NPUs on every node and leaves their visibility to the job ({NOSET}=1)"
    )


def network_lines(
    answers: Sequence[Mapping[str, Any]], job_env: Mapping[str, str], npus_per_node: int | None
) -> tuple[PreflightLine, ...]:
    """Every network verdict of the nodes' answers (the nodes were asked ``network``)."""
    alive = [a for a in answers if not a.get("error")]
    nodes = [n for n in (NodeNet.from_answer(a, job_env) for a in alive) if n is not None]
    lines = [interface_line(node, len(alive)) for node in nodes]
    lines += port_lines(nodes)
    lines += [reach_line(a) for a in alive if len(alive) > 1]
    lines.append(npu_line(alive, nodes, npus_per_node))
    return tuple(lines)
