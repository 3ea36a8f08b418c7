"""Launching a prepared run and recording it: run directory, the launcher's verdict, the export audit.

Order: a failed preflight refuses the run before anything exists; then the run directory (the plan's,
named by the run's id) is created and the plan recorded; the launcher asks where the job will run
whether it may (each node of a Ray cluster says which lock it runs, whether it has the NPUs, and what
the model, the data and the job probe are there: its answers join ``preflight.json``, and a failed one
refuses the job, recorded as ``refused``, exit 1, nothing submitted); the launcher runs the job to its
end (streaming into ``output.log``) — Ctrl-C or SIGTERM stops the job's process group, container or
Ray job and is recorded as ``interrupted``, naming the signal — and, when the job succeeded under a
lenient checkpoint setting, every Hugging Face export it wrote is audited where it lies
(:mod:`envrun.exports`); where the job probe did not run, where they lie is unknown and the run does not
succeed. ``status.json`` is written last, whatever happened, so a record always says
how the run ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from envbuild.data.jsonout import jfield, json_meta
from envbuild.errors import EnvbuildError
from envbuild.interrupts import stop_signals
from envbuild.progress import Progress, silent
from envrun.exports import ExportVerdict, export_verdict
from envrun.launch.base import Launcher, LaunchResult
from envrun.plan import RunPlan
from envrun.preflight import PROBE_CHECK, TARGET_CHECK, failed
from envrun.preflightline import PreflightLine
from envrun.prepare import PreparedRun, launcher_for
from envrun.probe.report import layout_of
from envrun.rundir import Echo, RunDir, Status

if TYPE_CHECKING:
    from envrun.cluster.state import ClusterState


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: its recorded status, the job's own exit code, and where the record is."""

    status: Status
    exit_code: int | None  # the job's; None when it never reported one
    run_dir: Path
    detail: str = jfield("", skip=True)
    # "PATH: what it lost", one per export that failed the audit.
    export_failures: tuple[str, ...] = jfield((), skip=True)
    exports: ExportVerdict | None = field(default=None, compare=False, metadata=json_meta(skip=True))

    @property
    def exit_status(self) -> int:
        """The exit status for envrun itself: the job's, 130 when interrupted, 1 for any other failure."""
        # refused: 1 as a refusal before submitting is (TargetRefused), whatever the job's node exited with
        return {"interrupted": 130, "succeeded": 0, "refused": 1}.get(self.status, self.exit_code or 1)


class TargetRefused(EnvbuildError):
    """Where the job would run may not run it (a node on another lock); nothing was started (exit 1)."""


def execute_run(prepared: PreparedRun, progress: Progress = silent, *, echo: Echo = "stdout") -> RunOutcome:
    """Launch ``prepared`` and record it under its plan's run directory; the job's output is shown on ``echo``."""
    prepared.refuse_if_failed()
    lenient = prepared.recipe.lenient_checkpoint is not None
    return execute_plan(prepared.plan, prepared.skip_checks, lenient, progress, cluster=prepared.cluster, echo=echo)


def execute_plan(
    plan: RunPlan,
    skip_checks: tuple[str, ...],
    lenient: bool,
    progress: Progress = silent,
    *,
    cluster: ClusterState | None = None,
    echo: Echo = "stdout",
) -> RunOutcome:
    """Launch a checked ``plan`` (its preflight passed) and record it: what a scheduler's job runs too
    (:mod:`envrun.injob`), with the plan envrun prepared on the submitting host. ``cluster``: the state of
    the cluster `envrun cluster up` started, when the run names it."""
    launcher = launcher_for(plan, cluster)
    record = RunDir(plan.run_dir, echo)
    digest = _image_digest(plan)
    record.record_plan(plan, image_digest=digest)
    progress(f"run directory {record.path}")
    signals: list[str] = []
    launched = False
    try:
        with stop_signals(signals):
            plan = _checked_target(skip_checks, plan, launcher, record, digest, progress)
            launched = True
            result = launcher.launch(plan, record.log)
    except TargetRefused as exc:
        record.finish("refused", None, detail=str(exc))
        raise
    except KeyboardInterrupt:
        first = signals[0] if signals else "Ctrl-C"
        if not launched:
            detail = f"stopped on {first} before the job ran"
        elif len(signals) > 1:  # a second signal while the launcher waited for the job it stopped (Ray, Slurm)
            detail = f"stopped on {first}, then on {signals[-1]} before the job was seen to end"
        else:
            detail = f"stopped on {first} before the job was seen to end"
        record.finish("interrupted", None, detail=detail)
        raise
    except BaseException as exc:
        record.finish("error", None, detail=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise
    if result.checked:
        plan = plan.with_preflight(plan.preflight + result.checked)
        record.record_plan(plan, image_digest=digest)
    status, detail = _status(result, signals)
    verdict = None
    if lenient:
        verdict = _audit_exports(plan, launcher, status, record, progress)
        if status == "succeeded" and not verdict.ok:
            status, detail = "failed", "export audit: " + "; ".join(verdict.failures)
    record.finish(status, result.exit_code, detail)
    progress(f"{status} (exit {result.exit_code}); record in {record.path}")
    failures = verdict.failures if verdict is not None else ()
    return RunOutcome(status, result.exit_code, record.path, detail, failures, verdict)


def _checked_target(
    skip_checks: tuple[str, ...],
    plan: RunPlan,
    launcher: Launcher,
    record: RunDir,
    digest: str | None,
    progress: Progress,
) -> RunPlan:
    """Where the job runs is asked whether it may (a cluster's nodes); refused: :class:`TargetRefused`."""
    if TARGET_CHECK in skip_checks:
        target: tuple[PreflightLine, ...] = (PreflightLine(TARGET_CHECK, "skip", "skipped by --skip-check"),)
    else:
        target = launcher.check_target(plan, frozenset(skip_checks), progress)
    if target:
        plan = plan.with_preflight(plan.preflight + target)
        record.record_plan(plan, image_digest=digest)
    if refused := failed(target):
        raise TargetRefused("refused, nothing submitted: " + "; ".join(line.detail for line in refused))
    return plan


def _status(result: LaunchResult, signals: list[str]) -> tuple[Status, str]:
    if result.interrupted:
        cause = f"stopped on {signals[0] if signals else 'Ctrl-C'}"
        return "interrupted", f"{cause}: {result.detail}" if result.detail else cause
    if result.status in ("refused", "error", "interrupted"):  # as the scheduler's job recorded it
        return cast(Status, result.status), result.detail
    return ("succeeded" if result.exit_code == 0 else "failed"), result.detail


def _image_digest(plan: RunPlan) -> str | None:
    if plan.image and plan.backend == "docker":
        from envrun.dockerhost import image_digest

        return image_digest(plan.image)
    return None


def _audit_exports(
    plan: RunPlan, launcher: Launcher, status: Status, record: RunDir, progress: Progress
) -> ExportVerdict:
    """The lenient save's guard, where verl wrote: recorded in ``exports.json`` whatever the job did."""
    layout = layout_of(plan.preflight)
    if status != "succeeded":
        verdict = export_verdict(layout, None, f"the job did not succeed ({status})")
        verdict = ExportVerdict(verdict.detail, layout=layout)  # a failed job fails on its own
    elif layout is None:
        verdict = export_verdict(None, None, _unlocated(plan))
    elif layout.root is None:
        verdict = export_verdict(layout, None)
    else:
        progress(f"auditing the HF exports under {layout.root}/{layout.pattern}")
        verdict = export_verdict(layout, launcher.find_exports(plan, layout, progress))
    record.record_json("exports.json", verdict.to_json())
    progress(f"export audit: {verdict.detail}")
    return verdict


def _unlocated(plan: RunPlan) -> str:
    """Why no export layout is known: the probe's own line, and on a cluster the node check's that carries
    it, say why the probe did not run."""
    skipped = [line for line in plan.preflight if line.name in (PROBE_CHECK, TARGET_CHECK) and line.status == "skip"]
    why = "".join(f"; {line.name}: {line.detail}" for line in skipped)
    return f"no export layout (the job probe did not run{why})"
