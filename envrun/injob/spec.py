"""What a scheduler's job is given: the prepared plan and how its nodes start Ray (``job.json``), and who
each node is (its environment, set by the scheduler's rendering)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SPEC_VERSION = 1
JOB_DIR = "/opt/envrun/job"  # where a node's container sees the job's directory (spec, code, record)
NODE_PORTS = 50  # a node's block of Ray ports when nodes share a machine: its own ports, then its workers'

# Who a node is, as the scheduler's rendering says it (sbatch: from Slurm's variables; Kubernetes: the
# downward API and Volcano's task index).
INDEX_VAR = "ENVRUN_NODE_INDEX"  # 0 is the head
NAME_VAR = "ENVRUN_NODE_NAME"  # Slurm's node name, the pod's name
IP_VAR = "ENVRUN_NODE_IP"  # the address the node advertises (Slurm's NodeAddr, the pod's IP)
HEAD_VAR = "ENVRUN_HEAD"  # where the workers find the head (its address, or its DNS name)
MACHINES_VAR = "ENVRUN_MACHINES"  # each node's machine, in node order: nodes sharing one take turns at ports


@dataclass(frozen=True)
class InJob:
    """The job: the run plan as prepared and checked on the submitting host, and how its Ray starts."""

    plan: Mapping[str, Any]  # envrun.planrecord.plan_record; its run_dir is where the job records the run
    lenient: bool  # the recipe saves checkpoints leniently: the exports are audited after the trainer
    nnodes: int
    npus_per_node: int | None = None
    skip_checks: tuple[str, ...] = ()
    head_port: int = 6379
    dashboard_port: int = 8265
    hccl_ports: int = 60000
    node_ports: int | None = None  # first port of the per-node blocks (nodes sharing a machine); None: Ray's
    join_timeout: float = 600.0
    ray_start_args: tuple[str, ...] = ()  # appended to every node's `ray start`

    def to_json(self) -> dict[str, Any]:
        return {"version": SPEC_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, document: Any) -> InJob:
        """The spec ``document`` says; :class:`SpecError` naming every field of the wrong kind (a string where
        a list belongs would become one argument per character, a port of text would fail only inside Ray)."""
        if not isinstance(document, Mapping):
            raise SpecError(f"expected a JSON object (envrun's job spec), not {type(document).__name__}")
        if document.get("version") != SPEC_VERSION:
            raise SpecError(f"job spec version {document.get('version')!r}; this envrun reads {SPEC_VERSION}")
        problems = [f"field {name}: {why}" for name, why in _field_problems(document)]
        if problems:
            raise SpecError("; ".join(problems))
        return cls(
            plan=dict(document["plan"]),
            lenient=document["lenient"],
            nnodes=document["nnodes"],
            npus_per_node=document.get("npus_per_node"),
            skip_checks=tuple(document.get("skip_checks") or ()),
            head_port=document["head_port"],
            dashboard_port=document["dashboard_port"],
            hccl_ports=document["hccl_ports"],
            node_ports=document.get("node_ports"),
            join_timeout=float(document["join_timeout"]),
            ray_start_args=tuple(document.get("ray_start_args") or ()),
        )

    @property
    def lock_sha256(self) -> str:
        return str(self.plan["lock_sha256"])


class SpecError(ValueError):
    """A job spec envrun did not write (truncated, edited, of another kind): what is wrong, field by field."""


def _is_int(value: Any, low: int, high: int = 1 << 62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_port(value: Any) -> bool:
    return _is_int(value, 1, 65535)


def _is_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


_MISSING = object()
# (field, required: a null or absent optional one is its default, the check a value passes, what it must be)
_FIELDS: tuple[tuple[str, bool, Callable[[Any], bool], str], ...] = (
    ("plan", True, lambda v: isinstance(v, Mapping), "expected an object (the run plan)"),
    ("nnodes", True, lambda v: _is_int(v, 1), "expected a whole number, at least 1"),
    ("lenient", True, lambda v: isinstance(v, bool), "expected true or false"),
    ("join_timeout", True, _is_seconds, "expected seconds above 0"),
    ("head_port", True, _is_port, "expected a TCP port (1 to 65535)"),
    ("dashboard_port", True, _is_port, "expected a TCP port (1 to 65535)"),
    ("hccl_ports", True, _is_port, "expected a TCP port (1 to 65535)"),
    ("npus_per_node", False, lambda v: _is_int(v, 0), "expected a whole number of NPUs, or null"),
    ("node_ports", False, _is_port, "expected a TCP port (1 to 65535), or null"),
    ("skip_checks", False, _is_strings, "expected a list of check names"),
    ("ray_start_args", False, _is_strings, "expected a list of `ray start` arguments"),
)


def _field_problems(document: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, what is wrong with it) for each field of the wrong kind, in the spec's order."""
    plan = document.get("plan")
    found = [(name, document.get(name, _MISSING), required, ok, why) for name, required, ok, why in _FIELDS]
    if isinstance(plan, Mapping):
        lock = plan.get("lock_sha256", _MISSING)
        found.insert(4, ("plan.lock_sha256", lock, True, lambda v: isinstance(v, str), "expected the lock's sha256"))
    return [
        (name, f"missing; {why}" if value is _MISSING else f"{why}, not {json.dumps(value)[:60]}")
        for name, value, required, ok, why in found
        if (required or value not in (None, _MISSING)) and not ok(value)
    ]


def read_spec(path: Path) -> InJob:
    with open(path, encoding="utf-8") as f:
        return InJob.from_json(json.load(f))


@dataclass(frozen=True)
class NodeIdentity:
    index: int
    name: str
    ip: str | None
    head: str | None  # the head's address for workers (None on the head)
    machines: tuple[str, ...] = field(default=())

    @property
    def slot(self) -> int:
        """This node's place among the nodes on its machine (0, 1, …): its ports follow from it."""
        if not self.machines or self.index >= len(self.machines):
            return 0
        return self.machines[: self.index].count(self.machines[self.index])


def identity(env: Mapping[str, str] = os.environ) -> NodeIdentity:
    index_text = env.get(INDEX_VAR, "")
    if not (index_text.isascii() and index_text.isdigit()):
        raise ValueError(f"{INDEX_VAR}={index_text!r}: expected the node's index (0 for the head)")
    index = int(index_text)
    head = env.get(HEAD_VAR) or None
    if index and not head:
        raise ValueError(f"{HEAD_VAR} is not set: a worker needs the head's address")
    return NodeIdentity(
        index=index,
        name=env.get(NAME_VAR) or f"node-{index}",
        ip=env.get(IP_VAR) or None,
        head=head,
        machines=tuple(env.get(MACHINES_VAR, "").split()),
    )
