"""What runs on the nodes of a Ray cluster: a short job whose driver runs one task pinned to each alive node
(``NodeAffinitySchedulingStrategy``, ``soft=False``, no CPU asked so a busy node still answers), and prints
every node's answer as one ``MARKER`` line.

It travels with the job (Ray's ``runtime_env`` ``py_modules``: this package and ``envbuild``), so a node
runs envrun's own checks with the image's Python, on the node's own files:

- ``lock``: the lock digest the image recorded (``/opt/envbuild/meta/manifest.json``) and the NPUs the
  node's container sees;
- ``model``: the checkpoint audit of the model directory, at the path the job will read there, against
  the names the model built by the job's interpreter there gives when the lock pins transformers;
- ``data``: each training file exists and is parquet, at that path;
- ``probe``: the job probe (:mod:`envrun.probe.job_script`) with the node's interpreter and environment;
- ``exports``: after a run, every Hugging Face export under the trainer's checkpoint directory, audited
  on the node that holds it;
- ``storage``: whether the job's output directory is one storage for every node (:mod:`envrun.cluster.onstore`);
  ``checkpoints``: after a run, every file under the checkpoint directory, as this node sees it;
- ``network``: the node's interfaces and the variables that choose HCCL's and Gloo's, and every node
  tried from every other on the ports the job needs (:mod:`envrun.cluster.onnet`).

Only the standard library, Ray and envrun's checkpoint audit are imported here: the node has no more.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

MARKER = "ENVRUN-NODES "
MANIFEST = "/opt/envbuild/meta/manifest.json"
TASK_TIMEOUT_SECONDS = 900.0  # the probe imports verl's stack; a node's first import may be slow


def lock_facts() -> dict[str, Any]:
    try:
        with open(MANIFEST, encoding="utf-8") as f:
            lock, problem = json.load(f).get("lock_sha256"), ""
    except (OSError, ValueError) as exc:
        lock, problem = None, f"{type(exc).__name__}: {exc}"
    devices = sorted(p for p in glob.glob("/dev/davinci*") if p[len("/dev/davinci") :].isdigit())
    return {
        "lock_sha256": lock,
        "manifest_problem": problem,
        "devices": devices,
        "visible_devices": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
        "hostname": socket.gethostname(),
    }


def names_for(spec: dict[str, Any]) -> Any:
    """The source of expected names on this node, chosen as on the host
    (:func:`envrun.checkpoint.modelnames.job_names`): the model built by the job's interpreter here when
    the lock pins transformers (``spec["transformers"]``), else None (envrun's static description)."""
    from envrun.checkpoint.modelnames import job_names

    python, env = spec.get("python") or "python3", dict(spec.get("env") or {})
    return job_names(spec.get("transformers") or None, python, env, f"on node {socket.gethostname()}")


def audit(path: str, names: Any = None) -> dict[str, Any]:
    """The checkpoint audit of ``path`` on this node, worded as on the host
    (:func:`envrun.checkpoint.audit.audit_model`)."""
    from envbuild.data.jsonout import to_jsonable
    from envrun.checkpoint.audit import audit_model

    answer: dict[str, Any] = to_jsonable(audit_model(path, names))
    return answer


def data(paths: list[str]) -> list[str]:
    from envrun.datafiles import parquet_problem

    return [problem for problem in (parquet_problem(Path(p)) for p in paths) if problem]


def probe(request: dict[str, Any], python: str, env: dict[str, str]) -> dict[str, Any]:
    """The job probe with the job's interpreter on this node (``python`` on the job's PATH, as the job's
    own command finds it) and the job's environment over the node's."""
    from envrun.probe.job_script import MARKER as PROBE_MARKER

    source = (Path(__file__).parent.parent / "probe" / "job_script.py").read_text(encoding="utf-8")
    job_env = {**os.environ, **env}
    found = shutil.which(python, path=job_env.get("PATH"))
    if found is None:
        return {"crash": f"{python}: not found on this node's PATH (the job's interpreter)"}
    try:
        done = subprocess.run(
            [found, "-c", source, json.dumps(request)],
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=TASK_TIMEOUT_SECONDS,
            env=job_env,
        )
    except subprocess.TimeoutExpired:
        return {"crash": f"the probe did not finish in {TASK_TIMEOUT_SECONDS:g} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(PROBE_MARKER)]
    if not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return {"crash": f"the probe gave no answer (exit {done.returncode}): {tail}"}
    answer: dict[str, Any] = json.loads(lines[-1][len(PROBE_MARKER) :])
    return answer


def exports(root: str, pattern: str, names: Any = None) -> dict[str, Any]:
    """Every export under ``root`` on this node, audited here (one model build for every step's export:
    ``names`` asks once per config.json); whether ``root`` exists here at all."""
    if not os.path.isdir(root):
        return {"root": root, "present": False, "audits": []}
    found = sorted(p for p in glob.glob(os.path.join(glob.escape(root), pattern)) if os.path.isdir(p))
    return {"root": root, "present": True, "audits": [audit(p, names) for p in found]}


def node_answer(spec: dict[str, Any]) -> dict[str, Any]:
    """Everything ``spec`` asks of this node."""
    import ray

    answer: dict[str, Any] = {"answered_from": ray.get_runtime_context().get_node_id()}
    if spec.get("lock", True):
        answer.update(lock_facts())
    if spec.get("model"):
        answer["model"] = audit(spec["model"], names_for(spec))
    if spec.get("data"):
        answer["data"] = data(list(spec["data"]))
    if spec.get("probe"):
        answer["probe"] = probe(spec["probe"], spec.get("python") or "python3", dict(spec.get("env") or {}))
    if spec.get("exports"):
        answer["exports"] = exports(spec["exports"]["root"], spec["exports"]["pattern"], names_for(spec))
    if spec.get("network"):
        from envrun.cluster.onnet import network_facts

        answer["network"] = network_facts()
    if spec.get("checkpoints"):
        from envrun.cluster.onstore import listing

        answer["checkpoints"] = listing(spec["checkpoints"])
    return answer


def main(argv: list[str]) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    spec = json.loads(argv[0])
    # Where a job's driver connects, as Ray's job manager tells it (every job's driver is told the same).
    job_address = os.environ.get("RAY_ADDRESS")
    ray.init()
    remote = ray.remote(num_cpus=0, max_retries=0)(node_answer)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    pending = [
        remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(spec)
        for n in nodes
    ]
    answers = []
    for node, ref in zip(nodes, pending):
        answer = {
            "node_id": node["NodeID"],
            "name": node.get("NodeName") or node["NodeManagerAddress"],
            "ip": node["NodeManagerAddress"],
            "npu_resource": node.get("Resources", {}).get("NPU", 0),
            "cpu_resource": node.get("Resources", {}).get("CPU", 0),
            "gpu_resource": node.get("Resources", {}).get("GPU", 0),
            "job_ray_address": job_address,
        }
        try:
            found: dict[str, Any] = ray.get(ref, timeout=TASK_TIMEOUT_SECONDS)
            answer.update(found)
        except Exception as exc:  # a node that cannot answer is an answer too
            answer["error"] = (type(exc).__name__ + ": " + str(exc)).splitlines()[0]
        answers.append(answer)
    if spec.get("network"):
        _reach(answers, nodes, spec, job_address)
    if spec.get("storage"):
        _shared(answers, nodes, spec["storage"])
    print(MARKER + json.dumps(answers, sort_keys=True), flush=True)
    return 0


def _reach(answers: list[dict[str, Any]], nodes: list[dict[str, Any]], spec: dict[str, Any], gcs: str | None) -> None:
    """Every node tried from every other (:func:`envrun.cluster.onnet.reach`), into each node's answer."""
    from envrun.cluster.onnet import reach

    own = {a["node_id"]: dict((a.get("network") or {}).get("env") or {}) for a in answers}
    try:
        found = reach(nodes, own, dict(spec.get("network_env") or {}), gcs)
    except Exception as exc:  # the check that could not run is an answer too
        problem = (type(exc).__name__ + ": " + str(exc)).splitlines()[0]
        found = {n["NodeID"]: {"error": problem} for n in nodes}
    for answer in answers:
        answer["reach"] = found.get(answer["node_id"], {"error": "no answer"})


def _shared(answers: list[dict[str, Any]], nodes: list[dict[str, Any]], root: str) -> None:
    """Whether ``root`` is one storage for every node (:func:`envrun.cluster.onstore.shared`)."""
    import uuid

    from envrun.cluster.onstore import shared

    try:
        found = shared(nodes, root, uuid.uuid4().hex)
    except Exception as exc:
        problem = (type(exc).__name__ + ": " + str(exc)).splitlines()[0]
        found = {n["NodeID"]: {"path": root, "error": f"the check did not run: {problem}", "sees": []} for n in nodes}
    for answer in answers:
        answer["storage"] = found.get(answer["node_id"], {"path": root, "error": "no answer", "sees": []})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
