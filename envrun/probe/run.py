"""Running the job probe where the job will run: this host (the local backend), or a container of the
image (the docker backend: no network, no devices, the job's environment and mounts). Ray nodes run it
from a task pinned to each (:mod:`envrun.cluster.onnode`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from envbuild.errors import EngineError
from envrun.probe.report import ProbeReport, failed_report, parse_report
from envrun.probe.request import ProbeRequest

TIMEOUT_SECONDS = 900  # importing verl and its stack is most of it: tens of seconds on a slow host


def probe_here(request: ProbeRequest, python: str, env: Mapping[str, str]) -> ProbeReport:
    """The probe run with ``python`` as the local backend runs the job: this environment plus the job's."""
    where = f"this host ({python})"
    try:
        done = subprocess.run(
            request.argv(python),
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=TIMEOUT_SECONDS,
        )
    except FileNotFoundError:
        return failed_report(where, f"{python}: not found on PATH (the job's interpreter)")
    except subprocess.TimeoutExpired:
        return failed_report(where, f"the probe did not finish in {TIMEOUT_SECONDS} s")
    return parse_report(where, done.stdout, done.stderr, done.returncode)


def probe_in_image(
    request: ProbeRequest,
    image: str,
    python: str,
    env: Mapping[str, str],
    volumes: Mapping[str, Mapping[str, str]],
) -> ProbeReport:
    """The probe in a container of ``image``: its own verl, no network, no devices, the job's env and mounts,
    and the image's bytecode volume (:mod:`envrun.bytecode`: the job that follows imports what it compiled)."""
    from envbuild.engine.client import Engine
    from envrun.bytecode import prepare_for, with_bytecode

    where = f"image {image}"
    try:
        with Engine.connect() as engine:
            environment, mounts = with_bytecode(prepare_for(engine, image), env, volumes)
            done = engine.run(image, request.argv(python), volumes=mounts, environment=environment)
    except EngineError as exc:
        return failed_report(where, f"cannot run the probe in a container: {exc}")
    return parse_report(where, done.stdout, done.stderr, done.exit_code)
