"""``envrun cluster up|status|down``: a thin layer over :mod:`envrun.cluster` — parse, call, print."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from envbuild.cli.common import StderrProgress, add_command_group, cache_dir_argument, cache_dir_in_force
from envbuild.data.jsonout import to_jsonable
from envbuild.errors import InputError


def add_cluster_command(subparsers: argparse._SubParsersAction) -> None:
    actions = add_command_group(subparsers, "cluster", "a Ray cluster of containers of the locked image")

    up = actions.add_parser(
        "up",
        help="start a node container on every host of CLUSTER.yaml and wait until each has joined",
        description="Exit 0 when every node has joined, 1 when a host or a node fails (nothing is left "
        "started), 2 on invalid input (the cluster file, an image of another lock).",
    )
    up.add_argument("cluster_file", type=Path, metavar="CLUSTER.yaml")
    up.add_argument("--image", required=True, metavar="REF", help="the image built from the lock, pushed")
    up.add_argument("--lock", type=Path, metavar="LOCK", help="the lock the image must carry (default: any)")
    up.add_argument(
        "--timeout", type=seconds, default=300.0, metavar="SECONDS", help="for every node to join (default 300)"
    )
    up.set_defaults(handler=_up)

    status = actions.add_parser(
        "status",
        help="each node read live: container, image, lock, Ray node, alive or dead",
        description="Exit 0 when every node is alive, 1 otherwise.",
    )
    status.add_argument("name", metavar="NAME", type=cluster_name)
    status.set_defaults(handler=_status)

    down = actions.add_parser("down", help="stop and remove every container of the cluster, on every host (idempotent)")
    down.add_argument(
        "target", metavar="NAME|CLUSTER.yaml", help="the cluster's name, or its file (also asks the file's hosts)"
    )
    down.set_defaults(handler=_down)
    for parser in (up, status):
        parser.add_argument("--json", action="store_true", help="print the cluster as JSON")
    for parser in (up, status, down):
        parser.add_argument(
            "--cache-dir", type=cache_dir_argument, help="where cluster state lives (default: the config's)"
        )
        parser.add_argument(
            "--config", type=Path, help="config file (default: $ENVBUILD_CONFIG or ~/.config/envbuild/config.yaml)"
        )


def seconds(text: str) -> float:
    """A positive, finite number of seconds (nan would never time out)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of seconds")
    return value


def cluster_name(name: str) -> str:
    """A cluster's name as its state file's (argparse refuses anything else: one line, exit 2)."""
    from envrun.cluster.state import cluster_name_problem

    if problem := cluster_name_problem(name):
        raise argparse.ArgumentTypeError(problem)
    return name


def _cache_dir(args: argparse.Namespace) -> Path:
    return cache_dir_in_force(args)


def _up(args: argparse.Namespace) -> int:
    from envbuild.lock.io import read_lock
    from envrun.cluster.info import render_cluster
    from envrun.cluster.spec import load_cluster_file
    from envrun.cluster.up import UpOptions, cluster_up

    spec = load_cluster_file(args.cluster_file)
    lock = read_lock(args.lock) if args.lock else None
    options = UpOptions(image=args.image, cache_dir=_cache_dir(args), lock=lock, join_timeout=args.timeout)
    info = cluster_up(spec, options, StderrProgress("envrun", args.quiet))
    sys.stdout.write(json.dumps(to_jsonable(info), indent=2) + "\n" if args.json else render_cluster(info))
    return 0


def _status(args: argparse.Namespace) -> int:
    from envrun.cluster.info import render_cluster
    from envrun.cluster.manage import cluster_status

    info = cluster_status(args.name, _cache_dir(args))
    sys.stdout.write(json.dumps(to_jsonable(info), indent=2) + "\n" if args.json else render_cluster(info))
    return 0 if all(node.alive for node in info.nodes) else 1


def _down(args: argparse.Namespace) -> int:
    from envrun.cluster.manage import cluster_down
    from envrun.cluster.spec import load_cluster_file
    from envrun.cluster.state import cluster_name_problem

    name: str = args.target
    hosts: tuple[str, ...] = ()
    timeout: dict[str, int] = {}
    if args.target.endswith((".yaml", ".yml")) or Path(args.target).is_file():
        spec = load_cluster_file(Path(args.target))
        name, hosts, timeout = spec.name, spec.engines, {"connect_timeout": spec.connect_timeout}
    elif problem := cluster_name_problem(name):  # a path here would name a file outside the state directory
        raise InputError(f"cluster down NAME: {problem} (nor a cluster file: none is there)")
    removed = cluster_down(name, _cache_dir(args), hosts, StderrProgress("envrun", args.quiet), **timeout)
    print(f"cluster {name}: removed {len(removed)} container(s)")
    return 0
