"""The run plan: everything a launcher needs, resolved and typed (:mod:`envrun.planview` renders it)."""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from envbuild.data.jsonout import jfield
from envbuild.data.reference import by_digest
from envbuild.data.typed import meta
from envbuild.errors import InputError
from envbuild.escape import for_terminal
from envbuild.image.plan import IMAGE_ROOT
from envbuild.lock.model import ENV_NAME
from envrun.injob.spec import JOB_DIR
from envrun.overrides import merge_overrides
from envrun.preflightline import PreflightLine
from envrun.probe.request import ProbeRequest
from envrun.recipe import REQUIRED_PARAMETERS, Recipe, override_key

Backend = Literal["docker", "ray", "local", "slurm"]
BACKENDS: tuple[Backend, ...] = ("docker", "ray", "local", "slurm")
# Backends whose job runs on a cluster's nodes: the model, the data and the probe are checked there.
ON_NODES: tuple[Backend, ...] = ("ray", "slurm")
# What Hydra takes unquoted and reads as the same string; anything else is quoted.
_PLAIN = re.compile(r"[A-Za-z0-9_/.+:@%-]+")


def _absolute(path: str) -> str | None:
    if not path.startswith("/") or "\0" in path or ".." in PurePosixPath(path).parts:
        return f"{path!r} is not an absolute path (without '..')"
    if not path.isprintable():
        return f"{for_terminal(path)!r} contains a control character"
    if ":" in path:  # docker joins a bind as HOST:CONTAINER:MODE, and splits it again on ':'
        return f"{path!r} contains ':', which a docker bind cannot hold"
    return None


def mount_point(path: str) -> str:
    """The container path as the engine sees it: ``/data/``, ``//data/.`` and ``/data`` are one mount."""
    return posixpath.normpath("/" + path.lstrip("/"))


def _container_path(path: str) -> str | None:
    """Where a volume is mounted: absolute, and never over what the image installed from the lock (its
    sources under IMAGE_ROOT, editable installs the job imports): a mount there, or above it, would run
    the host's files instead of the pinned trees the lock and the image check vouch for."""
    if problem := _absolute(path):
        return problem
    if _overlaps(mount_point(path), IMAGE_ROOT):
        return f"{path!r} would hide what the image installed from the lock ({IMAGE_ROOT}); mount elsewhere"
    return None


def _overlaps(point: str, directory: str) -> bool:
    """A mount at ``point`` would hide ``directory``, or some of it: it is at, above or under it."""
    return point == directory or directory.startswith(point.rstrip("/") + "/") or point.startswith(directory + "/")


@dataclass(frozen=True)
class Volume:
    """A host directory or file seen inside a container (a job's, a cluster node's); read-only unless rw."""

    host: str = field(metadata=meta(check=_absolute, description="the path on the host"))
    container: str = field(metadata=meta(check=_container_path, description="where the job sees it"))
    mode: Literal["ro", "rw"] = "ro"

    @classmethod
    def parse(cls, text: str) -> Volume:
        """``HOST:CONTAINER[:ro|rw]``, as ``--volume`` takes it."""
        parts = text.split(":")
        mode = parts.pop() if len(parts) == 3 else "ro"
        if len(parts) != 2 or mode not in ("ro", "rw"):
            raise InputError(f"--volume {text!r}: expected HOST:CONTAINER[:ro|rw]")
        volume = cls(os.path.abspath(parts[0]), parts[1], "rw" if mode == "rw" else "ro")  # noqa: PTH100 (not resolve(): a symlinked path stays the one given)
        if problem := _container_path(volume.container) or _absolute(volume.host):
            raise InputError(f"--volume {for_terminal(text)!r}: {problem}")
        return volume

    def bind(self) -> dict[str, str]:
        return {"bind": self.container, "mode": self.mode}


def _volumes_problem(volumes: tuple[Volume, ...], *, scheduled: bool) -> str | None:
    """Why the ``--volume``\\ s cannot all be mounted in one container: two at one mount point (docker refuses
    the container, "Duplicate mount point", on every node of a scheduled job once it runs; Kubernetes keeps
    one of them), or, for a scheduler's job, one at, under or above the job's directory (envrun's code and
    spec on each node)."""
    seen: dict[str, Volume] = {}
    for volume in volumes:
        point, named = (
            mount_point(volume.container),
            f"--volume {for_terminal(volume.host)}:{for_terminal(volume.container)}",
        )
        if point in seen:
            first = seen[point]
            return f"{named}: {point} is mounted twice (--volume {for_terminal(first.host)}:{for_terminal(first.container)} too); give each its own path"
        if scheduled and _overlaps(point, JOB_DIR):
            return f"{named}: it would hide the job's directory ({JOB_DIR}: envrun's code and the job's spec on each node); mount elsewhere"
        seen[point] = volume
    return None


@dataclass(frozen=True)
class Scheduled:
    """How a scheduler's job starts Ray on its nodes (``--backend slurm``, ``--emit``): the ports, the
    join deadline, the scheduler's own options."""

    head_port: int = 6379  # the head's GCS port (Ray's default)
    dashboard_port: int = 8265  # the job API (Ray's default)
    hccl_ports: int = 60000  # the first HCCL port on each machine
    node_ports: int | None = None  # first of the per-node blocks of Ray's ports (nodes sharing a machine)
    join_timeout: float = 600.0  # seconds for every node to join the head
    scheduler_args: tuple[str, ...] = ()  # `sbatch` options (`--partition=npu`, `--time=2-00:00:00`)
    ray_start_args: tuple[str, ...] = ()  # appended to every node's `ray start`


@dataclass(frozen=True)
class RunParameters:
    """What the user chose on the command line."""

    backend: Backend = "local"
    model: Path | None = None
    train_files: tuple[Path, ...] = ()
    val_files: tuple[Path, ...] = ()
    nnodes: int | None = None
    npus_per_node: int | None = None
    image: str | None = None
    overrides: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    entry_point: tuple[str, ...] | None = None  # a stand-in trainer for tests
    ray_address: str | None = None
    output_dir: Path | None = None  # where the trainer writes (the recipe's outputs); default <run dir>/outputs
    volumes: tuple[Volume, ...] = ()  # extra mounts for the docker backend and a scheduler's nodes
    scheduled: Scheduled = Scheduled()  # how a scheduler's job starts its nodes
    emit: str | None = None  # the scheduler whose job --emit writes (its plan is a slurm one), for messages


@dataclass(frozen=True)
class RunPlan:
    recipe: str
    argv: tuple[str, ...]
    env: dict[str, str]  # added to the job's environment (and Ray's runtime_env)
    backend: Backend
    image: str | None
    lock_file: str
    lock_sha256: str
    config_name: str
    overrides: tuple[str, ...]  # exactly as Hydra receives them
    model: Path | None
    data_files: tuple[Path, ...]
    lenient_checkpoint: bool
    run_dir: Path
    ray_address: str | None = None
    preflight: tuple[PreflightLine, ...] = ()
    output_dir: Path | None = None  # the recipe's outputs are under it (None: the recipe has none)
    volumes: tuple[Volume, ...] = ()
    probe: ProbeRequest | None = None  # the job probe, when the recipe has one
    nnodes: int | None = None  # what the final overrides set for the recipe's nnodes / npus_per_node
    npus_per_node: int | None = None
    python: str = "python3"  # the job's interpreter (the recipe's entry point), which runs the probe
    transformers: str | None = None  # the version the lock pins: checkpoint audits ask that model for its names
    launch: Mapping[str, Any] | None = jfield(None, skip=True)  # what the launcher would start, once prepared
    scheduled: Scheduled | None = jfield(None, skip=True)  # a scheduler's job: how its nodes start (in its spec)

    @property
    def on_nodes(self) -> bool:
        """The job runs on a cluster's nodes: what it reads and what it imports are checked there."""
        return self.backend in ON_NODES

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def with_preflight(self, results: tuple[PreflightLine, ...]) -> RunPlan:
        return replace(self, preflight=results)

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    @property
    def audit_names(self) -> str:
        """Which names the run's checkpoint audits check against (envrun.auditnames chooses the source)."""
        if self.transformers is None:
            return "envrun's static description (the lock pins no transformers)"
        where = f"with the job's {self.python} {'on each node' if self.on_nodes else 'on this host'}"
        if self.backend == "docker":
            where = f"in image {self.image}"
        return f"the model built by the lock's transformers {self.transformers} {where}"


def hydra_string(value: str) -> str:
    """``value`` as a Hydra override value that reads back as exactly this string."""
    # Unquoted, Hydra reads a number (1e3, -inf), a boolean or null as such: those stay quoted.
    if _PLAIN.fullmatch(value) and not re.fullmatch(r"[-+]?(?:[0-9.].*|inf|nan)|true|false|null", value, re.I):
        return value
    # OmegaConf reads `${` as an interpolation unless written `\${`, and backslashes before one as escaping
    # each other; Hydra's quoted string reads `\'` as a quote, and backslashes only before a quote (the
    # closing one too) as escaping each other. Every other backslash is itself.
    text = re.sub(r"(\\*)\$\{", lambda m: m[1] * 2 + "\\${", value)
    text = re.sub(r"(\\*)'", lambda m: m[1] * 2 + "\\'", text)
    return "'" + re.sub(r"(\\*)\Z", lambda m: m[1] * 2, text, count=1) + "'"


def _files_value(files: tuple[Path, ...]) -> str:
    if len(files) == 1:
        return hydra_string(str(files[0]))
    return "[" + ",".join(hydra_string(str(f)) for f in files) + "]"


def parameter_overrides(recipe: Recipe, params: RunParameters) -> tuple[str, ...]:
    """The overrides the command-line parameters stand for, through the recipe's ``parameters``."""
    values: dict[str, str] = {}
    if params.model is not None:
        values["model"] = hydra_string(str(params.model))
    if params.train_files:
        values["train_files"] = _files_value(params.train_files)
    if params.val_files or params.train_files:  # --val-data alone too: the training files may be the recipe's
        values["val_files"] = _files_value(params.val_files or params.train_files)
    for name in ("nnodes", "npus_per_node"):
        number = getattr(params, name)
        if number is not None:
            if number < 1:
                raise InputError(f"--{name.replace('_', '-')}: expected a positive number, got {number}")
            values[name] = str(number)
    out = []
    for name, value in values.items():
        if name not in recipe.parameters:
            raise InputError(f"recipe {recipe.name} has no parameter {name}; use -o KEY=VALUE")
        out.append(f"{recipe.parameters[name]}={value}")
    return tuple(out)


def output_overrides(recipe: Recipe, output_dir: Path, run_id: str) -> tuple[str, ...]:
    """The recipe's ``outputs`` as plain values: no interpolation is left for a Ray worker to resolve."""
    return tuple(
        f"{key}={hydra_string(str(output_dir / sub.replace('{run_id}', run_id)))}"
        for key, sub in recipe.outputs.items()
    )


def _absolute_paths(params: RunParameters) -> RunParameters:
    """The model and data as absolute paths, symlinks kept: the trainer, the checks and a container's
    mounts then name one path, whatever the job's working directory (not resolve(): a container sees the
    path given, mounted from what it points to)."""

    def absolute(path: Path) -> Path:
        return Path(os.path.abspath(path))  # noqa: PTH100

    model = None if params.model is None else absolute(params.model)
    train, val = tuple(map(absolute, params.train_files)), tuple(map(absolute, params.val_files))
    return replace(params, model=model, train_files=train, val_files=val)


def _output_dir(recipe: Recipe, params: RunParameters, run_dir: Path) -> Path | None:
    if not recipe.outputs:
        return None
    if params.output_dir is not None:
        return Path(os.path.abspath(params.output_dir))  # noqa: PTH100 (not resolve(): a symlinked path stays the one given)
    if params.backend in ON_NODES:
        raise InputError(
            f"--backend {params.backend} needs --output-dir DIR for recipe {recipe.name}: a directory every node writes to "
            "(a cluster volume), where the checkpoints are kept and audited"
        )
    return Path(os.path.abspath(run_dir)) / "outputs"  # noqa: PTH100 (not resolve(): symlinks kept); host directories, mounted


def build_plan(
    recipe: Recipe,
    params: RunParameters,
    lock_file: str,
    lock_sha256: str,
    run_dir: Path,
    *,
    transformers: str | None = None,
) -> RunPlan:
    """The plan for ``recipe`` with ``params``: a pure function, so a dry run needs nothing running.

    The one place a plan is validated: what it returns is complete for its backend (an image for
    docker, an address for Ray), and the launchers trust it. ``lock_sha256`` is the digest of the lock's
    bytes as :func:`envbuild.lock.io.read_lock` gives it (the digest the image's label carries);
    ``run_dir`` is where the run is recorded, and its name the run's id; ``transformers`` is the version
    the lock pins (:func:`envrun.auditnames.locked_transformers`), None when it pins none."""
    if params.backend not in BACKENDS:
        raise InputError(f"--backend: expected one of {', '.join(BACKENDS)}, got {params.backend!r}")
    params = _absolute_paths(params)
    owned = recipe.flag_keys()  # an -o of one would win the merge: the trainer would read what was not checked
    if refused := [p for o in params.overrides if (p := _owned_by_flag(o, owned))]:
        raise InputError("; ".join(refused))
    recipe_keys = {override_key(o) for o in recipe.overrides()}
    for name in REQUIRED_PARAMETERS:
        key = recipe.parameters.get(name)
        by_flag = params.model if name == "model" else params.train_files
        if key and key not in recipe_keys and not by_flag:
            flag = "--data" if name == "train_files" else f"--{name.replace('_', '-')}"
            raise InputError(f"{flag} is required by recipe {recipe.name} (sets {key})")
    if params.backend == "docker" and not params.image:
        raise InputError("--backend docker needs --image REF (the image built from the lock)")
    if params.backend == "ray" and not params.ray_address:
        raise InputError("--backend ray needs --ray-address URL (the Ray dashboard, e.g. http://HEAD:8265)")
    if params.volumes and params.backend not in ("docker", "slurm"):
        raise InputError(
            "--volume: only the docker and slurm backends mount (a cluster's volumes are in its cluster file)"
        )
    if problem := _volumes_problem(params.volumes, scheduled=params.backend == "slurm"):
        raise InputError(problem)
    scheduled_by = f"--emit {params.emit}" if params.emit else "--backend slurm"
    if params.backend == "slurm" and not (params.image and by_digest(params.image)):
        shown = f"not {for_terminal(repr(params.image))}" if params.image else "none given"
        raise InputError(
            f"{scheduled_by} needs --image REPOSITORY@sha256:<64 lowercase hex>, {shown} (every node "
            "pulls the same bits; `envbuild image --push --json` prints the digest)"
        )
    for name, value in params.extra_env.items():
        if not re.fullmatch(ENV_NAME, name) or "\0" in value:
            raise InputError(f"--env {name}: not a valid environment variable")
    output_dir = _output_dir(recipe, params, run_dir)
    outputs = output_overrides(recipe, output_dir, run_dir.name) if output_dir else ()
    if params.backend == "local":  # Hydra's own record (outputs/DATE/TIME/) in the run, not the caller's directory
        outputs += (f"hydra.run.dir={hydra_string(os.path.abspath(run_dir / 'hydra'))}",)  # noqa: PTH100
    overrides = merge_overrides(recipe.overrides() + outputs, parameter_overrides(recipe, params) + params.overrides)
    entry = params.entry_point or recipe.entry_point
    argv = (*entry, f"--config-name={recipe.config_name}", *overrides)
    probe = None
    if recipe.probe is not None and recipe.entry_module is not None:
        skip = {s.name: s.reason for s in recipe.probe.skip_imports}
        probe = ProbeRequest(recipe.config_name, overrides, recipe.entry_module, skip)
    nnodes = _int_override(overrides, recipe.parameters.get("nnodes"))
    if params.backend == "slurm" and not nnodes:
        raise InputError(f"{scheduled_by} needs --nnodes N: the nodes the job asks its scheduler for")
    return RunPlan(
        recipe=recipe.name,
        argv=argv,
        env=dict(sorted({**recipe.runtime_env, **params.extra_env}.items())),
        backend=params.backend,
        image=params.image,
        lock_file=lock_file,
        lock_sha256=lock_sha256,
        config_name=recipe.config_name,
        overrides=overrides,
        model=params.model,
        data_files=tuple(dict.fromkeys(params.train_files + params.val_files)),
        lenient_checkpoint=recipe.lenient_checkpoint is not None,
        run_dir=run_dir,
        ray_address=params.ray_address,
        output_dir=output_dir,
        volumes=params.volumes,
        probe=probe,
        python=recipe.entry_point[0],
        transformers=transformers,
        nnodes=nnodes,
        npus_per_node=_int_override(overrides, recipe.parameters.get("npus_per_node")),
        scheduled=params.scheduled if params.backend == "slurm" else None,
    )


def _owned_by_flag(override: str, owned: dict[str, str]) -> str | None:
    """The problem with ``override`` when it sets a key a path flag sets, or a section holding one."""
    given = override_key(override)
    for key, flag in owned.items():
        if given == key or key.startswith(given + "."):
            why = f"set by {flag}, whose path envrun checks and mounts"
            if given == key:
                return f"-o {for_terminal(override)}: {key} is {why}; use {flag}"
            return f"-o {for_terminal(override)}: the section {given} holds {key}, {why}; set its other keys one by one"
    return None


def _int_override(overrides: tuple[str, ...], key: str | None) -> int | None:
    value = None
    for override in overrides:
        name, sep, rest = override.lstrip("+").partition("=")
        if key and sep and name == key:
            value = rest
    return int(value) if value is not None and value.isascii() and value.isdigit() else None
