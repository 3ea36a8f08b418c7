"""The run plan as people and scripts read it, by pure functions: ``plan.json`` (:func:`plan_to_json`),
``--dry-run --json`` and the dry run's text, with the launch each backend would start."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from envbuild.data.jsonout import to_jsonable
from envbuild.terminal import wrap
from envrun.plan import RunPlan


def plan_to_json(plan: RunPlan) -> dict[str, Any]:
    return {
        "argv": list(plan.argv),
        "env": dict(plan.env),
        "backend": plan.backend,
        "preflight": to_jsonable(plan.preflight),
        "image": plan.image,
        "lock": {"file": plan.lock_file, "sha256": plan.lock_sha256},
        "recipe": plan.recipe,
        "ray_address": plan.ray_address,
        "run_id": plan.run_id,
        "output_dir": None if plan.output_dir is None else str(plan.output_dir),
        "volumes": to_jsonable(plan.volumes),
        "launch": None if plan.launch is None else dict(plan.launch),
        "audit_names": plan.audit_names if plan.lenient_checkpoint else None,
    }


def render_plan_json(plan: RunPlan) -> str:
    """Stable JSON: the four promised keys first, then what else the run directory records."""
    return json.dumps(plan_to_json(plan), indent=2) + "\n"


def render_plan_text(plan: RunPlan, width: int | None = None) -> str:
    """The plan for people; a preflight check's reason wraps at ``width``, under the check's name (the
    command lines stay whole: they are run as printed)."""
    lines = [
        f"recipe:  {plan.recipe}",
        f"backend: {plan.backend}",
        f"image:   {plan.image or '-'}",
        f"lock:    {plan.lock_file} (sha256 {plan.lock_sha256})",
        f"run:     {plan.run_dir}" + (f" (outputs in {plan.output_dir})" if plan.output_dir else ""),
    ]
    lines += [f"env:     {k}={v}" for k, v in plan.env.items()]
    if plan.lenient_checkpoint:
        lines.append(f"audits:  checkpoint names from {plan.audit_names}")
    lines.append("command:")
    lines += [f"  {shlex.quote(arg)}" for arg in plan.argv]
    if plan.launch is not None:
        lines += render_launch(plan.launch)
    if plan.preflight:
        lines.append("preflight:")
        lines += [wrap(f"  {c.status:<4} {c.name}: {c.detail}", width, indent="     ") for c in plan.preflight]
    return "\n".join(lines) + "\n"


def render_launch(launch: Mapping[str, Any]) -> list[str]:
    """What the launcher would start, for people: the ``docker run`` it amounts to, the Ray submission,
    or the local process."""
    backend = launch.get("backend")
    if backend == "docker":
        lines = ["launch:  a container, through the engine's API; as a docker command:", f"  {launch['docker_run']}"]
        lines += [f"  device  {d}" for d in launch.get("devices") or ()] or ["  device  (none on this host)"]
        lines += [f"  mount   {v['host']} -> {v['bind']} ({v['mode']})" for v in launch.get("volumes") or ()]
        return lines
    if backend == "ray":
        return [
            f"launch:  a Ray job submitted to {launch['address']}",
            f"  entrypoint:   {launch['entrypoint']}",
            f"  runtime_env:  {json.dumps(launch['runtime_env'], sort_keys=True)}",
            f"  metadata:     {json.dumps(launch['metadata'], sort_keys=True)}",
            f"  submission:   {launch['submission_id']}",
        ]
    if backend == "slurm":
        return [
            f"launch:  a Slurm batch job of {launch['nodes']} node(s), each running {launch['image']}",
            f"  submit:  {launch['submit']}",
            *(f"  sbatch  {arg}" for arg in launch["sbatch"]),
        ]
    return [
        f"launch:  a local process in {launch.get('cwd')}, the env above over this one",
        f"  {launch.get('process_group')}",
    ]
