"""The Ray backend: submit the trainer to a Ray cluster through Ray's job submission API.

The multi-node path: the submitted entry point is the trainer's driver, and verl itself places the
workers on the cluster. Before anything is submitted, the run's caller asks every node what it runs
(:mod:`envrun.cluster.nodecheck`). The job carries the lock digest in its metadata and the recipe's
environment in its runtime env; its logs stream back; Ctrl-C stops it on the cluster.
"""

from __future__ import annotations

import uuid
from typing import Any

from envbuild.errors import EngineError
from envbuild.progress import Progress
from envrun import ray_api
from envrun.launch import LaunchResult, LogSink
from envrun.plan import PreflightLine, RunPlan

STOP_TIMEOUT_SECONDS = 60.0


def submission_id(plan: RunPlan) -> str:
    return f"envrun-{plan.recipe}-{uuid.uuid4().hex[:12]}"


class RayLauncher:
    def __init__(self, address: str) -> None:
        self.address = address
        self.job_id: str | None = None

    def check_target(self, plan: RunPlan, progress: Progress) -> tuple[PreflightLine, ...]:
        """Each alive node's own answer: the lock it runs and the NPUs it sees."""
        from envrun.cluster.nodecheck import CHECK, ask_nodes, node_lines

        progress(f"asking every node of {self.address} which lock it runs")
        try:
            answers = ask_nodes(self.address)
        except EngineError as exc:  # unverified is refused: a job never starts on nodes nobody checked
            return (PreflightLine(CHECK, "fail", f"the nodes could not be asked which lock they run: {exc}"),)
        return node_lines(answers, plan.lock_sha256, plan.lock_file)

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        client = ray_api.job_client(self.address)
        self.job_id = ray_api.submit(
            client,
            self.address,
            plan.argv,
            runtime_env={"env_vars": dict(plan.env)},
            submission_id=submission_id(plan),
            metadata={"envrun.recipe": plan.recipe, "envrun.lock.sha256": plan.lock_sha256},
        )
        log(f"envrun: submitted Ray job {self.job_id} to {self.address}\n")
        try:
            ray_api.tail_logs(client, self.job_id, log)
            return self._result(client)
        except KeyboardInterrupt:
            client.stop_job(self.job_id)
            ray_api.wait_terminal(client, self.job_id, STOP_TIMEOUT_SECONDS)
            info = client.get_job_info(self.job_id)
            return LaunchResult(
                info.driver_exit_code,
                interrupted=True,
                detail=f"Ray job {self.job_id} stopped on Ctrl-C ({info.status.value})",
            )

    def _result(self, client: Any) -> LaunchResult:
        assert self.job_id is not None
        status = ray_api.wait_terminal(client, self.job_id, STOP_TIMEOUT_SECONDS)
        info = client.get_job_info(self.job_id)
        code = info.driver_exit_code
        if code is None:
            code = 0 if status == "SUCCEEDED" else 1
        return LaunchResult(code, detail=f"Ray job {self.job_id} {status}: {info.message or ''}".strip())
