"""The envrun command line: parse arguments, call one library function, map errors to exit codes.

Each subcommand registers itself with ``_add_<name>(subparsers)`` and sets ``handler``, a function of
the parsed namespace returning the exit status; a new subcommand (``grpo-glm5``, ...) is one more
``_add_*`` function and one line in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import sys

from envbuild.cli.common import ArgumentParser, add_global_options, run


def build_parser() -> argparse.ArgumentParser:
    from envrun.checkpoint.cli import add_checkpoint_command
    from envrun.cli_cluster import add_cluster_command
    from envrun.cli_run import add_run_commands

    parser = ArgumentParser(prog="envrun", description="Run training jobs from locked images.")
    add_global_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_checkpoint_command(commands)
    add_run_commands(commands)
    add_cluster_command(commands)
    return parser


def add_command_group(commands: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
    """A command made of actions (``envrun NAME ACTION``); without an action it prints its help, exit 2."""
    group = commands.add_parser(name, help=help)
    group.set_defaults(handler=lambda args: (group.print_help(sys.stderr), 2)[1])
    return group.add_subparsers(dest="action", metavar="ACTION")


def main(argv: list[str] | None = None) -> int:
    return run("envrun", build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
