"""What every envbuild/envrun command shares: error mapping to exit codes, progress, source options."""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuild.config import Config, SourceOptions, cache_dir_problem, load_config
from envbuild.errors import EnvbuildError, InputError
from envbuild.escape import for_terminal
from envbuild.git.mirrors import Mirrors
from envbuild.interrupts import forget_caught_interrupts
from envbuild.pipes import escape_what_stdout_cannot_encode, stdout_reader_gone

if TYPE_CHECKING:
    from envbuild.verify.pins import VerifyOptions


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is an :class:`InputError` (exit 2, one line) rather than SystemExit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # The program's name is said once, by :func:`run` (`envrun: error: …`); a subcommand's words stay.
        command = self.prog.partition(" ")[2]
        raise InputError(f"{command}: {message}" if command else message)


def run(prog: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse, dispatch to ``args.handler(args) -> int``, and map the project's errors to exit codes.
    ``argv`` None: the process's own arguments, and the process ends when this returns: what the command
    made is left to that end (:func:`gc.freeze`) — Python's last collection would walk every object the
    imports made first (0.03 s of a one-source rebuild's 2 s); atexit handlers and finalizers still run."""
    try:
        return _run(prog, parser, argv)
    finally:
        if argv is None:
            gc.freeze()
            forget_caught_interrupts()  # an interrupt answered here ends with its status, not by SIGINT


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, except that a command whose trailing names may follow its options
    (``set_defaults(intermixed=DEST)``: `lock update LOCK --dry-run NAME`) gets them: argparse takes a
    ``*`` positional's words only before the first option."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        into: str | None = getattr(args, "intermixed", None)
        unknown = extra if into is None else [word for word in extra if word.startswith("-")]
        if into is None or unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        getattr(args, into).extend(extra)
    return args


def _run(prog: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    escape_what_stdout_cannot_encode()
    _offer_global_options(parser)
    try:
        try:
            args = _parse(parser, argv)
        except SystemExit as exc:  # --help / --version printed and asked to stop: a status, not an exit
            return exc.code if isinstance(exc.code, int) else 0
        handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
        if handler is None:
            parser.print_help(sys.stderr)
            return 2
        status = handler(args)
        sys.stdout.flush()  # here, not at exit: a reader gone (`| head`) is then seen below
        return status
    except EnvbuildError as exc:
        if debug:
            traceback.print_exc()
        for line in str(exc).splitlines() or [type(exc).__name__]:  # several problems: each its own line
            print(f"{prog}: error: {for_terminal(line)}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a file the user named cannot be written or read: one line, never a traceback
        if isinstance(exc, BrokenPipeError) and stdout_reader_gone():
            return 141  # as a shell's tools end then (128 + SIGPIPE), saying nothing: the reader asked for no more
        if debug:
            traceback.print_exc()
        named = exc.filename2 or exc.filename  # for a rename, the target the user named, not our temporary
        where = f"{named}: " if named else ""
        print(f"{prog}: error: {for_terminal(f'{where}{exc.strerror or exc}')}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


class StderrProgress:
    """Progress lines on stderr, safe to call from worker threads; silent with --quiet."""

    def __init__(self, prog: str, quiet: bool = False) -> None:
        self.prog, self.quiet, self._lock = prog, quiet, threading.Lock()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            with self._lock:
                print(f"{self.prog}: {for_terminal(message)}", file=sys.stderr, flush=True)


def add_global_options(parser: argparse.ArgumentParser, default: object = False) -> None:
    parser.add_argument("--debug", action="store_true", default=default, help="show tracebacks for errors")
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="no progress on stderr")


def _offer_global_options(parser: argparse.ArgumentParser) -> None:
    """Accept --debug and -q after any subcommand too (`envbuild lock verify X -q`). SUPPRESS as the
    default, so a subcommand that was not given them keeps the top-level values. A subcommand's help page
    opens with the line its parent's list shows for it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            said = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if sub.description is None and said.get(name):
                    sub.description = said[name]
                known = {opt for a in sub._actions for opt in a.option_strings}
                if not {"--debug", "-q", "--quiet"} & known:
                    add_global_options(sub, default=argparse.SUPPRESS)
                _offer_global_options(sub)


def add_command_group(commands: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
    """A command made of actions (``envrun NAME ACTION``); without an action it prints its help, exit 2."""
    group = commands.add_parser(name, help=help)
    group.set_defaults(handler=lambda args: (group.print_help(sys.stderr), 2)[1])
    return group.add_subparsers(dest="action", metavar="ACTION")


def add_source_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mirror",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="rewrite repository URLs starting with FROM to start with TO (repeatable; "
        "like git's url.<base>.insteadOf; also `mirrors:` in the config file)",
    )
    parser.add_argument(
        "--cache-dir",
        type=cache_dir_argument,
        help="cache of bare repositories and files (default: $ENVBUILD_CACHE, config cache_dir or ~/.cache/envbuild)",
    )
    parser.add_argument("--offline", action="store_true", help="check against the cache alone; no network")
    parser.add_argument(
        "--config", type=Path, help="config file (default: $ENVBUILD_CONFIG or ~/.config/envbuild/config.yaml)"
    )
    parser.add_argument("--jobs", type=int, default=8, help="parallel fetches (default 8)")


def verify_options(args: argparse.Namespace, source: SourceOptions | None = None) -> VerifyOptions:
    """The options of `lock verify`: where pins are read from (``source``, or :func:`source_options`), as
    every command takes them, and ``--strict``."""
    from envbuild.verify.pins import VerifyOptions  # only the commands that verify pay for importing it

    return VerifyOptions(source or source_options(args), strict=getattr(args, "strict", False))


def source_options(args: argparse.Namespace) -> SourceOptions:
    """Where pins and files are read from: the cache, mirrors, ``--offline``, ``--jobs``."""
    cache_dir, mirrors = source_settings(args)
    return SourceOptions(cache_dir=cache_dir, mirrors=mirrors, offline=args.offline, jobs=args.jobs)


def source_settings(args: argparse.Namespace) -> tuple[Path, Mirrors]:
    """The cache directory and mirrors in force: command line over config file over defaults."""
    config = load_config(args.config)
    mirrors = config.mirrors.merged(Mirrors.parse(args.mirror))
    if args.jobs < 1:
        raise InputError(f"--jobs: expected a positive number, got {args.jobs}")
    return cache_dir_in_force(args, config), mirrors


def cache_dir_argument(text: str) -> Path:
    """``--cache-dir``'s type. An empty one (``--cache-dir "$CACHE"`` with ``CACHE`` unset) is refused as the
    config file's ``cache_dir: ""`` is, not taken as ``.``: the working directory filled with the cache."""
    if (problem := cache_dir_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


def cache_dir_in_force(args: argparse.Namespace, config: Config | None = None) -> Path:
    """``--cache-dir``, else the config's (``$ENVBUILD_CACHE``, the file's, the default), for every command that
    takes ``--cache-dir`` and ``--config``; one that exists as anything but a directory is bad input."""
    cache_dir: Path = args.cache_dir or (config or load_config(args.config)).cache_dir
    if cache_dir.exists() and not cache_dir.is_dir():
        where = "--cache-dir" if args.cache_dir else "cache_dir (config file or $ENVBUILD_CACHE)"
        raise InputError(f"{where}: {cache_dir} is not a directory")
    return cache_dir


def command_words(option: str, text: str) -> tuple[str, ...]:
    """A command given as one option's text (``--entry-point "python3 -m x"``), split as a shell would;
    an unbalanced quote, or no word at all, is bad input naming the option."""
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise InputError(f"{option} {for_terminal(text)!r}: {str(exc).lower()}") from None
    if not words:  # not "unset": an empty command is a mistake, never the default
        raise InputError(f"{option} {for_terminal(text)!r}: names no command")
    return words


def render_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
