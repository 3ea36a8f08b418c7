"""A node's own check (envrun.injob.node) on its addresses, as a Slurm job's node runs it:
``python3 -m envrun.injob check`` with the identity node.sh gives it. A loopback address (Debian's
``127.0.1.1 HOSTNAME`` in /etc/hosts, Slurm's NodeAddr being the host's name) where the job spans machines
is refused at once, on every node, instead of every worker waiting for the head at its own loopback until
the join deadline. (This host has no image manifest: the lock part of each line refuses too.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envrun.injob.spec import InJob

REPO = Path(__file__).resolve().parents[1]


def check(tmp_path: Path, index: int, ip: str, head: str, machines: str) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(InJob(plan={"lock_sha256": "ab" * 32}, lenient=False, nnodes=2).to_json()))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ENVRUN_NODE_INDEX": str(index),
        "ENVRUN_NODE_NAME": f"n{index + 1}",
        "ENVRUN_NODE_IP": ip,
        "ENVRUN_HEAD": head,
        "ENVRUN_MACHINES": machines,
    }
    command = [sys.executable, "-m", "envrun.injob", "check", str(spec)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(
    ("index", "ip", "head", "said"),
    [
        (1, "10.0.0.2", "127.0.1.1", "the head's address 127.0.1.1: loopback"),
        (1, "127.0.1.1", "127.0.1.1", "its own address 127.0.1.1 and the head's address 127.0.1.1: loopback"),
        (0, "127.0.1.1", "", "its own address 127.0.1.1: loopback"),
    ],
)
def test_a_loopback_address_across_machines_is_refused_naming_it(
    tmp_path: Path, index: int, ip: str, head: str, said: str
) -> None:
    done = check(tmp_path, index, ip, head, "npu-a npu-b")
    assert done.returncode == 3 and done.stdout.count("\n") == 1
    assert (
        f"{said}, which the job's other machines (npu-a, npu-b) cannot reach; give each node a NodeAddr" in done.stdout
    )


@pytest.mark.parametrize(
    ("ip", "head", "machines"),
    [
        ("127.0.0.3", "127.0.0.2", "localhost localhost"),  # two nodes on one machine: loopback reaches both
        ("10.0.0.2", "10.0.0.1", "npu-a npu-b"),
        ("10.0.0.2", "glm5-head-0.glm5", ""),  # Kubernetes: a pod IP and the head's DNS name
    ],
)
def test_addresses_the_nodes_reach_are_not_refused(tmp_path: Path, ip: str, head: str, machines: str) -> None:
    done = check(tmp_path, 1, ip, head, machines)
    assert "loopback" not in done.stdout and "Traceback" not in done.stderr
