"""What a scheduler's job carries: the job spec (``job.json``) and envrun's own code (``code/``), which the
image's ``python3`` imports (the image holds the job's stack, not envrun)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path, PurePosixPath

from envbuild.fileio import write_atomic
from envrun.injob.spec import InJob
from envrun.plan import RunPlan
from envrun.planrecord import plan_record

PACKAGES = ("envbuild", "envrun")
CHECKOUT = Path(__file__).resolve().parents[2]
SPEC_FILE = "job.json"
CODE_DIR = "code"
RECORD_DIR = "record"  # the job's own run record, under the job's directory


def in_job(plan: RunPlan, record_dir: PurePosixPath, skip_checks: tuple[str, ...] = ()) -> InJob:
    """The spec a scheduler's job runs: ``plan`` with its record where the job writes it."""
    assert plan.nnodes and plan.scheduled is not None  # build_plan's promise for a scheduled run
    scheduled = plan.scheduled
    aimed = replace(plan, run_dir=Path(str(record_dir)), launch=None)
    return InJob(
        plan=plan_record(aimed),
        lenient=plan.lenient_checkpoint,
        nnodes=plan.nnodes,
        npus_per_node=plan.npus_per_node,
        skip_checks=skip_checks,
        head_port=scheduled.head_port,
        dashboard_port=scheduled.dashboard_port,
        hccl_ports=scheduled.hccl_ports,
        node_ports=scheduled.node_ports,
        join_timeout=scheduled.join_timeout,
        ray_start_args=scheduled.ray_start_args,
    )


def code_files() -> list[tuple[str, Path]]:
    """What the job carries of envrun: envbuild's and envrun's modules, sources only (each node compiles for
    its own Python), as (path under the checkout, file), in a stable order."""
    return [
        (source.relative_to(CHECKOUT).as_posix(), source)
        for package in PACKAGES
        for source in sorted((CHECKOUT / package).rglob("*.py"))
    ]


def write_code(target: Path) -> int:
    """:func:`code_files` under ``target``; returns the number of files."""
    files = code_files()
    for name, source in files:
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)
    return len(files)


def write_spec(target: Path, spec: InJob) -> None:
    write_atomic(target, json.dumps(spec.to_json(), indent=2, sort_keys=True) + "\n")
