"""Recipes: a training job as data (entry point, config name, Hydra overrides, runtime env).

A recipe file is read strictly, with line-numbered problems, by the same decoder as the lockfile.
Another job is another file under ``envrun/recipes/``, not more code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from envbuild.data.decode import decode_yaml
from envbuild.data.typed import meta, mfield
from envbuild.data.yamlfile import read_capped
from envbuild.errors import DataFileError, Problem
from envbuild.lock.model import ENV_NAME, SAFE_NAME, check_env

RECIPES_DIR = Path(__file__).parent / "recipes"
# The parameters the command line offers; a recipe says which override key each one sets.
PARAMETERS = ("model", "train_files", "val_files", "nnodes", "npus_per_node")
REQUIRED_PARAMETERS = ("model", "train_files")
# The flags of the paths the preflight checks and a job's container mounts: the keys they set are theirs.
PATH_FLAGS = {"model": "--model", "train_files": "--data", "val_files": "--val-data"}
_OVERRIDE = r"(?:\+\+|\+|~)?[A-Za-z_][A-Za-z0-9_./@-]*(?:=.*)?"
_KEY = r"[A-Za-z_][A-Za-z0-9_./@-]*"
_MODULE = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_OUTPUT = r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]*|\{run_id\})(?:/(?:[A-Za-z0-9_][A-Za-z0-9_.-]*|\{run_id\}))*"


class RecipeError(DataFileError):
    """A recipe file failed validation: every problem, each with its file and line (exit 2)."""


def _check_override(value: str) -> str | None:
    if not re.fullmatch(_OVERRIDE, value, flags=re.S):
        return f"{value!r} is not a Hydra override (key=value, +key=value, ++key=value or ~key)"
    if "\n" in value or "\0" in value:
        return f"{value!r} contains a newline or NUL"
    return None


def _check_outputs(outputs: dict[str, str]) -> str | None:
    for key, sub in outputs.items():
        if not re.fullmatch(_KEY, key or ""):
            return f"{key!r} is not a config key"
        if not re.fullmatch(_OUTPUT, sub or "") or ".." in sub.split("/"):
            return f"{key}: {sub!r} is not a relative directory (a/b, no '..'; {{run_id}} is the run's id)"
    return None


def _check_parameters(params: dict[str, str]) -> str | None:
    for name, key in params.items():
        if name not in PARAMETERS:
            return f"unknown parameter {name!r} (known: {', '.join(PARAMETERS)})"
        if not re.fullmatch(_KEY, key or ""):
            return f"{name}: {key!r} is not a config key"
    return None


@dataclass(frozen=True)
class OverrideGroup:
    """Overrides that belong together (data, actor, rollout, ...), in the order Hydra gets them."""

    group: str = field(metadata=meta(pattern=SAFE_NAME, expect="a short lowercase name"))
    overrides: tuple[str, ...] = mfield((), check=lambda vs: next(filter(None, map(_check_override, vs)), None))


@dataclass(frozen=True)
class LenientCheckpoint:
    """A lenient checkpoint setting, why it is needed, and the check that keeps it safe.

    Where the exports it guards are written is not said here: the job probe reads it from the verl the
    job runs (its layout for the configured strategy, and whether the config saves any)."""

    override: str = field(metadata=meta(check=_check_override))
    reason: str
    guard: Literal["checkpoint-audit"]


@dataclass(frozen=True)
class SkipImport:
    """A module the job probe may fail to import where it runs, and why that failure says nothing about
    the job (as ``skip_imports`` does for a source's modules in the in-image check)."""

    name: str = field(metadata=meta(pattern=_MODULE, expect="a dotted module name such as vllm"))
    reason: str = field(metadata=meta(check=lambda r: None if r.strip() else "must say why"))


@dataclass(frozen=True)
class JobProbe:
    """The job probe (:mod:`envrun.probe`): run where the job will run, before anything is launched."""

    skip_imports: tuple[SkipImport, ...] = ()


@dataclass(frozen=True)
class Recipe:
    """One training job: how to start it and every Hydra override it passes."""

    recipe: Literal[1]
    name: str = field(metadata=meta(pattern=SAFE_NAME, expect="a safe name such as grpo-glm5"))
    entry_point: tuple[str, ...]
    config_name: str = field(metadata=meta(pattern=r"[A-Za-z0-9_./-]+", expect="a Hydra config name"))
    override_groups: tuple[OverrideGroup, ...]
    description: str = ""
    lock: str | None = mfield(None, description="default lockfile, relative to the current directory or the checkout")
    verl_package: str = "verl"
    runtime_env: dict[str, str] = mfield(default_factory=dict, check=check_env)
    parameters: dict[str, str] = mfield(default_factory=dict, check=_check_parameters)
    lenient_checkpoint: LenientCheckpoint | None = None
    probe: JobProbe | None = mfield(None, description="the job probe: verl's recipes run it before launching")
    outputs: dict[str, str] = mfield(
        default_factory=dict,
        check=lambda outputs: _check_outputs(outputs),
        description="config keys envrun sets to directories under the run's output directory ({run_id}: the run's id)",
    )

    @property
    def entry_module(self) -> str | None:
        """``MODULE`` of an entry point ``python… -m MODULE``; None for any other program."""
        entry = self.entry_point
        if len(entry) >= 3 and Path(entry[0]).name.startswith("python") and entry[1] == "-m":
            return entry[2]
        return None

    def flag_keys(self) -> dict[str, str]:
        """Each config key a path flag sets, with the flag: the model and data parameters, and the
        ``outputs`` (directories under ``--output-dir``)."""
        keys = {self.parameters[name]: flag for name, flag in PATH_FLAGS.items() if name in self.parameters}
        return {**keys, **dict.fromkeys(self.outputs, "--output-dir")}

    def overrides(self) -> tuple[str, ...]:
        """Every override of the recipe, in order: runtime env (as Ray workers get it, through verl's
        ray_init, in upstream's own spelling), groups, then the lenient checkpoint."""
        out = [f"++ray_kwargs.ray_init.runtime_env.env_vars.{k}='{v}'" for k, v in self.runtime_env.items()]
        for group in self.override_groups:
            out.extend(group.overrides)
        if self.lenient_checkpoint is not None:
            out.append(self.lenient_checkpoint.override)
        return tuple(out)


def recipe_path(name_or_path: str) -> Path:
    """A shipped recipe by name (``grpo-glm5``) or a recipe file by path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        return candidate
    return RECIPES_DIR / f"{name_or_path}.yaml"


def shipped_recipes() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))


def load_recipe(path: Path) -> Recipe:
    return parse_recipe(read_capped(path, RecipeError), str(path))


def parse_recipe(text: bytes | str, file: str = "<recipe>") -> Recipe:
    return decode_yaml(
        text,
        file,
        Recipe,
        RecipeError,
        empty="a recipe needs recipe, name, entry_point, config_name, override_groups",
        checks=lambda recipe, root: _cross_checks(recipe, file),
    )


def _cross_checks(recipe: Recipe, file: str) -> list[Problem]:
    problems = []
    if not recipe.entry_point:
        problems.append(
            Problem(file, 0, "entry_point", "must name a program, e.g. [python3, -m, verl.trainer.main_ppo]")
        )
    seen: dict[str, str] = {}
    for override in recipe.overrides():
        key = override_key(override)
        if key in seen:
            problems.append(Problem(file, 0, "override_groups", f"{key} is set twice ({seen[key]!r} and {override!r})"))
        seen[key] = override
    for key in recipe.outputs:
        if key in seen:
            problems.append(Problem(file, 0, "outputs", f"{key} is set by envrun; drop {seen[key]!r}"))
    if recipe.probe is not None and recipe.entry_module is None:
        problems.append(Problem(file, 0, "probe", "the job probe needs an entry point [python3, -m, MODULE]"))
    for name in recipe.runtime_env:
        if not re.fullmatch(ENV_NAME, name):
            problems.append(Problem(file, 0, "runtime_env", f"{name!r} is not an environment variable name"))
    return problems


def override_key(override: str) -> str:
    """The config key an override addresses, without its ``+``/``++``/``~`` prefix and value."""
    return override.lstrip("+~").split("=", 1)[0]


def override_prefix(override: str) -> str:
    return override[: len(override) - len(override.lstrip("+~"))]
