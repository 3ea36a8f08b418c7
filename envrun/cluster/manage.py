"""``envrun cluster status`` and ``down``: a cluster read live from its hosts, and taken down everywhere.

``status`` asks each host's engine for the node's container and the cluster's own node list for its
Ray node; a node is alive when both say so. ``down`` asks each host for the containers labelled with
the cluster's name and removes them by ID, workers before the head; it is idempotent, and keeps the
state file when a host could not be reached, so running it again finishes the job.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from envbuild.engine.calls import CONNECT_TIMEOUT
from envbuild.engine.client import Engine
from envbuild.engine.jobs import ContainerState
from envbuild.errors import CacheError, EngineError, EnvbuildError
from envbuild.image.plan import LOCK_LABEL
from envbuild.progress import Progress, silent
from envrun import ray_api
from envrun.cluster.engines import MAX_PARALLEL, each_connected, reached
from envrun.cluster.info import ClusterInfo, NodeInfo, OtherNode
from envrun.cluster.nodes import container_name
from envrun.cluster.state import CLUSTER_LABEL, NODE_ROLE_LABEL, load_state, remove_state, require_state


@dataclass(frozen=True)
class Removed:
    host: str
    name: str
    container: str


def cluster_status(name: str, cache_dir: Path) -> ClusterInfo:
    state = require_state(cache_dir, name)
    listed: list[ray_api.RayNode] = []
    if state.address:
        try:
            listed = ray_api.list_nodes(state.address, timeout=10)
        except ray_api.RayAuthError:
            raise  # the head answers, but not to envrun: its nodes are not dead
        except EngineError:
            pass  # the head is gone: every node shows as not alive
    ray_nodes: dict[str, ray_api.RayNode] = {}
    for node in listed:
        if node.alive or node.name not in ray_nodes:  # a restarted node's dead entry stays listed
            ray_nodes[node.name] = node
    containers: dict[str, dict[str, ContainerState] | str] = {}
    with each_connected(state.engines, state.connect_timeout) as engines:
        for url, engine in engines.items():
            try:
                containers[url] = {c.name: c for c in reached(engine).containers({CLUSTER_LABEL: name})}
            except EnvbuildError as exc:
                containers[url] = f"unreachable: {exc}"
    nodes = []
    for index, url in enumerate(state.engines):
        cname = container_name(name, index)
        found = containers[url]
        container = found.get(cname) if isinstance(found, dict) else None
        ray = ray_nodes.get(cname)
        alive = bool(container and container.running and ray and ray.alive)
        where = found if isinstance(found, str) else (container.state if container else "missing")
        nodes.append(
            NodeInfo(
                host=url,
                container=container.id if container else "",
                image_id=container.image_id if container else "",
                lock_sha256=container.labels.get(LOCK_LABEL) if container else None,
                ray_node_id=ray.node_id if ray else None,
                head=index == 0,
                npus=ray.npus if ray else 0,
                alive=alive,
                state=where,
            )
        )
    ours = {container_name(name, index) for index in range(len(state.engines))}
    others = tuple(
        OtherNode(n.node_id, n.name, n.ip) for n in sorted(listed, key=lambda n: (n.name, n.node_id))
        if n.alive and n.name not in ours
    )  # fmt: skip
    return ClusterInfo(name, state.address, tuple(nodes), others)


def cluster_down(
    name: str,
    cache_dir: Path,
    hosts: tuple[str, ...] = (),
    progress: Progress = silent,
    connect_timeout: int = CONNECT_TIMEOUT,
) -> list[Removed]:
    """Remove every container of cluster ``name`` on the hosts its state names (and ``hosts``, from a
    cluster file); then its state file. Raises after trying every host if one could not be reached."""
    try:
        state = load_state(cache_dir, name)
    except CacheError as exc:
        if not hosts:
            raise
        # A damaged state names no host it can be trusted for: the cluster file's hosts are asked instead.
        progress(f"{exc}; asking the hosts of the cluster file instead")
        state = None
    engines = tuple(dict.fromkeys((*(state.engines if state else ()), *hosts)))
    removed: list[Removed] = []
    unreachable: list[str] = []
    with each_connected(engines, state.connect_timeout if state else connect_timeout) as connected:
        # Every host at once (a node's stop waits for Ray's shutdown); the head's host goes last, after
        # its workers, for the head is first in the file.
        workers = [url for url in reversed(engines) if url != engines[0]]
        for batch in (workers, engines[:1]):
            with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(batch)))) as pool:
                done = [pool.submit(_down_on, url, connected[url], name, progress) for url in batch]
            for future in done:
                gone, problem = future.result()
                removed.extend(gone)
                if problem:
                    unreachable.append(problem)
    if unreachable:
        # With no state to keep (none was written, or it could not be read), only the file names the hosts.
        again = (
            f"the state is kept: run `envrun cluster down {name}`" if state else "run the same `envrun cluster down`"
        )
        raise EngineError("; ".join(unreachable) + f" — {again} again once it answers")
    remove_state(cache_dir, name)
    return removed


def _down_on(
    url: str, answer: Engine | EnvbuildError, name: str, progress: Progress
) -> tuple[list[Removed], str | None]:
    """Remove cluster ``name``'s containers on one host, its head last; what was removed, or why not all."""
    removed: list[Removed] = []
    try:
        engine = reached(answer)
        for container in sorted(engine.containers({CLUSTER_LABEL: name}), key=_head_last):
            if engine.remove_container(container.id):
                removed.append(Removed(url, container.name, container.id))
                progress(f"{url}: removed {container.name} ({container.id[:12]})")
    except EnvbuildError as exc:
        return removed, str(exc)
    return removed, None


def _head_last(container: ContainerState) -> tuple[bool, str]:
    return (container.labels.get(NODE_ROLE_LABEL) == "head", container.name)
