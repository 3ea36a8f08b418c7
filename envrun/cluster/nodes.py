"""A cluster node's container, as a pure function of the cluster file, the node and what its host has.

Each node is one container of the locked image on its host: host networking (Ray's ports are the
host's; nodes sharing a host need distinct ports through ``ray_start_args``), the Ascend devices and
driver mounts that exist on that host (the docker backend's explicit list, never ``--privileged``), the
cluster file's volumes (the job's model, data and output directory, at the paths the job names),
half the host's memory as ``/dev/shm`` (Ray's object store takes 30 % by default and wants it in
shared memory), and ``ray start … --block`` as the main process, so stopping the container stops the
node (SIGTERM: Ray's own clean shutdown) and a node that dies shows as an exited container.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.engine.jobs import JobSpec
from envbuild.image.plan import LOCK_LABEL
from envrun.bytecode import Bytecode, with_bytecode
from envrun.cluster import netifs
from envrun.cluster.netifs import carrier
from envrun.cluster.network import node_network_env, ray_node_flags
from envrun.cluster.spec import ClusterSpec
from envrun.cluster.state import CLUSTER_LABEL, NODE_LABEL, NODE_ROLE_LABEL, container_name
from envrun.dockerhost import DEVICE_PATTERNS, DRIVER_MOUNTS, devices_and_mounts

# Where a host's paths are seen inside the probe container (read-only binds of what always exists).
PROBE_ROOT = "/host"
PROBE_BINDS = ("/dev", "/usr/local", "/etc")
STOP_TIMEOUT_SECONDS = 30
NODE_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


@dataclass(frozen=True)
class HostFacts:
    """What one host has for a node: its Ascend paths (as found on the host), its memory, and its network
    interfaces with their addresses."""

    ascend_paths: tuple[str, ...]
    memory_bytes: int
    interfaces: Mapping[str, list[str]] = field(default_factory=dict)
    hostname: str = ""

    @property
    def npus(self) -> int:
        return sum(1 for p in self.ascend_paths if p.startswith("/dev/davinci") and p[len("/dev/davinci") :].isdigit())


def probe_command() -> list[str]:
    """The host probe (:mod:`envrun.cluster.netifs`, run by the image's python3 with host networking)."""
    patterns = [PROBE_ROOT + p for p in (*DEVICE_PATTERNS, *DRIVER_MOUNTS)]
    source = Path(netifs.__file__).read_text(encoding="utf-8")
    return ["python3", "-c", source, json.dumps(patterns)]


def probe_volumes() -> dict[str, dict[str, str]]:
    return {path: {"bind": PROBE_ROOT + path, "mode": "ro"} for path in PROBE_BINDS}


def host_facts(probe_output: str, memory_bytes: int) -> HostFacts:
    """The probe's answer: its paths as host paths (``/host/dev/davinci0`` → ``/dev/davinci0``), and the
    host's interfaces."""
    found = json.loads(probe_output)
    paths = tuple(
        p[len(PROBE_ROOT) :] for p in found.get("paths", ()) if isinstance(p, str) and p.startswith(PROBE_ROOT + "/")
    )
    interfaces = {
        str(name): [str(a) for a in addresses]
        for name, addresses in (found.get("interfaces") or {}).items()
        if isinstance(addresses, list)
    }
    return HostFacts(paths, memory_bytes, interfaces, str(found.get("hostname") or ""))


def host_slots(cluster: ClusterSpec, hostnames: Mapping[str, str]) -> tuple[int, ...]:
    """Each node's place among the nodes on its machine (0, 1, …), its HCCL ports following from it. A
    machine is a hostname (``hostnames``: by engine URL), so two engines on one machine share it."""
    machines = [hostnames.get(node.engine) or node.engine for node in cluster.nodes]
    return tuple(machines[:index].count(machine) for index, machine in enumerate(machines))


def shared_npu_machines(cluster: ClusterSpec, hosts: Mapping[str, HostFacts]) -> str | None:
    """Why the nodes cannot start (None when they can): two or more nodes on one machine that has NPUs.
    Each node's container gets every NPU of its host and claims them all as Ray's ``NPU`` resource, so
    Ray would count the machine's NPUs once per node (32 for 16) and a run's capacity check pass falsely.
    A machine is a hostname, as for :func:`host_slots` (``hosts``: by engine URL)."""
    machines: dict[str, list[int]] = {}
    for index, node in enumerate(cluster.nodes):
        facts = hosts.get(node.engine)
        machines.setdefault((facts.hostname if facts else "") or node.engine, []).append(index)
    problems = []
    for machine, indexes in machines.items():
        engines = {cluster.nodes[i].engine for i in indexes}
        npus = max((hosts[url].npus for url in engines if url in hosts), default=0)
        if len(indexes) > 1 and npus:
            names = ", ".join(container_name(cluster.name, i) for i in indexes)
            problems.append(
                f"nodes {names} are on one machine, {machine}, which has {npus} NPU(s): each node would be given "
                f"all of them, and Ray would count {npus * len(indexes)}; give each NPU host one node"
            )
    return "; ".join(problems) or None


def ray_start_command(cluster: ClusterSpec, index: int, head_address: str | None, npus: int) -> tuple[str, ...]:
    """``ray start`` for node ``index``; workers join ``head_address`` (``ip:port`` of the GCS)."""
    node = cluster.nodes[index]
    argv = ["ray", "start", "--block", "--disable-usage-stats", f"--node-name={container_name(cluster.name, index)}"]
    flags = ray_node_flags(node.ip, npus, cluster.head_port, cluster.dashboard_port, head_address, head=index == 0)
    return (*argv, *flags, *node.ray_start_args)


def node_container(
    cluster: ClusterSpec,
    index: int,
    *,
    image: str,
    lock_sha256: str,
    host: HostFacts,
    bytecode: Bytecode | None,
    head_address: str | None = None,
    slot: int = 0,
) -> JobSpec:
    """Node ``index``'s container; ``bytecode`` the image's volume on that host (None: the image ships
    its own bytecode); ``slot`` its place among the nodes on its machine (:func:`host_slots`)."""
    devices, mounts = devices_and_mounts(host.ascend_paths)
    for volume in cluster.volumes:
        mounts[volume.host] = volume.bind()
    ip = cluster.nodes[index].ip
    interface = carrier(dict(host.interfaces), ip) if ip else None
    network = node_network_env(ip, interface, cluster.hccl_ports, slot)
    # The image ships no bytecode (a reproducible build compiles nothing). The node writes it to the image's
    # bytecode volume on its host (envrun.bytecode): each module is compiled once per host and image, not in
    # each of Ray's dozen processes nor again by the next node, which halves a node's start on a busy host
    # (and keeps it inside Ray's fixed 30 s registration wait).
    env, volumes = with_bytecode(bytecode, {**NODE_ENV, **network}, mounts)
    return JobSpec(
        image=image,
        command=ray_start_command(cluster, index, head_address, host.npus),
        env=env,
        devices=tuple(devices),
        volumes=volumes,
        network_mode="host",
        labels={
            CLUSTER_LABEL: cluster.name,
            NODE_LABEL: str(index),
            NODE_ROLE_LABEL: "head" if index == 0 else "worker",
            LOCK_LABEL: lock_sha256,
        },
        stop_timeout=STOP_TIMEOUT_SECONDS,
        name=container_name(cluster.name, index),
        shm_size=host.memory_bytes // 2 or None,
    )
