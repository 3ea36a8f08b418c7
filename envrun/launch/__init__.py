"""Launchers: run a :class:`~envrun.plan.RunPlan` on one backend, stream its output, stop it on Ctrl-C.

Each backend is one module and the only place that talks to its engine (a subprocess, Ray's job
API, dockerd); the engines' packages are imported only when that backend is used. What a launcher is
lives in :mod:`.base`, which the backends import; this module only chooses one.
"""

from __future__ import annotations

from envrun.launch.base import Launcher
from envrun.plan import RunPlan


def launcher_for(plan: RunPlan) -> Launcher:
    if plan.backend == "local":
        from envrun.launch.local import LocalLauncher

        return LocalLauncher()
    if plan.backend == "slurm":
        from envrun.schedule.slurm import SlurmLauncher

        return SlurmLauncher()
    if plan.backend == "ray":
        from envrun.launch.ray_backend import RayLauncher

        return RayLauncher(plan.ray_address or "")  # build_plan gives every Ray plan an address
    from envrun.launch.docker_backend import DockerLauncher

    return DockerLauncher()
