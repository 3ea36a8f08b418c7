"""``envrun cluster up``: a Ray cluster of containers of one locked image, one per node, on their hosts.

Order — nothing starts until every host has passed steps 1-3:

1. every host's engine answers (one that does not: one line naming it);
2. the image is pinned to one manifest digest (given, the one the head's engine already knows, or the
   registry's for its tag), every host has exactly that image (pulled where absent), its
   ``io.envbuild.lock.sha256`` label is the lock's (without ``--lock``: it has one), and it is for the
   host's machine (an aarch64 image on an x86_64 host: refused, naming the host);
3. each host is probed for its Ascend devices, driver files and memory, and must hold no container of
   this cluster already; a machine with NPUs holds one node only (each node gets all of its host's);
4. the state file is written (phase ``starting``, see :mod:`envrun.cluster.state`); the head starts,
   then the workers, joining the GCS address the head reports; ``up`` waits until every node is ALIVE
   in the cluster's own node list;
5. the state is completed (phase ``up``, the job API address).

A failure, Ctrl-C or SIGTERM during 4-5 (a node that exits or does not join in time, a host lost, a
scheduler or ``kill`` ending ``up``) removes every container started, on every host, and the state file:
nothing is left half-started (a second Ctrl-C or SIGTERM does not cut the removal short).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from envbuild.data.reference import split_tag
from envbuild.engine.client import Engine
from envbuild.engine.transfer import Pulled
from envbuild.errors import EngineError, EnvbuildError, InputError
from envbuild.image.plan import LOCK_LABEL
from envbuild.interrupts import sigterm_interrupts, while_stopping
from envbuild.lock.io import LockFile
from envbuild.lock.platform import OCI_ARCH
from envbuild.progress import Progress, silent
from envrun import ray_api
from envrun.bytecode import Bytecode, prepare_image
from envrun.cluster.engines import connected
from envrun.cluster.info import ClusterInfo, NodeInfo
from envrun.cluster.netifs import carrier, shown_interfaces
from envrun.cluster.nodes import (
    HostFacts,
    container_name,
    host_facts,
    host_slots,
    node_container,
    probe_command,
    probe_volumes,
    shared_npu_machines,
)
from envrun.cluster.spec import ClusterSpec, hccl_room, same_address
from envrun.cluster.state import (
    CLUSTER_LABEL,
    ClusterState,
    claim_state,
    load_state,
    remove_state,
    save_state,
    state_path,
)

ADDRESS_FILE = "ray_current_cluster"  # where `ray start --head` writes the GCS address, in its temp dir
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class UpOptions:
    image: str  # a reference every host's engine can pull: repository:tag or repository@sha256:…
    cache_dir: Path  # holds the state file
    lock: LockFile | None = None  # the lock the image must carry; None: whatever lock label it has
    join_timeout: float = 300.0  # seconds for the head to come up and every node to join


@dataclass(frozen=True)
class _Host:
    engine: Engine
    facts: HostFacts
    image_id: str
    lock_sha256: str
    bytecode: Bytecode | None  # the image's volume on this host; None: the image ships its bytecode
    pulled: Pulled | None  # what the host fetched for the image; None: it had it already


@dataclass(frozen=True)
class _Started:
    index: int
    url: str
    engine: Engine
    container: str


def cluster_up(spec: ClusterSpec, options: UpOptions, progress: Progress = silent) -> ClusterInfo:
    if load_state(options.cache_dir, spec.name) is not None:
        raise InputError(
            f"cluster {spec.name} is already recorded ({state_path(options.cache_dir, spec.name)}); "
            f"`envrun cluster down {spec.name}` first"
        )
    progress(f"connecting to {len(spec.engines)} host(s)")
    # Every engine closed, however up ends; SIGTERM unwinds as Ctrl-C does, so the roll-back below removes
    # what was started (killed by it, up left them running).
    with connected(spec.engines, spec.connect_timeout) as engines, sigterm_interrupts():
        reference = pin_image(options.image, engines[spec.head.engine])
        hosts = _prepare_hosts(spec, engines, reference, progress)
        expected = options.lock.sha256 if options.lock else hosts[spec.head.engine].lock_sha256
        for url, host in hosts.items():
            if host.lock_sha256 != expected:
                wanted = f"{options.lock.path}'s" if options.lock else "the head's image's"
                raise InputError(
                    f"{url}: {reference} was built from lock sha256 {host.lock_sha256}, not {wanted} "
                    f"(sha256 {expected}); rebuild the image or pass the lock it was built from"
                )
        if problem := shared_npu_machines(spec, {url: host.facts for url, host in hosts.items()}):
            raise InputError(problem)
        engines_of_nodes = tuple(n.engine for n in spec.nodes)
        ips = tuple(n.ip for n in spec.nodes)
        state = ClusterState(
            spec.name, "starting", reference, expected, engines_of_nodes, None, spec.connect_timeout, ips
        )
        recorded = claim_state(options.cache_dir, state)  # another `up` of the name since the check above: refused
        started: list[_Started] = []
        try:
            address, node_ids = _start(spec, reference, hosts, started, options.join_timeout, progress)
        except BaseException as exc:
            with while_stopping(lambda: None):  # a second Ctrl-C or SIGTERM must not leave nodes running
                _roll_back(spec, started, options.cache_dir, exc, recorded)
            raise
        save_state(options.cache_dir, replace(state, phase="up", address=address))
    nodes = tuple(
        NodeInfo(
            host=s.url,
            container=s.container,
            image_id=hosts[s.url].image_id,
            lock_sha256=hosts[s.url].lock_sha256,
            ray_node_id=node_ids[container_name(spec.name, s.index)],
            head=s.index == 0,
            npus=hosts[s.url].facts.npus,
            pulled=hosts[s.url].pulled,
        )
        for s in started
    )
    progress(f"cluster {spec.name} is up: {len(nodes)} node(s), job API {address}")
    return ClusterInfo(spec.name, address, nodes)


def pin_image(image: str, engine: Engine) -> str:
    """``image`` as ``repository@sha256:…``: every host then runs the same bits, whatever a tag says later."""
    if "@sha256:" in image:
        return image
    repository = split_tag(image)[0]
    attrs = engine.inspect(image)
    for known in (attrs or {}).get("RepoDigests") or []:
        if known.split("@", 1)[0] == repository:
            return str(known)
    try:
        return f"{repository}@{engine.distribution(image)[0]}"
    except EngineError as exc:
        raise EngineError(
            f"{image}: cannot pin it to a digest every host can pull ({exc}); push it first (`envbuild image --push`)"
        ) from None


def _prepare_hosts(
    spec: ClusterSpec, engines: dict[str, Engine], reference: str, progress: Progress
) -> dict[str, _Host]:
    """Every host made ready at once (pulls are the slow part); the first failure, in file order, wins."""
    with ThreadPoolExecutor(max_workers=len(engines)) as pool:
        futures = {url: pool.submit(_prepare_host, spec, url, engines[url], reference, progress) for url in engines}
    return {url: future.result() for url, future in futures.items()}


def _prepare_host(spec: ClusterSpec, url: str, engine: Engine, reference: str, progress: Progress) -> _Host:
    attrs = engine.inspect(reference)
    pulled = None
    if attrs is None:
        progress(f"{url}: pulling {reference}")
        pulled = engine.pull(reference)
        attrs = engine.inspect(reference) or {}
    label = ((attrs.get("Config") or {}).get("Labels") or {}).get(LOCK_LABEL)
    if label is None:
        raise InputError(f"{url}: {reference} has no {LOCK_LABEL} label; build the image with `envbuild image`")
    machine, arch = engine.machine(), attrs.get("Architecture")
    if machine and arch and OCI_ARCH.get(machine, machine) != arch:
        raise EngineError(
            f"{url}: {reference} is an image for {arch}, but this host is {machine}: its nodes cannot run it; "
            f"build the lock for {machine} (platform.arch) or leave this host out"
        )
    leftovers = engine.containers({CLUSTER_LABEL: spec.name})
    if leftovers:
        names = ", ".join(c.name for c in leftovers)
        raise InputError(f"{url}: containers of cluster {spec.name} are already there ({names}); run down first")
    missing = engine.missing_paths(reference, [v.host for v in spec.volumes])
    if missing:  # the engine would create each one empty, and the job would find nothing there
        raise InputError(
            f"{url}: the cluster file's volumes name host paths that do not exist on this host: "
            f"{', '.join(missing)}; create them there (or fix `volumes`)"
        )
    bytecode = prepare_image(engine, attrs)
    probe = engine.run(reference, probe_command(), volumes=probe_volumes(), network_mode="host")
    if probe.exit_code != 0:
        said = " | ".join(line.strip() for line in probe.stderr.splitlines() if line.strip())  # one line
        raise EngineError(f"{url}: the host probe failed (exit {probe.exit_code}): {said[-300:]}")
    facts = host_facts(probe.stdout, engine.memory_bytes())
    for index, node in enumerate(spec.nodes):
        if node.engine == url and node.ip and carrier(dict(facts.interfaces), node.ip) is None:
            raise InputError(
                f"{url}: no interface of this host carries {node.ip}, the cluster file's ip for node "
                f"{container_name(spec.name, index)} (its interfaces: {shown_interfaces(facts.interfaces)}); give "
                "the node an address of its host"
            )
    progress(f"{url}: image {attrs['Id'][:19]}, lock {label[:12]}, {facts.npus} NPU(s)")
    return _Host(engine, facts, attrs["Id"], label, bytecode, pulled)


def _start(
    spec: ClusterSpec,
    reference: str,
    hosts: dict[str, _Host],
    started: list[_Started],
    timeout: float,
    progress: Progress,
) -> tuple[str, dict[str, str]]:
    """Start the head, then the workers; the job API address and each container name's Ray node ID."""
    deadline = time.monotonic() + timeout
    head_address: str | None = None
    slots = host_slots(spec, {url: host.facts.hostname for url, host in hosts.items()})
    if problem := hccl_room(spec.hccl_ports, max(slots) + 1):  # the file's check counted engines, not machines
        raise InputError(f"hccl_ports: {problem}; lower it")
    for index, node in enumerate(spec.nodes):
        host = hosts[node.engine]
        container = node_container(
            spec,
            index,
            image=reference,
            lock_sha256=host.lock_sha256,
            host=host.facts,
            head_address=head_address,
            bytecode=host.bytecode,
            slot=slots[index],
        )
        started.append(_Started(index, node.engine, host.engine, host.engine.start(container)))
        progress(f"{node.engine}: started {container.name}")
        if index == 0:
            head_address = _wait_head(started[0], spec, deadline)
    gcs_host = (spec.head.ip or (head_address or "").rsplit(":", 1)[0]).strip("[]")
    address = f"http://{f'[{gcs_host}]' if ':' in gcs_host else gcs_host}:{spec.dashboard_port}"
    return address, _wait_joined(address, spec, started, deadline)


def _stopped(spec: ClusterSpec, node: _Started, what: str) -> EngineError:
    name = container_name(spec.name, node.index)
    try:
        tail = " | ".join(node.engine.logs_tail(node.container, 6).strip().splitlines())
    except EngineError:
        tail = "(no log)"
    return EngineError(f"{node.url}: node {name} {what}; its log ends: {tail}")


def _check_running(spec: ClusterSpec, node: _Started) -> None:
    state = node.engine.container(node.container)
    if state is None or not state.running:
        raise _stopped(spec, node, f"exited before the cluster was up ({state.state if state else 'removed'})")


def _wait_head(head: _Started, spec: ClusterSpec, deadline: float) -> str:
    """The GCS address (``ip:port``) the head reports once it is up."""
    temp_dir = next((a.split("=", 1)[1] for a in spec.head.ray_start_args if a.startswith("--temp-dir=")), "/tmp/ray")
    while True:
        _check_running(spec, head)
        found = head.engine.exec(head.container, ["cat", f"{temp_dir}/{ADDRESS_FILE}"])
        if found.exit_code == 0 and found.stdout.strip():
            return found.stdout.strip()
        if time.monotonic() > deadline:
            raise _stopped(spec, head, "did not come up in time")
        time.sleep(POLL_SECONDS)


def _wait_joined(address: str, spec: ClusterSpec, started: list[_Started], deadline: float) -> dict[str, str]:
    while True:
        for node in started:
            _check_running(spec, node)
        try:
            alive = {n.name: n for n in ray_api.list_nodes(address, timeout=10) if n.alive}
        except ray_api.RayAuthError:
            raise  # a token it refuses: no wait mends that
        except EngineError:
            alive = {}  # the job API is still starting
        missing = [n for n in started if container_name(spec.name, n.index) not in alive]
        if not missing:
            _check_addresses(spec, started, alive)
            return {name: node.node_id for name, node in alive.items()}
        if time.monotonic() > deadline:
            raise _stopped(spec, missing[0], f"did not join the cluster at {address} in time")
        time.sleep(POLL_SECONDS)


def _check_addresses(spec: ClusterSpec, started: list[_Started], alive: dict[str, ray_api.RayNode]) -> None:
    """Each node advertises the address the file gives it: the one the other nodes, and the job's HCCL and
    Gloo, will use to reach it (Ray picks another when the one asked for is not the host's)."""
    for node in started:
        wanted, name = spec.nodes[node.index].ip, container_name(spec.name, node.index)
        if wanted and not same_address(alive[name].ip, wanted):
            raise EngineError(
                f"{node.url}: node {name} advertises {alive[name].ip} to the cluster, not {wanted} (the cluster "
                f"file's ip): is {wanted} an address of that host?"
            )


def _roll_back(
    spec: ClusterSpec, started: list[_Started], cache_dir: Path, cause: BaseException, recorded: int
) -> None:
    """Remove what was started, workers first; keep the state file (the one this ``up`` recorded, inode
    ``recorded``) only if something could not be removed."""
    left = []
    for node in reversed(started):
        try:
            node.engine.remove_container(node.container, stop_timeout=10)
        except EngineError:
            left.append(f"{container_name(spec.name, node.index)} on {node.url}")
    if not left:
        remove_state(cache_dir, spec.name, recorded)
    elif isinstance(cause, EnvbuildError):
        cause.args = (f"{cause}; could not remove {', '.join(left)}: run `envrun cluster down {spec.name}`",)
