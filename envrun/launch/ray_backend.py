"""The Ray backend: submit the trainer to an existing Ray cluster through Ray's job submission API.

The multi-node path: the submitted entry point is the trainer's driver, and verl itself places the
workers on the cluster. ``ray`` is an optional extra (``pip install 'envbuild[ray]'``), imported here only.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from envbuild.errors import EngineError, InputError
from envrun.launch import LaunchResult, LogSink
from envrun.plan import RunPlan

STOP_TIMEOUT_SECONDS = 60.0
_POLL_SECONDS = 0.5


def _client(address: str) -> Any:
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise InputError("--backend ray needs Ray: pip install 'envbuild[ray]'") from None
    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError by version
        raise EngineError(f"{address}: cannot reach the Ray job API: {str(exc).splitlines()[0]}") from None


def submission_id(plan: RunPlan) -> str:
    return f"envrun-{plan.recipe}-{uuid.uuid4().hex[:12]}"


class RayLauncher:
    def __init__(self, address: str) -> None:
        self.address = address
        self.job_id: str | None = None

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        client = _client(self.address)
        try:
            self.job_id = client.submit_job(
                entrypoint=plan.command_line,
                runtime_env={"env_vars": dict(plan.env)},
                submission_id=submission_id(plan),
                metadata={"envrun.recipe": plan.recipe, "envrun.lock.sha256": plan.lock_sha256},
            )
        except Exception as exc:
            raise EngineError(f"{self.address}: job submission failed: {str(exc).splitlines()[0]}") from None
        log(f"envrun: submitted Ray job {self.job_id} to {self.address}\n")
        try:
            asyncio.run(_tail(client, self.job_id, log))
            return self._result(client)
        except KeyboardInterrupt:
            client.stop_job(self.job_id)
            _wait_terminal(client, self.job_id, STOP_TIMEOUT_SECONDS)
            info = client.get_job_info(self.job_id)
            return LaunchResult(
                info.driver_exit_code,
                interrupted=True,
                detail=f"Ray job {self.job_id} stopped on Ctrl-C ({info.status.value})",
            )

    def _result(self, client: Any) -> LaunchResult:
        assert self.job_id is not None
        status = _wait_terminal(client, self.job_id, STOP_TIMEOUT_SECONDS)
        info = client.get_job_info(self.job_id)
        code = info.driver_exit_code
        if code is None:
            code = 0 if status == "SUCCEEDED" else 1
        return LaunchResult(code, detail=f"Ray job {self.job_id} {status}: {info.message or ''}".strip())


async def _tail(client: Any, job_id: str, log: LogSink) -> None:
    async for chunk in client.tail_job_logs(job_id):
        log(chunk)


def _wait_terminal(client: Any, job_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        status = client.get_job_status(job_id).value
        if status in ("SUCCEEDED", "FAILED", "STOPPED") or time.monotonic() > deadline:
            return status
        time.sleep(_POLL_SECONDS)
