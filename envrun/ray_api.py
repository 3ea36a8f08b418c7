"""The only module that talks to Ray: its job submission API and its state API, both over HTTP to the
head's dashboard (the "address", ``http://HEAD:8265``).

``ray`` is an optional extra (``pip install 'envbuild[ray]'``), imported here only, when used. Nothing
here joins the cluster as a driver: the client's Python and Ray need not be the cluster's.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envbuild.errors import EngineError, InputError

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class RayNode:
    """A node as the cluster's state API lists it."""

    node_id: str
    name: str  # --node-name, or Ray's default (its IP)
    ip: str
    alive: bool
    head: bool
    npus: int  # its NPU resource


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def job_client(address: str) -> Any:
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise InputError("Ray is needed here: pip install 'envbuild[ray]'") from None
    # Ray's client logs every package it uploads for a job (the node check's py_modules) at INFO: noise
    # between envrun's own lines.
    logging.getLogger("ray.dashboard.modules.dashboard_sdk").setLevel(logging.WARNING)
    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError by version
        raise EngineError(f"{address}: cannot reach the Ray job API: {_first_line(exc)}") from None


def submit(client: Any, address: str, argv: tuple[str, ...] | list[str], **options: Any) -> str:
    """Submit ``argv`` (run through the head's shell, each word quoted) as a job; its submission ID."""
    try:
        return str(client.submit_job(entrypoint=shlex.join(argv), **options))
    except Exception as exc:
        raise EngineError(f"{address}: job submission failed: {_first_line(exc)}") from None


def tail_logs(client: Any, job_id: str, log: Callable[[str], None]) -> None:
    async def follow() -> None:
        async for chunk in client.tail_job_logs(job_id):
            log(chunk)

    asyncio.run(follow())


def wait_terminal(client: Any, job_id: str, timeout: float) -> str:
    """The job's status once it is SUCCEEDED, FAILED or STOPPED, or whatever it is at ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        status = str(client.get_job_status(job_id).value)
        if status in TERMINAL or time.monotonic() > deadline:
            return status
        time.sleep(_POLL_SECONDS)


def run_job(address: str, argv: list[str], *, timeout: float, submission_id: str, **options: Any) -> str:
    """Run a short job to its end and return its output; an error with its last lines if it fails."""
    client = job_client(address)
    job_id = submit(client, address, argv, submission_id=submission_id, **options)
    status = wait_terminal(client, job_id, timeout)
    if status not in TERMINAL:
        client.stop_job(job_id)
        raise EngineError(f"{address}: job {job_id} did not finish within {timeout:g} s")
    logs = str(client.get_job_logs(job_id))
    if status != "SUCCEEDED":
        tail = " | ".join(logs.strip().splitlines()[-5:])
        raise EngineError(f"{address}: job {job_id} {status}: {tail}")
    return logs


def list_nodes(address: str, timeout: int = 30) -> list[RayNode]:
    """Every node the cluster knows, alive or dead."""
    try:
        from ray.util.state import list_nodes as ray_list_nodes
    except ImportError:
        raise InputError("Ray is needed here: pip install 'envbuild[ray]'") from None
    try:
        nodes = ray_list_nodes(
            address=address, limit=10_000, timeout=timeout, detail=True, raise_on_missing_output=False
        )
    except Exception as exc:
        raise EngineError(f"{address}: cannot list the cluster's nodes: {_first_line(exc)}") from None
    return [
        RayNode(
            n.node_id,
            n.node_name or n.node_ip,
            n.node_ip,
            n.state == "ALIVE",
            bool(n.is_head_node),
            int((n.resources_total or {}).get("NPU", 0)),
        )
        for n in nodes
    ]
