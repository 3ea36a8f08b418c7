"""The docker backend: run the locked image through the docker SDK with the host's Ascend devices.

The devices and driver mounts are the host's (:mod:`envrun.dockerhost`: Ascend's explicit list, each
passed only where it exists, never ``--privileged``). The job's files are mounted at the same path
inside: the model and data read-only, the run's output directory read-write — a host directory under
the run directory by default, so checkpoints outlive the container and are audited on the host that
holds them. The engine itself is only ever reached through :mod:`envbuild.engine.client`.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from envbuild.engine.client import Engine
from envbuild.engine.jobs import JobSpec
from envbuild.errors import EngineError, InputError
from envbuild.image.plan import LOCK_LABEL
from envrun.bytecode import Bytecode, bytecode_of, prepare_image, with_bytecode
from envrun.dockerhost import ascend_paths, devices_and_mounts, job_volumes
from envrun.launch.base import LaunchResult, LogSink, OnThisHost
from envrun.plan import RunPlan

STOP_TIMEOUT_SECONDS = 20


class DockerLauncher(OnThisHost):
    def __init__(self, network_mode: str = "host", workdir: Path | None = None) -> None:
        self.network_mode, self.workdir = network_mode, workdir

    def describe(self, plan: RunPlan) -> dict[str, Any]:
        """The container :meth:`launch` would start, from this host's Ascend paths (for the dry run): its
        bytecode volume is named when the engine has the image (the dry run creates none)."""
        spec = self.job_spec(plan, ascend_paths(), _known_bytecode(plan.image or ""))
        return {
            "backend": "docker",
            "image": spec.image,
            "command": list(spec.command),
            "env": dict(spec.env),
            "devices": list(spec.devices),
            "volumes": [{"host": host, **bind} for host, bind in sorted(spec.volumes.items())],
            "network_mode": spec.network_mode,
            "ipc_mode": spec.ipc_mode,
            "working_dir": spec.working_dir,
            "labels": dict(spec.labels),
            "stop_timeout": spec.stop_timeout,
            "init": spec.init,
            "docker_run": docker_run_line(spec),
        }

    def job_spec(self, plan: RunPlan, paths: tuple[str, ...], bytecode: Bytecode | None = None) -> JobSpec:
        """The container of the job: ``paths`` are the Ascend devices and driver files of the host;
        ``bytecode`` the image's bytecode volume (:mod:`envrun.bytecode`)."""
        devices, mounts = devices_and_mounts(paths)
        mounts.update(job_volumes(plan, outputs=True))
        env, volumes = with_bytecode(bytecode, plan.env, mounts)
        return JobSpec(
            image=plan.image or "",  # build_plan gives every docker plan an image
            command=tuple(plan.argv),
            env=env,
            devices=tuple(devices),
            volumes=volumes,
            network_mode=self.network_mode,
            ipc_mode="host",
            working_dir=str(self.workdir) if self.workdir else None,
            labels={"io.envbuild.run.recipe": plan.recipe, LOCK_LABEL: plan.lock_sha256},
            stop_timeout=STOP_TIMEOUT_SECONDS,
        )

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        with Engine.connect() as engine:
            attrs = engine.inspect(plan.image or "")
            if attrs is None:
                raise InputError(f"image {plan.image} not found in the local engine")
            spec = self.job_spec(plan, ascend_paths(), prepare_image(engine, attrs))
            if plan.output_dir is not None:
                plan.output_dir.mkdir(parents=True, exist_ok=True)  # ours, not root's from the engine
            code, interrupted = engine.run_job(spec, log)
        if interrupted:
            return LaunchResult(code, interrupted=True, detail="container stopped")
        return LaunchResult(code)


def _known_bytecode(reference: str) -> Bytecode | None:
    """The bytecode volume of the image ``reference`` names, when the engine answers and has it."""
    try:
        with Engine.connect() as engine:
            attrs = engine.inspect(reference) if reference else None
    except EngineError:
        return None
    return bytecode_of(attrs) if attrs is not None else None


def docker_run_line(spec: JobSpec) -> str:
    """The ``docker run`` command that starts the same container (for people; envrun uses the engine's API)."""
    args = ["docker", "run", "--rm", f"--network={spec.network_mode}"]
    args += [f"--ipc={spec.ipc_mode}"] if spec.ipc_mode else []
    args += ["--init"] if spec.init else []
    args += [f"--stop-timeout={spec.stop_timeout}"]
    args += [f"--workdir={spec.working_dir}"] if spec.working_dir else []
    args += [f"--device={device}" for device in spec.devices]
    args += [f"--volume={host}:{bind['bind']}:{bind['mode']}" for host, bind in sorted(spec.volumes.items())]
    args += [f"--env={name}={value}" for name, value in sorted(spec.env.items())]
    args += [f"--label={name}={value}" for name, value in sorted(spec.labels.items())]
    return shlex.join([*args, spec.image, *spec.command])
