"""Launching a prepared run and recording it: run directory, the launcher's verdict, the export audit.

Order: a failed preflight refuses the run before anything exists; then the run directory is created
and the plan recorded; the launcher asks where the job will run whether it may (each node of a Ray
cluster says which lock it runs: its answers join ``preflight.json``, and a node on another lock
refuses the job, recorded as ``refused``, exit 1, nothing submitted); the launcher runs the job to its
end (streaming into ``output.log``),
and, when the job succeeded under a lenient checkpoint setting, every Hugging Face export it wrote is
audited. ``status.json`` is written last, whatever happened, so a record always says how the run ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import EnvbuildError
from envbuild.progress import Progress, silent
from envrun.exports import ExportSpec, audit_exports
from envrun.launch import LaunchResult, launcher_for
from envrun.plan import PreflightLine, RunPlan
from envrun.preflight import TARGET_CHECK, failed
from envrun.prepare import PreparedRun
from envrun.rundir import RunDir, Status, default_run_dir


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: its recorded status, the job's own exit code, and where the record is."""

    status: Status
    exit_code: int | None  # the job's; None when it never reported one
    run_dir: Path
    detail: str = ""
    export_failures: tuple[str, ...] = ()  # "PATH: what it lost", one per export that failed the audit

    @property
    def exit_status(self) -> int:
        """The exit status for envrun itself: the job's, 130 when interrupted, 1 for any other failure."""
        if self.status == "interrupted":
            return 130
        if self.status == "succeeded":
            return 0
        return self.exit_code if self.exit_code else 1

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "exit_code": self.exit_code, "run_dir": str(self.run_dir)}


class TargetRefused(EnvbuildError):
    """Where the job would run may not run it (a node on another lock); nothing was started (exit 1)."""


def execute_run(prepared: PreparedRun, run_dir: Path | None = None, progress: Progress = silent) -> RunOutcome:
    """Launch ``prepared`` and record it under ``run_dir`` (default ``runs/<recipe>-<UTC time>``)."""
    prepared.refuse_if_failed()
    plan = prepared.plan
    launcher = launcher_for(plan)
    record = RunDir(run_dir or default_run_dir(plan.recipe))
    digest = _image_digest(plan)
    record.record_plan(plan, image_digest=digest)
    progress(f"run directory {record.path}")
    try:
        if TARGET_CHECK in prepared.skip_checks:
            target: tuple[PreflightLine, ...] = (PreflightLine(TARGET_CHECK, "skip", "skipped by --skip-check"),)
        else:
            target = launcher.check_target(plan, progress)
        if target:
            plan = plan.with_preflight(plan.preflight + target)
            record.record_plan(plan, image_digest=digest)
        if refused := failed(target):
            raise TargetRefused("refused, nothing submitted: " + "; ".join(line.detail for line in refused))
        result = launcher.launch(plan, record.log)
    except TargetRefused as exc:
        record.finish("refused", None, detail=str(exc))
        raise
    except BaseException as exc:
        record.finish("error", None, detail=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise
    status, detail = _status(result)
    bad: tuple[str, ...] = ()
    if status == "succeeded" and prepared.exports is not None:
        bad = _audit_exports(plan, prepared.exports, record, progress)
        if bad:
            status, detail = "failed", "export audit: " + "; ".join(bad)
    record.finish(status, result.exit_code, detail)
    progress(f"{status} (exit {result.exit_code}); record in {record.path}")
    return RunOutcome(status, result.exit_code, record.path, detail, bad)


def _status(result: LaunchResult) -> tuple[Status, str]:
    if result.interrupted:
        return "interrupted", result.detail
    return ("succeeded" if result.exit_code == 0 else "failed"), result.detail


def _image_digest(plan: RunPlan) -> str | None:
    if plan.image and plan.backend == "docker":
        from envrun.launch.docker_backend import image_digest

        return image_digest(plan.image)
    return None


def _audit_exports(plan: RunPlan, exports: ExportSpec, record: RunDir, progress: Progress) -> tuple[str, ...]:
    """The lenient save's guard: every HF export the run wrote may lack the MTP layers and nothing else."""
    where, audits = audit_exports(plan.overrides, plan.env, exports)
    record.record_json("exports.json", {"where": where, "exports": [a.to_json() for a in audits]})
    progress(f"export audit: {where}")
    return tuple(f"{a.path}: {a.error or ', '.join([*a.missing[:3], *a.unexpected[:3]])}" for a in audits if not a.ok)
