"""The `envbuild` command: `lock init|add|verify|update|diff|fetch|export|schema`, `image`, `check` and `bisect`."""

from __future__ import annotations

from collections.abc import Sequence

from envbuild import __version__
from envbuild.cli.bisect import add_bisect_command
from envbuild.cli.check import add_check_command
from envbuild.cli.common import ArgumentParser, add_global_options, run
from envbuild.cli.image import add_image_command
from envbuild.cli.lock import add_lock_commands


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="envbuild", description=__doc__)
    parser.add_argument("--version", action="version", version=f"envbuild {__version__}")
    add_global_options(parser)
    commands = parser.add_subparsers(metavar="COMMAND")
    add_lock_commands(commands)
    add_check_command(commands)
    add_image_command(commands)
    add_bisect_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run("envbuild", build_parser(), argv)
