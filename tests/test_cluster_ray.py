"""``envrun cluster`` for real: two hosts, each an extra dockerd on this machine behind an sshd of its own
(:mod:`tests.lib.sshhosts`), so that every engine call ``up``, ``status``, ``down`` and a job's checks
make goes through real OpenSSH, to the host a Host alias of the user's ssh config names; the image is
built from a Ray lock by ``envbuild image`` and pushed to the test registry, each host pulls it by
digest, and real Ray runs in the containers. One image pair and one cluster serve the whole module (tests run in order:
the failures that must leave nothing first, then the cluster's life, ``down`` last).

Everything started here is stopped by its ID: the engines by PID, containers by container ID (``down``
removes by ID what carries the cluster's label; the stale node is removed by its own ID).
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from envbuild.data.reference import split_reference
from envbuild.errors import EngineError
from envbuild.lock.io import read_lock, write_lock
from envbuild.lock.platform import OCI_ARCH
from envrun import ray_api
from envrun.bytecode import MOUNT, Bytecode
from envrun.cli.main import main
from envrun.cluster.info import ClusterInfo
from envrun.cluster.spec import ClusterSpec, load_cluster_file
from envrun.cluster.state import CLUSTER_LABEL, state_path
from envrun.cluster.up import UpOptions, cluster_up
from envrun.execute import TargetRefused, execute_run
from envrun.prepare import RunRequest, prepare_run
from envrun.rundir import read_status
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint
from tests.lib.pyenvs import Venv, interpreter_mounts
from tests.lib.raycluster import NODE_PORTS, BuiltImage, build_and_push, cluster_file, free_block, node_args, node_ip
from tests.lib.raycluster import resolved_lock as ray_lock
from tests.lib.registryapi import platform_variant, tag_digest
from tests.lib.services import PushedImage
from tests.lib.sshhosts import SshHost, ssh_hosts
from tests.lib.tinyrun import FAKE_TRAINER, Tiny, tiny_setup
from tests.lib.verlenv import probe_recipe, verl_env, verl_hf_export_dir

pytestmark = [
    pytest.mark.network,
    pytest.mark.docker,
    pytest.mark.engine_only_in("images"),  # the hosts' engines run everything else: see tests/conftest.py
    pytest.mark.registry,
    pytest.mark.ray,
    pytest.mark.sshd,
    pytest.mark.slow,
]
NAME = "pair"


def test_a_volume_whose_host_path_is_missing_is_refused_before_anything_starts(
    images: Images, hosts: list[SshHost], state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The engine would create the bind's source empty, silently: the job would then read an empty /data.
    (tmp_path / "here").mkdir()
    volumes = [
        {"host": str(tmp_path / "here"), "container": "/here"},
        {"host": str(tmp_path / "gone"), "container": "/data"},
    ]
    spec = cluster_file(tmp_path / "c.yaml", "novol", [hosts[0].url], volumes=volumes)
    args = ["cluster", "up", str(spec), "--image", images.current.reference, "--lock", str(images.current.lock)]
    assert main([*args, "--cache-dir", str(state_dir)]) == 2
    error = one_line_error(capsys)
    assert hosts[0].url in error and f"do not exist on this host: {tmp_path / 'gone'};" in error
    assert str(tmp_path / "here") + "," not in error
    assert not (tmp_path / "gone").exists()  # not created by the check either
    assert containers_of(hosts[0], "novol") == [] and not state_path(state_dir, "novol").exists()


@dataclass(frozen=True)
class Images:
    current: BuiltImage  # the lock the cluster runs
    stale: BuiltImage  # another lock's image: last week's


@pytest.fixture(scope="module")
def images(pushed_base_image: PushedImage, registry: str, tmp_path_factory: pytest.TempPathFactory) -> Images:
    work = tmp_path_factory.mktemp("raylocks")
    path = ray_lock(pushed_base_image, work, "raycluster")
    current = build_and_push(path, registry, work / "record")
    # Last week's lock of the same name: another epoch, so another lock and image, built on the packages
    # image the first build left (Ray is installed once, not twice).
    lock = read_lock(path).lock
    (work / "lastweek").mkdir()
    older = work / "lastweek" / path.name
    write_lock(older, replace(lock, source_date_epoch=lock.source_date_epoch - 7 * 86400))
    stale = build_and_push(older, registry, work / "record-old")
    assert current.lock_sha256 != stale.lock_sha256 and current.image_id != stale.image_id
    return Images(current, stale)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SshHost]]:
    """Two hosts, each its own dockerd behind its own sshd: every engine call of envrun goes through ssh."""
    with ssh_hosts(2, tmp_path_factory) as (_client, started):
        yield started


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


def containers_of(engine: SshHost, name: str) -> list[str]:
    client = engine.client()
    try:
        return [c.id for c in client.containers.list(all=True, filters={"label": f"{CLUSTER_LABEL}={name}"})]
    finally:
        client.close()


def all_containers(engine: SshHost) -> list[str]:
    client = engine.client()
    try:
        return [c.id for c in client.containers.list(all=True)]
    finally:
        client.close()


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("envrun: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_a_host_lost_during_up_leaves_nothing_started_on_any_host(
    images: Images, hosts: list[SshHost], state_dir: Path, tmp_path: Path
) -> None:
    """The second host's sshd (and every session it serves) dies once the head has started on the first:
    the worker cannot be started there, and the head is stopped and removed; one line names the host."""
    spec = load_cluster_file(cluster_file(tmp_path / "c.yaml", "lost", [h.url for h in hosts]))
    said: list[str] = []

    def progress(message: str) -> None:
        said.append(message)
        if message.endswith("started envrun-lost-0"):
            hosts[1].stop_sshd()

    options = UpOptions(image=images.current.reference, cache_dir=state_dir, lock=read_lock(images.current.lock))
    try:
        with pytest.raises(EngineError) as info:
            cluster_up(spec, options, progress)
    finally:
        hosts[1].start_sshd()
    message = str(info.value)
    assert "\n" not in message and hosts[1].url in message, message
    assert any(m.endswith("started envrun-lost-0") for m in said)  # the head had started
    assert containers_of(hosts[0], "lost") == containers_of(hosts[1], "lost") == []
    assert not state_path(state_dir, "lost").exists()


def test_a_node_that_does_not_join_leaves_nothing_started(
    images: Images, hosts: list[SshHost], state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The head comes up on the first host; the second host's node exits at once: the head goes too.
    spec = cluster_file(tmp_path / "c.yaml", "broken", [h.url for h in hosts], extra={1: ["--no-such-flag"]})
    args = ["cluster", "up", str(spec), "--image", images.current.reference, "--lock", str(images.current.lock)]
    assert main([*args, "--cache-dir", str(state_dir)]) == 1
    error = one_line_error(capsys)
    assert hosts[1].url in error and "envrun-broken-1" in error and "no-such-flag" in error
    assert containers_of(hosts[0], "broken") == containers_of(hosts[1], "broken") == []
    assert not state_path(state_dir, "broken").exists()


def test_an_image_of_another_lock_is_refused_before_anything_starts(
    images: Images, hosts: list[SshHost], state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = cluster_file(tmp_path / "c.yaml", "wrong", [hosts[0].url])
    args = ["cluster", "up", str(spec), "--image", images.stale.reference, "--lock", str(images.current.lock)]
    assert main([*args, "--cache-dir", str(state_dir)]) == 2
    error = one_line_error(capsys)
    assert images.stale.lock_sha256 in error and images.current.lock_sha256 in error
    assert containers_of(hosts[0], "wrong") == [] and not state_path(state_dir, "wrong").exists()


def test_an_image_for_another_machine_is_refused_naming_the_host(
    images: Images,
    registry: str,
    hosts: list[SshHost],
    state_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The locked image again, its config saying the other machine's architecture (same layers, same label).
    repository, tag = images.current.reference.removeprefix(f"{registry}/").rsplit(":", 1)
    other = {"amd64": "arm64", "arm64": "amd64"}[OCI_ARCH[platform.machine()]]
    variant = platform_variant(registry, repository, tag_digest(registry, repository, tag), other)
    reference = f"{registry}/{repository}@{variant.digest}"
    spec = cluster_file(tmp_path / "c.yaml", "foreign", [hosts[0].url])
    args = ["cluster", "up", str(spec), "--image", reference, "--lock", str(images.current.lock)]
    assert main([*args, "--cache-dir", str(state_dir)]) == 1
    error = one_line_error(capsys)
    assert hosts[0].url in error and f"an image for {other}" in error and platform.machine() in error
    assert containers_of(hosts[0], "foreign") == [] and not state_path(state_dir, "foreign").exists()


@dataclass(frozen=True)
class Running:
    spec: ClusterSpec
    info: ClusterInfo

    @property
    def address(self) -> str:
        assert self.info.address is not None
        return self.info.address


VOLUME = "/data"  # where every node sees the job's files (the cluster file's volume)
VOLUME_TEXT = "the same file on every node"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The host directory the cluster's volume mounts on every node: a model, data, a file to read."""
    root = tmp_path_factory.mktemp("shared")
    tiny_setup(root)  # model/, train.parquet
    (root / "read-me.txt").write_text(VOLUME_TEXT)
    return root


RUNS = "/runs"  # a read-write volume: the job's output directory on every node


@pytest.fixture(scope="module")
def verl() -> Venv:
    return verl_env()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def cluster(
    images: Images,
    hosts: list[SshHost],
    state_dir: Path,
    shared: Path,
    runs: Path,
    verl: Venv,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Running]:
    # The nodes' image holds Ray, not verl: the real verl 0.9.1 is mounted from the cached environments
    # (and the interpreter they link to), at the same paths, so the job's python3 on its PATH is verl's.
    stack = dict.fromkeys((verl.root, verl_env(transfer_queue=False).root, *interpreter_mounts(verl.python)))
    volumes = [{"host": str(shared), "container": VOLUME}, {"host": str(runs), "container": RUNS, "mode": "rw"}]
    volumes += [{"host": str(p), "container": str(p)} for p in stack]
    path = cluster_file(tmp_path_factory.mktemp("cluster") / "pair.yaml", NAME, [h.url for h in hosts], volumes=volumes)
    spec = load_cluster_file(path)
    options = UpOptions(image=images.current.reference, cache_dir=state_dir, lock=read_lock(images.current.lock))
    try:
        yield Running(spec, cluster_up(spec, options))
    finally:
        assert main(["cluster", "down", NAME, "--cache-dir", str(state_dir), "-q"]) == 0


def test_up_starts_one_checked_node_per_host(cluster: Running, images: Images, hosts: list[SshHost]) -> None:
    info = cluster.info
    assert [n.host for n in info.nodes] == [h.url for h in hosts]
    assert [n.head for n in info.nodes] == [True, False]
    for node, host in zip(info.nodes, hosts):
        assert node.image_id == images.current.image_id  # pulled by digest: the very image that was built
        assert node.lock_sha256 == images.current.lock_sha256
        assert containers_of(host, NAME) == [node.container]
        assert node.npus == 0  # no Ascend device on this machine
        env = dict(e.split("=", 1) for e in host.client().api.inspect_container(node.container)["Config"]["Env"])
        assert env["HCCL_IF_IP"] == node_ip(info.nodes.index(node)) and env["GLOO_SOCKET_IFNAME"] == "lo"
        assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
    # The two nodes share this machine: each has HCCL ports of its own.
    ranges = [
        dict(e.split("=", 1) for e in h.client().api.inspect_container(n.container)["Config"]["Env"])[
            "HCCL_HOST_SOCKET_PORT_RANGE"
        ]
        for n, h in zip(info.nodes, hosts)
    ]
    assert ranges == ["60000-60063", "60128-60191"]  # two engines, one machine: told apart by its hostname
    for node, host in zip(info.nodes, hosts):
        mounts = host.client().api.inspect_container(node.container)["Mounts"]
        assert ("volume", Bytecode(node.image_id).volume, MOUNT) in {
            (m["Type"], m.get("Name"), m["Destination"]) for m in mounts
        }  # Ray's processes on this host compile each module once
    ids = [n.ray_node_id for n in info.nodes]
    assert len(set(ids)) == 2 and all(i and len(i) == 56 for i in ids)
    assert cluster.address == f"http://{node_ip(0)}:{cluster.spec.dashboard_port}"


def test_status_reads_every_node_live(cluster: Running, state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "status", NAME, "--json", "--cache-dir", str(state_dir)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["name"] == NAME and status["address"] == cluster.address
    assert [n["alive"] for n in status["nodes"]] == [True, True]
    # As up said, without what up pulled (status pulls nothing), with what it reads live.
    expected = [
        {**{k: v for k, v in n.to_json().items() if k != "pulled"}, "alive": True, "state": "running"}
        for n in cluster.info.nodes
    ]
    assert status["nodes"] == expected


def test_the_installed_command_reaches_the_hosts_over_ssh(cluster: Running, state_dir: Path) -> None:
    """The console script of the README's install (no paramiko), as a user runs it: its own process, the
    user's ssh config and known_hosts (this module's ssh home), every host's engine through its sshd."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "envrun"), "cluster", "status", NAME, "--cache-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "ssh://root@node-0" in done.stdout and "ssh://root@node-1" in done.stdout and "DEAD" not in done.stdout


def cluster_run(tiny: Tiny, images: Images, state_dir: Path) -> list[str]:
    """The tiny recipe on the cluster, its stand-in trainer sent along (the image does not hold it)."""
    source = FAKE_TRAINER.read_text()
    return tiny.args(
        "--backend", "ray", "--cluster", NAME, "--cache-dir", str(state_dir), "--lock", str(images.current.lock),
        "--entry-point", f"python3 -c {shlex.quote(source)}",
        "--env", "FAKE_TRAINER_RAY_NODES=2", "--env", "FAKE_TRAINER_RAY_ENV=TINY_PATCH=1",
        "--model", f"{VOLUME}/model", "--data", f"{VOLUME}/train.parquet",  # where the nodes see them
        entry=False,
    )  # fmt: skip


def volume_request(tiny: Tiny, images: Images, state_dir: Path, **params: object) -> RunRequest:
    """The tiny recipe on the cluster, reading its model and data at the volume's path on the nodes."""
    request = tiny.request(
        backend="ray",
        model=Path(VOLUME) / "model",
        train_files=(Path(VOLUME) / "train.parquet",),
        entry_point=("python3", "-c", FAKE_TRAINER.read_text()),
        extra_env={
            "FAKE_TRAINER_RAY_NODES": "2",
            "FAKE_TRAINER_RAY_ENV": "TINY_PATCH=1",
            "FAKE_TRAINER_RAY_READ": f"{VOLUME}/read-me.txt={VOLUME_TEXT}",
        },
        **params,
    )
    return replace(request, lock=images.current.lock, cluster=NAME, cache_dir=state_dir)


def with_outputs(tiny: Tiny) -> Tiny:
    """The tiny recipe writing its checkpoints under --output-dir, as the real one does."""
    tiny.recipe.write_text(tiny.recipe.read_text() + "outputs:\n  trainer.default_local_dir: ckpts\n")
    return tiny


def test_a_job_is_checked_on_every_node_then_reads_the_volume_on_each(
    cluster: Running, images: Images, state_dir: Path, runs: Path, tmp_path: Path
) -> None:
    tiny = with_outputs(tiny_setup(tmp_path))
    outcome = execute_run(prepare_run(volume_request(tiny, images, state_dir, output_dir=Path(RUNS))))
    log = (outcome.run_dir / "output.log").read_text()
    # The job succeeded; its lenient save's exports are unchecked without a job probe (the tiny recipe
    # has none), and an unchecked lenient save fails the run (envrun.exports).
    assert outcome.exit_code == 0 and outcome.status == "failed", log[-2000:]
    assert "exports not checked: no export layout (the job probe did not run" in outcome.detail
    assert "fake trainer: ok, on every node" in log
    node_ids = sorted(str(n.ray_node_id) for n in cluster.info.nodes)
    assert str(node_ids) in log  # a task ran on each node, and read the volume's file there
    recorded = json.loads((outcome.run_dir / "preflight.json").read_text())
    lines = [line for line in recorded if line["name"] == "ray-node" and line.get("facts")]
    assert sorted(line["facts"]["node_id"] for line in lines) == node_ids
    for line in lines:
        assert line["status"] == "ok" and line["facts"]["lock_sha256"] == images.current.lock_sha256
        assert line["facts"]["answered_from"] == line["facts"]["node_id"]  # the node itself answered
    # Each node advertises the cluster file's address (Ray's own choice would be the machine's eth0), and a
    # job's driver reaches the head there.
    assert sorted(line["facts"]["ip"] for line in lines) == [node_ip(0), node_ip(1)]
    (address,) = [line for line in recorded if "RAY_ADDRESS=" in line["detail"]]
    assert address["status"] == "ok" and f"RAY_ADDRESS={node_ip(0)}:{cluster.spec.head_port}" in address["detail"]
    # The output directory is one storage for both nodes (the cluster's rw volume): a resume reads it anywhere.
    (storage,) = [line for line in recorded if line["name"] == "storage"]
    assert (
        storage["status"] == "ok"
        and storage["detail"] == f"{RUNS}: one storage for all 2 nodes (each saw every node's file)"
    )
    assert not (runs / ".envrun-shared").exists()  # the markers are gone again
    # The network every node would give HCCL and Gloo, and every node reached from the other.
    network = [line for line in recorded if line["name"] == "network"]
    assert [line["status"] for line in network] == ["ok"] * 5 + ["skip"], network
    for index in range(2):
        assert (
            f"(ip {node_ip(index)}): HCCL_IF_IP={node_ip(index)}, HCCL_SOCKET_IFNAME=lo, GLOO_SOCKET_IFNAME=lo, "
            in (network[index]["detail"])
        )
    assert "HCCL port ranges apart" in network[2]["detail"]  # both nodes are on this machine: one host
    for line in network[3:5]:
        targets = {(c["to"], c["what"]) for c in line["facts"]["connects"]}
        assert {what for _, what in targets} >= {"Ray's node manager", "Ray's object manager", "the HCCL host port"}
        assert all(c["error"] is None for c in line["facts"]["connects"])
    # envrun started these nodes: each host's engine, not the node, says which image each container runs.
    engine_lines = [line for line in recorded if line["name"] == "ray-node" and "the engine runs" in line["detail"]]
    assert [line["status"] for line in engine_lines] == ["ok", "ok"], engine_lines
    assert all(images.current.image_id in line["detail"] for line in engine_lines)
    # The model and the data, checked on each node at the path the job reads there (not on this host).
    for check in ("model", "data"):
        per_node = [line for line in recorded if line["name"] == check]
        assert per_node[0]["status"] == "skip" and "checked on every node" in per_node[0]["detail"]
        assert [line["status"] for line in per_node[1:]] == ["ok", "ok"], per_node
    assert any(f"{VOLUME}/model: checkpoint audit ok" in line["detail"] for line in recorded)


def test_a_cluster_without_the_npus_the_run_needs_refuses_it(
    cluster: Running, images: Images, state_dir: Path, tmp_path: Path
) -> None:
    tiny = tiny_setup(tmp_path)
    prepared = prepare_run(volume_request(tiny, images, state_dir, nnodes=2, npus_per_node=1))
    with pytest.raises(TargetRefused) as info:
        execute_run(prepared)
    assert "the run needs 2 node(s) x 1 NPU(s); the cluster has 2 alive node(s), 0 with 1 NPU(s) or more" in str(
        info.value
    )
    assert read_status(tmp_path / "run")["status"] == "refused"


def test_the_job_probe_runs_on_every_node(
    cluster: Running, images: Images, verl: Venv, state_dir: Path, tmp_path: Path
) -> None:
    """grpo-glm5 asked of the cluster (a dry run asks every node): the probe runs on each node with the job's
    python3 there; the nodes hold no NPU, so the run's 32 x 16 NPUs are refused, naming what each has."""
    tiny = tiny_setup(tmp_path)
    request = replace(
        tiny.request(
            backend="ray",
            model=Path(VOLUME) / "model",
            train_files=(Path(VOLUME) / "train.parquet",),
            extra_env={
                "PATH": f"{verl.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                # The mounted environment ships its bytecode: the job reads it (an empty prefix is none)
                # rather than compiling it into the nodes' bytecode volume (envrun.bytecode).
                "PYTHONPYCACHEPREFIX": "",
            },
            output_dir=Path(RUNS),
            entry_point=None,
        ),
        recipe=str(probe_recipe(tmp_path)),
        lock=images.current.lock,  # the cluster's lock pins Ray, not verl: its config comes from the environment
        verl_config=verl_env(transfer_queue=False).site_packages / "verl" / "trainer" / "config",
        cluster=NAME,
        cache_dir=state_dir,
        dry_run=True,
    )
    preflight = prepare_run(request).plan.preflight
    probes = [line for line in preflight if line.name == "job-probe" and line.status != "skip"]
    assert [line.status for line in probes] == ["ok", "ok"], [line.detail for line in preflight]
    names = sorted(str(n) for n in (f"envrun-{NAME}-0", f"envrun-{NAME}-1"))
    assert sorted(line.detail.split(" (ip")[0].removeprefix("node ") for line in probes) == names
    assert all("verl 0.9.1 (PPOTrainerSync)" in line.detail for line in probes)
    (capacity,) = [line for line in preflight if line.name == "ray-node" and "the run needs" in line.detail]
    assert capacity.status == "fail" and "the run needs 32 node(s) x 16 NPU(s)" in capacity.detail
    # The job's actors against the cluster's CPUs, as the nodes' Ray reports them (the job's ray.init joins
    # it): TransferQueue's 9 at once, on two nodes started with --num-cpus=1, would wait forever.
    (cpus,) = [line for line in preflight if line.name == "ray-resources"]
    assert cpus.status == "fail" and "ask for 9 CPU(s) at once (TaskRunnerV1" in cpus.detail, cpus
    assert "the cluster's 2 alive node(s) have 2 (" in cpus.detail and "wait for them forever" in cpus.detail
    assert cpus.facts is not None and cpus.facts["set_for_a_new_ray"] == []


def test_a_job_whose_network_is_wrong_is_refused_naming_the_node_and_what_to_set(
    cluster: Running, images: Images, state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(cluster.address)
    before = {job.submission_id for job in jobs.list_jobs()}
    tiny = tiny_setup(tmp_path)
    run_dir = tmp_path / "run"
    wrong = ["--env", "GLOO_SOCKET_IFNAME=eth9", "--env", "HCCL_HOST_SOCKET_PORT_RANGE=61000-61063"]
    assert main([*cluster_run(tiny, images, state_dir), *wrong, "--run-dir", str(run_dir)]) == 1
    error = one_line_error(capsys)
    assert "nothing submitted" in error
    assert f"node envrun-{NAME}-0 (ip {node_ip(0)}): GLOO_SOCKET_IFNAME=eth9 names no interface of this node" in error
    assert f"nodes envrun-{NAME}-0 and envrun-{NAME}-1 share HCCL host ports 61000-61063" in error
    new = {job.submission_id for job in jobs.list_jobs()} - before
    assert new and all(job.startswith("envrun-nodecheck-") for job in new)  # the check ran; the job did not


def test_an_output_directory_only_one_node_sees_is_refused_before_the_job(
    cluster: Running, images: Images, state_dir: Path, tmp_path: Path
) -> None:
    tiny = with_outputs(tiny_setup(tmp_path))
    scratch = Path("/tmp/envrun-scratch")  # inside each node's container: every node has its own
    with pytest.raises(TargetRefused) as info:
        execute_run(prepare_run(volume_request(tiny, images, state_dir, output_dir=scratch)))
    assert (
        f"{scratch} is not one storage for the job's nodes: node envrun-{NAME}-0 sees the files of envrun-{NAME}-0 "
        in str(info.value)
    )
    assert "mount shared storage at /tmp/envrun-scratch on every node" in str(info.value)
    assert read_status(tmp_path / "run")["status"] == "refused"


def test_checkpoint_files_a_node_cannot_see_fail_the_post_run_audit(
    cluster: Running, hosts: list[SshHost], tmp_path: Path
) -> None:
    """A checkpoint saved where only the saving node sees it (a directory inside its container): the node
    that cannot see common.pt and the metadata is named; a resume there would fail."""
    from envrun.exports import export_verdict
    from envrun.launch.ray_backend import RayLauncher
    from envrun.probe.report import ExportLayout

    root = "/tmp/envrun-unshared-ckpts"
    step = f"{root}/global_step_1/actor"
    client = hosts[0].client()
    try:
        done = client.api.exec_create(
            cluster.info.nodes[0].container,
            ["sh", "-c", f"mkdir -p {step} && touch {step}/common.pt {step}/.metadata {step}/metadata.json"],
        )
        client.api.exec_start(done["Id"])
    finally:
        client.close()
    layout = ExportLayout(root, "global_step_*/actor/huggingface", False, "trainer.save_freq=-1", False)
    plan = prepare_run(tiny_setup(tmp_path).request(backend="ray", ray_address=cluster.address)).plan
    search = RayLauncher(cluster.address).find_exports(plan, layout, lambda _m: None)
    verdict = export_verdict(layout, search)
    assert not verdict.ok
    (failure,) = verdict.failures
    assert failure.startswith(f"envrun-{NAME}-1: a resume there would not find global_step_1/actor/.metadata, ")
    assert f"(written where envrun-{NAME}-0 sees them: not shared storage)" in failure


def test_a_lost_export_on_a_node_fails_the_audit(cluster: Running, verl: Venv, runs: Path, tmp_path: Path) -> None:
    """An export where verl writes it (its own function's path), on the cluster's output volume: found and
    audited by a task on the nodes, which the client's host never reads; lm_head lost fails the verdict."""
    from envrun.exports import export_verdict
    from envrun.launch.ray_backend import RayLauncher
    from envrun.probe.report import ExportLayout

    scratch = tmp_path / "scratch"
    relative = verl_hf_export_dir(verl, scratch).relative_to(scratch)  # global_step_1/actor/<verl's layout>
    write_checkpoint(runs / "lost" / relative, CheckpointSpec(include_mtp=False), drop=("lm_head.weight",))
    pattern = str(relative).replace("global_step_1", "global_step_*")
    layout = ExportLayout(f"{RUNS}/lost", pattern, True, "trainer.save_freq=1", False)
    plan = prepare_run(tiny_setup(tmp_path).request(backend="ray", ray_address=cluster.address)).plan
    search = RayLauncher(cluster.address).find_exports(plan, layout, lambda _m: None)
    verdict = export_verdict(layout, search)
    assert not verdict.ok and len(verdict.audits) == 2  # one volume, seen and audited on each node
    assert all(a.path == f"{RUNS}/lost/{relative}" and "lm_head.weight" in a.missing for a in verdict.audits)
    assert {a.node for a in verdict.audits} == {f"envrun-{NAME}-0", f"envrun-{NAME}-1"}


@pytest.fixture()
def stale_node(cluster: Running, images: Images, hosts: list[SshHost]) -> Iterator[str]:
    """A container of last week's image on the second host, joined to the cluster by hand."""
    client = hosts[1].client()
    repository, tag, digest = split_reference(images.stale.reference)
    client.images.pull(repository, tag=digest or tag)
    container = client.containers.run(
        images.stale.reference,
        ["ray", "start", "--block", f"--address={node_ip(0)}:{cluster.spec.head_port}", "--node-name=stale-by-hand"]
        + node_args(free_block(NODE_PORTS), head=False),
        network_mode="host",
        environment={"PYTHONDONTWRITEBYTECODE": ""},
        detach=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not any(n.name == "stale-by-hand" and n.alive for n in ray_api.list_nodes(cluster.address)):
            container.reload()
            assert container.status == "running", container.logs(tail=5)
            assert time.monotonic() < deadline, "the stale node did not join"
            time.sleep(1)
        yield container.id
    finally:
        container.remove(force=True)
        client.close()


def test_a_node_on_another_lock_refuses_the_job(
    cluster: Running,
    images: Images,
    state_dir: Path,
    stale_node: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(cluster.address)
    before = {job.submission_id for job in jobs.list_jobs()}
    tiny = tiny_setup(tmp_path)
    run_dir = tmp_path / "run"
    assert main([*cluster_run(tiny, images, state_dir), "--run-dir", str(run_dir)]) == 1
    error = one_line_error(capsys)
    assert "stale-by-hand" in error and images.stale.lock_sha256 in error and "nothing submitted" in error
    status = read_status(run_dir)
    assert status["status"] == "refused" and images.stale.lock_sha256 in status["detail"]
    recorded = json.loads((run_dir / "preflight.json").read_text())
    stale = next(line for line in recorded if line["name"] == "ray-node" and line["status"] == "fail")
    assert stale["facts"]["name"] == "stale-by-hand" and stale["facts"]["lock_sha256"] == images.stale.lock_sha256
    new = {job.submission_id for job in jobs.list_jobs()} - before
    assert new and all(job.startswith("envrun-nodecheck-") for job in new)  # the check ran; the job did not
    assert main(["cluster", "status", NAME, "--json", "--cache-dir", str(state_dir)]) == 0
    (other,) = json.loads(capsys.readouterr().out)["other_nodes"]  # status shows who joined by hand
    assert other["name"] == "stale-by-hand" and other["ray_node_id"] == stale["facts"]["node_id"]


def test_down_leaves_nothing_on_any_host(
    cluster: Running, hosts: list[SshHost], state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cluster", "down", NAME, "--cache-dir", str(state_dir)]) == 0
    assert "removed 2 container(s)" in capsys.readouterr().out
    assert all_containers(hosts[0]) == all_containers(hosts[1]) == []
    assert not state_path(state_dir, NAME).exists()
    assert main(["cluster", "down", NAME, "--cache-dir", str(state_dir)]) == 0  # again: nothing to do
    assert "removed 0 container(s)" in capsys.readouterr().out
