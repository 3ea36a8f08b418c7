"""The envrun command line: parse arguments, call one library function, map errors to exit codes.

Each command group registers itself from its own module of ``envrun/cli/`` (``add_<name>_command(subparsers)``)
and sets ``handler``, a function of the parsed namespace returning the exit status; a new command is one
more such function and one line in :func:`build_parser`. The modules import the shared pieces from
:mod:`envbuild.cli.common`, never this one, so the command line has no circle.
"""

from __future__ import annotations

import argparse
import sys

from envbuild import __version__
from envbuild.cli.common import ArgumentParser, add_global_options, run
from envrun.cli.checkpoint import add_checkpoint_command
from envrun.cli.cluster import add_cluster_command
from envrun.cli.run import add_run_commands


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="envrun", description="Run training jobs from locked images.")
    parser.add_argument("--version", action="version", version=f"envrun {__version__}")
    add_global_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_checkpoint_command(commands)
    add_run_commands(commands)
    add_cluster_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run("envrun", build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
