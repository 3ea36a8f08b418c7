"""Preparing a run: recipe, lock and its digest, the plan, verl's config, override validation, preflight.

Order: the recipe and the lock are read (strictly; the lock with the sha256 of exactly its bytes), the
run's id is chosen (its run directory's name), the plan is built (:func:`envrun.plan.build_plan`, the one
place a plan is validated), every override is checked against the verl config the run will use, then the
preflight runs — the job probe among it, where the job will run. A dry run on a Ray cluster also asks
every node (the checks a real run makes just before it submits). Nothing is started and nothing is
written; :func:`envrun.execute.execute_run` launches what this returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from envbuild.config import load_config
from envbuild.errors import InputError
from envbuild.escape import for_terminal
from envbuild.lock.io import LockFile, read_lock
from envbuild.progress import Progress, silent
from envrun.auditnames import locked_transformers
from envrun.cluster.state import ClusterState
from envrun.launch.base import Launcher
from envrun.plan import RunParameters, RunPlan, build_plan
from envrun.preflight import TARGET_CHECK, PreflightEnv, PreflightError, failed, run_preflight
from envrun.recipe import RECIPES_DIR, Recipe, load_recipe, recipe_path
from envrun.rundir import default_run_dir


@dataclass(frozen=True)
class RunRequest:
    """Everything a run is prepared from: the recipe, the user's parameters and where to look things up."""

    recipe: str  # a shipped recipe's name (grpo-glm5) or a recipe file
    params: RunParameters
    lock: Path | None = None  # default: the recipe's lock
    verl_config: Path | None = None  # an extracted verl/trainer/config; default: from the lock's verl wheel
    cache_dir: Path | None = None  # default: the config file's cache_dir
    offline: bool = False
    dry_run: bool = False
    skip_checks: tuple[str, ...] = ()
    cluster: str | None = None  # a cluster `envrun cluster up` started: its job API is the Ray address
    run_dir: Path | None = None  # where the run is recorded; default runs/<recipe>-<UTC time>


@dataclass(frozen=True)
class PreparedRun:
    """A validated plan with its preflight report, and what the run is checked against afterwards."""

    recipe: Recipe
    lock: LockFile
    plan: RunPlan
    skip_checks: tuple[str, ...] = ()  # the user's --skip-check, for the checks made at launch
    cluster: ClusterState | None = None  # the cluster `envrun cluster up` started, when the run names it

    def refuse_if_failed(self) -> None:
        """Raise :class:`PreflightError` (exit 2, nothing started) when a preflight check failed."""
        problems = failed(self.plan.preflight)
        if problems:
            raise PreflightError(
                "preflight failed, nothing started: " + "; ".join(f"{c.name}: {c.detail}" for c in problems)
            )


def resolve_lock(recipe: Recipe, given: Path | None) -> Path:
    """The lock given, else the recipe's: relative to the current directory, else to the shipped recipes,
    which carry the project's ``lockfiles/`` (a link in a checkout, files in an installed wheel)."""
    if given is not None:
        return given
    if recipe.lock is None:
        raise InputError(f"recipe {recipe.name} names no lock; pass --lock PATH")
    if (Path.cwd() / recipe.lock).is_file():
        return Path.cwd() / recipe.lock
    if (RECIPES_DIR / recipe.lock).is_file():
        return (RECIPES_DIR / recipe.lock).resolve()
    raise InputError(
        f"{recipe.lock}: the recipe's lock is neither here nor among envrun's shipped lockfiles; pass --lock PATH"
    )


def _cache_dir(request: RunRequest) -> Path:
    return request.cache_dir or load_config(None).cache_dir


def _on_cluster(params: RunParameters, name: str, cache_dir: Path) -> tuple[RunParameters, ClusterState]:
    """``params`` aimed at the job API of the cluster ``name``, and its state (from its state file)."""
    from envrun.cluster.state import require_state

    if params.backend != "ray" or params.ray_address:
        raise InputError("--cluster NAME: use it with --backend ray and without --ray-address")
    state = require_state(cache_dir, name)
    if state.phase != "up" or not state.address:
        raise InputError(f"cluster {name} is still starting, or its start failed: see `envrun cluster status {name}`")
    return replace(params, ray_address=state.address), state


def prepare_run(request: RunRequest, progress: Progress = silent) -> PreparedRun:
    """Read, plan, validate and preflight ``request``; raise the project's errors on bad input.

    A failed preflight check does not raise here (a dry run shows the whole report first): see
    :meth:`PreparedRun.refuse_if_failed`."""
    recipe = load_recipe(recipe_path(request.recipe))
    lock = read_lock(resolve_lock(recipe, request.lock))
    params, cluster = request.params, None
    if request.cluster is not None:
        params, cluster = _on_cluster(params, request.cluster, _cache_dir(request))
    run_dir = request.run_dir or default_run_dir(recipe.name)
    if not request.dry_run and os.path.lexists(run_dir):  # before any check runs: a run dir records one run
        raise InputError(
            f"--run-dir {for_terminal(str(run_dir))}: exists; pick another (a run directory records one run)"
        )
    if params.backend == "slurm" and params.emit is None:
        from envrun.schedule.sbatch import job_dir_problem
        from envrun.schedule.slurm import SUBDIR

        slurm_dir = run_dir.absolute() / SUBDIR  # where the job is written: its scripts name it
        if problem := job_dir_problem(str(slurm_dir)):
            raise InputError(f"--run-dir {for_terminal(str(run_dir))!r}: the Slurm job's directory {problem}")
    transformers = locked_transformers(lock.lock)
    plan = build_plan(recipe, params, str(lock.path), lock.sha256, run_dir, transformers=transformers)

    from envrun.overrides import validate_overrides  # Hydra costs a second to import

    config_dir = request.verl_config
    if config_dir is None:
        from envrun.verlconfig import verl_config_dir, verl_wheel_from_lock

        wheel = verl_wheel_from_lock(lock.lock, str(lock.path), recipe.verl_package)
        config_dir = verl_config_dir(wheel, _cache_dir(request), offline=request.offline, progress=progress)
    progress(f"validating {len(plan.overrides)} overrides against {config_dir}")
    validate_overrides(plan.overrides, config_dir, recipe.config_name)

    env = PreflightEnv()
    if plan.image and plan.backend != "slurm":  # a slurm job's nodes read the image they pull
        from envrun.dockerhost import image_labels, image_platform

        env = PreflightEnv(image_labels=image_labels, image_platform=image_platform)
    if plan.probe is not None and not plan.on_nodes:
        progress(f"probing the job where it will run ({plan.image or plan.python})")
    lines = run_preflight(plan, env, dry_run=request.dry_run, skip=request.skip_checks)
    launcher = launcher_for(plan, cluster)
    if request.dry_run and plan.backend == "ray" and TARGET_CHECK not in request.skip_checks:
        lines += launcher.check_target(plan, frozenset(request.skip_checks), progress)
    plan = replace(plan.with_preflight(lines), launch=launcher.describe(plan))
    return PreparedRun(recipe, lock, plan, request.skip_checks, cluster)


def launcher_for(plan: RunPlan, cluster: ClusterState | None = None) -> Launcher:
    """The launcher of the plan's backend; ``cluster`` is the state of the cluster a Ray run names."""
    if plan.backend == "local":
        from envrun.launch.local import LocalLauncher

        return LocalLauncher()
    if plan.backend == "slurm":
        from envrun.schedule.slurm import SlurmLauncher

        return SlurmLauncher()
    if plan.backend == "ray":
        from envrun.launch.ray_backend import RayLauncher

        return RayLauncher(plan.ray_address or "", cluster)  # build_plan gives every Ray plan an address
    from envrun.launch.docker_backend import DockerLauncher

    return DockerLauncher()
