"""Every node checked before a job starts: each alive node of the cluster says which lock it runs.

The answer comes from the node itself, never from the client: a short Ray job runs one task pinned to
each alive node (``NodeAffinitySchedulingStrategy``, ``soft=False``, no CPU asked so a busy node still
answers), which reads the lock digest the image recorded in ``/opt/envbuild/meta/manifest.json`` and
lists the NPUs the node's container sees. A node on another lock, on an image envbuild did not build
(no manifest), or that does not answer, refuses the job before it is submitted — naming the node and
what it runs. The verdict is a pure function of the answers, one preflight line per node.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from envbuild.errors import EngineError
from envrun import ray_api
from envrun.plan import PreflightLine

CHECK = "ray-node"
MARKER = "ENVRUN-NODES "
TIMEOUT_SECONDS = 300.0
MANIFEST = "/opt/envbuild/meta/manifest.json"

# Runs on the cluster as the job's driver, with the cluster's own Python and Ray (standard library + ray).
PROBE = f"""
import glob, json, os, socket
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

@ray.remote(num_cpus=0, max_retries=0)
def facts():
    try:
        with open({MANIFEST!r}, encoding="utf-8") as f:
            lock, problem = json.load(f).get("lock_sha256"), ""
    except (OSError, ValueError) as exc:
        lock, problem = None, f"{{type(exc).__name__}}: {{exc}}"
    devices = sorted(p for p in glob.glob("/dev/davinci*") if p[len("/dev/davinci"):].isdigit())
    return {{"lock_sha256": lock, "manifest_problem": problem, "devices": devices,
            "visible_devices": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), "hostname": socket.gethostname(),
            "answered_from": ray.get_runtime_context().get_node_id()}}

ray.init()
nodes = [n for n in ray.nodes() if n["Alive"]]
pending = [facts.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
           for n in nodes]
answers = []
for node, ref in zip(nodes, pending):
    answer = {{"node_id": node["NodeID"], "name": node.get("NodeName") or node["NodeManagerAddress"],
              "ip": node["NodeManagerAddress"], "npu_resource": node.get("Resources", {{}}).get("NPU", 0)}}
    try:
        answer.update(ray.get(ref, timeout={TIMEOUT_SECONDS / 2}))
    except Exception as exc:
        answer["error"] = (type(exc).__name__ + ": " + str(exc)).splitlines()[0]
    answers.append(answer)
print({MARKER!r} + json.dumps(answers, sort_keys=True), flush=True)
"""


def ask_nodes(address: str) -> list[dict[str, Any]]:
    """Each alive node's answer: node_id, name, ip, lock_sha256 (None without a manifest), devices, …"""
    logs = ray_api.run_job(
        address,
        ["python3", "-c", PROBE],
        timeout=TIMEOUT_SECONDS,
        submission_id=f"envrun-nodecheck-{uuid.uuid4().hex[:12]}",
        metadata={"envrun.purpose": "node check"},
    )
    for line in reversed(logs.splitlines()):
        if line.startswith(MARKER):
            answers = json.loads(line[len(MARKER) :])
            return sorted(answers, key=lambda a: (a.get("name", ""), a.get("node_id", "")))
    raise EngineError(f"{address}: the node check printed no answer; its output ends: {logs.strip()[-300:]}")


def node_label(answer: dict[str, Any]) -> str:
    return f"node {answer.get('name')} (ip {answer.get('ip')}, Ray node {answer.get('node_id')})"


def node_lines(answers: list[dict[str, Any]], lock_sha256: str, lock_file: str) -> tuple[PreflightLine, ...]:
    """One line per node: ok when it runs ``lock_sha256``; the answer itself rides along for the record."""
    if not answers:
        return (PreflightLine(CHECK, "fail", "the cluster has no alive node"),)
    lines = []
    for answer in answers:
        who, found = node_label(answer), answer.get("lock_sha256")
        devices = answer.get("devices") or []
        npus = f"{len(devices)} NPU(s) visible{' (' + ', '.join(devices) + ')' if devices else ''}"
        npus += f", Ray NPU resource {answer.get('npu_resource', 0):g}"
        if answer.get("error"):
            line = PreflightLine(CHECK, "fail", f"{who} did not answer: {answer['error']}", answer)
        elif found is None:
            reason = answer.get("manifest_problem") or "no lock digest"
            line = PreflightLine(CHECK, "fail", f"{who} runs no envbuild image ({MANIFEST}: {reason})", answer)
        elif found != lock_sha256:
            line = PreflightLine(
                CHECK, "fail", f"{who} runs lock sha256 {found}, not {lock_file} (sha256 {lock_sha256})", answer
            )
        else:
            line = PreflightLine(CHECK, "ok", f"{who} runs lock sha256 {found}; {npus}", answer)
        lines.append(line)
    return tuple(lines)
