"""The part of a build that reads source trees (before the engine), on a real-size tree, side by side
with the export a hand script makes for each build.

    python benchmarks/bench_context.py [--repo BARE --ref REF] [--repeat 5]

The tree: Megatron-LM at ``core_v0.18.0`` (2,749 files, 55 MB; the real lock holds it twice, itself
and inside Megatron-Bridge) when its snapshot is here (``--repo``, default
``/work/.mirror/NVIDIA+Megatron-LM/repo``: the tool library's ``fetch github:NVIDIA/Megatron-LM``), else
a generated one of the same shape (``git fast-import``, 2,750 files × 20 KB). Served by ``git daemon``
on 127.0.0.1, with a lock naming it (outside the timings), then timed into an empty cache:

- envbuild: the build context (``assemble_context``: each source's tree exported once per commit into
  ``<cache>/image/trees`` and checked, then read from there) and the docker CLI's sync directory
  (``buildkit_context(...).write_to``), the first build of the commit and ``--repeat`` later ones;
- by hand: ``git archive COMMIT | tar -x`` into an empty directory from a clone that holds the commit
  (what a script that hands the docker CLI a context of the pinned tree does for each build).

Prints medians and the ratio; never fails on them (no timing assertion in tests).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project and its test helpers

from envbuild.config import SourceOptions  # noqa: E402
from envbuild.fetch import exporter_for  # noqa: E402
from envbuild.image.assemble import assemble_context  # noqa: E402
from envbuild.image.plan import plan_context  # noqa: E402
from envbuild.image.render import render_buildkit_image_dockerfile, render_dockerfile  # noqa: E402
from envbuild.image.stream import buildkit_context  # noqa: E402
from envbuild.image.treestore import TreeStore  # noqa: E402
from envbuild.lock import parse_lock  # noqa: E402
from tests.lib.gitrepos import GitDaemon, fast_import_repo, git  # noqa: E402

SNAPSHOT = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")


def served_repo(root: Path, repo: Path | None, ref: str) -> tuple[Path, str]:
    """The directory the daemon serves (holding ``source``) and the ref to pin."""
    served = root / "served"
    served.mkdir()
    bare = repo or (SNAPSHOT if SNAPSHOT.is_dir() else None)
    if bare is not None:
        (served / "source").symlink_to(bare.resolve())
        print(f"tree: {bare} at {ref}", file=sys.stderr)
        return served, ref
    print("tree: generated, 2,750 files of ~20 KB (no snapshot here)", file=sys.stderr)
    fast_import_repo(served / "source", commits=3, files=2750, lines=300, tag_every=1000)
    return served, "main"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, help="a bare repository holding --ref")
    parser.add_argument("--ref", default="core_v0.18.0")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-context-"))
    try:
        served, ref = served_repo(root, args.repo, args.ref)
        commit = git("rev-parse", f"{ref}^{{commit}}", cwd=served / "source")
        tree = git("rev-parse", f"{ref}^{{tree}}", cwd=served / "source")
        ref_type = "branch" if ref == "main" else "tag"
        files = len(git("ls-tree", "-r", "--name-only", tree, cwd=served / "source").splitlines())
        daemon = GitDaemon(served, allow_filter=True).start()
        try:
            lock = parse_lock(
                textwrap.dedent(f"""\
                version: 1
                name: benchcontext
                platform: {{os: linux, arch: x86_64, python: "3.11"}}
                base_image: {{name: "127.0.0.1:5000/bench/base:1", digest: "sha256:{"ab" * 32}"}}
                source_date_epoch: 1700000000
                sources:
                  - {{name: source, repo: "{daemon.url("source")}", ref: {ref}, ref_type: {ref_type},
                      commit: {commit}, tree: {tree}}}
                """),
                "benchcontext.lock.yaml",
            )
            plan = plan_context(lock, lock_sha256="cd" * 32)
            cache = root / "cache"
            exporter, store = exporter_for(SourceOptions(cache)), TreeStore(cache)
            exporter(lock.sources[0], _empty(root / "warm-up"))  # the commit fetched: not what is timed
            times = []
            for _ in range(args.repeat + 1):
                work = Path(tempfile.mkdtemp(dir=root))
                start = time.perf_counter()
                context = assemble_context(
                    plan, render_dockerfile(plan), work / "context", exporter, _no_file, store=store
                )
                stream = buildkit_context(context, render_buildkit_image_dockerfile(plan))
                stream.write_to(_empty(work / "sync"))
                times.append(time.perf_counter() - start)
                shutil.rmtree(work)
            clone = root / "clone"
            git("clone", "-q", "--bare", str(served / "source"), str(clone))
            hand = []
            for _ in range(args.repeat):
                dest = _empty(root / "hand")
                start = time.perf_counter()
                archive = subprocess.run(["git", "archive", commit], cwd=clone, capture_output=True, check=True).stdout
                subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
                hand.append(time.perf_counter() - start)
                shutil.rmtree(dest)
        finally:
            daemon.stop()
        warm, by_hand = statistics.median(times[1:]), statistics.median(hand)
        print(f"  {files} files, {stream.payload / 1e6:.0f} MB", file=sys.stderr)
        print(f"  envbuild, the commit's first build (export, check, keep)  {times[0]:7.2f} s", file=sys.stderr)
        print(f"  envbuild, every later build (median of {args.repeat})          {warm:7.2f} s", file=sys.stderr)
        print(f"  by hand, git archive | tar -x (median of {args.repeat})         {by_hand:7.2f} s", file=sys.stderr)
        print(f"  later build / by hand: {warm / by_hand:.2f}x", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _no_file(package: object, file: object) -> Path:
    raise AssertionError("the lock has no package files")


def _empty(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


if __name__ == "__main__":
    sys.exit(main())
