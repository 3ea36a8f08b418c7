"""A run plan as JSON and back, whole: what a scheduler's job carries to the machine that runs it.

:func:`envrun.planview.plan_to_json` is the record a user reads (``plan.json``); this is the plan itself, every
field, so that the job started by a scheduler (:mod:`envrun.injob`) runs exactly the plan envrun prepared
and checked on the submitting host, nothing re-derived there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envbuild.data.jsonout import fields_json
from envrun.plan import RunPlan, Volume
from envrun.preflightline import PreflightLine
from envrun.probe.request import ProbeRequest

RECORD_VERSION = 1


def plan_record(plan: RunPlan) -> dict[str, Any]:
    """Every field of ``plan`` (but what its launcher would start and how a scheduler's nodes start:
    neither travels in the plan), in the order they are declared."""
    return {"version": RECORD_VERSION, **fields_json(plan)}


def plan_from_record(document: dict[str, Any]) -> RunPlan:
    if document.get("version") != RECORD_VERSION:
        raise ValueError(f"a plan record of version {document.get('version')!r}; this envrun reads {RECORD_VERSION}")
    probe = document.get("probe")
    return RunPlan(
        recipe=document["recipe"],
        argv=tuple(document["argv"]),
        env=dict(document["env"]),
        backend=document["backend"],
        image=document.get("image"),
        lock_file=document["lock_file"],
        lock_sha256=document["lock_sha256"],
        config_name=document["config_name"],
        overrides=tuple(document["overrides"]),
        model=None if document.get("model") is None else Path(document["model"]),
        data_files=tuple(Path(p) for p in document.get("data_files") or ()),
        lenient_checkpoint=bool(document["lenient_checkpoint"]),
        run_dir=Path(document["run_dir"]),
        ray_address=document.get("ray_address"),
        preflight=tuple(
            PreflightLine(line["name"], line["status"], line["detail"], line.get("facts"))
            for line in document.get("preflight") or ()
        ),
        output_dir=None if document.get("output_dir") is None else Path(document["output_dir"]),
        volumes=tuple(Volume(v["host"], v["container"], v["mode"]) for v in document.get("volumes") or ()),
        probe=None
        if probe is None
        else ProbeRequest(
            probe["config_name"], tuple(probe["overrides"]), probe["entry_module"], dict(probe["skip_imports"])
        ),
        nnodes=document.get("nnodes"),
        npus_per_node=document.get("npus_per_node"),
        python=document.get("python") or "python3",
        transformers=document.get("transformers"),
    )
