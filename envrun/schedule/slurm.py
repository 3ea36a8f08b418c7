"""The Slurm backend: the run submitted as a batch job (:mod:`.sbatch`), followed to its end.

``launch`` writes the job's directory under the run's (``slurm/``: the spec, envrun's code, the scripts),
submits it with ``sbatch``, streams the job's output file into the run's ``output.log`` while it runs, and
reads how it ended: the batch job's state and exit code (``scontrol``), each node's own check
(``checks/``), the run the head recorded (``record/``: its node checks, status and export audit) and what
ended the job (``ended.txt``). Ctrl-C or SIGTERM cancels the job (``scancel``) and waits, up to
:data:`CANCEL_SECONDS`, until Slurm says it ended: every node's script removes its container on the way.

The run's directory must be on storage every node sees at the same path (Slurm's own output lands there).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import IO, Any

from envbuild.data.jsonout import to_jsonable
from envbuild.errors import EngineError, InputError
from envbuild.interrupts import deferred_interrupts, while_stopping
from envbuild.progress import Progress
from envrun.checkpoint.audit import ModelAudit
from envrun.exports import ExportSearch
from envrun.injob.spec import JOB_DIR as IN_CONTAINER
from envrun.launch.base import LaunchResult, LogSink
from envrun.plan import RunPlan
from envrun.preflight import TARGET_CHECK
from envrun.preflightline import PreflightLine
from envrun.schedule.jobdir import CODE_DIR, RECORD_DIR, SPEC_FILE, in_job, write_code, write_spec
from envrun.schedule.sbatch import SlurmJob, render_batch, render_node

SUBDIR = "slurm"  # the job's directory, under the run's
POLL_SECONDS = 1.0
CANCEL_SECONDS = 120.0  # Slurm's KillWait (30 s) and the containers' removal, with room
ENDED = frozenset(
    ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
)
COMMAND_SECONDS = 60


def slurm_job(plan: RunPlan, job_dir: Path) -> SlurmJob:
    assert plan.image and plan.nnodes and plan.scheduled is not None  # build_plan's promise for slurm
    return SlurmJob(
        name=f"envrun-{plan.recipe}",
        nnodes=plan.nnodes,
        job_dir=str(job_dir),
        image=plan.image,
        volumes=plan.volumes,
        sbatch_args=plan.scheduled.scheduler_args,
    )


def write_job(plan: RunPlan, job_dir: Path, skip: frozenset[str]) -> SlurmJob:
    """The job's directory: spec, code and scripts (``--emit sbatch`` writes the same)."""
    job = slurm_job(plan, job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    write_spec(job_dir / SPEC_FILE, in_job(plan, PurePosixPath(IN_CONTAINER) / RECORD_DIR, tuple(sorted(skip))))
    write_code(job_dir / CODE_DIR)
    (job_dir / "job.sbatch").write_text(render_batch(job), encoding="utf-8")
    (job_dir / "node.sh").write_text(render_node(job), encoding="utf-8")
    return job


def _slurm(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        raise InputError(f"{argv[0]} not found: --backend slurm runs Slurm's commands on this host")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise EngineError(f"`{' '.join(argv)}` did not answer within {COMMAND_SECONDS} s") from None
    if done.returncode:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise EngineError(f"`{' '.join(argv[:2])}` failed: {reason}")
    return done.stdout


def job_fields(job_id: str) -> dict[str, str] | None:
    """``scontrol show job -o``'s fields (JobState, ExitCode, Reason, …); empty once Slurm has forgotten the
    job (``MinJobAge`` after it ended); None when slurmctld does not answer now (asked again later)."""
    try:
        line = _slurm(["scontrol", "show", "job", "-o", job_id])
    except EngineError as exc:
        return {} if "Invalid job id" in str(exc) else None
    fields: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            fields.setdefault(key, value)
    return fields


class _Follower:
    """The job's output file, streamed as it grows."""

    def __init__(self, path: Path, log: LogSink) -> None:
        self.path, self.log = path, log
        self.handle: IO[str] | None = None
        self.partial = ""

    def pump(self) -> None:
        if self.handle is None:
            if not self.path.exists():
                return
            self.handle = self.path.open(encoding="utf-8", errors="replace")
        text = self.partial + self.handle.read()
        lines = text.split("\n")
        self.partial = lines.pop()
        for line in lines:
            self.log(line + "\n")

    def close(self) -> None:
        self.pump()
        if self.partial:
            self.log(self.partial + "\n")
        if self.handle is not None:
            self.handle.close()


class SlurmLauncher:
    def __init__(self) -> None:
        self.job_id: str | None = None
        self.skip: frozenset[str] = frozenset({TARGET_CHECK})  # check_target not asked: the job checks nothing

    def check_target(self, plan: RunPlan, skip: frozenset[str], progress: Progress) -> tuple[PreflightLine, ...]:
        """Nothing to ask before submitting: every node checks itself inside the job, and the head checks
        them all before the trainer (the job's record says each verdict, and joins this one)."""
        self.skip = skip
        return ()

    def describe(self, plan: RunPlan) -> dict[str, Any]:
        job_dir = Path(plan.run_dir).absolute() / SUBDIR  # as launch writes it: the nodes see this path
        job = slurm_job(plan, job_dir)
        return {
            "backend": "slurm",
            "nodes": job.nnodes,
            "image": job.image,
            "job_dir": str(job_dir),
            "submit": f"sbatch {shlex.quote(str(job_dir / 'job.sbatch'))}",
            "sbatch": [
                line.removeprefix("#SBATCH ") for line in render_batch(job).splitlines() if line.startswith("#SBATCH")
            ],
        }

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        job_dir = Path(plan.run_dir).absolute() / SUBDIR
        write_job(plan, job_dir, self.skip)
        self.job_id = None
        follower: _Follower | None = None
        try:
            with deferred_interrupts():  # Ctrl-C while it is submitted: taken once the job can be cancelled
                submitted = _slurm(["sbatch", "--parsable", f"--chdir={job_dir}", str(job_dir / "job.sbatch")])
                self.job_id = submitted.strip().split(";")[0]
            log(f"envrun: submitted Slurm job {self.job_id}; its output: {job_dir}/slurm-{self.job_id}.out\n")
            follower = _Follower(job_dir / f"slurm-{self.job_id}.out", log)
            fields = self._follow(follower, deadline=None)
        except KeyboardInterrupt:
            if self.job_id is None:
                raise  # nothing was submitted
            log(f"envrun: cancelling Slurm job {self.job_id}\n")
            with while_stopping(lambda: None):  # a second Ctrl-C must not leave the job holding its nodes
                _slurm(["scancel", self.job_id])
            follower = follower or _Follower(job_dir / f"slurm-{self.job_id}.out", log)
            fields = self._follow(follower, deadline=time.monotonic() + CANCEL_SECONDS)
            follower.close()
            state = fields.get("JobState", "UNKNOWN")
            return LaunchResult(None, interrupted=True, detail=f"cancelled Slurm job {self.job_id} ({state})")
        assert follower is not None
        follower.close()
        return self._result(plan, job_dir, fields)

    def _follow(self, follower: _Follower, deadline: float | None) -> dict[str, str]:
        """The job's fields once it ended (or the deadline passed), its output streamed meanwhile."""
        assert self.job_id is not None
        last: dict[str, str] = {}
        while True:
            follower.pump()
            fields = job_fields(self.job_id)
            if fields == {}:  # forgotten: it ended long ago
                state = last.get("JobState", "")
                return {**last, "JobState": state if state in ENDED else "UNKNOWN"}
            if fields is not None:
                last = fields
            if last.get("JobState") in ENDED or (deadline is not None and time.monotonic() > deadline):
                return last
            time.sleep(POLL_SECONDS)

    def _result(self, plan: RunPlan, job_dir: Path, fields: dict[str, str]) -> LaunchResult:
        state = fields.get("JobState", "UNKNOWN")
        code_text, _, signal = fields.get("ExitCode", "").partition(":")
        code = int(code_text) if code_text.isascii() and code_text.isdigit() else None
        record = job_dir / RECORD_DIR
        recorded = _json(record / "status.json")
        recorded = recorded if isinstance(recorded, dict) else {}  # the job's own words, or none
        known = to_jsonable(plan.preflight)
        lines = _json(record / "preflight.json")
        checked = tuple(  # the head's own checks of every node: what the job's record adds to this one
            PreflightLine(line["name"], line["status"], line["detail"], line.get("facts"))
            for line in (lines if isinstance(lines, list) else ())
            if isinstance(line, dict)
            and all(isinstance(line.get(key), str) for key in ("name", "status", "detail"))
            and line not in known
        )
        checks = [_json(path) for path in sorted((job_dir / "checks").glob("node-*.json"))]  # each node's own
        refusals = [str(c.get("line")) for c in checks if isinstance(c, dict) and not c.get("ok")]
        ended = (job_dir / "ended.txt").read_text(encoding="utf-8").strip() if (job_dir / "ended.txt").exists() else ""
        where = f"Slurm job {self.job_id} {state}"
        if refusals:
            return LaunchResult(
                code,
                detail=f"{where}: refused, nothing started: " + "; ".join(refusals),
                status="refused",
                checked=checked,
            )
        if recorded:
            detail = f"{where}: {recorded.get('detail') or recorded.get('status')}"
            return LaunchResult(code, detail=detail, status=str(recorded.get("status")), checked=checked)
        if state == "CANCELLED":
            return LaunchResult(code, detail=f"{where}: {ended or 'cancelled'}", status="interrupted")
        signalled = f", signal {signal}" if signal not in ("", "0") else ""
        detail = f"{where} (exit {code}{signalled}) before the run was recorded" + (f": {ended}" if ended else "")
        return LaunchResult(code if code else 1, detail=detail, status="error")

    def find_exports(self, plan: RunPlan, layout: Any, progress: Progress) -> ExportSearch:
        """What the head's audit found on the nodes (the job's ``record/exports.json``)."""
        found = _json(Path(plan.run_dir).absolute() / SUBDIR / RECORD_DIR / "exports.json")
        if not isinstance(found, dict):
            return ExportSearch("the Slurm job", False, (ModelAudit("", False, error="the job recorded no audit"),))
        audits = tuple(ModelAudit.of_answer(a, str(a.get("node") or "")) for a in found.get("exports") or ())
        return ExportSearch(
            str(found.get("where") or "the Slurm job's nodes"), bool(audits) or found.get("ok", False), audits
        )


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
