"""``envrun <recipe>`` and ``envrun run RECIPE_FILE``: a thin layer over :mod:`envrun.prepare` and
:mod:`envrun.execute` — parse, build a :class:`~envrun.prepare.RunRequest`, call, print.

Every recipe shipped in ``envrun/recipes/`` becomes a subcommand of its own name, so another recipe
is another file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from envbuild.cli.common import StderrProgress, cache_dir_argument, cache_dir_in_force, command_words
from envbuild.cli.width import output_width
from envbuild.data.jsonout import to_jsonable
from envbuild.errors import InputError
from envbuild.escape import for_terminal
from envrun.cli.cluster import cluster_name
from envrun.cluster.spec import HCCL_PORTS_PER_NODE, check_ray_start_args
from envrun.injob.spec import NODE_PORTS
from envrun.plan import BACKENDS, RunParameters, Scheduled, Volume
from envrun.planview import render_plan_json, render_plan_text
from envrun.preflight import CHECKS
from envrun.recipe import shipped_recipes


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
        "--cluster",
        metavar="NAME",
        type=cluster_name,
        help="for --backend ray: the cluster `envrun cluster up` started (its job API)",
    )
    p.add_argument(
        "--ray-ports",
        type=int,
        metavar="BASE",
        help="for --backend slurm and --emit: Ray's ports from BASE (the head's GCS, its job API, then 50 for each "
        "node by its place on its machine); needed when nodes share a machine (default: Ray's own ports)",
    )
    p.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        dest="scheduler_args",
        help="for --backend slurm: an sbatch option for the batch job, e.g. --sbatch-arg=--partition=npu (repeatable)",
    )
    p.add_argument(
        "--ray-start-arg",
        action="append",
        default=[],
        metavar="ARG",
        dest="ray_start_args",
        help="for --backend slurm and --emit: appended to every node's `ray start`, e.g. "
        "--ray-start-arg=--num-cpus=64 (repeatable)",
    )
    p.add_argument(
        "--join-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="for --backend slurm: how long the head waits for every node to join (default 600)",
    )
    p.add_argument(
        "--run-dir", type=Path, metavar="DIR", help="run record directory (default runs/<recipe>-<UTC time>)"
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="where the trainer writes checkpoints and rollout data (default <run dir>/outputs; "
        "with --backend ray, a directory every node writes to)",
    )
    p.add_argument(
        "--volume",
        action="append",
        default=[],
        metavar="HOST:CONTAINER[:ro|rw]",
        help="for --backend docker or slurm: mount a host path into the job's container(s) (repeatable; read-only by default)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate, run the preflight (the job probe too) and print the plan; start nothing",
    )
    p.add_argument(
        "--emit",
        nargs=2,
        metavar=("KIND", "DIR"),
        help="write what a scheduler runs instead of running it: sbatch (a Slurm batch job), volcano (a Volcano "
        "Job) or rayjob (a KubeRay RayJob), into DIR; the preflight runs first, as for --dry-run",
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
        "--cache-dir",
        type=cache_dir_argument,
        help="cache (default: $ENVBUILD_CACHE, config cache_dir or ~/.cache/envbuild)",
    )
    p.add_argument("--offline", action="store_true", help="use only the cache for verl's config")
    p.add_argument(
        "--entry-point", metavar="CMD", help="replace the recipe's entry point (a stand-in trainer for tests)"
    )
    # SUPPRESS: do not reset a top-level `envrun --debug` (subparser defaults overwrite the parent's).
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress on stderr")
    p.add_argument(
        "--config", type=Path, help="config file (default: $ENVBUILD_CONFIG or ~/.config/envbuild/config.yaml)"
    )


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise InputError(f"--env {pair!r}: expected NAME=VALUE")
        env[name] = value
    return env


RAY_BLOCKS = 4  # the nodes of one machine --ray-ports leaves room for, a block of Ray's ports each


def _scheduled(args: argparse.Namespace) -> Scheduled:
    base = args.ray_ports
    last = 65535 - 2 - NODE_PORTS * RAY_BLOCKS
    if base is not None and not 1024 <= base <= last:
        raise InputError(f"--ray-ports {base}: expected a port from 1024 to {last}")
    if base is not None:
        ray = (base, base + 2 + NODE_PORTS * RAY_BLOCKS - 1)  # the head's GCS and job API, then each node's block
        first = Scheduled.hccl_ports  # each machine's HCCL host and device ranges, one node's after another's
        hccl = (first, first + HCCL_PORTS_PER_NODE * RAY_BLOCKS - 1)
        if ray[0] <= hccl[1] and hccl[0] <= ray[1]:
            raise InputError(
                f"--ray-ports {base}: Ray's ports {ray[0]}-{ray[1]} overlap HCCL's {hccl[0]}-{hccl[1]} "
                "(HCCL_HOST_SOCKET_PORT_RANGE and HCCL_NPU_SOCKET_PORT_RANGE on each machine); give a base up to "
                f"{hccl[0] - (ray[1] - ray[0]) - 1} or from {hccl[1] + 1}"
            )
    if args.join_timeout <= 0:
        raise InputError(f"--join-timeout {args.join_timeout:g}: expected a positive number of seconds")
    for arg in args.scheduler_args:
        if not arg.startswith("-") or not arg.isprintable():  # a control character ends or cuts its #SBATCH line
            raise InputError(f"--sbatch-arg {arg!r}: expected one sbatch option, such as --partition=npu")
    if problem := check_ray_start_args(tuple(args.ray_start_args)):
        raise InputError(f"--ray-start-arg: {problem}")
    ports = {} if base is None else {"head_port": base, "dashboard_port": base + 1, "node_ports": base + 2}
    return Scheduled(
        **ports,
        join_timeout=args.join_timeout,
        scheduler_args=tuple(args.scheduler_args),
        ray_start_args=tuple(args.ray_start_args),
    )


def run_recipe_command(args: argparse.Namespace) -> int:
    from envrun.execute import execute_run
    from envrun.prepare import RunRequest, prepare_run

    if args.emit and args.backend not in ("local", "slurm"):
        raise InputError(f"--emit writes a scheduler's job; it takes no --backend {args.backend}")
    if args.emit:
        from envrun.schedule.emit import emit_target

        kind, directory = args.emit
        emit_target(kind, Path(directory))  # before the run is prepared: a refusal costs nothing
    request = RunRequest(
        recipe=args.recipe,
        params=RunParameters(
            backend="slurm" if args.emit else args.backend,  # a scheduled run's plan, whichever scheduler
            model=args.model,
            train_files=tuple(args.data),
            val_files=tuple(args.val_data),
            nnodes=args.nnodes,
            npus_per_node=args.npus_per_node,
            image=args.image,
            overrides=tuple(args.overrides),
            extra_env=_env_pairs(args.env),
            ray_address=args.ray_address,
            entry_point=command_words("--entry-point", args.entry_point) if args.entry_point is not None else None,
            output_dir=args.output_dir,
            volumes=tuple(Volume.parse(v) for v in args.volume),
            scheduled=_scheduled(args),
            emit=args.emit[0] if args.emit else None,
        ),
        lock=args.lock,
        verl_config=args.verl_config,
        cache_dir=cache_dir_in_force(args),
        offline=args.offline,
        dry_run=args.dry_run or bool(args.emit),
        skip_checks=tuple(args.skip_check),
        cluster=args.cluster,
        run_dir=args.run_dir,
    )
    progress = StderrProgress("envrun", getattr(args, "quiet", False))
    prepared = prepare_run(request, progress)
    if args.emit:
        from envrun.schedule.emit import emit

        prepared.refuse_if_failed()
        kind, directory = args.emit
        written = emit(prepared.plan, kind, Path(directory), frozenset(args.skip_check))
        if args.json:
            print(json.dumps({"emitted": kind, "files": [str(path) for path in written]}, sort_keys=True))
        else:
            print("\n".join(str(path) for path in written))
        return 0
    if args.dry_run:
        sys.stdout.write(
            render_plan_json(prepared.plan) if args.json else render_plan_text(prepared.plan, output_width())
        )
        prepared.refuse_if_failed()
        return 0
    outcome = execute_run(prepared, progress, echo="stderr" if args.json else "stdout")  # --json: stdout is JSON
    for failure in outcome.export_failures:
        print(f"envrun: export audit FAILED: {for_terminal(failure)}", file=sys.stderr)  # a result, not progress
    if args.json:
        print(json.dumps(to_jsonable(outcome), sort_keys=True))
    return outcome.exit_status
