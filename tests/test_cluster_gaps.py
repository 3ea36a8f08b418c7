"""``envrun cluster`` paths no other test reached: ``up`` refusing before anything starts (a cluster
already recorded, an image it cannot pin, one without the lock label, containers of the cluster already
on the host, a host probe that fails, a node address no interface of the host carries, two engine URLs
of one machine short of HCCL ports) and failing after a node started (a node removed under it, a head
that never reports its address, a node that never joins, a host lost before its node could be removed);
the engines' view of a started cluster when a host does not answer; and the node side's storage rounds
and node-check verdicts on edges of their data.

``up`` runs against the test engine at ``DOCKER_HOST`` (one "host" here), with two small images built
in this module on the cached base image and pushed to the test registry, so that each is pinned by
digest as a real one is. They are no Ray images: ``ray`` in them is a script that prints its arguments
and waits (writing the GCS address file only where ``--temp-dir`` says) — what ``up`` does before a
node joins is the engine's and the host's work, not Ray's (tests/test_cluster_ray.py runs real Ray).
Everything made here is removed by its ID: the images when the module ends, a container a test left
behind (and that test fails).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import docker
import pytest

from envbuild.data.jsonout import to_jsonable
from envbuild.engine.client import Engine
from envbuild.errors import EngineError
from envbuild.image.plan import LOCK_LABEL
from envrun.cli.main import main
from envrun.cluster.info import ClusterInfo
from envrun.cluster.netifs import interfaces, shown_interfaces
from envrun.cluster.nodecheck import NodeAsk, engine_image_lines, job_address_line
from envrun.cluster.onstore import listing, seen_markers, write_marker
from envrun.cluster.spec import load_cluster_file
from envrun.cluster.state import CLUSTER_LABEL, NODE_LABEL, ClusterState, save_state, state_path
from envrun.cluster.storage import storage_line, unseen_files
from envrun.cluster.up import UpOptions, cluster_up, pin_image
from tests.lib.gitrepos import LoopbackServer, relay_both_ways
from tests.lib.legacybuild import dockerfile_context
from tests.lib.raycluster import free_block
from tests.lib.services import PushedImage, push_as

LOCK_SHA = hashlib.sha256(b"tests/test_cluster_gaps.py").hexdigest()
REPOSITORY = "envrun-gaps/node"
# `ray` in the node images: says how it was started, writes the GCS address file only where --temp-dir
# names a directory (not in Ray's default /tmp/ray: that head never reports an address), and exits at
# once on SIGTERM, as `ray start --block` does.
STUB_RAY = b"""#!/usr/bin/python3
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("stub ray:", " ".join(sys.argv[1:3]), flush=True)
temp = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--temp-dir=")), None)
if temp:
    os.makedirs(temp, exist_ok=True)
    with open(os.path.join(temp, "ray_current_cluster"), "w") as out:
        out.write("127.0.0.1:6379\\n")
while True:
    time.sleep(60)
"""
STUB_LOG = "stub ray: start --block"


# --- the node side's storage rounds and the verdicts, on real directories and answers ------------------


def test_a_node_that_cannot_write_under_the_output_directory_sees_no_node_there(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("a file where the job's output directory should be")
    root = str(tmp_path / "runs" / "out")
    wrote = write_marker(root, "t0k3n", "id-n1")
    assert wrote == {"error": f"cannot write under {root} here: Not a directory"}
    assert seen_markers(root, "t0k3n", "id-n1") == []  # nothing listed, not an error of its own
    answers = [
        {"name": "n1", "node_id": "id-n1", "storage": {"path": root, **wrote, "sees": []}},
        {"name": "n2", "node_id": "id-n2", "storage": {"path": root, "error": None, "sees": ["id-n2"]}},
    ]
    line = storage_line(answers, root)
    assert line.status == "fail"
    assert line.detail.startswith(
        f"{root} is not one storage for the job's nodes: node n1: cannot write under {root} here: Not a directory; "
        "node n2 sees the files of n2 there: mount shared storage"
    )


def test_a_node_without_the_checkpoint_directory_misses_every_file(tmp_path: Path) -> None:
    step = tmp_path / "ckpts" / "global_step_1"
    step.mkdir(parents=True)
    (step / "common.pt").write_bytes(b"12345")
    saving = listing(str(tmp_path / "ckpts"))
    assert saving == {"present": True, "files": {"global_step_1/common.pt": 5}, "truncated": False}
    absent = listing(str(tmp_path / "elsewhere"))
    assert absent == {"present": False, "files": {}, "truncated": False}
    answers = [{"name": "n1", "checkpoints": saving}, {"name": "n2", "checkpoints": absent}]
    assert unseen_files(answers, "/runs/ckpts") == (
        "n2: a resume there would not find global_step_1/common.pt under /runs/ckpts (written where n1 sees "
        "them: not shared storage)",
    )


def test_a_listing_stops_at_its_bound_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b", "c", "d"):
        (tmp_path / name).write_text(name)
    monkeypatch.setattr("envrun.cluster.onstore.MAX_FILES", 3)  # 100,000 files, made small
    found = listing(str(tmp_path))
    assert found["present"] and found["truncated"] and len(found["files"]) == 3
    assert set(found["files"]) < {"a", "b", "c", "d"} and set(found["files"].values()) == {1}


def test_a_nodes_audit_asks_for_the_locks_transformers_only_with_something_to_audit() -> None:
    """The model's names come from the model the lock's transformers builds, by the job's interpreter in
    the job's environment: sent with a model or exports to audit, not with a lock check alone."""
    env = {"HF_HOME": "/data/hf", "HCCL_IF_IP": "10.0.0.1"}
    ask = NodeAsk(model="/data/model", python="/opt/py/bin/python3", env=env, transformers="4.57.1")
    assert ask.to_json() == {
        "lock": True,
        "model": "/data/model",
        "transformers": "4.57.1",
        "python": "/opt/py/bin/python3",
        "env": env,
    }
    exports = {"root": "/runs/ckpts", "pattern": "global_step_*/actor/huggingface"}
    assert NodeAsk(lock=False, exports=exports, transformers="4.57.1").to_json()["transformers"] == "4.57.1"
    assert NodeAsk(transformers="4.57.1", env=env).to_json() == {"lock": True}


def test_a_node_check_driver_given_no_ray_address_fails_the_head_address_check() -> None:
    answers: list[dict[str, Any]] = [{"name": "n1", "node_id": "a" * 56}]
    line = job_address_line(answers, "10.0.0.1")
    assert line is not None and (line.status, line.detail) == (
        "fail",
        "the node check's driver was given no RAY_ADDRESS: not a Ray job?",
    )
    assert job_address_line(answers, None) is None  # the file gives the head no address: nothing to compare


def test_a_host_of_a_started_cluster_that_does_not_answer_is_named_with_its_node(tmp_path: Path) -> None:
    gone = f"unix://{tmp_path}/docker.sock"  # no engine there
    state = ClusterState("lost", "up", "r.example/n@sha256:" + "1" * 64, LOCK_SHA, (gone,), "http://h:8265", 1)
    (line,) = engine_image_lines(state)
    assert line.status == "fail" and "\n" not in line.detail
    assert line.detail.startswith(f"{gone}: cannot ask the engine about envrun-lost-0: no container engine answers at ")


def test_up_refuses_a_cluster_already_recorded_and_asks_no_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = f"unix://{tmp_path}/docker.sock"  # asked, it would fail otherwise
    state = ClusterState("twice", "up", "r.example/n@sha256:" + "1" * 64, LOCK_SHA, (gone,), "http://h:8265")
    save_state(tmp_path / "state", state)
    recorded = state_path(tmp_path / "state", "twice")
    before = recorded.read_bytes()
    spec = write_cluster(tmp_path / "c.yaml", "twice", [gone])
    code, error = up(capsys, spec, "r.example/n@sha256:" + "2" * 64, tmp_path / "state")
    assert code == 2 and error == (f"cluster twice is already recorded ({recorded}); `envrun cluster down twice` first")
    assert recorded.read_bytes() == before


# --- up against a real engine and registry -----------------------------------------------------------


@dataclass(frozen=True)
class Images:
    node: str  # repository@sha256:… of the image with the lock label and the stub ray
    tagged: str  # the same image by its tag, as pushed
    broken: str  # repository@sha256:… of the same, whose python3 cannot start (the host probe fails)


def build(client: docker.DockerClient, dockerfile: str, files: dict[str, bytes], tag: str) -> str:
    """An image built from ``dockerfile`` and ``files`` (executable), no network; its ID."""
    context = dockerfile_context(dockerfile, files, mode=0o755)
    image, _ = client.images.build(fileobj=context, custom_context=True, tag=tag, network_mode="none", rm=True)
    return str(image.id)


@pytest.fixture(scope="module")
def images(docker_client: docker.DockerClient, registry: str, pushed_base_image: PushedImage) -> Iterator[Images]:
    base = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    label = f"LABEL {LOCK_LABEL}={LOCK_SHA}\n"
    node_file = f"FROM {base}\n{label}COPY ray /usr/local/bin/ray\n"
    made = [build(docker_client, node_file, {"ray": STUB_RAY}, f"{REPOSITORY}:stub")]
    broken_file = f"{node_file}ENV PYTHONHOME=/nonexistent\n"  # every python3 in it fails to start
    made.append(build(docker_client, broken_file, {"ray": STUB_RAY}, f"{REPOSITORY}:broken"))
    try:
        repository = f"{registry}/{REPOSITORY}"
        node = push_as(docker_client, f"{REPOSITORY}:stub", repository, "stub")
        broken = push_as(docker_client, f"{REPOSITORY}:broken", repository, "broken")
        yield Images(f"{repository}@{node}", f"{repository}:stub", f"{repository}@{broken}")
    finally:
        for image_id in reversed(made):  # the broken one is built on the other: removed first
            docker_client.images.remove(image_id, force=True)


@pytest.fixture()
def engine_url(docker_client: docker.DockerClient) -> Iterator[str]:
    """The test engine as a cluster file names a host; every container of this module's clusters gone after."""
    url = os.environ["DOCKER_HOST"]
    yield url
    left = docker_client.api.containers(all=True, filters={"label": CLUSTER_LABEL})
    ours = [c["Id"] for c in left if c["Labels"][CLUSTER_LABEL].startswith("gaps-")]
    for container in ours:
        docker_client.api.remove_container(container, force=True)
    assert not ours, f"containers left behind: {ours}"


def write_cluster(path: Path, name: str, engines: list[str], **fields: Any) -> Path:
    """A cluster file: a node per engine (``ip``, ``ray_start_args``: the head's), and the file's ``fields``."""
    head = {key: fields.pop(key) for key in ("ip", "ray_start_args") if key in fields}
    nodes = [{"engine": engine, **(head if i == 0 else {})} for i, engine in enumerate(engines)]
    path.write_text(json.dumps({"name": name, "nodes": nodes, "connect_timeout": 10, **fields}))  # JSON is YAML
    return path


def up(capsys: pytest.CaptureFixture[str], spec: Path, image: str, state: Path, *extra: str) -> tuple[int, str]:
    """``envrun cluster up``: its exit status and its one error line (no traceback)."""
    code = main(["cluster", "up", str(spec), "--image", image, "--cache-dir", str(state), *extra])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("envrun: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return code, errors[0].removeprefix("envrun: error: ")


def clusters_of(client: docker.DockerClient, name: str, node: str | None = None) -> list[str]:
    """The containers of cluster ``name`` (of its node ``node`` alone: "0" is the head), running or not."""
    labels = [f"{CLUSTER_LABEL}={name}", *([f"{NODE_LABEL}={node}"] if node is not None else [])]
    return [c["Id"] for c in client.api.containers(all=True, filters={"label": labels})]


def assert_nothing_left(client: docker.DockerClient, state: Path, name: str) -> None:
    """An ``up`` that failed left no state file and no container of cluster ``name``."""
    assert not state_path(state, name).exists()
    assert clusters_of(client, name) == []


@pytest.mark.docker
@pytest.mark.registry
def test_an_image_no_registry_serves_cannot_be_pinned_and_nothing_starts(
    engine_url: str, registry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = f"{registry}/envrun-gaps/never-pushed:1"
    spec = write_cluster(tmp_path / "c.yaml", "gaps-unpinned", [engine_url])
    code, error = up(capsys, spec, image, tmp_path / "state")
    assert code == 1
    assert error.startswith(f"{image}: cannot pin it to a digest every host can pull (registry data of {image}: ")
    assert error.endswith("); push it first (`envbuild image --push`)")
    assert not state_path(tmp_path / "state", "gaps-unpinned").exists()


@pytest.mark.docker
@pytest.mark.registry
def test_a_tag_the_engine_knows_from_the_registry_is_pinned_to_its_digest(images: Images, engine_url: str) -> None:
    with Engine.connect(engine_url) as engine:
        assert pin_image(images.tagged, engine) == images.node
        assert pin_image(images.node, engine) == images.node


@pytest.mark.docker
@pytest.mark.registry
def test_an_image_without_the_lock_label_is_refused_before_anything_starts(
    pushed_base_image: PushedImage,
    engine_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = write_cluster(tmp_path / "c.yaml", "gaps-nolabel", [engine_url])
    code, error = up(capsys, spec, pushed_base_image.by_digest, tmp_path / "state")
    assert (code, error) == (
        2,
        f"{engine_url}: {pushed_base_image.by_digest} has no {LOCK_LABEL} label; build the image with `envbuild image`",
    )
    assert_nothing_left(docker_client, tmp_path / "state", "gaps-nolabel")


@pytest.mark.docker
@pytest.mark.registry
def test_containers_of_the_cluster_already_on_a_host_refuse_up_and_are_left_alone(
    images: Images,
    engine_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An earlier ``up`` killed before its state file was written, say: ``down CLUSTER.yaml`` finds them."""
    stale = docker_client.api.create_container(
        images.node, ["true"], name="envrun-gaps-stale-0", labels={CLUSTER_LABEL: "gaps-stale"}
    )["Id"]
    try:
        spec = write_cluster(tmp_path / "c.yaml", "gaps-stale", [engine_url])
        code, error = up(capsys, spec, images.node, tmp_path / "state")
        assert (code, error) == (
            2,
            f"{engine_url}: containers of cluster gaps-stale are already there (envrun-gaps-stale-0); run down first",
        )
        assert clusters_of(docker_client, "gaps-stale") == [stale]  # not removed, not joined by another
        assert not state_path(tmp_path / "state", "gaps-stale").exists()
    finally:
        docker_client.api.remove_container(stale, force=True)


@pytest.mark.docker
@pytest.mark.registry
def test_a_host_probe_that_fails_is_named_with_its_exit_status_and_words(
    images: Images,
    engine_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = write_cluster(tmp_path / "c.yaml", "gaps-probe", [engine_url])
    code, error = up(capsys, spec, images.broken, tmp_path / "state")
    assert code == 1
    head, _, said = error.partition(": the host probe failed (exit 1): ")
    assert head == engine_url and len(said) == 300  # python3's last words, its stderr's lines on one line
    assert re.search(
        r" \| Fatal Python error: init_fs_encoding: failed to get the Python codec of the filesystem encoding"
        r" \| Python runtime state: core initialized \| ModuleNotFoundError: No module named 'encodings'"
        r" \| Current thread 0x[0-9a-f]+ \(most recent call first\): \| <no Python frame>$",
        said,
    ), said
    assert_nothing_left(docker_client, tmp_path / "state", "gaps-probe")


@pytest.mark.docker
@pytest.mark.registry
def test_a_node_address_no_interface_of_its_host_carries_is_refused(
    images: Images,
    engine_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = write_cluster(tmp_path / "c.yaml", "gaps-ip", [engine_url], ip="203.0.113.7")  # TEST-NET-3
    code, error = up(capsys, spec, images.node, tmp_path / "state")
    assert code == 2
    # The probe runs with the host's network: its interfaces are this machine's.
    assert error == (
        f"{engine_url}: no interface of this host carries 203.0.113.7, the cluster file's ip for node "
        f"envrun-gaps-ip-0 (its interfaces: {shown_interfaces(interfaces())}); give the node an address of its host"
    )
    assert_nothing_left(docker_client, tmp_path / "state", "gaps-ip")


@pytest.mark.docker
@pytest.mark.registry
def test_two_engine_urls_of_one_machine_share_its_hccl_ports(
    images: Images,
    engine_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The file's own check counts nodes per engine URL (one each: 65400 leaves room for one); the hosts'
    names say both engines are one machine, whose two nodes need 256 ports from 65400."""
    assert engine_url.startswith("unix:///"), engine_url
    same = engine_url.replace("unix:///", "unix:////", 1)  # another URL, the same socket
    spec = write_cluster(tmp_path / "c.yaml", "gaps-hccl", [engine_url, same], hccl_ports=65400)
    code, error = up(capsys, spec, images.node, tmp_path / "state")
    assert (code, error) == (2, "hccl_ports: 65400 leaves no room for 2 node(s) on one host (128 ports each); lower it")
    assert_nothing_left(docker_client, tmp_path / "state", "gaps-hccl")


@pytest.mark.docker
@pytest.mark.registry
def test_nodes_sharing_a_machine_with_npus_are_refused_before_anything_starts(
    images: Images,
    engine_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, each node was given all of its host's NPUs and claimed them all: Ray counted the machine's
    NPUs once per node. This machine has none, so the host probe's real answer gets two device paths."""
    import envrun.cluster.up as up_module

    probed = up_module.host_facts
    npus = ("/dev/davinci0", "/dev/davinci1", "/dev/davinci_manager")
    monkeypatch.setattr(up_module, "host_facts", lambda out, memory: replace(probed(out, memory), ascend_paths=npus))
    spec = write_cluster(tmp_path / "c.yaml", "gaps-npus", [engine_url, engine_url])
    code, error = up(capsys, spec, images.node, tmp_path / "state")
    assert code == 2
    assert re.fullmatch(
        r"nodes envrun-gaps-npus-0, envrun-gaps-npus-1 are on one machine, \S+, which has 2 NPU\(s\): each node "
        r"would be given all of them, and Ray would count 4; give each NPU host one node",
        error,
    ), error
    assert_nothing_left(docker_client, tmp_path / "state", "gaps-npus")


@pytest.mark.docker
@pytest.mark.registry
def test_a_node_removed_while_up_waits_for_it_is_said_without_a_log(
    images: Images, engine_url: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """Someone else's ``docker rm -f`` of the head between its start and its first check."""
    spec = load_cluster_file(write_cluster(tmp_path / "c.yaml", "gaps-removed", [engine_url]))

    def progress(message: str) -> None:
        if message == f"{engine_url}: started envrun-gaps-removed-0":
            for container in clusters_of(docker_client, "gaps-removed"):
                docker_client.api.remove_container(container, force=True)

    with pytest.raises(EngineError) as info:
        cluster_up(spec, UpOptions(images.node, tmp_path / "state", join_timeout=30), progress)
    assert str(info.value) == (
        f"{engine_url}: node envrun-gaps-removed-0 exited before the cluster was up (removed); its log ends: (no log)"
    )
    assert not state_path(tmp_path / "state", "gaps-removed").exists()


@pytest.mark.docker
@pytest.mark.registry
def test_a_head_that_reports_no_address_in_time_is_removed(
    images: Images,
    engine_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = write_cluster(tmp_path / "c.yaml", "gaps-slowhead", [engine_url])
    code, error = up(capsys, spec, images.node, tmp_path / "state", "--timeout", "2")
    assert (code, error) == (
        1,
        f"{engine_url}: node envrun-gaps-slowhead-0 did not come up in time; its log ends: {STUB_LOG}",
    )
    assert_nothing_left(docker_client, tmp_path / "state", "gaps-slowhead")


@pytest.mark.docker
@pytest.mark.registry
def test_a_node_that_never_joins_is_removed_naming_the_job_api_asked(
    images: Images,
    engine_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The head reports its GCS address; no job API ever answers at the file's dashboard port (asked
    again and again as one that is still starting) until the deadline."""
    port = free_block(1, 30000)
    args = ["--temp-dir=/tmp/ray-gaps"]
    spec = write_cluster(tmp_path / "c.yaml", "gaps-nojoin", [engine_url], ray_start_args=args, dashboard_port=port)
    code, error = up(capsys, spec, images.node, tmp_path / "state", "--timeout", "3")
    assert (code, error) == (
        1,
        f"{engine_url}: node envrun-gaps-nojoin-0 did not join the cluster at http://127.0.0.1:{port} in time; "
        f"its log ends: {STUB_LOG}",
    )
    assert_nothing_left(docker_client, tmp_path / "state", "gaps-nojoin")


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.parametrize("signals", [1, 2], ids=["once", "again-while-it-removes"])
def test_sigterm_while_up_waits_removes_every_node_and_the_state_as_ctrl_c_does(
    images: Images, engine_url: str, docker_client: docker.DockerClient, tmp_path: Path, signals: int
) -> None:
    """A real SIGTERM (a scheduler, ``kill``) to a real ``envrun cluster up`` whose two nodes are started and
    waiting to join: it unwinds as Ctrl-C, exit 130, nothing left (it used to die at once, exit 143, its
    containers running and its state file "starting"). A second SIGTERM, sent once the worker is removed
    and while the head is, does not cut the removal short."""
    port = free_block(1, 30000)
    args = ["--temp-dir=/tmp/ray-gaps"]  # the head reports its address: the worker starts too
    name = f"gaps-sigterm-{signals}"
    spec = write_cluster(tmp_path / "c.yaml", name, [engine_url, engine_url], ray_start_args=args, dashboard_port=port)
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "envrun.cli.main", "cluster", "up", str(spec), "--image", images.node]
    with (tmp_path / "stderr").open("wb") as err:
        process = subprocess.Popen([*argv, "--cache-dir", str(state), "--timeout", "120"], stderr=err)
    try:
        deadline = time.monotonic() + 120
        while f"started envrun-{name}-1" not in (tmp_path / "stderr").read_text():
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()
            time.sleep(0.2)
        head, worker = clusters_of(docker_client, name, "0"), clusters_of(docker_client, name, "1")
        assert len(head) == len(worker) == 1 and state_path(state, name).exists()
        process.send_signal(signal.SIGTERM)
        if signals == 2:
            while clusters_of(docker_client, name, "1"):  # workers first
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert clusters_of(docker_client, name, "0") == head  # the head's removal is under way
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 130, (tmp_path / "stderr").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (tmp_path / "stderr").read_text().endswith("envrun: interrupted\n")
    assert_nothing_left(docker_client, state, name)


@pytest.mark.docker
def test_status_json_always_has_other_nodes_and_up_s_never(
    engine_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``other_nodes`` is [] when no node joined by hand (it was left out, as if status had not asked)."""
    state = ClusterState("gaps-others", "up", "r/x@sha256:" + "a" * 64, LOCK_SHA, (engine_url,), None)
    save_state(tmp_path, state)
    assert main(["cluster", "status", "gaps-others", "--json", "--cache-dir", str(tmp_path)]) == 1  # no node
    shown = json.loads(capsys.readouterr().out)
    assert shown["other_nodes"] == [] and shown["nodes"][0]["state"] == "missing"
    assert "other_nodes" not in to_jsonable(ClusterInfo("gaps-others", None, ()))  # up's


@dataclass
class Relay(LoopbackServer):
    """A TCP port relaying to the engine's unix socket: the host's engine at ``tcp://``, until :meth:`cut`
    (the host lost: every connection reset, the port closed)."""

    socket_path: str = ""
    port: int = 0
    _server: socket.socket | None = None
    _sockets: list[socket.socket] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX)
        upstream.connect(self.socket_path)
        self._sockets.append(upstream)
        relay_both_ways(client, upstream)

    def cut(self) -> None:
        ends = [self._server] if self._server is not None else []
        for end in [*ends, *self._sockets]:  # the port and every connection reset, not only closed here
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.close()


@pytest.mark.docker
@pytest.mark.registry
def test_a_host_lost_before_its_node_is_removed_keeps_the_state_and_says_what_is_left(
    images: Images, engine_url: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    relay = Relay(socket_path=engine_url.removeprefix("unix://")).start()
    spec = load_cluster_file(write_cluster(tmp_path / "c.yaml", "gaps-lost", [relay.url]))

    def progress(message: str) -> None:
        if message == f"{relay.url}: started envrun-gaps-lost-0":
            relay.cut()

    try:
        with pytest.raises(EngineError) as info:
            cluster_up(spec, UpOptions(images.node, tmp_path / "state", join_timeout=30), progress)
        message = str(info.value)
        assert "\n" not in message and message.startswith("inspect container ")
        assert message.endswith(
            f"; could not remove envrun-gaps-lost-0 on {relay.url}: run `envrun cluster down gaps-lost`"
        )
        # What `down gaps-lost` needs: the state names the host, and the node is still there.
        state = json.loads(state_path(tmp_path / "state", "gaps-lost").read_text())
        assert (state["phase"], state["engines"]) == ("starting", [relay.url])
        assert len(clusters_of(docker_client, "gaps-lost")) == 1
    finally:
        for container in clusters_of(docker_client, "gaps-lost"):
            docker_client.api.remove_container(container, force=True)
