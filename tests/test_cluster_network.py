"""The network verdicts before a job (envrun.cluster.network): pure functions of the nodes' answers, as
the nodes give them (tests/test_cluster_ray.py has them asked of real nodes), and the interfaces read
from this machine's own kernel."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from envrun.cluster import onnet
from envrun.cluster.netifs import carrier, interfaces
from envrun.cluster.network import (
    NodeNet,
    interface_line,
    network_lines,
    npu_line,
    port_lines,
    reach_line,
)
from envrun.cluster.onnet import first_host_port, meet, parse_ports

ETH = {"eth0": ["10.0.0.1/24", "fe80::1/64"], "ib0": ["192.168.0.1/24"], "lo": ["127.0.0.1/8", "::1/128"]}


def answer(name: str = "n1", ip: str = "10.0.0.1", hostname: str = "host-a", **env: str) -> dict[str, Any]:
    return {"name": name, "ip": ip, "network": {"interfaces": ETH, "env": env, "hostname": hostname}}


def node(job_env: dict[str, str] | None = None, **kwargs: Any) -> NodeNet:
    found = NodeNet.from_answer(answer(**kwargs), job_env or {})
    assert found is not None
    return found


def test_this_machines_interfaces_are_read_from_the_kernel() -> None:
    found = interfaces()
    assert "127.0.0.1/8" in found["lo"]
    assert carrier(found, "127.0.0.1") == carrier(found, "127.0.0.9") == "lo"  # lo takes all of 127/8
    assert carrier(found, "203.0.113.77") is None


def test_the_interface_carrying_the_nodes_address_is_ok() -> None:
    line = interface_line(node(HCCL_IF_IP="10.0.0.1", HCCL_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0"), 2)
    assert line.status == "ok" and "on eth0, which carries 10.0.0.1" in line.detail
    assert interface_line(node(HCCL_SOCKET_IFNAME="eth"), 2).status == "ok"  # HCCL matches a prefix


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"GLOO_SOCKET_IFNAME": "eth9"}, "GLOO_SOCKET_IFNAME=eth9 names no interface of this node (it has: eth0 10.0"),
        ({"GLOO_SOCKET_IFNAME": "eth"}, "GLOO_SOCKET_IFNAME=eth names no interface"),  # Gloo takes whole names
        ({"HCCL_SOCKET_IFNAME": "ib0"}, "HCCL_SOCKET_IFNAME=ib0, but the address Ray advertises (10.0.0.1) is on eth0"),
        ({"HCCL_SOCKET_IFNAME": "=eth"}, "HCCL_SOCKET_IFNAME==eth names no interface"),  # '=': exactly
        ({"HCCL_IF_IP": "192.168.0.1"}, "HCCL_IF_IP=192.168.0.1, but the node advertises 10.0.0.1 to Ray"),
    ],
)
def test_an_interface_or_address_that_misses_the_nodes_is_refused(env: dict[str, str], said: str) -> None:
    line = interface_line(node(**env), 2)
    assert line.status == "fail" and said in line.detail and "node n1 (ip 10.0.0.1)" in line.detail


def test_the_jobs_variables_are_laid_over_the_nodes() -> None:
    line = interface_line(node({"GLOO_SOCKET_IFNAME": "ib0"}, GLOO_SOCKET_IFNAME="eth0"), 2)
    assert line.status == "fail" and "GLOO_SOCKET_IFNAME=ib0" in line.detail


def test_nothing_naming_the_interface_is_refused_only_across_nodes() -> None:
    many = interface_line(node(), 2)
    assert many.status == "fail" and "they pick the first they find" in many.detail and "(eth0)" in many.detail
    assert interface_line(node(), 1).status == "ok"


def test_hccl_port_syntax() -> None:
    assert parse_ports("60000-60050") == [range(60000, 60051)]
    assert parse_ports("56000, 60100-60110") == [range(56000, 56001), range(60100, 60111)]
    assert parse_ports("auto") is None
    for bad in ("60000-", "6e4", "0-10", "70000", "10-5", "²"):
        with pytest.raises(ValueError):
            parse_ports(bad)


def test_nodes_of_one_host_on_the_same_hccl_ports_are_refused() -> None:
    both = [node(name="n1"), node(name="n2", ip="10.0.0.1")]  # neither sets ports: HCCL's defaults, twice
    (line,) = port_lines(both)
    assert line.status == "fail" and "host host-a (n1, n2)" in line.detail
    assert "nodes n1 and n2 share HCCL host ports 60000-60015" in line.detail and "HCCL's default" in line.detail
    apart = [
        node(name="n1", HCCL_HOST_SOCKET_PORT_RANGE="60000-60063", HCCL_NPU_SOCKET_PORT_RANGE="60064-60127"),
        node(name="n2", HCCL_HOST_SOCKET_PORT_RANGE="60128-60191", HCCL_NPU_SOCKET_PORT_RANGE="60192-60255"),
    ]
    assert [line.status for line in port_lines(apart)] == ["ok"]
    overlapping = [apart[0], node(name="n2", HCCL_IF_BASE_PORT="60050", HCCL_NPU_SOCKET_PORT_RANGE="auto")]
    (clash,) = port_lines(overlapping)
    assert clash.status == "fail" and "share HCCL host ports 60050-60063" in clash.detail
    elsewhere = [node(name="n1"), node(name="n2", hostname="host-b")]  # two hosts: the same ports are fine
    assert port_lines(elsewhere) == []
    (unreadable,) = port_lines([node(name="n1", HCCL_HOST_SOCKET_PORT_RANGE="lots"), node(name="n2")])
    assert unreadable.status == "fail" and "not HCCL's port syntax (lots)" in unreadable.detail


def test_a_node_that_cannot_reach_another_is_refused_naming_both() -> None:
    connects = [
        {"to": "n2", "ip": "10.0.0.2", "port": 40001, "what": "Ray's node manager", "error": None},
        {"to": "n2", "ip": "10.0.0.2", "port": 60000, "what": "the HCCL host port", "error": "Connection refused"},
    ]
    found = {**answer(), "reach": {"listen": {"port": 60000, "error": None}, "connects": connects}}
    line = reach_line(found)
    assert line.status == "fail"
    assert "cannot reach n2 at 10.0.0.2:60000 (the HCCL host port): Connection refused" in line.detail
    connects[1]["error"] = None
    assert reach_line(found).status == "ok"
    found["reach"]["listen"] = {"port": 60000, "error": "cannot listen on 10.0.0.1 port 60000: Address already in use"}
    assert "Address already in use" in reach_line(found).detail
    assert reach_line({**answer(), "reach": {"error": "GetTimeoutError: x"}}).status == "fail"


def test_a_run_on_npus_needs_ray_to_count_them_and_leave_them_visible() -> None:
    counted = {**answer(), "npu_resource": 16, "gpu_resource": 0}
    nodes = [node(RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES="1")]
    assert npu_line([counted], nodes, 16).status == "ok"
    gpus = npu_line([{**counted, "npu_resource": 0, "gpu_resource": 8}], nodes, 16)
    assert gpus.status == "fail" and "Ray counts 8 GPU(s) and no NPU" in gpus.detail
    unset = npu_line([counted], [node()], 16)
    assert unset.status == "fail" and "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES is not 1" in unset.detail
    assert npu_line([counted], [node()], None).status == "skip"


def test_every_verdict_of_a_cluster() -> None:
    reach = {"listen": {"port": 60000, "error": None}, "connects": []}
    answers = [
        {**answer("n1", HCCL_IF_IP="10.0.0.1", HCCL_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0"), "reach": reach},
        {**answer("n2", hostname="host-b", GLOO_SOCKET_IFNAME="eth0"), "reach": reach},
        {"name": "n3", "error": "GetTimeoutError"},  # a node that did not answer is judged by the node check
    ]
    lines = network_lines(answers, {}, None)
    assert [line.status for line in lines] == ["ok", "ok", "ok", "ok", "skip"]


def free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def test_two_nodes_meet_each_listening_and_connecting_at_once() -> None:
    """The node side of the all-pairs connect on real sockets (two loopback addresses, two threads): each
    listens, connects to the other (which may not listen yet), and is connected to."""
    ports = {"127.0.0.2": free_port("127.0.0.2"), "127.0.0.3": free_port("127.0.0.3")}
    other = {"127.0.0.2": "127.0.0.3", "127.0.0.3": "127.0.0.2"}
    with ThreadPoolExecutor(2) as pool:
        done = {
            ip: pool.submit(
                meet,
                ip,
                ports[ip],
                [{"to": other[ip], "ip": other[ip], "port": ports[other[ip]], "what": "hccl"}],
                1,
                ip,
            )
            for ip in ports
        }
    for ip, future in done.items():
        found = future.result()
        assert found["listen"] == {"port": ports[ip], "error": None}
        assert [c["error"] for c in found["connects"]] == [None] and found["accepted"] == 1


def test_a_port_another_process_holds_and_a_peer_that_never_listens_are_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnet, "MEET_SECONDS", 1.0)
    with socket.socket() as holder:
        holder.bind(("127.0.0.2", 0))
        holder.listen(1)
        taken = holder.getsockname()[1]
        silent = free_port("127.0.0.3")
        found = meet("127.0.0.2", taken, [{"to": "n2", "ip": "127.0.0.3", "port": silent, "what": "hccl"}], 1, "n1")
    assert "cannot listen on 127.0.0.2 port" in found["listen"]["error"] and "in use" in found["listen"]["error"]
    (connect,) = found["connects"]
    assert connect["error"] and "refused" in connect["error"].lower()
    line = reach_line({"name": "n1", "ip": "127.0.0.2", "reach": found})
    assert line.status == "fail" and "cannot reach n2 at 127.0.0.3" in line.detail and "in use" in line.detail


def test_the_node_listens_where_the_verdict_reads_hccls_first_port() -> None:
    assert first_host_port({}) == 60000  # HCCL's default
    assert first_host_port({"HCCL_IF_BASE_PORT": "50000"}) == 50000
    assert first_host_port({"HCCL_HOST_SOCKET_PORT_RANGE": "61000-61063", "HCCL_IF_BASE_PORT": "50000"}) == 61000
    assert first_host_port({"HCCL_HOST_SOCKET_PORT_RANGE": "auto"}) is None  # the OS picks
    assert first_host_port({"HCCL_HOST_SOCKET_PORT_RANGE": "lots"}) is None  # unreadable: the verdict says so
