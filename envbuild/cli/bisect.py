"""`envbuild bisect GOOD BAD`: a thin wrapper over :func:`envbuild.bisect.run.run_bisect`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from envbuild.cli.common import StderrProgress, add_source_options, render_json, verify_options
from envbuild.cli.width import output_width
from envbuild.errors import EnvbuildError, InputError
from envbuild.fileio import write_atomic


def add_bisect_command(subparsers: argparse._SubParsersAction) -> None:
    bisect = subparsers.add_parser(
        "bisect",
        help="find the change from a lock that passed to one that fails: the pin, then a source's first bad commit",
    )
    bisect.add_argument("good", type=Path, metavar="GOOD_LOCK", help="a lock whose image was built and passed")
    bisect.add_argument("bad", type=Path, metavar="BAD_LOCK", help="a later lock whose image fails")
    bisect.add_argument(
        "--assume-good", action="store_true", help="do not build GOOD again: it passed (the nightly says so)"
    )
    bisect.add_argument(
        "--all-parents",
        action="store_true",
        help="try every commit of a source's range, not only its branch's first-parent line",
    )
    bisect.add_argument(
        "--run",
        metavar="CMD",
        help="a test after each build, as `git bisect run` runs one (the image in $ENVBUILD_IMAGE): "
        "exit 0 good, 125 cannot test, 1-127 bad, 128 or more stops",
    )
    bisect.add_argument(
        "--deadline", type=float, metavar="SECONDS", help="start no build once this many seconds have passed"
    )
    bisect.add_argument("--json", action="store_true", help="one JSON object on stdout")
    bisect.add_argument("--report", type=Path, metavar="FILE", help="write the report, every build, as Markdown")
    bisect.add_argument(
        "--write-lock",
        type=Path,
        metavar="FILE",
        help="write BAD with the breaking change at its last good value: the lock that goes forward",
    )
    add_source_options(bisect)
    bisect.set_defaults(handler=cmd_bisect)


def cmd_bisect(args: argparse.Namespace) -> int:
    from envbuild.bisect.report import render_markdown, render_text
    from envbuild.bisect.run import BisectOptions, run_bisect
    from envbuild.lock.io import read_lock

    if args.deadline is not None and not args.deadline > 0:
        raise InputError(f"--deadline: expected a positive number of seconds, got {args.deadline:g}")
    check_outputs(args.report, args.write_lock)
    options = BisectOptions(
        verify_options(args),
        assume_good=args.assume_good,
        first_parent=not args.all_parents,
        run=args.run,
        deadline=args.deadline,
    )
    good, bad = read_lock(args.good), read_lock(args.bad)
    result = run_bisect(good, bad, options, progress=StderrProgress("envbuild", args.quiet))
    written, unwritten = None, []
    if args.write_lock is not None and result.forward is not None:
        from envbuild.lock.roundtrip import text_over  # BAD's comments and layout kept where they can be

        try:
            write_atomic(args.write_lock, text_over(bad, result.forward, args.write_lock).text)
            written = str(args.write_lock)
        except OSError as exc:
            unwritten.append(f"--write-lock {args.write_lock}: cannot be written: {exc.strerror or exc}")
    if args.report is not None:
        try:
            write_atomic(args.report, render_markdown(result, written))
        except OSError as exc:
            unwritten.append(f"--report {args.report}: cannot be written: {exc.strerror or exc}")
    if args.json:
        sys.stdout.write(render_json({**result.to_json(), "forward_lock_written": written}))
    else:
        sys.stdout.write(render_text(result, output_width(), written))
    if unwritten:  # the answer, which took the builds, is out first
        raise EnvbuildError(f"{'; '.join(unwritten)} (the bisect's result is on stdout)")
    return result.exit_code


def check_outputs(report: Path | None, write_lock: Path | None) -> None:
    """``--report`` and ``--write-lock`` can be written (a file in a writable directory), checked before
    anything is built: a bisect's builds are not spent on an answer that cannot be kept."""
    problems = []
    for option, path in (("--report", report), ("--write-lock", write_lock)):
        if path is None:
            continue
        if path.is_dir() or not path.parent.is_dir():
            problems.append(f"{option} {path}: not a file in an existing directory")
        elif not os.access(path.parent, os.W_OK):
            problems.append(f"{option} {path}: cannot be written (its directory is not writable)")
    if problems:
        raise InputError("\n".join(problems))
