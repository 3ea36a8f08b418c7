"""`envbuild check LOCKFILE [--json] [--report DIR] [--history FILE]`: the nightly reproducibility check."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envbuild.cli.common import Progress, add_source_options, source_settings
from envbuild.report import render_json


def add_check_command(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser("check", help="nightly: verify every pin, rebuild without cache, compare image IDs")
    check.add_argument("lockfile", type=Path)
    check.add_argument("--json", action="store_true", help="one JSON object on stdout")
    check.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write check.json, check.md (a CI job summary) and check.html (status grid) here",
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
    from envbuild.check.history import read_history
    from envbuild.check.report import render_html, render_markdown
    from envbuild.check.run import CheckOptions, run_check
    from envbuild.verify import VerifyOptions

    cache_dir, mirrors = source_settings(args)
    options = CheckOptions(
        VerifyOptions(cache_dir=cache_dir, mirrors=mirrors, offline=args.offline, strict=args.strict, jobs=args.jobs),
        history=args.history,
    )
    report = run_check(args.lockfile, options, Progress("envbuild", args.quiet))
    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
        (args.report / "check.json").write_text(render_json(report.to_json()), encoding="utf-8")
        (args.report / "check.md").write_text(render_markdown(report), encoding="utf-8")
        history = read_history(args.history) if args.history else []
        (args.report / "check.html").write_text(render_html(history, str(args.lockfile)), encoding="utf-8")
    sys.stdout.write(render_json(report.to_json()) if args.json else render_markdown(report))
    return 0 if report.ok else 1
