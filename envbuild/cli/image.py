"""`envbuild image LOCKFILE`: a thin wrapper over :func:`envbuild.image.build.build_image`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envbuild.cli.common import StderrProgress, add_source_options, render_json, source_options, verify_options
from envbuild.data.jsonout import to_jsonable


def add_image_command(subparsers: argparse._SubParsersAction) -> None:
    image = subparsers.add_parser("image", help="build the lock's image from verified pins, reproducibly")
    image.add_argument("lockfile", type=Path)
    image.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="NAME:TAG",
        help="tag the image (repeatable; default envbuild/<lock name>:<first 12 hex of the lock's sha256>)",
    )
    image.add_argument("--push", action="store_true", help="push every tag (credentials from the docker config)")
    image.add_argument("--no-cache", action="store_true", help="build every layer again")
    image.add_argument("--dry-run", action="store_true", help="print the rendered Dockerfile; start no build")
    image.add_argument("--json", action="store_true", help="one JSON object on stdout")
    image.add_argument(
        "--record-dir", type=Path, help="where the build record goes (default <lock's directory>/build/<lock name>)"
    )
    image.add_argument("--strict", action="store_true", help="refuse a lock whose branch pins moved on (behind)")
    add_source_options(image)
    image.set_defaults(handler=cmd_image)


def cmd_image(args: argparse.Namespace) -> int:
    from envbuild.lock.io import read_lock

    source = source_options(args)
    lock = read_lock(args.lockfile)
    progress = StderrProgress("envbuild", args.quiet)
    exporter = None  # the build's, its work begun while the rest of the builder is imported
    if not args.dry_run:  # what the build would refuse at its end, refused before anything begins
        from envbuild.image.early import begin_build
        from envbuild.image.options import check_image_options

        check_image_options(lock, tags=tuple(args.tag), push=args.push, record_dir=args.record_dir, source=source)
        exporter = begin_build(lock, source, progress, no_cache=args.no_cache)

    from envbuild.image.build import ImageOptions, build_image, dry_run, plan_json

    options = ImageOptions(
        verify_options(args, source),
        tags=tuple(args.tag),
        push=args.push,
        no_cache=args.no_cache,
        record_dir=args.record_dir,
    )
    if args.dry_run:
        dry = dry_run(lock, options, progress)
        sys.stdout.write(render_json(plan_json(dry)) if args.json else dry.dockerfile)
        if dry.refusals:  # the rendering is shown, but the lock is not one a build takes: as the build says
            print(
                f"envbuild: dry run: a build refuses {args.lockfile}: {len(dry.refusals)} reason(s) above",
                file=sys.stderr,
            )
            return 1
        return 0
    result = build_image(lock, options, progress=progress, exporter=exporter)
    if args.json:
        sys.stdout.write(render_json(to_jsonable(result)))
    else:
        print(f"{result.image_id} {' '.join(result.tags)}")
        print(f"record: {result.record_dir}")
    return 0
