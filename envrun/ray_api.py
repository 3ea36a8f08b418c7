"""The only module that talks to Ray: its job submission API and its state API, both over HTTP to the
head's dashboard (the "address", ``http://HEAD:8265``).

``ray`` is an optional extra (``pip install 'envbuild[ray]'``), imported here only, when used, with Ctrl-C
and SIGTERM held until the import ends (:func:`ray_module`). Nothing here joins the cluster as a driver: the
client's Python and Ray need not be the cluster's.

Token authentication (Ray 2.60): ``ray start --head`` turns it on when a token exists and
``RAY_AUTH_MODE`` is unset (``maybe_enable_token_auth_if_token_available``), and its dashboard then
answers 401 to a request without ``Authorization: Bearer TOKEN``. Ray's own clients send the token only
when ``RAY_AUTH_MODE=token`` is set in their environment; envrun follows ``ray start`` instead, so that
a cluster started on a machine with a token is reached from it as started: the token is sent whenever
one is found, unless ``RAY_AUTH_MODE=disabled``. It is looked for where Ray's token loader looks, in its
order: ``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.data.tokens import bearer_problem
from envbuild.errors import EngineError, EnvbuildError, InputError
from envbuild.fileio import open_regular
from envbuild.interrupts import deferred_interrupts
from envrun import first_line

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


class RayAuthError(EngineError):
    """The cluster asked for a token envrun did not send, or refused the one it sent (401, 403): said at
    once, never waited out as a head still starting."""


def auth_headers() -> dict[str, str]:
    """``{"Authorization": "Bearer TOKEN"}`` when a Ray token is found (see the module docstring), else ``{}``."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return {}
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        named = os.environ.get("RAY_AUTH_TOKEN_PATH")
        path = Path(named) if named else Path.home() / ".ray" / "auth_token"
        try:
            with open_regular(path) as handle:  # a FIFO named as the token file would wait forever
                token = handle.read(64 * 1024).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            if named:  # named and unreadable: Ray's loader refuses it too; say so rather than get a 401
                raise InputError(f"RAY_AUTH_TOKEN_PATH={named}: cannot read the Ray token there") from None
            token = ""
    if token and (problem := bearer_problem(token)):
        where = "RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN", "").strip() else "the Ray token file"
        raise InputError(f"{where}: {problem}")
    return {"Authorization": f"Bearer {token}"} if token else {}


def ray_module(name: str) -> Any:
    """Ray's module ``name``, imported with Ctrl-C and SIGTERM held until the import ends, then delivered.
    Ray's Cython core (``ray._raylet``), as it is first imported, runs code whose errors it only prints
    ("Exception ignored in: <module 'collections.abc'> … KeyboardInterrupt", then "Cython module failed to
    patch module with custom type"): an interrupt that landed there was lost. ``envrun cluster up``
    SIGTERMed as it first asked the head which nodes had joined went on waiting for them until its timeout,
    its containers running. Without Ray: the extra to install, exit 2."""
    try:
        with deferred_interrupts():
            return importlib.import_module(name)
    except ImportError:
        raise InputError("Ray is needed here: pip install 'envbuild[ray]'") from None


def job_client(address: str) -> Any:
    JobSubmissionClient = ray_module("ray.job_submission").JobSubmissionClient  # noqa: N806 (Ray's class)
    # Ray's client logs every package it makes and uploads for a job (the node check's py_modules) at
    # INFO: noise between envrun's own lines. (Its handler also keeps the stderr it was made with, which
    # may be closed by the time it writes: a "--- Logging error ---" traceback in envrun's output.)
    for name in ("ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)
    headers = auth_headers()
    try:
        return JobSubmissionClient(address, headers=headers)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError by version
        said = f"{address}: cannot reach the Ray job API: {first_line(exc)}{_token_hint(exc, headers)}"
        raise (RayAuthError if _refused(exc) else EngineError)(said) from None


def _refused(exc: BaseException) -> bool:
    """Whether Ray's client met a 401 or 403 (its AuthenticationError)."""
    return isinstance(exc, ray_module("ray.exceptions").AuthenticationError)


def _token_hint(exc: BaseException, headers: dict[str, str]) -> str:
    """What envrun sent, when the cluster asked for a token."""
    if "authentication" not in str(exc).lower():
        return ""
    if headers:
        if os.environ.get("RAY_AUTH_TOKEN", "").strip():
            source = "$RAY_AUTH_TOKEN"
        else:
            source = os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token"
        return f" (envrun sent the token it found: it is not this cluster's; it came from {source})"
    return " (envrun found no token in $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"


def submit(client: Any, address: str, argv: tuple[str, ...] | list[str], **options: Any) -> str:
    """Submit ``argv`` (run through the head's shell, each word quoted) as a job; its submission ID."""
    try:
        return str(client.submit_job(entrypoint=shlex.join(argv), **options))
    except Exception as exc:
        raise EngineError(f"{address}: job submission failed: {first_line(exc)}") from None


@contextmanager
def following(address: str, job_id: str) -> Iterator[None]:
    """Ray's client failing while a job is followed, stopped or asked about — the head gone mid-job is a
    ``RuntimeError: WebSocket connection closed unexpectedly with close code 1006`` — as one EngineError."""
    try:
        yield
    except EnvbuildError:
        raise
    except Exception as exc:  # Ray raises RuntimeError, ConnectionError, requests' errors by version
        raise EngineError(f"{address}: lost Ray job {job_id}: {first_line(exc)} (is the cluster's head up?)") from None


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
    state, common = ray_module("ray.util.state"), ray_module("ray.util.state.common")
    headers = auth_headers()  # a token file that cannot be read is the user's to mend: InputError, as it is
    try:
        # ray.util.state.list_nodes, with the token: that function takes no headers
        nodes: list[Any] = state.StateApiClient(address=address, headers=headers).list(
            common.StateResource.NODES,
            options=common.ListApiOptions(limit=10_000, timeout=timeout, detail=True),
            raise_on_missing_output=False,
        )
    except Exception as exc:
        said = first_line(exc)
        if _refused(exc):
            raise RayAuthError(f"{address}: the cluster refused envrun: {said}{_token_hint(exc, headers)}") from None
        if "Failed to connect to API server" in said:  # Ray's words then go on to `pip install ray[default]`
            said = "its dashboard does not answer there (is the head up, with its dashboard, at that address?)"
        raise EngineError(f"{address}: cannot list the cluster's nodes: {said}") from None
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
