"""`envbuild lock init|add`: start a lock, add a source by its repository and ref."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envbuild.cli.common import StderrProgress, add_source_options, source_settings
from envbuild.errors import InputError
from envbuild.lock.io import read_lock, write_lock
from envbuild.lock.model import Install, Platform


def add_start_commands(commands: argparse._SubParsersAction) -> None:
    init = commands.add_parser("init", help="write a new, empty lock")
    init.add_argument("lockfile", type=Path, metavar="LOCK")
    init.add_argument("--name", required=True, help="the lock's name (the image is envbuild/NAME)")
    init.add_argument("--arch", choices=("aarch64", "x86_64"), help="the target platform's machine (linux)")
    init.add_argument("--python", help="the target CPython, e.g. 3.12 (with --arch)")
    init.add_argument("--base-image", metavar="IMAGE", help="the base image by name; `lock update` pins its digest")
    init.add_argument("--index", metavar="URL", help="the package index (PEP 691); default PyPI")
    init.set_defaults(handler=cmd_init)

    add = commands.add_parser("add", help="add a source by its repository and ref, pinned as `lock update` pins")
    add.add_argument("lockfile", metavar="LOCK")
    add.add_argument("name", metavar="NAME", help="the source's name in the lock")
    add.add_argument(
        "repo", metavar="REPO", help="its git repository: a URL, as the lock records it, or a local directory (file://)"
    )
    add.add_argument("ref", metavar="REF", help="a branch or a tag (which one is asked upstream)")
    add.add_argument(
        "--install", choices=("editable", "wheel", "none"), default="editable", help="how the image installs it"
    )
    add_source_options(add)
    add.set_defaults(handler=cmd_add)


def cmd_init(args: argparse.Namespace) -> int:
    from envbuild.update.start import new_lock

    path = args.lockfile
    if path.exists():
        raise InputError(
            f"{path}: exists; a lock is started once (add sources to it with: envbuild lock add {path} NAME REPO REF)"
        )
    if (args.arch is None) != (args.python is None):
        raise InputError("lock init: --arch and --python go together (the lock's platform)")
    platform = Platform(os="linux", arch=args.arch, python=args.python) if args.arch else None
    write_lock(
        path, new_lock(args.name, platform=platform, base_image=args.base_image, index=args.index, file=str(path))
    )
    print(f"{path}: a new lock {args.name!r}; add its sources: envbuild lock add {path} NAME REPO REF")
    if args.base_image is None:
        print(f"and its base image: envbuild lock update {path} --base-image IMAGE[:TAG]")
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    from envbuild.git.cache import GitCache
    from envbuild.lock.io import replace_lock_file
    from envbuild.lock.roundtrip import text_over
    from envbuild.update.start import add_source, repo_url

    if args.offline:
        raise InputError("lock add: --offline makes no sense here; the ref is looked up upstream")
    read = read_lock(args.lockfile)
    cache_dir, mirrors = source_settings(args)
    repo = repo_url(args.repo)
    if repo != args.repo:
        print(f"envbuild: {args.repo} is recorded as {repo}", file=sys.stderr)
    new = add_source(
        read.lock,
        args.name,
        repo,
        args.ref,
        GitCache(cache_dir / "git"),
        install=Install(mode=args.install),
        mirrors=mirrors,
        file=str(read.path),
        progress=StderrProgress("envbuild", args.quiet),
    )
    replace_lock_file(read, text_over(read, new).text)  # its comments and layout kept
    source = next(s for s in new.sources if s.name == args.name)
    print(f"{read.path}: added {source.name}: {source.ref_type} {source.ref} at {source.commit}")
    if new.packages or new.requirements or source.requires or source.build_requires:
        print(f"resolve the packages it needs with `envbuild lock update {read.path} --packages`", file=sys.stderr)
    return 0
