"""The head's part of a scheduler's job: wait for every node, then run the plan as the Ray backend runs it.

The plan is the one envrun prepared and checked on the submitting host (:mod:`envrun.planrecord`), aimed at
this job's own Ray: every node is checked before the trainer (which lock it runs, its NPUs, the model, the
data and the job probe where it runs, its network, the output directory's storage), a failed check refuses
the job (recorded ``refused``, no trainer), the trainer runs as a Ray job, and a lenient save's exports are
audited on the nodes that hold them. The record is written where the plan's ``run_dir`` says (the job's
directory), and the exit status is the run's.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from envbuild.errors import EnvbuildError
from envrun import ray_api
from envrun.execute import TargetRefused, execute_plan
from envrun.injob.spec import InJob, NodeIdentity
from envrun.planrecord import plan_from_record

POLL_SECONDS = 2.0


def say(message: str) -> None:
    print(f"envrun: {message}", file=sys.stderr, flush=True)


def wait_for_nodes(address: str, spec: InJob) -> str | None:
    """None once ``spec.nnodes`` nodes are alive; else why not, when the join deadline passes."""
    deadline = time.monotonic() + spec.join_timeout
    alive: list[str] = []
    while time.monotonic() < deadline:
        try:
            alive = [n.name for n in ray_api.list_nodes(address, timeout=10) if n.alive]
        except EnvbuildError:
            alive = []
        if len(alive) >= spec.nnodes:
            say(f"all {spec.nnodes} node(s) joined: {', '.join(sorted(alive))}")
            return None
        time.sleep(POLL_SECONDS)
    return f"{len(alive)} of {spec.nnodes} node(s) joined within {spec.join_timeout:g} s ({', '.join(alive) or 'none'})"


def drive(spec: InJob, head: NodeIdentity) -> int:
    """The run on this job's Ray; its exit status. What envrun refuses on the way (a record directory an
    earlier submission of the same job left, Ray's job API failing) is one line and its exit status."""
    try:
        return _drive(spec, head)
    except EnvbuildError as exc:
        say(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return exc.exit_code


def _drive(spec: InJob, head: NodeIdentity) -> int:
    address = f"http://{head.ip or '127.0.0.1'}:{spec.dashboard_port}"
    plan = replace(plan_from_record(dict(spec.plan)), backend="ray", ray_address=address)
    if plan.run_dir.exists() or plan.run_dir.is_symlink():  # before waiting for the nodes: a job submitted again
        say(
            f"{plan.run_dir}: an earlier run of this job recorded itself there; nothing was run. Move it away, or "
            "emit the run again (a run id, and a record, of its own)"
        )
        return 2
    say(f"waiting for {spec.nnodes} node(s) to join the head at {address}")
    missing = wait_for_nodes(address, spec)
    if missing is not None:
        from envrun.rundir import RunDir

        record = RunDir(plan.run_dir)
        record.record_plan(plan)
        record.finish("error", None, detail=missing)
        say(missing)
        return 1
    try:
        outcome = execute_plan(plan, spec.skip_checks, spec.lenient, say)
    except TargetRefused as exc:
        say(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    for failure in outcome.export_failures:
        say(f"export audit FAILED: {failure}")
    return outcome.exit_status
