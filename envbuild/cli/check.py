"""`envbuild check LOCKFILE [--json] [--report DIR] [--history FILE]`: the nightly reproducibility check.
A person reads a short summary on stdout; the full table is the report's (check.md), always written."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from envbuild.cli.common import StderrProgress, add_source_options, render_json, verify_options
from envbuild.cli.width import output_width
from envbuild.errors import EnvbuildError, InputError
from envbuild.fileio import write_atomic

if TYPE_CHECKING:
    from envbuild.check.report import CheckReport


def add_check_command(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser("check", help="nightly: verify every pin, rebuild without cache, compare image IDs")
    check.add_argument("lockfile", type=Path)
    check.add_argument("--json", action="store_true", help="one JSON object on stdout")
    check.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write check.json, check.md (every pin's row; a CI job summary) and check.html (status grid) here "
        "(default: CACHE_DIR/check/LOCK_NAME)",
    )
    check.add_argument(
        "--history",
        type=Path,
        metavar="FILE",
        help="JSON-lines history: compare with the last build of this lock, append this run",
    )
    check.add_argument("--strict", action="store_true", help="a branch that moved on (behind) fails too")
    add_source_options(check)
    check.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from envbuild.check.report import render_summary
    from envbuild.check.run import CheckOptions, run_check
    from envbuild.lock.io import read_lock

    check_outputs(args.report, args.history)  # a bad path fails now, not after an hour of building
    options = CheckOptions(verify_options(args), history=args.history)
    read = read_lock(args.lockfile)
    # Without --report: beside the check's work in the cache, one directory per lock, each night's
    # replacing the last (the history keeps the nights).
    directory = args.report or options.verify.source.cache_dir / "check" / read.lock.name
    if args.report is None:
        check_outputs(directory, None)
    report = run_check(read, options, StderrProgress("envbuild", args.quiet))
    unwritten = write_reports(directory, report, args.history, str(args.lockfile))
    sys.stdout.write(
        render_json(report.to_json())
        if args.json
        else render_summary(report, str(directory / "check.md"), output_width())
    )
    # A write that failed after the hour of work: the answer above stands, and the file is named.
    failed = [f"--history {report.history_error}"] if report.history_error else []
    if failed or unwritten:
        raise EnvbuildError("\n".join(failed + unwritten))
    return 0 if report.ok else 1


def check_outputs(report: Path | None, history: Path | None) -> None:
    """``--report`` must be a writable directory (or creatable as one) and ``--history`` a writable
    regular file (or creatable as one in an existing directory); checked before anything runs."""
    outputs = (("--report", report, Path.is_dir, "a directory"), ("--history", history, Path.is_file, "a regular file"))
    problems = []
    for option, path, fits, kind in outputs:
        if path is not None and path.exists() and not fits(path):
            problems.append(f"{option} {path}: exists and is not {kind}")
        elif path is not None and path.exists() and (reason := _unwritable(path)):
            problems.append(f"{option} {path}: cannot be written ({reason})")
        elif path is not None and not path.exists() and not _creatable(path):
            problems.append(f"{option} {path}: cannot be created (its parent is not a writable directory)")
    if problems:
        raise InputError("\n".join(problems))


def _unwritable(path: Path) -> str | None:
    """Why ``path`` (a directory or a regular file) cannot be written, found by trying as the check will
    (an immutable file or a read-only mount, which mode bits do not show, too); None when it can."""
    try:
        if path.is_dir():
            tempfile.TemporaryFile(dir=path).close()
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _creatable(path: Path) -> bool:
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    return parent.is_dir() and os.access(parent, os.W_OK)


def write_reports(directory: Path, report: CheckReport, history_path: Path | None, lock: str) -> list[str]:
    """check.json, check.md and check.html, each written atomically, for every outcome of the check. The
    grid is drawn from the history as it now stands (this run appended); an unreadable history gives an
    empty grid, and the JSON and Markdown say why. Returns a line per file that could not be written,
    naming it (not the temporary it was written to); the others are written all the same."""
    from envbuild.check.history import read_history
    from envbuild.check.report import render_html, render_markdown

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [f"--report {directory}: cannot be created ({exc.strerror or exc})"]
    try:
        history = read_history(history_path) if history_path else []
    except EnvbuildError:
        history = []
    unwritten = []
    for name, render in (
        ("check.json", lambda: render_json(report.to_json())),
        ("check.md", lambda: render_markdown(report)),
        ("check.html", lambda: render_html(history, lock)),
    ):
        try:
            write_atomic(directory / name, render())
        except OSError as exc:
            unwritten.append(f"--report {directory / name}: cannot be written ({exc.strerror or exc})")
    return unwritten
