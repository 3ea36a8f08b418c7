"""One node of a scheduler's job, inside the locked image: its own check, then Ray (and, on the head, the
run). Run as ``python3 -m envrun.injob node|check JOB_JSON``, with the node's identity in its environment
(:mod:`.spec`).

The check (before Ray, before the trainer, with the standard library alone: it judges any image): the lock the image recorded is the run's, the node sees the
NPUs the run needs on each node, and no address the job's other machines need is a loopback one. A node that fails it prints one line naming itself and why, writes it to
``CHECKS_DIR`` when the job's directory is mounted (Slurm), and exits ``REFUSED``: it never joins, and the
job ends without its trainer.

Ray: the head starts it (``--head``, the job API on its address) and runs the driver
(:mod:`.driver`); a worker waits until the head's GCS port answers, then joins it with ``--block``, so the
node lives as long as Ray on it. Each node gets the network ``envrun cluster up`` gives its nodes: HCCL's and
Gloo's interface (the one carrying the node's address), HCCL port ranges of its own, Ray's NPU resource.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from envrun.cluster.netifs import carrier, interfaces
from envrun.cluster.onnode import lock_facts
from envrun.injob.spec import JOB_DIR, NODE_PORTS, InJob, NodeIdentity

REFUSED = 3  # the node refused the run (its own check): the scheduler ends the job
CHECKS_DIR = JOB_DIR + "/checks"
# Ray waits 30 s for a new node to register; a node's first start on a host compiles Ray's modules (the image
# ships no bytecode) while the other nodes of that host do the same, and took longer here.
NODE_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_raylet_start_wait_time_s": "180"}


def who(node: NodeIdentity) -> str:
    return f"node {node.index} {node.name} (ip {node.ip or 'Ray’s choice'}, host {socket.gethostname()})"


def own_check(spec: InJob, node: NodeIdentity, facts: dict[str, Any]) -> tuple[bool, str]:
    """This node's verdict on itself, from its facts (:func:`envrun.cluster.onnode.lock_facts`): the image's
    lock and the NPUs it sees. One line."""
    found, devices = facts["lock_sha256"], facts["devices"]
    problems = []
    if found != spec.lock_sha256:
        why = f" ({facts['manifest_problem']})" if facts["manifest_problem"] else ""
        problems.append(
            f"its image records lock {str(found)[:12]}{why}, the run's is {spec.lock_sha256[:12]}: "
            "not the image built from the run's lock"
        )
    need = spec.npus_per_node or 0
    if len(devices) < need:
        problems.append(f"it sees {len(devices)} NPU(s), the run needs {need} on each node")
    problems += address_problems(node)
    if problems:
        return False, f"{who(node)}: refused: " + "; ".join(problems)
    npus = f", {len(devices)} NPU(s) ({', '.join(devices)})" if devices else ", no NPU"
    return True, f"{who(node)}: ok: lock {spec.lock_sha256[:12]}{npus}"


def _loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:  # a name (Kubernetes' head): not ours to judge
        return False


def address_problems(node: NodeIdentity) -> list[str]:
    """Addresses the job's other machines cannot reach: a loopback address (Debian's ``127.0.1.1 HOSTNAME``
    in /etc/hosts, where Slurm's NodeAddr is the host's name) where the job's nodes are on more than one
    machine. Without this the workers wait for the head at their own loopback until the join deadline."""
    machines = node.machines
    if len(set(machines)) < 2 or node.index >= len(machines):
        return []  # one machine (loopback reaches every node), or machines unknown (Kubernetes: pod IPs)
    bad = [f"its own address {node.ip}"] if _loopback(node.ip) else []
    if node.index and _loopback(node.head) and machines[node.index] != machines[0]:
        bad.append(f"the head's address {node.head}")
    if not bad:
        return []
    return [
        f"{' and '.join(bad)}: loopback, which the job's other machines ({', '.join(sorted(set(machines)))}) "
        "cannot reach; give each node a NodeAddr they reach (slurm.conf), not a name /etc/hosts maps to loopback"
    ]


def record_check(node: NodeIdentity, ok: bool, line: str) -> None:
    """The verdict where the submitting host reads it (a Slurm job's shared directory), when mounted."""
    if not Path(JOB_DIR).is_dir():
        return
    Path(CHECKS_DIR).mkdir(exist_ok=True)
    target = Path(CHECKS_DIR) / f"node-{node.index}.json"
    scratch = target.with_suffix(".tmp")
    scratch.write_text(json.dumps({"index": node.index, "name": node.name, "ok": ok, "line": line}))
    scratch.replace(target)


def port_args(spec: InJob, node: NodeIdentity) -> list[str]:
    """Ray's ports for this node: its defaults for the first node on a machine without ``node_ports``; a
    block of its own from ``node_ports`` (by its slot on the machine) otherwise."""
    if spec.node_ports is None:
        if node.slot:
            raise ValueError(
                f"{node.slot + 1} nodes of this job share machine {node.machines[node.index]}: give "
                "--ray-ports BASE so that each takes its own block of Ray's ports"
            )
        return []
    return port_flags(spec.node_ports + NODE_PORTS * node.slot, head=node.index == 0)


def port_flags(base: int, *, head: bool) -> list[str]:
    """``ray start`` flags giving a node the ports ``base`` … ``base + NODE_PORTS - 1``: its own, then its
    workers'."""
    ports = [
        f"--node-manager-port={base}",
        f"--object-manager-port={base + 1}",
        f"--metrics-export-port={base + 2}",
        f"--dashboard-agent-listen-port={base + 3}",
        f"--dashboard-agent-grpc-port={base + 4}",
        f"--runtime-env-agent-port={base + 5}",
        f"--min-worker-port={base + 10}",
        f"--max-worker-port={base + NODE_PORTS - 1}",
    ]
    return [*ports, f"--ray-client-server-port={base + 6}"] if head else ports


def ray_start(spec: InJob, node: NodeIdentity, npus: int) -> list[str]:
    """``ray start`` for this node: the head without ``--block`` (the driver follows it), workers with."""
    from envrun.cluster.network import ray_node_flags  # Ray's yaml with it: after the check, which needs none

    head_address = f"{node.head}:{spec.head_port}"
    argv = ["ray", "start", "--disable-usage-stats", f"--node-name={node.name}", *(["--block"] if node.index else [])]
    flags = ray_node_flags(node.ip, npus, spec.head_port, spec.dashboard_port, head_address, head=node.index == 0)
    return [*argv, *flags, *port_args(spec, node), *spec.ray_start_args]


def node_env(spec: InJob, node: NodeIdentity) -> dict[str, str]:
    from envrun.cluster.network import node_network_env  # Ray's yaml with it: after the check, which needs none

    interface = carrier(interfaces(), node.ip) if node.ip else None
    return {**NODE_ENV, **node_network_env(node.ip, interface, spec.hccl_ports, node.slot)}


def wait_for_head(spec: InJob, node: NodeIdentity) -> None:
    deadline = time.monotonic() + spec.join_timeout
    while True:
        try:
            with socket.create_connection((str(node.head), spec.head_port), timeout=5):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{who(node)}: the head {node.head}:{spec.head_port} did not answer within "
                    f"{spec.join_timeout:g} s ({exc.strerror or exc})"
                ) from None
        time.sleep(1)


def run_node(spec: InJob, node: NodeIdentity) -> int:
    facts = lock_facts()
    ok, line = own_check(spec, node, facts)
    print(f"envrun: {line}", flush=True)
    record_check(node, ok, line)
    if not ok:
        return REFUSED
    # Ray, and on the head the driver and the trainer's processes it starts, run with the node's network.
    os.environ.update(node_env(spec, node))
    argv = ray_start(spec, node, len(facts["devices"]))
    if node.index:
        wait_for_head(spec, node)
        print(f"envrun: {who(node)}: joining {node.head}:{spec.head_port}", flush=True)
        os.execvp(argv[0], argv)  # the node is Ray from here on: stopping the container stops it
    started = subprocess.run(argv, check=False)
    if started.returncode:
        print(f"envrun: {who(node)}: `ray start --head` exited {started.returncode}", flush=True)
        return started.returncode
    from envrun.injob.driver import drive

    return drive(spec, node)


def main(argv: list[str]) -> int:
    from envrun.injob.spec import SpecError, identity, read_spec

    if len(argv) != 2 or argv[0] not in ("node", "check", "driver"):
        print("usage: python3 -m envrun.injob node|check|driver JOB_JSON", file=sys.stderr)
        return 2
    try:
        spec, node = read_spec(Path(argv[1])), identity()
    except SpecError as exc:  # a spec envrun did not write: what is wrong, field by field
        print(f"envrun: {argv[1]}: {exc}", file=sys.stderr, flush=True)
        return 2
    except (OSError, ValueError) as exc:  # unreadable, no JSON, or an identity the scheduler got wrong
        print(f"envrun: {argv[1]}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        if argv[0] == "check":
            ok, line = own_check(spec, node, lock_facts())
            print(f"envrun: {line}", flush=True)
            return 0 if ok else REFUSED
        if argv[0] == "driver":  # Ray started by another (KubeRay): the run alone, on the head
            from envrun.injob.driver import drive

            return drive(spec, node)
        return run_node(spec, node)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a spec or an identity the scheduler got wrong
        print(f"envrun: {argv[1]}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
