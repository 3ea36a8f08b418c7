"""`envrun cluster` at scale on this machine: what a node pulls after one source moves, and the time of the
whole check before a job at 2, 4 and 8 nodes.

    . /run/envbuild-test/env; python benchmarks/bench_cluster.py --pull
    . /run/envbuild-test/env; python benchmarks/bench_cluster.py --preflight 2,4,8 [--repeat 3] [--no-probe]

``--pull``: the test lock of tests/lib/imagelock.py (three sources served by a git daemon, two wheels from
a local index, the test base image) is built and pushed by ``envbuild image --push``; then one source
(gamma) moves and the lock is built and pushed again. Two fresh engines (their own dockerd) pull the first
image by digest, then the second, as ``envrun cluster up`` does (``Engine.pull``, which records what each
fetched). The registry's manifests say which layers are new in the second image and their compressed
size. Goal (issue 40): each node fetches the moved layers plus less than 1 MB, whatever the image's size.

``--preflight``: for each N, N hosts behind their own sshd (tests/lib/sshhosts.py), one node each, the Ray
image of tests/lib/raycluster.py brought up with ``cluster_up``; then the whole check before a job
(:meth:`RayLauncher.check_target`: each node's lock and NPUs, the model audit and the data at the
cluster volume's paths, the job probe with the real verl 0.9.1 mounted, the network with the all-pairs
connect, and the output directory's storage) is timed ``--repeat`` times, with the CPU each node's
container spent on it. Goal: within 1.5x from 2 to 8 nodes — on a real cluster each node has its own
cores; here the N nodes share this machine's two, so the wall time grows with this machine's CPU and
each node's own CPU says what a node of its own would take (``--no-probe`` leaves out the probe, the
CPU-bound part; ``--breakdown`` times the check's parts).

Prints, never fails. Everything started is stopped by its PID or container ID.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project and its test helpers

from envbuild.engine.client import Engine  # noqa: E402

MB = 1 << 20
ACCEPT = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    )
)


def layers(registry: str, reference: str) -> dict[str, int]:
    """The layers of ``registry/repository@digest`` (or ``:tag``) as the registry lists them: digest -> size."""
    name, _, rest = reference.removeprefix(f"{registry}/").partition("@")
    if not rest:
        name, _, rest = name.rpartition(":")
    response = requests.get(f"http://{registry}/v2/{name}/manifests/{rest}", headers={"Accept": ACCEPT}, timeout=60)
    response.raise_for_status()
    return {layer["digest"]: int(layer["size"]) for layer in response.json()["layers"]}


def envbuild_push(lock: Path, tag: str, cache_dir: Path) -> str:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "envbuild"), "image", str(lock), "--tag", tag, "--push", "--json", "-q",
         "--cache-dir", str(cache_dir)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"envbuild image failed: {done.stderr[-2000:]}")
    (pushed,) = json.loads(done.stdout)["pushed"]
    return f"{tag.rsplit(':', 1)[0]}@{pushed['digest']}"


def bench_pull(registry: str) -> None:
    import docker

    from tests.lib.baseimage import ensure_base_image
    from tests.lib.engines import start_engine
    from tests.lib.gitrepos import GitDaemon
    from tests.lib.imagelock import ImageLockEnv, make_sources, make_wheels
    from tests.lib.pyindex import PyIndex
    from tests.lib.services import push_as

    work = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    engines = []
    client = docker.from_env()
    try:
        base = ensure_base_image(client)
        repository, tag = f"{registry}/envbuild-bench/base", base.tag.rsplit(":", 1)[1]
        digest = push_as(client, base.tag, repository, tag)
        repos = make_sources(work / "git")
        make_wheels(work / "wheels", "bench-pull")
        daemon = GitDaemon(work / "git", allow_filter=True).start()
        with PyIndex(work / "wheels") as index:
            urls = {name: daemon.url(name) for name in repos}
            env = ImageLockEnv(repos, urls, index, f"{repository}:{tag}", digest)
            first = envbuild_push(env.write(work / "v1" / "pullbench.lock.yaml", env.lock(name="pullbench")),
                                  f"{registry}/envbuild-bench/pull:v1", work / "cache")  # fmt: skip
            # 2 MB of hex digits: a source layer of ~1 MB compressed, large enough to tell from the meta layer
            repos["gamma"].commit(
                "gamma moved", files={"data/table.csv": "a,b\n1,2\n3,4\n" + os.urandom(1 << 20).hex()}
            )
            second = envbuild_push(env.write(work / "v2" / "pullbench.lock.yaml", env.lock(name="pullbench")),
                                   f"{registry}/envbuild-bench/pull:v2", work / "cache")  # fmt: skip
        daemon.stop()
        old, new = layers(registry, first), layers(registry, second)
        moved = {d: s for d, s in new.items() if d not in old}
        source = max(moved.values(), default=0)  # gamma's layer; the rest is envbuild's meta layer (the lock's record)
        print(f"image: {len(new)} layers, {sum(new.values()) / MB:.1f} MB compressed; after gamma moved, "
              f"{len(moved)} new layer(s): {', '.join(f'{s / MB:.3f}' for s in sorted(moved.values(), reverse=True))} MB")  # fmt: skip
        for index_ in range(2):
            engine = start_engine(work / f"engine{index_}")
            engines.append(engine)
            with Engine.connect(engine.host) as connected:
                cold = connected.pull(first)
                started = time.monotonic()
                after = connected.pull(second)
                took = time.monotonic() - started
            excess = after.fetched_bytes - source
            verdict = "met" if excess < MB else "NOT met"
            print(f"node {index_}: first pull {cold.fetched} layer(s), {cold.fetched_bytes / MB:.1f} MB; after the "
                  f"move {after.fetched} layer(s), {after.fetched_bytes / MB:.3f} MB in {took:.2f} s: the moved "
                  f"source's layer plus {excess / MB:.3f} MB (goal < 1 MB: {verdict})")  # fmt: skip
    finally:
        for engine in engines:
            engine.stop()
        client.close()
        shutil.rmtree(work, ignore_errors=True)


def node_cpu(hosts: Any, info: Any) -> list[float]:
    """CPU seconds each node's container has used so far (its engine's one-shot stats), in node order.
    The N nodes share this machine's cores: what a node spends is what the check costs it on a machine of
    its own, where the nodes run side by side."""
    used = []
    for host, node in zip(hosts, info.nodes):
        client = host.client()
        try:
            stats = client.api.stats(node.container, stream=False, one_shot=True)
        finally:
            client.close()
        used.append(stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9)
    return used


class _Dirs:
    """What tests/lib/sshhosts.py asks of pytest's tmp_path_factory: a new directory per name."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))


def print_breakdown(address: str, plan: Any, state_dir: Path, name: str, repeat: int) -> None:
    """Where the check's time goes: the engines over ssh, and the node job asked for more and more."""
    from envrun.cluster.nodecheck import NodeAsk, ask_nodes, engine_image_lines
    from envrun.cluster.state import require_state

    state = require_state(state_dir, name)
    parts: list[tuple[str, Any]] = [
        ("engines over ssh", lambda: engine_image_lines(state)),
        ("node job: lock", lambda: ask_nodes(address, NodeAsk())),
        ("+ model, data", lambda: ask_nodes(address, NodeAsk(model="/data/model", data=("/data/train.parquet",)))),
        ("+ network", lambda: ask_nodes(address, NodeAsk(model="/data/model", data=("/data/train.parquet",), network=True))),
        ("+ storage", lambda: ask_nodes(address, NodeAsk(model="/data/model", data=("/data/train.parquet",), network=True, storage="/runs"))),
    ]  # fmt: skip
    for label, run in parts:
        times = []
        for _ in range(repeat):
            started = time.monotonic()
            run()
            times.append(time.monotonic() - started)
        print(f"    {label}: {statistics.median(times):.2f} s")


def bench_preflight(registry: str, counts: list[int], repeat: int, probe: bool, breakdown: bool = False) -> None:
    from dataclasses import replace

    import docker

    from envbuild.lock.io import read_lock
    from envrun.cluster.manage import cluster_down
    from envrun.cluster.spec import load_cluster_file
    from envrun.cluster.up import UpOptions, cluster_up
    from envrun.launch.ray_backend import RayLauncher
    from envrun.prepare import prepare_run
    from tests.lib.baseimage import ensure_base_image
    from tests.lib.raycluster import build_and_push, cluster_file, resolved_lock
    from tests.lib.services import PushedImage, push_as
    from tests.lib.sshhosts import ssh_hosts
    from tests.lib.tinyrun import tiny_setup
    from tests.lib.verlenv import probe_recipe, verl_env

    work = Path(tempfile.mkdtemp(prefix="bench-preflight-"))
    client = docker.from_env()
    factory = _Dirs(work / "t")
    try:
        base = ensure_base_image(client)
        repository, tag = f"{registry}/envbuild-test/base", base.tag.rsplit(":", 1)[1]
        pushed = PushedImage(repository, tag, push_as(client, base.tag, repository, tag))
        image = build_and_push(resolved_lock(pushed, work, "raycluster"), registry, work / "record")
        verl = verl_env()
        interpreter = Path(os.path.realpath(verl.python)).parents[1]
        shared = work / "shared"
        shared.mkdir()
        tiny = tiny_setup(shared)
        runs = work / "runs"
        runs.mkdir()
        for count in counts:
            with ssh_hosts(count, factory) as (_client, hosts):  # type: ignore[arg-type]
                volumes = [
                    {"host": str(shared), "container": "/data"},
                    {"host": str(runs), "container": "/runs", "mode": "rw"},
                ]
                volumes += [
                    {"host": str(p), "container": str(p)}
                    for p in dict.fromkeys((verl.root, verl_env(transfer_queue=False).root, interpreter))
                ]
                spec = load_cluster_file(
                    cluster_file(work / f"c{count}.yaml", f"bench{count}", [h.url for h in hosts], volumes=volumes)
                )
                state = work / f"state{count}"
                started = time.monotonic()
                info = cluster_up(spec, UpOptions(image=image.reference, cache_dir=state, lock=read_lock(image.lock)))
                up = time.monotonic() - started
                try:
                    request = replace(
                        tiny.request(
                            backend="ray",
                            model=Path("/data/model"),
                            train_files=(Path("/data/train.parquet"),),
                            extra_env={
                                "PATH": f"{verl.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                "PYTHONPYCACHEPREFIX": "",
                            },
                            output_dir=Path("/runs"),
                            entry_point=None,
                        ),
                        recipe=str(probe_recipe(work)),
                        lock=image.lock,
                        verl_config=verl_env(transfer_queue=False).site_packages / "verl" / "trainer" / "config",
                        cluster=spec.name,
                        cache_dir=state,
                        dry_run=True,
                        skip_checks=("npus",) + (() if probe else ("job-probe",)),
                    )
                    plan = prepare_run(replace(request, skip_checks=request.skip_checks + ("ray-node",))).plan
                    launcher = RayLauncher(str(info.address))
                    skip = frozenset(request.skip_checks)
                    times, cpus = [], []
                    for _ in range(repeat):
                        before = node_cpu(hosts, info)
                        started = time.monotonic()
                        lines = launcher.check_target(plan, skip, lambda _m: None)
                        times.append(time.monotonic() - started)
                        cpus.append([b - a for a, b in zip(before, node_cpu(hosts, info))])
                    if breakdown:
                        print_breakdown(str(info.address), plan, state, spec.name, repeat)
                    failed = [f"{line.name}: {line.detail[:120]}" for line in lines if line.status == "fail"]
                    worker_cpu = statistics.median(c for run in cpus for c in run[1:])
                    head_cpu = statistics.median(run[0] for run in cpus)
                    print(f"{count} node(s): up {up:.1f} s; the check before a job {statistics.median(times):.2f} s "
                          f"(median of {repeat}: {', '.join(f'{t:.2f}' for t in times)}); CPU per node: head "
                          f"{head_cpu:.2f} s, a worker {worker_cpu:.2f} s (median); {len(lines)} lines, "
                          f"{len(failed)} failing" + (f" ({'; '.join(failed[:3])})" if failed else ""))  # fmt: skip
                finally:
                    cluster_down(spec.name, state)
    finally:
        client.close()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pull", action="store_true", help="bytes each node pulls after one source moves")
    parser.add_argument("--preflight", metavar="N,N,…", help="time the check before a job at these node counts")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-probe", action="store_true", help="leave the job probe out of --preflight")
    parser.add_argument("--breakdown", action="store_true", help="with --preflight: time the check's parts too")
    args = parser.parse_args(argv)
    registry = os.environ.get("ENVBUILD_TEST_REGISTRY")
    if not registry or not os.environ.get("DOCKER_HOST"):
        parser.error("start the services first: scripts/services start; . /run/envbuild-test/env")
    if args.pull:
        bench_pull(registry)
    if args.preflight:
        counts = [int(n) for n in args.preflight.split(",")]
        bench_preflight(registry, counts, args.repeat, not args.no_probe, args.breakdown)
    if not (args.pull or args.preflight):
        parser.error("give --pull and/or --preflight N,N,…")
    return 0


if __name__ == "__main__":
    sys.exit(main())
