"""The cluster file: a Ray cluster as data, read strictly with the lock's typed decoder.

```yaml
name: glm5                      # the handle for `envrun cluster status/down`
head_port: 6379                 # optional: the GCS port (Ray's default)
connect_timeout: 30             # optional: seconds to reach each host's engine (ssh: TCP, keys, login)
hccl_ports: 60000               # optional: the first HCCL port on each host (128 per node sharing the host)
dashboard_port: 8265            # optional: the job API port (Ray's default)
volumes:                        # optional: on every node, host path -> container path (read-only by default)
  - {host: /data, container: /data}
  - {host: /scratch/glm5, container: /runs, mode: rw}
nodes:                          # the first is the head
  - engine: ssh://root@node-001 # the host's container engine: ssh://, tcp://host:port or unix:///path
    ip: 10.0.0.1                # optional: the address Ray advertises for this node
    ray_start_args: [--num-cpus=64]   # optional, appended to this node's `ray start`
```

Every problem is reported at once as ``FILE:LINE: FIELD: message`` (exit 2). The flags ``envrun cluster``
itself sets are refused in ``ray_start_args``: they would silently fight the file's own fields.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from envbuild.data.decode import decode_yaml
from envbuild.data.typed import meta, mfield
from envbuild.data.urls import check_userinfo, redact_url
from envbuild.data.yamlfile import node_line, read_capped
from envbuild.errors import DataFileError, Problem
from envbuild.lock.model import SAFE_NAME
from envrun.cluster.state import CLUSTER_NAME_MAX
from envrun.plan import Volume, mount_point

ENGINE_SCHEMES = ("ssh", "tcp", "unix")
# Flags `envrun cluster up` sets from the file or from what it finds on the host.
MANAGED_FLAGS = {
    "--head": "the first node is the head",
    "--address": "workers join the head at its address",
    "--block": "the node runs as the container's main process",
    "--node-name": "the node is named after its container",
    "--node-ip-address": "set `ip` on the node",
    "--port": "set `head_port`",
    "--dashboard-port": "set `dashboard_port`",
    "--dashboard-host": "the job API listens on the head's `ip`, or on every address without one",
    "--resources": "the node's NPUs are counted on its host",
}


class ClusterFileError(DataFileError):
    """A cluster file failed validation: every problem, each with its file and line (exit 2)."""


ENGINE_CREDENTIALS = "ssh keys belong to ssh-agent or ~/.ssh/config, TLS certificates to the docker config"


def check_engine_url(url: str) -> str | None:
    """ssh://[user@]host[:port], tcp://host:port or unix:///path; never a secret (refusals hide the user part)."""
    if any(c.isspace() or ord(c) < 32 for c in url):
        return f"{redact_url(url)!r} contains whitespace or control characters"
    if problem := check_userinfo(url, ENGINE_CREDENTIALS):
        return problem
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return f"{shown!r} has an invalid host or port"
    if parts.scheme not in ENGINE_SCHEMES:
        return f"{shown!r}: expected a container engine URL (ssh://[user@]host, tcp://host:port or unix:///path)"
    if parts.scheme == "unix":
        return None if parts.path.startswith("/") and not parts.netloc else f"{shown!r}: expected unix:///absolute/path"
    if not parts.hostname:
        return f"{shown!r} has no host"
    if parts.scheme == "ssh" and (parts.hostname.startswith("-") or (parts.username or "").startswith("-")):
        return f"{shown!r}: a host or user starting with '-' would be an option to ssh"
    if parts.scheme == "tcp" and port is None:
        return f"{shown!r}: a tcp:// engine needs a port (dockerd's is usually 2375, or 2376 with TLS)"
    if parts.path not in ("", "/"):
        return f"{shown!r}: an engine URL has no path"
    if "?" in url or "#" in url:  # dropped by ssh and docker alike: the host would be reached without it
        return f"{shown!r}: an engine URL has no query or fragment (what follows '?' or '#' would be ignored)"
    if port == 0:
        return f"{shown!r}: 0 is not a port (1-65535)"
    return None


def check_ip(value: str) -> str | None:
    """An address a node can advertise: Ray, the job's HCCL and Gloo and the other nodes use this one."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return f"{value!r} is not an IP address"
    if address == ipaddress.ip_address("127.0.0.1"):
        # ray start replaces 127.0.0.1 (and only it) with the address of the host's default route: the
        # node would advertise an address the file never named.
        return (
            "127.0.0.1 is not what the node would advertise: `ray start` replaces it with the host's own "
            "address; give the node's address on the cluster's network (or another 127.0.0.x for nodes on "
            "one machine)"
        )
    if address.is_unspecified or address.is_multicast:
        return f"{value} is not an address a node can be reached at"
    return None


def same_address(found: str, wanted: str) -> bool:
    """One address, however each is written (``::1`` and ``0:0::1``)."""
    try:
        return ipaddress.ip_address(found.strip("[]")) == ipaddress.ip_address(wanted.strip("[]"))
    except ValueError:
        return found == wanted


HCCL_PORTS_PER_NODE = 128  # a node's HCCL host and device ranges, 64 each, from `hccl_ports` on its machine


def hccl_room(first_port: int, nodes: int) -> str | None:
    """Whether ``nodes`` nodes on one machine fit their HCCL ports from ``first_port`` below 65536."""
    if first_port + HCCL_PORTS_PER_NODE * nodes - 1 > 65535:
        return f"{first_port} leaves no room for {nodes} node(s) on one host ({HCCL_PORTS_PER_NODE} ports each)"
    return None


def check_port(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"{value} is not a port (1-65535)"


def check_ray_start_args(args: tuple[str, ...]) -> str | None:
    for arg in args:
        if not arg.startswith("--") or any(c in arg for c in "\n\0"):
            return f"{arg!r}: expected a `ray start` flag such as --num-cpus=64"
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            return f"{flag} is set by envrun cluster ({MANAGED_FLAGS[flag]})"
    return None


@dataclass(frozen=True)
class NodeSpec:
    """One node: its host's container engine, the address Ray advertises, extra `ray start` flags."""

    engine: str = field(metadata=meta(check=check_engine_url, description="the host's container engine URL"))
    ip: str | None = mfield(None, check=check_ip, description="the address Ray advertises for this node")
    ray_start_args: tuple[str, ...] = mfield((), check=check_ray_start_args, description="appended to `ray start`")


@dataclass(frozen=True)
class ClusterSpec:
    """A Ray cluster of containers of one locked image; the first node is the head."""

    name: str = field(
        metadata=meta(pattern=SAFE_NAME, max_length=CLUSTER_NAME_MAX, expect="a safe name such as glm5")
    )  # the state file's name, less ".json"
    nodes: tuple[NodeSpec, ...]
    head_port: int = mfield(6379, check=check_port, description="the head's GCS port")
    hccl_ports: int = mfield(
        60000,
        minimum=1024,
        maximum=65535,
        description="the first HCCL port on each host; nodes sharing a host get 128 ports each from there",
    )
    connect_timeout: int = mfield(
        30, minimum=1, maximum=3600, description="seconds to reach each host's engine (over ssh: connect and log in)"
    )
    dashboard_port: int = mfield(8265, check=check_port, description="the job API port")
    volumes: tuple[Volume, ...] = mfield(
        (), description="host paths every node's container sees (the job's model, data and output directory)"
    )

    @property
    def head(self) -> NodeSpec:
        return self.nodes[0]

    @property
    def engines(self) -> tuple[str, ...]:
        """Each host's engine once, in the file's order."""
        return tuple(dict.fromkeys(node.engine for node in self.nodes))


def load_cluster_file(path: Path) -> ClusterSpec:
    return parse_cluster_file(read_capped(path, ClusterFileError), str(path))


def _port_problems(spec: ClusterSpec, root: yaml.Node, file: str, per_host: int) -> list[Problem]:
    """The file's ports apart: the head's GCS and job API ports, and both outside the HCCL ranges every
    node of a host takes from ``hccl_ports`` (``up`` would start nodes whose ports collide)."""
    problems = []
    if spec.head_port == spec.dashboard_port:
        field_name = "dashboard_port" if node_line(root, "dashboard_port") else "head_port"
        message = f"{spec.dashboard_port} is the head_port and the dashboard_port; give each its own port"
        problems.append(Problem(file, node_line(root, field_name), field_name, message))
    last = spec.hccl_ports + HCCL_PORTS_PER_NODE * max(per_host, 1) - 1
    for field_name, port in (("head_port", spec.head_port), ("dashboard_port", spec.dashboard_port)):
        if spec.hccl_ports <= port <= last:
            line = node_line(root, field_name) or node_line(root, "hccl_ports")
            message = f"{port} is among HCCL's ports on each host ({spec.hccl_ports}-{last}, from hccl_ports)"
            problems.append(Problem(file, line, field_name, f"{message}; give a port outside them"))
    return problems


def parse_cluster_file(text: bytes | str, file: str = "<cluster>") -> ClusterSpec:
    def at_least_the_head(spec: ClusterSpec, root: yaml.Node) -> list[Problem]:
        problems = (
            [] if spec.nodes else [Problem(file, root.start_mark.line + 1, "nodes", "needs at least the head node")]
        )
        per_host = max((sum(1 for n in spec.nodes if n.engine == e) for e in spec.engines), default=0)
        if problem := hccl_room(spec.hccl_ports, per_host):
            problems.append(
                Problem(file, node_line(root, "hccl_ports") or node_line(root, "nodes"), "hccl_ports", problem)
            )
        problems += _port_problems(spec, root, file, per_host)
        for index, node in enumerate(spec.nodes):  # Ray, HCCL and Gloo reach each node at its own address
            ips = [n.ip for n in spec.nodes[:index]]
            first = next((i for i, ip in enumerate(ips) if ip and node.ip and same_address(ip, node.ip)), None)
            if first is not None:
                message = f"{node.ip} is nodes[{first}]'s address too; give each node its own address"
                problems.append(Problem(file, node_line(root, "nodes", index, "ip"), f"nodes[{index}].ip", message))
        seen: set[str] = set()
        for index, volume in enumerate(spec.volumes):
            point = mount_point(volume.container)
            if point in seen:
                line = node_line(root, "volumes", index, "container")
                problems.append(Problem(file, line, f"volumes[{index}].container", f"{point} is mounted twice"))
            seen.add(point)
        return problems

    return decode_yaml(
        text, file, ClusterSpec, ClusterFileError, empty="a cluster file needs name and nodes", checks=at_least_the_head
    )
