"""The run plan: everything a launcher needs, resolved and typed, rendered as JSON by a pure function."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping

from envbuild.errors import InputError
from envbuild.lock.model import ENV_NAME
from envrun.overrides import merge_overrides
from envrun.recipe import REQUIRED_PARAMETERS, Recipe, override_key

Backend = Literal["docker", "ray", "local"]
BACKENDS: tuple[Backend, ...] = ("docker", "ray", "local")
# What Hydra takes unquoted and reads as the same string; anything else is quoted.
_PLAIN = re.compile(r"[A-Za-z0-9_/.+:@%-]+")


PreflightStatus = Literal["ok", "fail", "skip"]


@dataclass(frozen=True)
class PreflightLine:
    """One line of the preflight report: a check's name, its verdict and why."""

    name: str
    status: PreflightStatus
    detail: str
    facts: Mapping[str, Any] | None = None  # what the check was told (a node's own answer), for the record

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"name": self.name, "status": self.status, "detail": self.detail}
        if self.facts is not None:
            document["facts"] = dict(self.facts)
        return document


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
    ray_address: str | None = None
    preflight: tuple[PreflightLine, ...] = ()

    def with_preflight(self, results: tuple[PreflightLine, ...]) -> RunPlan:
        return replace(self, preflight=results)

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)


def hydra_string(value: str) -> str:
    """``value`` as a Hydra override value that reads back as exactly this string."""
    if _PLAIN.fullmatch(value) and not re.fullmatch(r"[-+]?[0-9._]+|true|false|null|nan|inf", value, re.I):
        return value
    escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${")
    return f"'{escaped}'"


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


def build_plan(recipe: Recipe, params: RunParameters, lock_file: str, lock_sha256: str) -> RunPlan:
    """The plan for ``recipe`` with ``params``: a pure function, so a dry run needs nothing running.

    The one place a plan is validated: what it returns is complete for its backend (an image for
    docker, an address for Ray), and the launchers trust it. ``lock_sha256`` is the digest of the lock's
    bytes as :func:`envbuild.lock.io.read_lock` gives it (the digest the image's label carries)."""
    if params.backend not in BACKENDS:
        raise InputError(f"--backend: expected one of {', '.join(BACKENDS)}, got {params.backend!r}")
    recipe_keys = {override_key(o) for o in recipe.overrides()}
    given = {override_key(o) for o in params.overrides}
    for name in REQUIRED_PARAMETERS:
        key = recipe.parameters.get(name)
        if key and key not in recipe_keys and key not in given and not _given(name, params):
            flag = "--data" if name == "train_files" else f"--{name.replace('_', '-')}"
            raise InputError(f"{flag} is required by recipe {recipe.name} (sets {key})")
    if params.backend == "docker" and not params.image:
        raise InputError("--backend docker needs --image REF (the image built from the lock)")
    if params.backend == "ray" and not params.ray_address:
        raise InputError("--backend ray needs --ray-address URL (the Ray dashboard, e.g. http://HEAD:8265)")
    for name, value in params.extra_env.items():
        if not re.fullmatch(ENV_NAME, name) or "\0" in value:
            raise InputError(f"--env {name}: not a valid environment variable")
    overrides = merge_overrides(recipe.overrides(), parameter_overrides(recipe, params) + params.overrides)
    entry = params.entry_point or recipe.entry_point
    argv = (*entry, f"--config-name={recipe.config_name}", *overrides)
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
        ray_address=params.ray_address,
    )


def _given(name: str, params: RunParameters) -> bool:
    return bool(params.model) if name == "model" else bool(params.train_files)


def plan_to_json(plan: RunPlan) -> dict[str, Any]:
    return {
        "argv": list(plan.argv),
        "env": dict(plan.env),
        "backend": plan.backend,
        "preflight": [c.to_json() for c in plan.preflight],
        "image": plan.image,
        "lock": {"file": plan.lock_file, "sha256": plan.lock_sha256},
        "recipe": plan.recipe,
        "ray_address": plan.ray_address,
    }


def render_plan_json(plan: RunPlan) -> str:
    """Stable JSON: the four promised keys first, then what else the run directory records."""
    return json.dumps(plan_to_json(plan), indent=2) + "\n"


def render_plan_text(plan: RunPlan) -> str:
    lines = [
        f"recipe:  {plan.recipe}",
        f"backend: {plan.backend}",
        f"image:   {plan.image or '-'}",
        f"lock:    {plan.lock_file} (sha256 {plan.lock_sha256})",
    ]
    lines += [f"env:     {k}={v}" for k, v in plan.env.items()]
    lines.append("command:")
    lines += [f"  {shlex.quote(arg)}" for arg in plan.argv]
    if plan.preflight:
        lines.append("preflight:")
        lines += [f"  {c.status:<4} {c.name}: {c.detail}" for c in plan.preflight]
    return "\n".join(lines) + "\n"
