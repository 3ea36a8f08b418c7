"""The `ray-resources` check on the Ray backend: the CPUs the job's first actors ask for against the
cluster's, and the ``ray.init`` arguments a job that joins a running cluster must not pass.

The verdict is a pure function of the nodes' answers (their shape is the real one: tests/test_cluster_ray.py
asserts the ok line from a real cluster); what Ray refuses on connect is asked of the real Ray.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from envrun.cluster.nodecheck import cluster_cpu_line
from envrun.probe.job_script import RAY_INIT_NEW_CLUSTER_ONLY

TQ_PARTS = [["TaskRunnerV1 (to be placed)", 1.0], ["TransferQueueController", 1.0], ["8 SimpleStorageUnit x 1", 8.0]]


def answers(cpus: tuple[float, ...], *, needed: float = 9.0, refused: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    facts = {"needed": needed, "parts": TQ_PARTS, "num_cpus": None, "detected": 2.0, "set_for_a_new_ray": refused}
    return [
        {"name": f"node-{i}", "cpu_resource": c, "probe": {"facts": {"ray_cpus": facts}}} for i, c in enumerate(cpus)
    ]


def test_the_actors_fit_the_cluster_s_cpus_together() -> None:
    line = cluster_cpu_line(answers((4.0, 6.0)))
    assert line is not None and line.status == "ok", line
    assert "ask for 9 CPU(s) at once" in line.detail
    assert "the cluster's 2 alive node(s) have 10 (node-0: 4, node-1: 6)" in line.detail


def test_too_few_cpus_on_the_cluster_would_hang_the_job() -> None:
    line = cluster_cpu_line(answers((2.0, 2.0)))
    assert line is not None and line.status == "fail"
    assert "have 4 (node-0: 2, node-1: 2): Ray would wait for them forever" in line.detail
    assert "ray start --num-cpus" in line.detail and "num_cpus=" not in line.detail  # no override to suggest


def test_a_node_that_did_not_answer_brings_no_cpus() -> None:
    nodes = answers((8.0, 8.0))
    nodes[1] = {"name": "node-1", "cpu_resource": 8.0, "error": "GetTimeoutError: ..."}
    line = cluster_cpu_line(nodes)
    assert line is not None and line.status == "fail" and "1 alive node(s) have 8 (node-0: 8)" in line.detail


def test_ray_init_num_cpus_is_refused_on_a_cluster_with_the_fix() -> None:
    line = cluster_cpu_line(answers((64.0, 64.0), refused=("num_cpus",)))
    assert line is not None and line.status == "fail"
    assert line.detail.startswith("ray_kwargs.ray_init.num_cpus set: on a Ray cluster")
    assert "drop the override" in line.detail


def test_no_probe_answer_no_line() -> None:
    assert cluster_cpu_line([{"name": "node-0", "cpu_resource": 2.0}]) is None


def test_the_real_ray_refuses_each_of_those_arguments_when_it_joins_a_cluster() -> None:
    """What the probe records as refused is what Ray 2.60 refuses: each raises before any connection is
    tried (a key Ray accepted would try to reach 127.0.0.1:9 and time this out)."""
    values = {"num_cpus": 1, "num_gpus": 1, "resources": {"x": 1}, "labels": {"a": "b"}}
    values |= {"object_store_memory": 10**8, "_node_name": "n"}
    assert set(values) == set(RAY_INIT_NEW_CLUSTER_ONLY)
    script = (
        "import json, sys, ray\n"
        "out = {}\n"
        "for key, value in json.loads(sys.argv[1]).items():\n"
        "    try:\n"
        "        ray.init(address='127.0.0.1:9', **{key: value})\n"
        "        out[key] = 'accepted'\n"
        "    except ValueError as exc:\n"
        "        out[key] = str(exc)\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(values)], capture_output=True, text=True, timeout=120, check=True
    )
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(said) == set(values)
    assert all("connecting to an existing cluster" in message for message in said.values()), said
