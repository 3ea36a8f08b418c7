"""The envrun command line: parse arguments, call one library function, map errors to exit codes.

Each subcommand registers itself with ``_add_<name>(subparsers)`` and sets ``handler``, a function of
the parsed namespace returning the exit status; a new subcommand (``grpo-glm5``, ...) is one more
``_add_*`` function and one line in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from envbuild.cli.common import ArgumentParser, add_global_options, run


def build_parser() -> argparse.ArgumentParser:
    from envrun.cli_cluster import add_cluster_command
    from envrun.cli_run import add_run_commands

    parser = ArgumentParser(prog="envrun", description="Run training jobs from locked images.")
    add_global_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_checkpoint(commands)
    add_run_commands(commands)
    add_cluster_command(commands)
    return parser


def add_command_group(commands: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
    """A command made of actions (``envrun NAME ACTION``); without an action it prints its help, exit 2."""
    group = commands.add_parser(name, help=help)
    group.set_defaults(handler=lambda args: (group.print_help(sys.stderr), 2)[1])
    return group.add_subparsers(dest="action", metavar="ACTION")


def _add_checkpoint(commands: argparse._SubParsersAction) -> None:
    actions = add_command_group(commands, "checkpoint", "inspect Hugging Face checkpoints")
    audit = actions.add_parser(
        "audit",
        help="check a checkpoint is complete except, at most, its MTP layers (reads headers only)",
        description="Exit 0 if complete (MTP layers may be absent), 1 if anything else is missing "
        "or unexpected, 2 if the input cannot be read.",
    )
    audit.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    audit.set_defaults(handler=_checkpoint_audit)


def _checkpoint_audit(args: argparse.Namespace) -> int:
    # Imported here so that `envrun --help` and other subcommands do not pay for it.
    from envrun.checkpoint.audit import audit_checkpoint, render_audit

    report = audit_checkpoint(args.model_dir)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_audit(report, args.model_dir))
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    return run("envrun", build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
