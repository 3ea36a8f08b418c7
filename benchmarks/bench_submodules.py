"""Verify and fetch of a source with nested submodules, side by side with `git clone --recurse-submodules`.

    python benchmarks/bench_submodules.py [--scale 1.0] [--repeat 3] [--keep DIR]

Generates three repositories with ``git fast-import`` (long histories shaped like source code): a parent
(4,000 commits × 2,000 files at scale 1) whose tree holds a submodule (2,000 × 1,000) whose tree holds
another (1,000 × 500), the nesting of vllm-ascend → catlass → googletest. Serves them with ``git daemon``
on 127.0.0.1 (partial clone allowed), records the lock with ``lock update`` (outside the timings), then
times, each ``--repeat`` times into empty caches (medians):

- envbuild: cold ``lock verify`` (sources and submodules), warm ``lock verify``, cold ``lock fetch``
  (verify, then every level's exact tree into the export cache: what an ``--offline`` build needs);
- git: ``git clone --recurse-submodules`` of the same pins (full history, as upstream Dockerfiles clone
  without ``--depth``), ``git clone --depth 1 --recurse-submodules --shallow-submodules`` (the least a
  checkout of those pins can fetch), and, warm, ``git submodule status --recursive`` after ``git fetch``
  in the clone (what checks the pins again there).

Bytes are what each leaves on disk. Prints ratios; never fails on them (no timing assertion in tests).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project and its test helpers

from envbuild.cli import main as envbuild  # noqa: E402
from envbuild.config import SourceOptions  # noqa: E402
from envbuild.fetch import fetch_inputs  # noqa: E402
from envbuild.lock import LockFile, read_lock  # noqa: E402
from envbuild.verify.pins import VerifyOptions, verify_lock  # noqa: E402
from tests.lib.gitrepos import GitDaemon, Repo, fast_import_repo, git  # noqa: E402

SHAPES = {"gtest": (1000, 500), "catlass": (2000, 1000), "parent": (4000, 2000)}  # (commits, files) at scale 1


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def timed(label: str, repeat: int, run: Callable[[int], Path | None]) -> tuple[float, int]:
    """Median seconds of ``run(i)`` and the bytes of the directory it returns."""
    times, size = [], 0
    for i in range(repeat):
        start = time.perf_counter()
        where = run(i)
        times.append(time.perf_counter() - start)
        size = du(where) if where is not None else 0
    median = statistics.median(times)
    print(f"  {label:<58} {median:7.3f} s  {size / 1e6:8.1f} MB", file=sys.stderr)
    return median, size


def with_gitlink(bare: Path, work: Path, path: str, commit: str, url: str) -> str:
    """Commit a gitlink (and its .gitmodules entry) on top of the bare repository's main; return the commit."""
    git("clone", "-q", str(bare), str(work))
    repo = Repo(work)
    head = repo.commit_gitlinks(f"submodule {path}", {path: commit}, {path.rsplit("/", 1)[-1]: (path, url)})
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    return head


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every repository's commits and files")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep the generated repositories here (and reuse them)")
    args = parser.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-submodules-"))
    served = root / "served"
    heads: dict[str, str] = {}
    for seed, (name, (commits, files)) in enumerate(SHAPES.items(), start=1):
        bare = served / f"{name}.git"
        if not bare.exists():
            print(
                f"generating {name}: {int(commits * args.scale)} commits × {int(files * args.scale)} files",
                file=sys.stderr,
            )
            fast_import_repo(bare, commits=int(commits * args.scale), files=int(files * args.scale), seed=seed)
    daemon = GitDaemon(served, allow_filter=True).start()
    try:
        url = {name: daemon.url(f"{name}.git") for name in SHAPES}
        heads["gtest"] = git("rev-parse", "main", cwd=served / "gtest.git")
        marker = served / "gitlinks-added"
        if not marker.exists():  # relative URLs: the daemon's port changes from one run to the next
            with_gitlink(
                served / "catlass.git", root / "w-catlass", "3rdparty/googletest", heads["gtest"], "../gtest.git"
            )
            heads["catlass"] = git("rev-parse", "main", cwd=served / "catlass.git")
            with_gitlink(
                served / "parent.git", root / "w-parent", "csrc/third_party/catlass", heads["catlass"], "../catlass.git"
            )
            marker.write_text("")
        heads["parent"] = git("rev-parse", "main", cwd=served / "parent.git")
        lock = root / "bench.lock.yaml"
        lock.write_text(
            "version: 2\nname: bench-submodules\nsources:\n"
            f"  - {{name: parent, repo: '{url['parent']}', ref: main, ref_type: branch, commit: {heads['parent']},"
            " install: {mode: none}}\n"
        )
        assert envbuild(["lock", "update", str(lock), "--cache-dir", str(root / "update-cache"), "-q"]) == 0
        read = read_lock(lock)
        levels = [p for s in read.lock.sources for p in s.submodules]
        print(f"lock: parent + {len(levels)} submodule, nested {len(levels[0].submodules)} deeper", file=sys.stderr)
        figures = run_all(root, read, url["parent"], args.repeat)
    finally:
        daemon.stop()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    report(figures)
    return 0


def run_all(root: Path, read: LockFile, parent_url: str, repeat: int) -> dict[str, tuple[float, int]]:
    def fresh(name: str, i: int) -> Path:
        path = root / f"{name}-{i}"
        shutil.rmtree(path, ignore_errors=True)
        return path

    def verify(cache: Path) -> None:
        report = verify_lock(read.lock, str(read.path), VerifyOptions(SourceOptions(cache_dir=cache)))
        assert report.ok, [r for r in report.results if not r.passes()]

    def cold_verify(i: int) -> Path:
        cache = fresh("verify", i)
        verify(cache)
        return cache

    def lock_fetch(i: int) -> Path:
        cache = fresh("fetch", i)
        options = VerifyOptions(SourceOptions(cache_dir=cache))
        assert verify_lock(read.lock, str(read.path), options).ok
        fetch_inputs(read, options.source)
        return cache

    def clone(name: str, *flags: str) -> Callable[[int], Path]:
        def run(i: int) -> Path:
            dest = fresh(name, i)
            subprocess.run(["git", "clone", "-q", *flags, "--branch", "main", parent_url, str(dest)], check=True)
            return dest

        return run

    def warm_git(i: int) -> None:
        clone_dir = root / "clone-0"
        subprocess.run(["git", "-C", str(clone_dir), "fetch", "-q", "--recurse-submodules", "origin"], check=True)
        subprocess.run(
            ["git", "-C", str(clone_dir), "submodule", "status", "--recursive"], check=True, capture_output=True
        )

    print("timings (median of each):", file=sys.stderr)
    figures = {
        "verify cold": timed("envbuild lock verify, empty cache", repeat, cold_verify),
        "verify warm": timed("envbuild lock verify, warm cache", repeat, lambda i: verify(root / "verify-0")),
        "fetch cold": timed("envbuild lock fetch (verify + every level's tree), empty", repeat, lock_fetch),
        "clone full": timed("git clone --recurse-submodules", repeat, clone("clone", "--recurse-submodules")),
        "clone shallow": timed(
            "git clone --depth 1 --recurse-submodules --shallow-submodules",
            repeat,
            clone("shallow", "--depth", "1", "--recurse-submodules", "--shallow-submodules"),
        ),
    }
    figures["git warm"] = timed("git fetch --recurse-submodules + submodule status, warm", repeat, warm_git)
    return figures


def report(f: dict[str, tuple[float, int]]) -> None:
    def ratio(a: str, b: str) -> str:
        return f"{f[a][0] / f[b][0]:.2f}×"

    print("\nratios (envbuild / git; below 1 is faster):")
    print(f"  cold verify / git clone --recurse-submodules:          {ratio('verify cold', 'clone full')}")
    print(f"  cold lock fetch / git clone --recurse-submodules:      {ratio('fetch cold', 'clone full')}")
    print(f"  cold lock fetch / shallow clone of the same pins:      {ratio('fetch cold', 'clone shallow')}")
    print(f"  warm verify / warm git fetch + submodule status:       {ratio('verify warm', 'git warm')}")
    print(
        f"  disk: verify cache {f['verify cold'][1] / 1e6:.1f} MB, fetch cache {f['fetch cold'][1] / 1e6:.1f} MB; "
        f"clone {f['clone full'][1] / 1e6:.1f} MB, shallow clone {f['clone shallow'][1] / 1e6:.1f} MB"
    )


if __name__ == "__main__":
    sys.exit(main())
