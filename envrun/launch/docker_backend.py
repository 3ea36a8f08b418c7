"""The docker backend: run the locked image through the docker SDK with the host's Ascend devices.

The devices and driver mounts are Ascend's own explicit list (upstream-facts §5), passed only where
they exist on the host, instead of ``--privileged``. The engine itself is only ever reached through
:mod:`envbuild.engine`.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from envbuild.engine import Engine, JobSpec
from envbuild.errors import EngineError, InputError
from envbuild.image.plan import LOCK_LABEL
from envbuild.progress import Progress
from envrun.launch import LaunchResult, LogSink
from envrun.plan import PreflightLine, RunPlan

DEVICE_PATTERNS = ("/dev/davinci[0-9]*", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
DRIVER_MOUNTS = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
)
STOP_TIMEOUT_SECONDS = 20


def ascend_paths(root: str = "/") -> tuple[str, ...]:
    """The Ascend devices and driver files present under ``root``, as paths on that host."""
    found: list[str] = []
    for pattern in (*DEVICE_PATTERNS, *DRIVER_MOUNTS):
        found += sorted(glob.glob(os.path.join(root, pattern.lstrip("/"))))
    return tuple("/" + os.path.relpath(p, root) for p in found)


def devices_and_mounts(paths: tuple[str, ...]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """``host:container:rwm`` device specs and read-only driver mounts for the Ascend ``paths`` a host has
    (from :func:`ascend_paths` here, or from a probe on another host)."""
    devices = [f"{p}:{p}:rwm" for p in paths if p.startswith("/dev/")]
    mounts = {p: {"bind": p, "mode": "ro"} for p in paths if p in DRIVER_MOUNTS}
    return devices, mounts


def image_labels(ref: str) -> dict[str, str]:
    """The labels of a local image (for the preflight lock-label check)."""
    with Engine.connect() as engine:
        attrs = engine.inspect(ref)
    if attrs is None:
        raise InputError(f"image {ref} not found in the local engine; build or load it first")
    return dict((attrs.get("Config") or {}).get("Labels") or {})


def image_digest(ref: str) -> str | None:
    """The image ID (config digest) and, if pushed, its repository digest; for the run record."""
    try:
        with Engine.connect() as engine:
            attrs = engine.inspect(ref)
    except EngineError:
        return None
    if attrs is None:
        return None
    repo = (attrs.get("RepoDigests") or [None])[0]
    return f"{attrs['Id']} {repo}" if repo else attrs["Id"]


class DockerLauncher:
    def __init__(self, network_mode: str = "host", workdir: Path | None = None) -> None:
        self.network_mode, self.workdir = network_mode, workdir

    def check_target(self, plan: RunPlan, progress: Progress) -> tuple[PreflightLine, ...]:
        return ()  # this host and its image: the preflight has checked both

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        image = plan.image or ""  # build_plan gives every docker plan an image
        with Engine.connect() as engine:
            if engine.inspect(image) is None:
                raise InputError(f"image {image} not found in the local engine")
            devices, volumes = devices_and_mounts(ascend_paths())
            for path in (plan.model, *plan.data_files):
                if path is not None:
                    # Same path inside and out, so the trainer's overrides mean the same files.
                    host = str(path.resolve())
                    volumes.setdefault(host, {"bind": host, "mode": "ro"})
            spec = JobSpec(
                image=image,
                command=tuple(plan.argv),
                env=dict(plan.env),
                devices=tuple(devices),
                volumes=volumes,
                network_mode=self.network_mode,
                ipc_mode="host",
                working_dir=str(self.workdir) if self.workdir else None,
                labels={"io.envbuild.run.recipe": plan.recipe, LOCK_LABEL: plan.lock_sha256},
                stop_timeout=STOP_TIMEOUT_SECONDS,
            )
            code, interrupted = engine.run_job(spec, log)
        if interrupted:
            return LaunchResult(code, interrupted=True, detail="container stopped on Ctrl-C")
        return LaunchResult(code)
