"""Every node checked before a job starts, and every node's exports audited after it: each node answers
for itself (:mod:`envrun.cluster.onnode`, a short Ray job with a task pinned to each alive node).

Before a job, each node answers what :class:`NodeAsk` asks (its lock and NPUs, the model, the data and the
job probe where the job runs, its network, the output directory's storage). A node on another lock, on an image envbuild did not build (no manifest), or that does not answer refuses
the job; so do fewer alive nodes with enough NPUs than ``nnodes × npus-per-node``, a model or data file
a node cannot read, and a probe problem on any node — each one line naming the node. The verdicts are
pure functions of the answers; the model's and the probe's are this host's own
(:func:`envrun.preflight.model_verdict`, :func:`envrun.probe.report.probe_lines`), on each node's answer
read into the same typed report.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuild.errors import EngineError, EnvbuildError
from envrun import ray_api
from envrun.cluster.onnode import MANIFEST, MARKER, TASK_TIMEOUT_SECONDS
from envrun.cluster.spec import same_address
from envrun.cluster.state import ClusterState, container_name
from envrun.preflightline import PreflightLine
from envrun.probe.report import RAY_RESOURCES, cpu_ask, ray_cpus_problem

if TYPE_CHECKING:  # the check runs inside the image too (envrun.injob), where no docker package is
    from envbuild.engine.jobs import ContainerState

CHECK = "ray-node"
JOB_TIMEOUT_SECONDS = TASK_TIMEOUT_SECONDS + 120
# What travels with the node job: the packages of envrun's own checks, uploaded by Ray.
PY_MODULES = [str(Path(__file__).resolve().parents[2] / name) for name in ("envbuild", "envrun")]
# Bytecode stays home: the node compiles for its own Python, and a package's hash must not change with
# what the submitting interpreter happened to write (each new hash is another upload to the cluster).
PY_MODULES_EXCLUDES = ["__pycache__/", "*.pyc"]

__all__ = ["CHECK", "MANIFEST", "NodeAsk", "ask_nodes", "node_lines"]


@dataclass(frozen=True)
class NodeAsk:
    """What every node is asked (the on-node spec)."""

    model: str | None = None
    data: tuple[str, ...] = ()
    probe: Mapping[str, Any] | None = None  # a ProbeRequest's JSON
    exports: Mapping[str, str] | None = None  # {"root", "pattern"}
    lock: bool = True
    network: bool = False  # the interfaces, HCCL's and Gloo's variables, and the all-pairs connect
    storage: str | None = None  # a directory that must be one storage for every node (the output directory)
    checkpoints: str | None = None  # after a run: every file under it, as each node sees it
    python: str = "python3"  # the job's interpreter, which runs the probe
    env: Mapping[str, str] | None = None  # the job's environment, for the probe and the model's names
    transformers: str | None = None  # the lock's: audits take their names from the model it builds

    def to_json(self) -> dict[str, Any]:
        asked = {
            "model": self.model,
            "data": list(self.data),
            "probe": dict(self.probe or {}),
            "exports": dict(self.exports or {}),
            "storage": self.storage,
            "checkpoints": self.checkpoints,
        }
        spec: dict[str, Any] = {"lock": self.lock, **{key: value for key, value in asked.items() if value}}
        if self.transformers and (self.model or self.exports):
            spec["transformers"] = self.transformers
        if "transformers" in spec or "probe" in spec:  # who runs the model's build or the probe, and with what
            spec["python"] = self.python
            spec["env"] = dict(self.env or {})
        if self.network:
            from envrun.cluster.onnet import NET_VARS, NOSET

            spec["network"] = True
            spec["network_env"] = {k: v for k, v in (self.env or {}).items() if k in (*NET_VARS, NOSET)}
        return spec


def ask_nodes(address: str, ask: NodeAsk = NodeAsk()) -> list[dict[str, Any]]:
    """Each alive node's answer: node_id, name, ip, npu_resource, and what ``ask`` asked (sorted by name)."""
    import json

    logs = ray_api.run_job(
        address,
        ["python3", "-m", "envrun.cluster.onnode", json.dumps(ask.to_json(), sort_keys=True)],
        timeout=JOB_TIMEOUT_SECONDS,
        submission_id=f"envrun-nodecheck-{uuid.uuid4().hex[:12]}",
        metadata={"envrun.purpose": "node check"},
        runtime_env={"py_modules": PY_MODULES, "excludes": PY_MODULES_EXCLUDES},
    )
    for line in reversed(logs.splitlines()):
        if line.startswith(MARKER):
            answers = json.loads(line[len(MARKER) :])
            return sorted(answers, key=lambda a: (a.get("name", ""), a.get("node_id", "")))
    raise EngineError(f"{address}: the node check printed no answer; its output ends: {logs.strip()[-300:]}")


def node_label(answer: Mapping[str, Any]) -> str:
    return f"node {answer.get('name')} (ip {answer.get('ip')}, Ray node {answer.get('node_id')})"


def node_lines(
    answers: list[dict[str, Any]], lock_sha256: str, lock_file: str, ips: Mapping[str, str] | None = None
) -> tuple[PreflightLine, ...]:
    """One line per node: ok when it runs ``lock_sha256`` and advertises the address ``ips`` gives its name
    (the cluster file's); the answer itself rides along for the record."""
    if not answers:
        return (PreflightLine(CHECK, "fail", "the cluster has no alive node"),)
    lines = []
    for answer in answers:
        who, found = node_label(answer), answer.get("lock_sha256")
        devices = answer.get("devices") or []
        npus = f"{len(devices)} NPU(s) visible{' (' + ', '.join(devices) + ')' if devices else ''}"
        npus += f", Ray NPU resource {answer.get('npu_resource', 0):g}"
        facts = {k: v for k, v in answer.items() if k not in ("probe", "model", "data", "exports")}
        if answer.get("error"):
            failure = f"{who} did not answer: {answer['error']}"
        elif answer.get("answered_from") != answer.get("node_id"):
            # The task was pinned to the node asked (soft=False): another node's answer is not this node's.
            failure = f"{who}: the answer came from Ray node {answer.get('answered_from')}, not this node"
        elif (wanted := (ips or {}).get(str(answer.get("name")))) and not same_address(str(answer.get("ip")), wanted):
            failure = (
                f"{who} advertises {answer.get('ip')}, not {wanted} (the cluster file's ip): the other nodes and the "
                "job's HCCL and Gloo would reach it at another address"
            )
        elif found is None:
            reason = answer.get("manifest_problem") or "no lock digest"
            failure = f"{who} runs no envbuild image ({MANIFEST}: {reason})"
        elif found != lock_sha256:
            failure = f"{who} runs lock sha256 {found}, not {lock_file} (sha256 {lock_sha256})"
        else:
            lines.append(PreflightLine(CHECK, "ok", f"{who} runs lock sha256 {found}; {npus}", facts))
            continue
        lines.append(PreflightLine(CHECK, "fail", failure, facts))
    return tuple(lines)


def job_address_line(answers: list[dict[str, Any]], head_ip: str | None) -> PreflightLine | None:
    """Where the job's driver connects (``RAY_ADDRESS``, as Ray's job manager sets it for every job) is the
    head at the cluster file's address; None when the file gives the head none."""
    told = next((a.get("job_ray_address") for a in answers if a.get("job_ray_address")), None)
    if not head_ip:
        return None
    if not told:
        return PreflightLine(CHECK, "fail", "the node check's driver was given no RAY_ADDRESS: not a Ray job?")
    host = str(told).rsplit(":", 1)[0]
    if not same_address(host, head_ip):
        return PreflightLine(
            CHECK,
            "fail",
            f"a job's driver connects through RAY_ADDRESS={told}, not the head's address {head_ip} (the cluster file's ip)",
        )
    return PreflightLine(CHECK, "ok", f"a job's driver connects through RAY_ADDRESS={told}, the head's address")


def capacity_line(answers: list[dict[str, Any]], nnodes: int | None, npus_per_node: int | None) -> PreflightLine:
    """Enough alive nodes, each with enough NPUs, for ``nnodes × npus_per_node`` (verl places one bundle of
    ``npus_per_node`` NPUs on each of ``nnodes`` nodes)."""
    if nnodes is None or npus_per_node is None:
        return PreflightLine(CHECK, "skip", "the run's overrides do not set nnodes and NPUs per node")
    have = [(a.get("name"), float(a.get("npu_resource") or 0)) for a in answers if not a.get("error")]
    enough = [name for name, npus in have if npus >= npus_per_node]
    there = ", ".join(f"{name}: {npus:g}" for name, npus in have) or "none"
    need = f"the run needs {nnodes} node(s) x {npus_per_node} NPU(s)"
    if len(enough) < nnodes:
        return PreflightLine(
            CHECK,
            "fail",
            f"{need}; the cluster has {len(have)} alive node(s), {len(enough)} with {npus_per_node} NPU(s) or more "
            f"(NPU resource per node: {there})",
        )
    return PreflightLine(CHECK, "ok", f"{need}; {len(enough)} alive node(s) have them ({there})")


def cluster_cpu_line(answers: list[dict[str, Any]]) -> PreflightLine | None:
    """The CPUs the job's first Ray actors ask for at once (the probe's facts, from the first node that
    ran it) against the cluster's: the job's ``ray.init`` joins the running cluster, which neither grows
    for ``ray_init.num_cpus`` nor accepts it (Ray raises at connect). None: no node ran the probe."""
    facts = next(
        (
            found
            for a in answers
            if isinstance(a.get("probe"), dict)
            and isinstance(found := (a["probe"].get("facts") or {}).get("ray_cpus"), dict)
            and ray_cpus_problem(found) is None  # else that node's probe line says what is wrong
        ),
        None,
    )
    if facts is None:
        return None
    alive = [(a.get("name"), float(a.get("cpu_resource") or 0)) for a in answers if not a.get("error")]
    total = sum(cpus for _, cpus in alive)
    have = f"the cluster's {len(alive)} alive node(s) have {total:g} ({', '.join(f'{n}: {c:g}' for n, c in alive)})"
    asks = f"{cpu_ask(facts)}; {have}"
    refused = [str(key) for key in facts.get("set_for_a_new_ray") or ()]
    if refused:
        flags = ", ".join(f"ray_kwargs.ray_init.{key}" for key in refused)
        return PreflightLine(
            RAY_RESOURCES,
            "fail",
            f"{flags} set: on a Ray cluster the job's ray.init connects to the running cluster, and Ray refuses "
            f'them there ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided"); '
            f"drop the override ({asks}; a node's CPUs are its `ray start --num-cpus`, `ray_start_args` in the "
            "cluster file)",
            dict(facts),
        )
    if float(facts["needed"]) > total:
        return PreflightLine(
            RAY_RESOURCES,
            "fail",
            f"{asks}: Ray would wait for them forever; give the nodes more CPUs (`ray start --num-cpus`, "
            "`ray_start_args` in the cluster file)",
            dict(facts),
        )
    return PreflightLine(RAY_RESOURCES, "ok", asks, dict(facts))


def model_lines(answers: list[dict[str, Any]]) -> tuple[PreflightLine, ...]:
    """The model audited on each node, at the path the job reads there, judged as this host's is."""
    from envrun.checkpoint.audit import ModelAudit
    from envrun.preflight import model_verdict

    return tuple(
        model_verdict(ModelAudit.of_answer(answer["model"]), node_label(answer))
        for answer in answers
        if isinstance(answer.get("model"), dict)
    )


def data_lines(answers: list[dict[str, Any]], files: int) -> tuple[PreflightLine, ...]:
    return tuple(
        PreflightLine("data", "fail", f"{node_label(answer)}: " + "; ".join(answer["data"]))
        if answer["data"]
        else PreflightLine("data", "ok", f"{node_label(answer)}: {files} parquet file(s)")
        for answer in answers
        if "data" in answer
    )


def probe_lines_of(answers: list[dict[str, Any]]) -> tuple[PreflightLine, ...]:
    from envrun.probe.report import probe_lines, report_from_json

    lines: list[PreflightLine] = []
    for answer in answers:
        if isinstance(answer.get("probe"), dict):
            lines.extend(probe_lines(report_from_json(node_label(answer), answer["probe"])))
    return tuple(lines)


def engine_image_lines(state: ClusterState) -> tuple[PreflightLine, ...]:
    """For a cluster ``envrun cluster up`` started: each node's container as its host's engine sees it
    (not as the node reports itself) runs the image the cluster was pinned to, by image ID."""
    from envrun.cluster.engines import each_connected, reached

    lines = []
    with each_connected(state.engines, state.connect_timeout) as engines:
        for index, url in enumerate(state.engines):
            name = container_name(state.name, index)
            try:
                engine = reached(engines[url])
                container = engine.container(name)
                pinned = engine.inspect(state.image)
            except EnvbuildError as exc:
                lines.append(PreflightLine(CHECK, "fail", f"{url}: cannot ask the engine about {name}: {exc}"))
                continue
            lines.append(engine_image_line(url, name, container, pinned, state.image))
    return tuple(lines)


def engine_image_line(
    url: str, name: str, container: ContainerState | None, pinned: Mapping[str, Any] | None, image: str
) -> PreflightLine:
    """The verdict for one node container (pure): running, and on the pinned image's ID."""
    if container is None or not container.running:
        state = "gone" if container is None else container.state
        return PreflightLine(CHECK, "fail", f"{url}: the node container {name} is {state}; `envrun cluster status`")
    if pinned is None:
        return PreflightLine(CHECK, "fail", f"{url}: the engine no longer holds {image}, the cluster's pinned image")
    if container.image_id != pinned.get("Id"):
        return PreflightLine(
            CHECK,
            "fail",
            f"{url}: the engine runs {name} from image {container.image_id}, not {pinned.get('Id')} ({image}, "
            "the image the cluster was started from)",
        )
    return PreflightLine(CHECK, "ok", f"{url}: the engine runs {name} from {container.image_id} ({image}, pinned)")
