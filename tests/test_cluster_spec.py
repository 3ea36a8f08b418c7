"""The cluster file read strictly, a node's container and ``ray start`` line, the node check's verdict and
the cluster state — pure parts, no engine and no Ray (those are in test_cluster_ray.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from envbuild.data.jsonout import to_jsonable
from envbuild.errors import CacheError, InputError
from envrun.bytecode import MOUNT, Bytecode
from envrun.cli.main import main
from envrun.cluster.nodecheck import capacity_line, data_lines, job_address_line, model_lines, node_lines
from envrun.cluster.nodes import (
    HostFacts,
    host_facts,
    host_slots,
    node_container,
    probe_command,
    ray_start_command,
    shared_npu_machines,
)
from envrun.cluster.spec import ClusterFileError, parse_cluster_file
from envrun.cluster.state import ClusterState, claim_state, load_state, remove_state, save_state, state_path
from envrun.preflight import ModelAudit, model_verdict

GOOD = """\
name: glm5
head_port: 6380
nodes:
  - engine: ssh://root@node-001
    ip: 10.0.0.1
    ray_start_args: [--num-cpus=64]
  - engine: tcp://node-002:2375
  - engine: unix:///run/docker.sock
"""


def test_a_cluster_file_is_data() -> None:
    spec = parse_cluster_file(GOOD, "c.yaml")
    assert (spec.name, spec.head_port, spec.dashboard_port) == ("glm5", 6380, 8265)
    assert [n.engine for n in spec.nodes] == ["ssh://root@node-001", "tcp://node-002:2375", "unix:///run/docker.sock"]
    assert spec.head.ip == "10.0.0.1" and spec.head.ray_start_args == ("--num-cpus=64",)
    assert spec.nodes[1].ip is None and spec.nodes[1].ray_start_args == ()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("name: glm5", "name: glm5\ncolour: red"), "c.yaml:2: colour: unknown key"),
        (("name: glm5", f"name: {'a' * 251}"), "c.yaml:1: name: 251 characters long, at most 250"),  # NAME.json
        (("head_port: 6380", "head_port: '6380'"), "c.yaml:2: head_port: expected an integer"),
        (("head_port: 6380", "head_port: 70000"), "c.yaml:2: head_port: 70000 is not a port"),
        (
            ("ssh://root@node-001", "http://node-001"),
            "c.yaml:4: nodes[0].engine: 'http://node-001': expected a container",
        ),
        (
            ("tcp://node-002:2375", "tcp://node-002"),
            "c.yaml:7: nodes[1].engine: 'tcp://node-002': a tcp:// engine needs a port",
        ),
        (
            ("ssh://root@node-001", "ssh://root:secret@node-001"),
            "nodes[0].engine: 'ssh://***@node-001' carries a password",  # never echoed
        ),
        (
            ("tcp://node-002:2375", "tcp://u:pw@node-002:2375"),
            "nodes[1].engine: 'tcp://***@node-002:2375' carries credentials",
        ),
        (
            ("unix:///run/docker.sock", "unix://run/docker.sock"),
            "c.yaml:8: nodes[2].engine: 'unix://run/docker.sock': expected unix:///absolute/path",
        ),
        (("ip: 10.0.0.1", "ip: node-001"), "c.yaml:5: nodes[0].ip: 'node-001' is not an IP address"),
        (
            ("ssh://root@node-001", "ssh://-oProxyCommand=sh"),
            "nodes[0].engine: 'ssh://-oProxyCommand=sh': a host or user starting with '-' would be an option to ssh",
        ),
        (("ip: 10.0.0.1", "ip: 127.0.0.1"), "nodes[0].ip: 127.0.0.1 is not what the node would advertise: `ray start`"),
        (("ip: 10.0.0.1", "ip: 0.0.0.0"), "nodes[0].ip: 0.0.0.0 is not an address a node can be reached at"),
        (
            ("[--num-cpus=64]", "[--port=1]"),
            "nodes[0].ray_start_args: --port is set by envrun cluster (set `head_port`)",
        ),
        (("[--num-cpus=64]", "[--head]"), "nodes[0].ray_start_args: --head is set by envrun cluster"),
        (
            ("[--num-cpus=64]", "[--dashboard-host=127.0.0.1]"),
            "nodes[0].ray_start_args: --dashboard-host is set by envrun cluster (the job API listens on the head's",
        ),
        (("[--num-cpus=64]", "[num-cpus]"), "nodes[0].ray_start_args: 'num-cpus': expected a `ray start` flag"),
        (("    ip: 10.0.0.1\n", "    ip: 10.0.0.1\n    npus: 16\n"), "c.yaml:6: nodes[0].npus: unknown key"),
        # Settings `up` could only fail on, after every host's pull:
        (
            ("head_port: 6380", "head_port: 8265\ndashboard_port: 8265"),
            "c.yaml:3: dashboard_port: 8265 is the head_port and the dashboard_port; give each its own port",
        ),
        (("head_port: 6380", "head_port: 8265"), "c.yaml:2: head_port: 8265 is the head_port and the dashboard_port"),
        (
            ("head_port: 6380", "head_port: 60010"),
            "c.yaml:2: head_port: 60010 is among HCCL's ports on each host (60000-60127, from hccl_ports); give a port",
        ),
        (
            ("head_port: 6380", "head_port: 6380\nhccl_ports: 8200"),  # the job API's default port among them
            "c.yaml:3: dashboard_port: 8265 is among HCCL's ports on each host (8200-8327, from hccl_ports)",
        ),
        (
            ("tcp://node-002:2375", "ssh://root@node-001\n    ip: 10.0.0.1"),
            "c.yaml:8: nodes[1].ip: 10.0.0.1 is nodes[0]'s address too; give each node its own address",
        ),
        (
            ("tcp://node-002:2375", "tcp://node-002:2375\n    ip: 10.0.0.1"),
            "c.yaml:8: nodes[1].ip: 10.0.0.1 is nodes[0]'s",
        ),
        (("head_port: 6380", "hccl_ports: 65500"), "c.yaml:2: hccl_ports: 65500 leaves no room for 1 node(s)"),
    ],
)
def test_bad_cluster_files_are_named_by_line_and_field(change: tuple[str, str], expected: str) -> None:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster_file(GOOD.replace(*change), "c.yaml")
    assert expected in str(info.value) and info.value.exit_code == 2
    assert "secret" not in str(info.value) and ":pw@" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty file"),
        ("name: x\nnodes: []\n", "nodes: needs at least the head node"),
        ("nodes: [", "not valid YAML"),
    ],
)
def test_empty_or_broken_files(text: str, expected: str) -> None:
    with pytest.raises(ClusterFileError, match=expected):
        parse_cluster_file(text, "c.yaml")


def test_every_problem_at_once() -> None:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster_file(GOOD.replace("ip: 10.0.0.1", "ip: x").replace("head_port: 6380", "head_port: 0"), "c.yaml")
    assert len(info.value.problems) == 2


def test_a_bad_file_stops_up_with_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(GOOD.replace("tcp://node-002:2375", "ftp://node-002"))
    assert main(["cluster", "up", str(path), "--image", "x:1", "--cache-dir", str(tmp_path / "state")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"{path}:7: nodes[1].engine" in err
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("timeout", ["nan", "0", "-5", "inf", "soon"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_stops_up_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], timeout: str
) -> None:
    """nan never timed out; 0 and negative ones were taken too."""
    path = tmp_path / "c.yaml"
    path.write_text(GOOD)
    argv = ["cluster", "up", str(path), "--image", "x:1", "--timeout", timeout, "--cache-dir", str(tmp_path / "state")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"envrun: error: cluster up: argument --timeout: {timeout!r}: expected a positive number of seconds\n"
    )
    assert not (tmp_path / "state").exists()


def test_ray_start_lines_of_head_and_worker() -> None:
    spec = parse_cluster_file(GOOD, "c.yaml")
    assert ray_start_command(spec, 0, None, 16) == (
        "ray", "start", "--block", "--disable-usage-stats", "--node-name=envrun-glm5-0",
        "--head", "--port=6380", "--dashboard-port=8265", "--dashboard-host=10.0.0.1",
        "--node-ip-address=10.0.0.1", '--resources={"NPU": 16}', "--num-cpus=64",
    )  # fmt: skip
    assert ray_start_command(spec, 1, "10.0.0.1:6380", 0) == (
        "ray", "start", "--block", "--disable-usage-stats", "--node-name=envrun-glm5-1", "--address=10.0.0.1:6380",
    )  # fmt: skip


def test_a_node_gets_what_its_host_has() -> None:
    spec = parse_cluster_file(
        GOOD.replace("tcp://node-002:2375\n", "tcp://node-002:2375\n    ip: 10.0.0.2\n"), "c.yaml"
    )
    paths = ["/host/dev/davinci0", "/host/dev/davinci1", "/host/dev/davinci_manager", "/host/usr/local/dcmi"]
    interfaces = {"eth0": ["10.0.0.2/24"], "ib0": ["192.168.1.2/24"], "lo": ["127.0.0.1/8"]}
    host = host_facts(json.dumps({"paths": paths, "interfaces": interfaces}), memory_bytes=64 << 30)
    assert host.npus == 2 and host.interfaces == interfaces
    bytecode = Bytecode("sha256:" + "c" * 64)
    node = node_container(
        spec, 1, image="r/x@sha256:" + "a" * 64, lock_sha256="b" * 64, host=host, bytecode=bytecode, head_address="h:1"
    )
    assert node.devices == ("/dev/davinci0:/dev/davinci0:rwm", "/dev/davinci1:/dev/davinci1:rwm",
                            "/dev/davinci_manager:/dev/davinci_manager:rwm")  # fmt: skip
    assert node.volumes == {
        "/usr/local/dcmi": {"bind": "/usr/local/dcmi", "mode": "ro"},
        "envrun-bytecode-cccccccccccccccc": {"bind": "/var/cache/envrun/bytecode", "mode": "rw"},
    }
    assert node.env == {
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPYCACHEPREFIX": "/var/cache/envrun/bytecode",
        "PYTHONDONTWRITEBYTECODE": "",
        # HCCL and Gloo on the interface that carries the file's ip on this host; the node's own HCCL ports
        "HCCL_IF_IP": "10.0.0.2",
        "HCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "HCCL_HOST_SOCKET_PORT_RANGE": "60000-60063",
        "HCCL_NPU_SOCKET_PORT_RANGE": "60064-60127",
        "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1",
    }
    assert (node.network_mode, node.shm_size, node.name) == ("host", 32 << 30, "envrun-glm5-1")
    assert node.labels == {
        "io.envbuild.cluster.name": "glm5",
        "io.envbuild.cluster.node": "1",
        "io.envbuild.cluster.role": "worker",
        "io.envbuild.lock.sha256": "b" * 64,
    }
    assert '--resources={"NPU": 2}' in node.command
    assert json.loads(probe_command()[-1])[0] == "/host/dev/davinci[0-9]*"


def test_nodes_sharing_a_host_get_hccl_ports_of_their_own() -> None:
    text = GOOD.replace("head_port: 6380", "head_port: 6380\nhccl_ports: 50000")
    spec = parse_cluster_file(text.replace("tcp://node-002:2375", "ssh://root@node-001"), "c.yaml")
    host = HostFacts((), memory_bytes=1 << 30)
    # Nodes 0 and 1 on one engine, node 2 on another engine of the same machine (one hostname).
    slots = host_slots(spec, {"ssh://root@node-001": "m1", "unix:///run/docker.sock": "m1"})
    assert slots == (0, 1, 2) and host_slots(spec, {}) == (0, 1, 0)
    ranges = [
        {k: v for k, v in node_container(spec, i, image="r@sha256:" + "a" * 64, lock_sha256="b", host=host,
                                         bytecode=None, slot=slots[i]).env.items() if "PORT_RANGE" in k}
        for i in range(len(spec.nodes))
    ]  # fmt: skip
    assert [r["HCCL_HOST_SOCKET_PORT_RANGE"] for r in ranges][:2] == ["50000-50063", "50128-50191"]
    assert [r["HCCL_NPU_SOCKET_PORT_RANGE"] for r in ranges][:2] == ["50064-50127", "50192-50255"]
    with pytest.raises(ClusterFileError) as info:
        parse_cluster_file(GOOD.replace("head_port: 6380", "hccl_ports: 65500"), "c.yaml")
    assert "hccl_ports: 65500 leaves no room for 1 node(s) on one host" in str(info.value)


def test_nodes_sharing_a_machine_with_npus_are_refused_and_without_npus_allowed() -> None:
    spec = parse_cluster_file(GOOD.replace("tcp://node-002:2375", "ssh://root@node-001"), "c.yaml")
    npus = HostFacts(("/dev/davinci0", "/dev/davinci1", "/dev/davinci_manager"), 1 << 30, hostname="m1")
    cpus = HostFacts((), 1 << 30, hostname="m1")
    other = HostFacts(npus.ascend_paths, 1 << 30, hostname="m2")
    # Nodes 0 and 1 on one engine; node 2 on another engine of machine m1, then of machine m2.
    assert shared_npu_machines(spec, {"ssh://root@node-001": npus, "unix:///run/docker.sock": other}) == (
        "nodes envrun-glm5-0, envrun-glm5-1 are on one machine, m1, which has 2 NPU(s): each node would be "
        "given all of them, and Ray would count 4; give each NPU host one node"
    )
    both = {"ssh://root@node-001": cpus, "unix:///run/docker.sock": npus}  # one machine, two engines
    assert "nodes envrun-glm5-0, envrun-glm5-1, envrun-glm5-2 are on one machine, m1" in str(
        shared_npu_machines(spec, both)
    )
    assert shared_npu_machines(spec, {"ssh://root@node-001": cpus, "unix:///run/docker.sock": other}) is None
    alone = parse_cluster_file(GOOD, "c.yaml")  # one node per machine
    hosts = {
        "ssh://root@node-001": npus,
        "tcp://node-002:2375": other,
        "unix:///run/docker.sock": replace(other, hostname="m3"),
    }
    assert shared_npu_machines(alone, hosts) is None


def _answer(name: str, lock: str | None, **more: object) -> dict[str, object]:
    node_id = name * 56
    answer = {"node_id": node_id, "answered_from": node_id, "name": f"n{name}", "ip": "10.0.0.1", "lock_sha256": lock}
    return {**answer, "devices": [], **more}


def test_an_answer_from_another_node_than_the_one_asked_fails() -> None:
    want = "c" * 64
    (line,) = node_lines([_answer("1", want, answered_from="2" * 56)], want, "x.lock.yaml")
    assert line.status == "fail" and f"the answer came from Ray node {'2' * 56}, not this node" in line.detail
    (line,) = node_lines([{k: v for k, v in _answer("1", want).items() if k != "answered_from"}], want, "x")
    assert line.status == "fail"  # an answer that does not say where it came from is not the node's


def test_volumes_reach_every_node_read_only_unless_rw() -> None:
    text = GOOD.replace(
        "nodes:",
        "volumes:\n  - {host: /data, container: /data}\n  - {host: /scratch, container: /runs, mode: rw}\nnodes:",
    )
    spec = parse_cluster_file(text, "c.yaml")
    host = HostFacts((), memory_bytes=1 << 30)
    for index in range(len(spec.nodes)):
        bytecode = Bytecode("sha256:" + "c" * 64)
        node = node_container(
            spec, index, image="r/x@sha256:" + "a" * 64, lock_sha256="b" * 64, host=host, bytecode=bytecode
        )
        assert node.volumes == {
            "/data": {"bind": "/data", "mode": "ro"},
            "/scratch": {"bind": "/runs", "mode": "rw"},
            bytecode.volume: {"bind": MOUNT, "mode": "rw"},
        }


@pytest.mark.parametrize(
    ("volumes", "expected"),
    [
        ("[{host: data, container: /data}]", "c.yaml:2: volumes[0].host: 'data' is not an absolute path"),
        ("[{host: /d, container: /a/../b}]", "volumes[0].container: '/a/../b' is not an absolute path"),
        ("[{host: /d, container: /d, mode: rx}]", "volumes[0].mode: expected one of ro | rw"),
        (
            "[{host: /d, container: /d}, {host: /e, container: /d}]",
            "c.yaml:2: volumes[1].container: /d is mounted twice",
        ),
    ],
)
def test_bad_volumes_are_refused(volumes: str, expected: str) -> None:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster_file(GOOD.replace("head_port: 6380", f"volumes: {volumes}"), "c.yaml")
    assert expected in str(info.value) and info.value.exit_code == 2


def test_fewer_nodes_or_npus_than_the_run_needs_are_refused_naming_what_is_there() -> None:
    answers = [_answer("1", "a", npu_resource=16), _answer("2", "a", npu_resource=8), _answer("3", "a", error="x")]
    short = capacity_line(answers, 2, 16)
    assert short.status == "fail" and short.name == "ray-node"
    assert short.detail == (
        "the run needs 2 node(s) x 16 NPU(s); the cluster has 2 alive node(s), 1 with 16 NPU(s) or more "
        "(NPU resource per node: n1: 16, n2: 8)"
    )
    assert capacity_line(answers, 2, 8).status == "ok" and capacity_line(answers, None, 16).status == "skip"


def test_each_node_reports_the_model_and_the_data_it_sees() -> None:
    answers = [
        _answer("1", "a", model={"path": "/data/m", "ok": True, "expected_from": "M of transformers 5.10.4 on n1"},
                data=[]),
        _answer("2", "a", model={"path": "/data/m", "ok": False, "error": "/data/m: not a directory; pass the model "
                                 "directory holding config.json"},
                data=["/data/t.parquet: no such file"]),
    ]  # fmt: skip
    assert [(line.status, line.detail.split(": ", 1)[1]) for line in model_lines(answers)] == [
        ("ok", "/data/m: checkpoint audit ok (only MTP layers may be absent); names: M of transformers 5.10.4 on n1"),
        ("fail", "/data/m: not a directory; pass the model directory holding config.json"),
    ]
    assert [line.status for line in data_lines(answers, 1)] == ["ok", "fail"]
    assert "node n2 (ip 10.0.0.1" in data_lines(answers, 1)[1].detail


def test_a_nodes_model_audit_is_judged_by_the_local_verdict() -> None:
    """One judge: a node's answer, read into the typed audit, gets this host's words and facts, after its name."""
    lost = ["model.layers.3.mlp.gate.weight", "lm_head.weight"]
    audit = {"path": "/data/m", "ok": False, "missing": lost, "check": "architecture", "expected_from": "M"}
    (line,) = model_lines([_answer("1", "a", model=audit)])
    here = model_verdict(ModelAudit("/data/m", False, tuple(lost), check="architecture", expected_from="M"))
    assert line.status == here.status == "fail" and line.facts == here.facts
    assert line.detail == f"node n1 (ip 10.0.0.1, Ray node {'1' * 56}): {here.detail}"
    assert "missing: model.layers.3.mlp.gate.weight, lm_head.weight; names: M" in line.detail


def test_the_node_verdict_names_each_node_and_what_it_runs() -> None:
    want, other = "a" * 64, "c" * 64
    lines = node_lines(
        [
            _answer("1", want, devices=["/dev/davinci0"], npu_resource=1),
            _answer("2", other),
            _answer("3", None, manifest_problem="FileNotFoundError: no such file"),
            _answer("4", None, error="GetTimeoutError: timed out"),
        ],
        want,
        "x.lock.yaml",
    )
    assert [line.status for line in lines] == ["ok", "fail", "fail", "fail"]
    assert "node n1 (ip 10.0.0.1, Ray node " + "1" * 56 + ")" in lines[0].detail
    assert "1 NPU(s) visible (/dev/davinci0), Ray NPU resource 1" in lines[0].detail
    assert f"runs lock sha256 {other}, not x.lock.yaml (sha256 {want})" in lines[1].detail
    assert "runs no envbuild image" in lines[2].detail and "FileNotFoundError" in lines[2].detail
    assert "did not answer: GetTimeoutError" in lines[3].detail
    assert to_jsonable(lines[1])["facts"]["lock_sha256"] == other  # the node's own answer, recorded
    assert [line.status for line in node_lines([], want, "x")] == ["fail"]


def test_a_node_advertising_another_address_than_the_files_fails() -> None:
    want = "a" * 64
    answers = [_answer("1", want), _answer("2", want, ip="192.0.2.2")]
    lines = node_lines(answers, want, "x", {"n1": "10.0.0.1", "n2": "10.0.0.2"})
    assert [line.status for line in lines] == ["ok", "fail"]
    assert "node n2 (ip 192.0.2.2" in lines[1].detail and "advertises 192.0.2.2, not 10.0.0.2" in lines[1].detail


def test_the_jobs_driver_must_reach_the_head_at_the_files_address() -> None:
    answers = [_answer("1", "a", job_ray_address="10.0.0.1:6379")]
    assert job_address_line(answers, None) is None  # the file gives the head no address: Ray's own choice
    ok = job_address_line(answers, "10.0.0.1")
    assert ok is not None and ok.status == "ok"
    wrong = job_address_line([_answer("1", "a", job_ray_address="192.0.2.2:6379")], "10.0.0.1")
    assert wrong is not None and wrong.status == "fail"
    assert "RAY_ADDRESS=192.0.2.2:6379, not the head's address 10.0.0.1" in wrong.detail


def test_state_round_trips_and_names_its_file(tmp_path: Path) -> None:
    state = ClusterState(
        "glm5", "up", "r/x@sha256:" + "a" * 64, "b" * 64, ("ssh://a", "ssh://b"), "http://h:8265", 7, ("10.0.0.1", None)
    )
    save_state(tmp_path, state)
    assert load_state(tmp_path, "glm5") == state and state_path(tmp_path, "glm5").name == "glm5.json"
    assert load_state(tmp_path, "other") is None


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"engines": [5]}, "a wrong engines"),
        ({"engines": "unix:///x"}, "a wrong engines"),  # iterated, a string would be one engine per character
        ({"name": 7}, "a wrong name"),
        ({"phase": "gone"}, "a wrong phase"),
        ({"address": ["http://h"]}, "a wrong address"),
        ({"ips": "10.0.0.1"}, "a wrong ips"),
    ],
)
def test_a_state_file_of_wrong_types_is_refused_in_one_line(
    tmp_path: Path, change: dict[str, object], said: str
) -> None:
    """The state envrun wrote, changed since: refused naming the file and the field, with the way out."""
    state = ClusterState("glm5", "up", "r/x@sha256:" + "a" * 64, "b" * 64, ("ssh://a",), "http://h:8265")
    save_state(tmp_path, state)
    path = state_path(tmp_path, "glm5")
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(CacheError) as info:
        load_state(tmp_path, "glm5")
    message = str(info.value)
    assert message.startswith(f"{path}: cluster state with {said}") and "envrun cluster down" in message
    assert "\n" not in message


def test_down_without_a_cluster_is_a_no_op_and_status_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cluster", "down", "nothing", "--cache-dir", str(tmp_path)]) == 0
    assert "removed 0 container(s)" in capsys.readouterr().out
    assert main(["cluster", "status", "nothing", "--cache-dir", str(tmp_path)]) == 2
    assert "no cluster nothing is up" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["cluster", "down", "{outside}/precious"],  # the state file of another directory
        ["cluster", "status", "../outside/precious"],
        ["cluster", "down", "Bad Name!"],
        ["cluster", "down", "a" * 251],  # its state file's name would be 256 characters
        ["grpo-glm5", "--backend", "ray", "--cluster", "../outside/precious", "--dry-run"],
    ],
)
def test_a_cluster_name_that_is_not_one_touches_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """NAME names the state file: a path, or a name no state file has, is one line, exit 2, before any file
    is read or removed (`down /elsewhere/precious` removed /elsewhere/precious.json)."""
    state = ClusterState("precious", "up", "r/x@sha256:" + "a" * 64, "b" * 64, ("unix:///x",), "http://h:8265")
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / "precious.json"
    precious.write_text(json.dumps(state.to_json()))
    cache = tmp_path / "cache"
    (cache / "clusters").mkdir(parents=True)
    words = [word.replace("{outside}", str(outside)) for word in argv]
    assert main([*words, "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert "is not a cluster name" in err or "a cluster name has at most 250" in err, err
    assert err.count("\n") == 1 and precious.is_file()
    with pytest.raises(InputError, match="cluster name: '../outside/precious' is not"):
        state_path(cache, "../outside/precious")


def test_the_host_engine_s_image_id_must_be_the_pinned_one() -> None:
    from envbuild.engine.jobs import ContainerState
    from envrun.cluster.nodecheck import engine_image_line

    pinned = {"Id": "sha256:" + "a" * 64}
    running = ContainerState("c" * 64, "envrun-g-0", "running", "sha256:" + "a" * 64, {})
    assert engine_image_line("unix:///h", "envrun-g-0", running, pinned, "r/x@sha256:d").status == "ok"
    other = replace(running, image_id="sha256:" + "b" * 64)
    line = engine_image_line("unix:///h", "envrun-g-0", other, pinned, "r/x@sha256:d")
    assert line.status == "fail" and f"from image sha256:{'b' * 64}, not sha256:{'a' * 64}" in line.detail
    assert engine_image_line("unix:///h", "envrun-g-0", None, pinned, "r").status == "fail"
    stopped = replace(running, state="exited")
    assert "is exited" in engine_image_line("unix:///h", "envrun-g-0", stopped, pinned, "r").detail
    assert engine_image_line("unix:///h", "envrun-g-0", running, None, "r").status == "fail"


RACE = """
import sys
from pathlib import Path
from envbuild.errors import InputError
from envrun.cluster.state import ClusterState, claim_state
state = ClusterState("race", "starting", "r/x@sha256:" + "a" * 64, "b" * 64, ("unix:///e.sock",), None)
sys.stdin.readline()  # all started: claim at once
try:
    claim_state(Path(sys.argv[1]), state)
    print("recorded")
except InputError as exc:
    print(str(exc))
"""


def test_of_two_ups_of_one_name_one_records_it_and_the_others_are_refused(tmp_path: Path) -> None:
    """Once both wrote the state (the later over the earlier) after one existence check each, and the loser's
    roll-back removed the winner's file while its containers ran. Real processes, claiming at once."""
    import subprocess
    import sys

    claims = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    for claim in claims:
        assert claim.stdin is not None
        claim.stdin.write("go\n")
        claim.stdin.flush()
    said = sorted(claim.communicate(timeout=60)[0].strip() for claim in claims)
    refused = f"cluster race is already recorded ({state_path(tmp_path, 'race')}); `envrun cluster down race` first"
    assert said == [refused] * 5 + ["recorded"]
    state = load_state(tmp_path, "race")
    assert state is not None and state.phase == "starting"
    assert [p.name for p in (tmp_path / "clusters").iterdir()] == ["race.json"]  # no temporary file left


def test_a_roll_back_removes_only_the_state_it_recorded(tmp_path: Path) -> None:
    state = ClusterState("mine", "starting", "r/x@sha256:" + "a" * 64, "b" * 64, ("unix:///e.sock",), None)
    recorded = claim_state(tmp_path, state)
    save_state(tmp_path, replace(state, phase="up"))  # replaced since (another writer's file, another inode)
    remove_state(tmp_path, "mine", recorded)
    assert load_state(tmp_path, "mine") is not None
    remove_state(tmp_path, "mine", state_path(tmp_path, "mine").stat().st_ino)
    assert load_state(tmp_path, "mine") is None
