"""``envrun <recipe>`` and ``envrun run RECIPE_FILE``: validate, preflight, launch, record.

Every recipe shipped in ``envrun/recipes/`` becomes a subcommand of its own name, so another recipe
is another file. The lead wires :func:`add_run_commands` into ``envrun.cli``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from envbuild.cli.common import ArgumentParser, StderrProgress, run
from envbuild.config import load_config
from envbuild.errors import InputError
from envbuild.lock.io import parse_lock
from envbuild.progress import Progress
from envrun.plan import (
    BACKENDS,
    RunParameters,
    RunPlan,
    build_plan,
    render_plan_json,
    render_plan_text,
)
from envrun.preflight import CHECKS, PreflightEnv, PreflightError, failed, run_preflight
from envrun.recipe import Recipe, load_recipe, recipe_path, shipped_recipes

if TYPE_CHECKING:
    from envrun.exports import ExportSpec
    from envrun.rundir import RunDir

CHECKOUT = Path(__file__).resolve().parents[1]


def add_run_commands(subparsers: argparse._SubParsersAction) -> None:
    for name in shipped_recipes():
        parser = subparsers.add_parser(name, help=f"run the {name} recipe (envrun/recipes/{name}.yaml)")
        _add_options(parser)
        parser.set_defaults(handler=run_recipe_command, recipe=name)
    generic = subparsers.add_parser("run", help="run a recipe file")
    generic.add_argument("recipe", metavar="RECIPE_FILE", help="a recipe YAML file (or a shipped recipe's name)")
    _add_options(generic)
    generic.set_defaults(handler=run_recipe_command)


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", type=Path, metavar="DIR", help="Hugging Face model directory (actor_rollout_ref.model.path)"
    )
    p.add_argument(
        "--data",
        type=Path,
        nargs="+",
        default=[],
        metavar="FILE",
        help="parquet training files (also validation unless --val-data)",
    )
    p.add_argument("--val-data", type=Path, nargs="+", default=[], metavar="FILE", help="parquet validation files")
    p.add_argument("--nnodes", type=int, metavar="N", help="number of nodes (trainer.nnodes)")
    p.add_argument("--npus-per-node", type=int, metavar="N", help="NPUs per node (trainer.n_gpus_per_node)")
    p.add_argument("--image", metavar="REF", help="the image built from the lock")
    p.add_argument("--lock", type=Path, metavar="PATH", help="lockfile (default: the recipe's)")
    p.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="a Hydra override, as Hydra takes it (repeatable; the last of a key wins)",
    )
    p.add_argument("--backend", choices=BACKENDS, default="local", help="where the job runs (default local)")
    p.add_argument("--ray-address", metavar="URL", help="Ray dashboard address for --backend ray")
    p.add_argument(
        "--run-dir", type=Path, metavar="DIR", help="run record directory (default runs/<recipe>-<UTC time>)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="validate, run the preflight and print the plan; start nothing"
    )
    p.add_argument("--json", action="store_true", help="print the plan (or the final status) as JSON")
    p.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra job environment (repeatable)"
    )
    p.add_argument(
        "--skip-check", action="append", default=[], choices=CHECKS, help="skip one preflight check (recorded)"
    )
    p.add_argument(
        "--verl-config", type=Path, metavar="DIR", help="an extracted verl/trainer/config to validate against"
    )
    p.add_argument(
        "--cache-dir", type=Path, help="cache (default: config cache_dir, $ENVBUILD_CACHE or ~/.cache/envbuild)"
    )
    p.add_argument("--offline", action="store_true", help="use only the cache for verl's config")
    p.add_argument(
        "--entry-point", metavar="CMD", help="replace the recipe's entry point (a stand-in trainer for tests)"
    )
    # SUPPRESS: do not reset a top-level `envrun --debug` (subparser defaults overwrite the parent's).
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def _resolve_lock(recipe: Recipe, given: Path | None) -> Path:
    if given is not None:
        return given
    if recipe.lock is None:
        raise InputError(f"recipe {recipe.name} names no lock; pass --lock PATH")
    for base in (Path.cwd(), CHECKOUT):
        if (base / recipe.lock).is_file():
            return base / recipe.lock
    raise InputError(f"{recipe.lock}: the recipe's lock is not here or in {CHECKOUT}; pass --lock PATH")


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise InputError(f"--env {pair!r}: expected NAME=VALUE")
        env[name] = value
    return env


def prepare(args: argparse.Namespace, progress: Progress) -> tuple[Recipe, RunPlan]:
    """Recipe, lock and parameters to a validated plan with its preflight report."""
    recipe = load_recipe(recipe_path(args.recipe))
    lock_path = _resolve_lock(recipe, args.lock)
    try:
        lock_bytes = lock_path.read_bytes()
    except OSError as exc:
        raise InputError(f"{lock_path}: cannot read the lock: {exc.strerror or exc}") from None
    lock = parse_lock(lock_bytes, str(lock_path))
    params = RunParameters(
        backend=args.backend,
        model=args.model,
        train_files=tuple(args.data),
        val_files=tuple(args.val_data),
        nnodes=args.nnodes,
        npus_per_node=args.npus_per_node,
        image=args.image,
        overrides=tuple(args.overrides),
        extra_env=_env_pairs(args.env),
        ray_address=args.ray_address,
        entry_point=tuple(shlex.split(args.entry_point)) if args.entry_point else None,
    )
    plan = build_plan(recipe, params, str(lock_path), lock_bytes)

    from envrun.overrides import validate_overrides  # Hydra costs a second to import

    config_dir = args.verl_config
    if config_dir is None:
        from envrun.verlconfig import verl_config_dir, verl_wheel_from_lock

        wheel = verl_wheel_from_lock(lock, str(lock_path), recipe.verl_package)
        config_dir = verl_config_dir(
            wheel, args.cache_dir or load_config(None).cache_dir, offline=args.offline, progress=progress
        )
    progress(f"validating {len(plan.overrides)} overrides against {config_dir}")
    validate_overrides(plan.overrides, config_dir, recipe.config_name)

    labels: Callable[[str], dict[str, str]] | None = None
    if plan.image:
        from envrun.launch.docker_backend import image_labels

        labels = image_labels
    results = run_preflight(plan, PreflightEnv(image_labels=labels), dry_run=args.dry_run, skip=args.skip_check)
    return recipe, plan.with_preflight(results)


def _audit_exports(plan: RunPlan, exports: ExportSpec, record: RunDir, progress: Progress) -> list[str]:
    """The lenient save's guard: every HF export the run wrote may lack the MTP layers and nothing else."""
    from envrun.exports import audit_exports

    where, audits = audit_exports(plan.overrides, plan.env, exports)
    record.record_json("exports.json", {"where": where, "exports": [a.to_json() for a in audits]})
    progress(f"export audit: {where}")
    bad = []
    for audit in audits:
        if not audit.ok:
            lost = audit.error or ", ".join([*audit.missing[:3], *audit.unexpected[:3]])
            bad.append(f"{audit.path}: {lost}")
            print(f"envrun: export audit FAILED: {audit.path}: {lost}", file=sys.stderr)  # a result, not progress
    return bad


def run_recipe_command(args: argparse.Namespace) -> int:
    progress = StderrProgress("envrun", getattr(args, "quiet", False))
    recipe, plan = prepare(args, progress)
    problems = failed(plan.preflight)
    if args.dry_run:
        sys.stdout.write(render_plan_json(plan) if args.json else render_plan_text(plan))
    if problems:
        raise PreflightError(
            "preflight failed, nothing started: " + "; ".join(f"{c.name}: {c.detail}" for c in problems)
        )
    if args.dry_run:
        return 0
    exports = None
    if recipe.lenient_checkpoint is not None:
        from envrun.exports import ExportSpec

        exports = ExportSpec(recipe.lenient_checkpoint.export_dir_key, recipe.lenient_checkpoint.export_pattern)
    return launch_and_record(plan, args.run_dir, progress, as_json=args.json, exports=exports)


def launch_and_record(
    plan: RunPlan, run_dir: Path | None, progress: Progress, as_json: bool = False, exports: ExportSpec | None = None
) -> int:
    from envrun.launch import launcher_for
    from envrun.rundir import RunDir, default_run_dir

    launcher = launcher_for(plan)
    record = RunDir(run_dir or default_run_dir(plan.recipe))
    digest = None
    if plan.image and plan.backend == "docker":
        from envrun.launch.docker_backend import image_digest

        digest = image_digest(plan.image)
    record.record_plan(plan, image_digest=digest)
    progress(f"run directory {record.path}")
    try:
        result = launcher.launch(plan, record.log)
    except BaseException as exc:
        record.finish("error", None, detail=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise
    detail = result.detail
    if result.interrupted:
        status, code = "interrupted", 130
    else:
        status, code = (
            ("succeeded" if result.exit_code == 0 else "failed"),
            (result.exit_code if result.exit_code is not None else 1),
        )
    if status == "succeeded" and exports is not None:
        bad = _audit_exports(plan, exports, record, progress)
        if bad:
            status, code, detail = "failed", 1, "export audit: " + "; ".join(bad)
    record.finish(status, result.exit_code, detail)  # type: ignore[arg-type]
    progress(f"{status} (exit {result.exit_code}); record in {record.path}")
    if as_json:
        print(
            json.dumps({"status": status, "exit_code": result.exit_code, "run_dir": str(record.path)}, sort_keys=True)
        )
    return code


def main_for_tests(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(prog="envrun")
    add_run_commands(parser.add_subparsers(dest="command", metavar="COMMAND"))
    return run("envrun", parser, argv)


if __name__ == "__main__":
    sys.exit(main_for_tests())
