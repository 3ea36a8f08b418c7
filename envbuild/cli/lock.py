"""`envbuild lock init|add|verify|update|diff|fetch|export|schema`: thin wrappers over envbuild.verify / update / lock."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envbuild.cli.common import (
    StderrProgress,
    add_source_options,
    cache_dir_argument,
    cache_dir_in_force,
    render_json,
    source_settings,
    verify_options,
)
from envbuild.cli.lock_start import add_start_commands
from envbuild.cli.width import output_width
from envbuild.data.jsonout import to_jsonable
from envbuild.errors import InputError
from envbuild.fileio import write_atomic
from envbuild.lock import read_lock
from envbuild.lock.model import LOCK_VERSION, LOCK_VERSIONS

REPORT_HELP = "also write the change report to FILE in Markdown (a pull request's body)"


def add_lock_commands(subparsers: argparse._SubParsersAction) -> None:
    lock = subparsers.add_parser("lock", help="start, verify, update, compare, fetch and export lockfiles")
    commands = lock.add_subparsers(metavar="COMMAND")
    lock.set_defaults(handler=lambda args: _usage(lock))

    verify = commands.add_parser("verify", help="check every pin of a lock against its upstream")
    verify.add_argument("lockfile", type=Path)
    verify.add_argument("--json", action="store_true", help="one JSON object on stdout")
    verify.add_argument("--strict", action="store_true", help="a branch that moved on (behind) fails too")
    add_source_options(verify)
    verify.set_defaults(handler=cmd_verify)

    update = commands.add_parser(
        "update", help="move pins to their refs' current commits, the packages and the base image; or only those named"
    )
    update.add_argument("lockfile", type=Path)
    update.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="sources to move (default, when nothing is named: every source, the packages and the base image)",
    )
    update.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="PACKAGE",
        dest="package_names",
        help="move this package (repeatable); every other keeps its locked version where that still satisfies",
    )
    update.add_argument(
        "--upgrade",
        action="store_true",
        help="let every package move (default: the resolver prefers the locked versions)",
    )
    update.add_argument(
        "--base", action="store_true", help="re-pin the base image by the digest its registry serves for its tag"
    )
    update.add_argument(
        "--base-image",
        metavar="IMAGE",
        help="set the base image to IMAGE[:TAG] (registry/repository), pinned by the digest its registry serves",
    )
    update.add_argument(
        "--installer",
        action="store_true",
        help="pin uv, the image's installer, at the version envbuild runs (a re-resolve pins it where the lock has "
        "none)",
    )
    update.add_argument(
        "--packages",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="re-resolve the package closure; alone, move only that (default: when nothing is named, with --package "
        "or --upgrade)",
    )
    update.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    update.add_argument("--json", action="store_true", help="one JSON object on stdout")
    update.add_argument("--report", type=Path, metavar="FILE", help=REPORT_HELP + " (on --dry-run too)")
    add_source_options(update)
    update.set_defaults(handler=cmd_update, intermixed="names")

    diff = commands.add_parser("diff", help="pin changes between two locks (exit 1 when there are some, as diff does)")
    diff.add_argument("old", type=Path)
    diff.add_argument("new", type=Path)
    diff.add_argument("--json", action="store_true", help="one JSON object on stdout")
    diff.add_argument("--report", type=Path, metavar="FILE", help=REPORT_HELP)
    add_source_options(diff)
    diff.set_defaults(handler=cmd_diff)

    export = commands.add_parser("export", help="the lock as requirements.txt, pylock.toml or a vcstool .repos file")
    export.add_argument("lockfile", type=Path)
    export.add_argument("--format", required=True, choices=("requirements", "pylock", "repos"))
    export.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    export.add_argument(
        "--offline",
        action="store_true",
        help="pylock: do not ask the index for file URLs; files are referred to as files/<name>",
    )
    export.add_argument(
        "--cache-dir",
        type=cache_dir_argument,
        help="pylock: the cache whose package files give sizes (default: config cache_dir, $ENVBUILD_CACHE "
        "or ~/.cache/envbuild)",
    )
    export.add_argument(
        "--config", type=Path, help="config file (default: $ENVBUILD_CONFIG or ~/.config/envbuild/config.yaml)"
    )
    export.set_defaults(handler=cmd_export)

    fetch = commands.add_parser(
        "fetch", help="verify the lock and fetch everything a build needs into the cache (for --offline builds)"
    )
    fetch.add_argument("lockfile", type=Path)
    fetch.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_source_options(fetch)
    fetch.set_defaults(handler=cmd_fetch)

    add_start_commands(commands)

    schema = commands.add_parser("schema", help="print the JSON schema of the lockfile format")
    schema.add_argument(
        "--version",
        type=int,
        choices=LOCK_VERSIONS,
        default=LOCK_VERSION,
        help="of this format version (default: the current)",
    )
    schema.set_defaults(handler=cmd_schema)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_verify(args: argparse.Namespace) -> int:
    lock = read_lock(args.lockfile).lock  # before the heavier imports: a bad lock fails fast
    from envbuild.verify.pins import verify_lock
    from envbuild.verify.render import render_verify

    report = verify_lock(lock, str(args.lockfile), verify_options(args), StderrProgress("envbuild", args.quiet))
    sys.stdout.write(render_json(report.to_json()) if args.json else render_verify(report, output_width()))
    return 0 if report.ok else 1


def cmd_fetch(args: argparse.Namespace) -> int:
    """Verify online, then fetch every source's tree and package file (what `envbuild image --offline`
    builds from) whose pin verifies (:func:`envbuild.fetch.verify_and_fetch`). A pin that fails verify is
    not fetched (a build would refuse it): each is named, and the exit status is 1. The base image is not
    an input fetched here (a build pulls it by digest): an unpinned one is said."""
    read = read_lock(args.lockfile)
    from envbuild.fetch import verify_and_fetch

    if args.offline:
        raise InputError("lock fetch: --offline makes no sense here; this command is what fills the cache")
    options = verify_options(args)
    done = verify_and_fetch(read, options, StderrProgress("envbuild", args.quiet))
    for row in done.failing:
        what = "base image" if row.kind == "base_image" else row.kind
        unfetched = row in done.left or row.kind == "base_image"
        print(
            f"envbuild: {args.lockfile}: {what} {row.name} {'left unfetched' if unfetched else 'fails verify'} "
            f"({row.status}): {row.detail}",
            file=sys.stderr,
        )
    if args.json:
        sys.stdout.write(
            render_json(
                {
                    "lock": str(args.lockfile),
                    "complete": done.complete,
                    "verify": done.report.to_json(),
                    **to_jsonable(done.inputs),
                }
            )
        )
    else:
        inputs = done.inputs.inputs
        fetched = sum(i.fetched for i in inputs)
        print(
            f"{args.lockfile}: {len(inputs)} inputs in {options.source.cache_dir} "
            f"({fetched} fetched now, {len(inputs) - fetched} cached before); "
            + (
                "`envbuild image --offline` can build from them"
                if done.complete
                else f"{len(done.failing)} pins fail verify, {len(done.left)} of them left unfetched (named above): "
                "`envbuild image` refuses the lock until they verify"
            )
        )
    return 0 if done.complete else 1


def cmd_update(args: argparse.Namespace) -> int:
    from envbuild.git.cache import GitCache
    from envbuild.lock.diff import render_changes
    from envbuild.update.rewrite import update_lock_file
    from envbuild.update.update import Moves

    if args.offline:
        raise InputError(
            "lock update: --offline makes no sense here; an update asks each upstream where its refs are now "
            "(`lock verify --offline` checks a lock against the cache)"
        )
    _check_report(args.report)
    read = read_lock(args.lockfile)
    cache_dir, mirrors = source_settings(args)
    moves = Moves(
        names=tuple(args.names),
        packages=args.packages,
        package_names=tuple(args.package_names),
        upgrade=args.upgrade,
        base=args.base,
        base_image=args.base_image,
        installer=args.installer,
    )
    update = update_lock_file(
        read,
        moves,
        GitCache(cache_dir / "git"),
        mirrors=mirrors,
        jobs=args.jobs,
        report=args.report,
        dry_run=args.dry_run,
        progress=StderrProgress("envbuild", args.quiet),
    )
    if not update.layout_kept:
        print(
            f"envbuild: warning: {args.lockfile}: its comments and layout could not be kept "
            "(a value YAML 1.1 and 1.2 read differently, or a layout ruamel.yaml cannot reproduce); "
            "written in canonical form",
            file=sys.stderr,
        )
    sys.stdout.write(
        render_json(
            {
                "lock": str(args.lockfile),
                "written": update.written,
                "changes": to_jsonable(update.changes),
            }
        )
        if args.json
        else render_changes(update.changes, output_width())
    )
    if args.dry_run:
        print(f"envbuild: dry run: {args.lockfile} not written", file=sys.stderr)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from envbuild.git.cache import GitCache
    from envbuild.lock.diff import render_changes, render_markdown
    from envbuild.update.report import change_report

    _check_report(args.report)
    old, new = read_lock(args.old).lock, read_lock(args.new).lock
    cache_dir, mirrors = source_settings(args)
    changes = change_report(old, new, GitCache(cache_dir / "git"), mirrors=mirrors)
    if args.report is not None:
        write_atomic(args.report, render_markdown(changes, f"envbuild lock diff: {args.old} → {args.new}"))
    sys.stdout.write(
        render_json({"old": str(args.old), "new": str(args.new), "changes": to_jsonable(changes)})
        if args.json
        else render_changes(changes, output_width())
    )
    return 1 if changes else 0  # as diff(1) and `git diff --exit-code`: scripts can test for changes


def _check_report(path: Path | None) -> None:
    """Refused before anything is asked of an upstream: a report that could not be written."""
    if path is not None and path.is_dir():
        raise InputError(f"--report {path}: is a directory; name the file to write")
    if path is not None and not path.parent.is_dir():
        raise InputError(f"--report {path}: {path.parent} is not a directory; create it first")


def cmd_export(args: argparse.Namespace) -> int:
    from envbuild.lock import export

    lock = read_lock(args.lockfile).lock
    if args.output is not None and args.output.is_dir():
        raise InputError(f"-o {args.output}: is a directory; name the file to write")
    if args.format == "pylock":
        from envbuild.fetch import package_file_locations

        cache_dir = cache_dir_in_force(args)
        text = export.export_pylock(lock, files=package_file_locations(lock, cache_dir=cache_dir, offline=args.offline))
    else:
        text = export.export_lock(lock, args.format)
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from envbuild.lock.schema import schema_text

    sys.stdout.write(schema_text(args.version))
    return 0
