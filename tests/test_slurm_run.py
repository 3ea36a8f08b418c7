"""``envrun … --backend slurm`` for real: the run submitted to the Slurm of ``scripts/services`` (munged,
slurmctld and two slurmd, n1 at 127.0.0.2 and n2 at 127.0.0.3, on this machine), every node's container
of the Ray image pulled by digest from the test registry, Ray started inside the allocation, each node
checked before the trainer, the stand-in trainer run on both nodes, the batch job's exit status the run's.

What is stopped here is stopped by its ID: the batch jobs by their job id (``scancel``), containers by
their ID; a test that leaves a container of its job behind fails.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.lib.raycluster import NODE_PORTS, BuiltImage, build_and_push, free_block, node_ip
from tests.lib.raycluster import resolved_lock as ray_lock
from tests.lib.registryapi import tag_digest
from tests.lib.services import PushedImage
from tests.lib.tinyrun import FAKE_TRAINER, SLEEPING, tiny_setup

pytestmark = [pytest.mark.network, pytest.mark.docker, pytest.mark.registry, pytest.mark.slurm, pytest.mark.slow]

ENVRUN = Path(sys.executable).parent / "envrun"
JOB_LABEL = "io.envrun.slurm.job"
DATA = "/data"  # the shared directory, as every node's container sees it
RUNS = "/runs"  # the output directory, read-write on every node
VOLUME_TEXT = "the same file on every node"
STOP_DEADLINE = 90.0  # Slurm's KillWait (30 s) and the containers' removal, with room


@dataclass(frozen=True)
class Pinned:
    built: BuiltImage
    digest_ref: str  # repository@sha256:…


def by_digest(registry: str, reference: str) -> str:
    repository, _, tag = reference.rpartition(":")
    return f"{repository}@{tag_digest(registry, repository.removeprefix(registry + '/'), tag)}"


@pytest.fixture(scope="module")
def image(pushed_base_image: PushedImage, registry: str, tmp_path_factory: pytest.TempPathFactory) -> Pinned:
    work = tmp_path_factory.mktemp("slurmlock")
    built = build_and_push(ray_lock(pushed_base_image, work, "raycluster"), registry, work / "record")
    return Pinned(built, by_digest(registry, built.reference))


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shared")
    tiny = tiny_setup(root).strict()  # the run succeeds: no lenient save left unchecked without a probe
    tiny.recipe.write_text(
        tiny.recipe.read_text() + "outputs:\n  trainer.default_local_dir: ckpts\n"
    )  # as the real one
    (root / "read-me.txt").write_text(VOLUME_TEXT)
    (root / "runs").mkdir()
    return root


def job_containers(client: docker.DockerClient, job_id: str | None = None) -> list[str]:
    label = JOB_LABEL if job_id is None else f"{JOB_LABEL}={job_id}"
    # The engine's list as it is: no inspect of each (a container removing itself would fail it).
    return [c["Id"] for c in client.api.containers(all=True, filters={"label": label})]


@pytest.fixture()
def no_leftovers(docker_client: docker.DockerClient) -> Iterator[None]:
    """Every container a Slurm job of this test started is gone by the end (and removed if not)."""
    before = set(job_containers(docker_client))
    yield
    left = [c for c in job_containers(docker_client) if c not in before]
    for container in left:
        docker_client.api.remove_container(container, force=True)
    assert not left, f"containers of the test's Slurm jobs left running: {left}"


def run_args(shared: Path, image: Pinned, run_dir: Path, *extra: str, sleep: float = 0) -> list[str]:
    """The tiny recipe on two Slurm nodes, its stand-in trainer sent along (the image does not hold it)."""
    base = free_block(2 + NODE_PORTS * 2)
    env = {
        "FAKE_TRAINER_RAY_NODES": "2",
        "FAKE_TRAINER_RAY_ENV": "TINY_PATCH=1",
        "FAKE_TRAINER_RAY_READ": f"{DATA}/read-me.txt={VOLUME_TEXT}",
    }
    if sleep:
        env["FAKE_TRAINER_SLEEP"] = str(sleep)
    return [
        "run", str(shared / "tiny.yaml"), "--backend", "slurm", "--image", image.digest_ref,
        "--lock", str(image.built.lock), "--verl-config", str(shared / "conf"),
        "--model", f"{DATA}/model", "--data", f"{DATA}/train.parquet", "--nnodes", "2",
        "--output-dir", RUNS, "--run-dir", str(run_dir), "--skip-check", "npus",
        "--volume", f"{shared}:{DATA}", "--volume", f"{shared / 'runs'}:{RUNS}:rw",
        "--ray-ports", str(base), "--ray-start-arg=--num-cpus=1", "--ray-start-arg=--object-store-memory=100000000",
        "--join-timeout", "240",
        "--entry-point", f"python3 -c {shlex.quote(FAKE_TRAINER.read_text())}",
        *(f"--env={k}={v}" for k, v in env.items()), *extra,
    ]  # fmt: skip


def envrun(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ENVRUN), *args], capture_output=True, text=True, timeout=timeout)


def job_id_of(run_dir: Path) -> str:
    (out,) = (run_dir / "slurm").glob("slurm-*.out")
    return out.stem.removeprefix("slurm-")


def slurm_state(job_id: str) -> dict[str, str]:
    line = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def status_of(run_dir: Path) -> dict[str, object]:
    return json.loads((run_dir / "status.json").read_text())


def test_a_run_goes_through_slurm_checked_on_every_node_before_the_trainer(
    image: Pinned, shared: Path, tmp_path: Path, docker_client: docker.DockerClient, no_leftovers: None
) -> None:
    run_dir = tmp_path / "run"
    done = envrun(run_args(shared, image, run_dir))
    log = (run_dir / "output.log").read_text() if (run_dir / "output.log").exists() else ""
    assert done.returncode == 0, (done.stderr[-3000:], log[-3000:])
    assert status_of(run_dir)["status"] == "succeeded"
    job_id = job_id_of(run_dir)
    assert slurm_state(job_id)["ExitCode"] == "0:0"  # the batch job's exit status is the run's
    assert "fake trainer: ok, on every node" in log  # a task ran on each node and read the volume there
    # Each node checked itself before Ray (its image's lock), on its own Slurm node and address.
    for index, name in enumerate(("n1", "n2")):
        assert (
            f"envrun: node {index} {name} (ip {node_ip(index)}, " in log
            and f": ok: lock {image.built.lock_sha256[:12]}" in log
        )
    # The head checked every node through Ray before the trainer: recorded in the job's record and this run's.
    recorded = json.loads((run_dir / "preflight.json").read_text())
    nodes = [line for line in recorded if line["name"] == "ray-node" and line.get("facts")]
    assert sorted(line["facts"]["ip"] for line in nodes) == [node_ip(0), node_ip(1)]
    assert all(line["status"] == "ok" and line["facts"]["lock_sha256"] == image.built.lock_sha256 for line in nodes)
    (storage,) = [line for line in recorded if line["name"] == "storage"]
    assert storage["status"] == "ok" and "one storage for all 2 nodes" in storage["detail"]
    network = [line for line in recorded if line["name"] == "network"]
    assert network and all(line["status"] in ("ok", "skip") for line in network), network
    inner = json.loads((run_dir / "slurm" / "record" / "status.json").read_text())
    assert inner["status"] == "succeeded"
    assert "the head's step ended (exit 0)" in (run_dir / "slurm" / "ended.txt").read_text()
    assert job_containers(docker_client, job_id) == []


def test_an_image_not_built_from_the_lock_is_refused_on_every_node_before_ray(
    image: Pinned,
    pushed_base_image: PushedImage,
    shared: Path,
    tmp_path: Path,
    docker_client: docker.DockerClient,
    no_leftovers: None,
) -> None:
    run_dir = tmp_path / "run"
    wrong = f"{pushed_base_image.repository}@{pushed_base_image.digest}"  # python3, but no lock, no Ray
    args = run_args(shared, image, run_dir)
    args[args.index(image.digest_ref)] = wrong
    done = envrun(args)
    assert done.returncode == 1, done.stderr[-2000:]
    status = status_of(run_dir)
    assert status["status"] == "refused", status
    detail = str(status["detail"])
    assert "refused, nothing started" in detail and "not the image built from the run's lock" in detail
    assert "node 0 n1" in detail or "node 1 n2" in detail
    assert "fake trainer" not in (run_dir / "output.log").read_text()
    assert job_containers(docker_client, job_id_of(run_dir)) == []


def test_a_node_without_the_npus_the_run_needs_refuses_it_before_ray(
    image: Pinned, shared: Path, tmp_path: Path, docker_client: docker.DockerClient, no_leftovers: None
) -> None:
    run_dir = tmp_path / "run"
    done = envrun(run_args(shared, image, run_dir, "--npus-per-node", "1"))
    assert done.returncode == 1, done.stderr[-2000:]
    status = status_of(run_dir)
    assert status["status"] == "refused" and "it sees 0 NPU(s), the run needs 1 on each node" in str(status["detail"])
    assert "fake trainer" not in (run_dir / "output.log").read_text()
    assert job_containers(docker_client, job_id_of(run_dir)) == []


def wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:g} s: {what}")


@contextmanager
def sleeping_job(args: list[str], run_dir: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``envrun ARGS`` (a Slurm run whose trainer sleeps), once the trainer runs: the process and the job's
    id; killed on the way out whatever happened."""
    process = subprocess.Popen([str(ENVRUN), *args], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if SLEEPING in line:
                break
        yield process, job_id_of(run_dir)
    finally:
        process.kill()


def test_ctrl_c_cancels_the_batch_job_and_every_node_container_goes(
    image: Pinned, shared: Path, tmp_path: Path, docker_client: docker.DockerClient, no_leftovers: None
) -> None:
    run_dir = tmp_path / "run"
    with sleeping_job(run_args(shared, image, run_dir, sleep=300), run_dir) as (process, job_id):
        assert len(job_containers(docker_client, job_id)) == 2  # both nodes run, the trainer sleeps
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=STOP_DEADLINE + 30)
        assert process.returncode == 130
        wait_for(lambda: job_containers(docker_client, job_id) == [], STOP_DEADLINE, "every container removed")
        took = time.monotonic() - started
    status = status_of(run_dir)
    assert status["status"] == "interrupted" and f"cancelled Slurm job {job_id}" in str(status["detail"]), status
    assert slurm_state(job_id)["JobState"] == "CANCELLED"
    assert took < STOP_DEADLINE


def test_a_node_that_dies_ends_the_job_and_the_record_says_why(
    image: Pinned, shared: Path, tmp_path: Path, docker_client: docker.DockerClient, no_leftovers: None
) -> None:
    run_dir = tmp_path / "run"
    with sleeping_job(run_args(shared, image, run_dir, sleep=300), run_dir) as (process, job_id):
        (worker,) = docker_client.containers.list(
            filters={"label": [f"{JOB_LABEL}={job_id}", "io.envrun.slurm.node=1"]}
        )
        worker.kill()  # the node dies under the job (its container gone, as a lost host's would be)
        process.communicate(timeout=STOP_DEADLINE + 60)
    assert process.returncode not in (0, 130)
    status = status_of(run_dir)
    assert status["status"] != "succeeded", status
    assert "the workers' step ended" in (run_dir / "slurm" / "ended.txt").read_text()
    assert job_containers(docker_client, job_id) == []


def test_the_kubernetes_init_steps_run_in_the_locked_image(
    image: Pinned, shared: Path, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    """The emitted Volcano Job's init containers, as a pod runs them: ``envrun-unpack`` from the ConfigMap's
    files into an empty directory, then ``envrun-check`` with the pod's static environment, in the image of
    the lock (no Kubernetes here: the engine runs the containers' commands; the rendering is checked in
    tests/test_schedule_kube.py and against the CRDs by scripts/accept-k8s-manifests)."""
    import base64

    import yaml

    def emitted(*extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
        target = tmp_path / f"k8s{len(extra)}"
        args = run_args(shared, image, tmp_path / f"run{len(extra)}", *extra)
        done = envrun([*args, "--emit", "volcano", str(target)])
        assert done.returncode == 0, done.stderr[-2000:]
        (path,) = target.glob("*.volcano.yaml")
        config, job = yaml.safe_load_all(path.read_text())
        return config, job["spec"]["tasks"][0]["template"]["spec"]

    def run(pod: dict[str, Any], name: str, bundle: Path, job_dir: Path) -> tuple[int, str]:
        (container,) = [c for c in pod["initContainers"] if c["name"] == name]
        env = {e["name"]: e["value"] for e in container.get("env") or () if "value" in e}
        env["ENVRUN_NODE_IP"] = "127.0.0.2"  # the downward API's podIP
        started = docker_client.containers.run(
            container["image"],
            container["command"] + list(container.get("args") or ()),
            environment=env,
            volumes={
                str(bundle): {"bind": "/opt/envrun/bundle", "mode": "ro"},
                str(job_dir): {"bind": "/opt/envrun/job", "mode": "rw"},
            },
            network_mode="none",
            detach=True,
        )
        try:
            status = started.wait(timeout=120)["StatusCode"]
            return status, started.logs().decode()
        finally:
            started.remove(force=True)

    for extra, expected in (((), ": ok: lock"), (("--npus-per-node", "1"), "it sees 0 NPU(s), the run needs 1")):
        config, pod = emitted(*extra)
        bundle, job_dir = tmp_path / f"bundle{len(extra)}", tmp_path / f"job{len(extra)}"
        bundle.mkdir()
        job_dir.mkdir()
        (bundle / "job.json").write_text(config["data"]["job.json"])
        (bundle / "code.zip").write_bytes(base64.b64decode(config["binaryData"]["code.zip"]))
        assert run(pod, "envrun-unpack", bundle, job_dir)[0] == 0
        assert (job_dir / "code" / "envrun" / "injob" / "node.py").is_file() and (job_dir / "job.json").is_file()
        status, said = run(pod, "envrun-check", bundle, job_dir)
        assert expected in said, said
        assert status == (0 if not extra else 3)  # a refusing init container fails the pod: the job is aborted
