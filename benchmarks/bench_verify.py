"""Cold and warm source verification against plain git, side by side, on a long generated history.

    python benchmarks/bench_verify.py [--commits 10000 --files 5000] [--repeat 3] [--repo DIR]

Generates a repository with ``git fast-import`` (or reuses ``--repo`` if it already exists), serves it
with ``git daemon`` on 127.0.0.1 with partial clone allowed, and times, each ``--repeat`` times (the
median is reported):

- cold ``verify_source`` of a branch pin (12 commits behind its head) and of a tag pin with a tree,
  each into an empty cache;
- warm ``verify_source`` of the branch pin;
- ``git clone --bare`` (full), ``git fetch --filter=tree:0`` of the one ref into an empty bare
  repository, and ``git ls-remote``.

Targets (issue 2): cold verify >= 10x faster than a full clone and within 2x of the filtered fetch;
warm verify within 2x of ls-remote. Not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project and its test helpers

from envbuild.git.cache import GitCache  # noqa: E402
from envbuild.lock.model import Source  # noqa: E402
from envbuild.verify.sources import verify_source  # noqa: E402
from tests.lib.gitrepos import GitDaemon, fast_import_repo, git  # noqa: E402


def measure(label: str, repeat: int, setup: Callable[[int], object], run: Callable[[object], object]) -> list[float]:
    times = []
    for i in range(repeat):
        arg = setup(i)
        start = time.perf_counter()
        run(arg)
        times.append(time.perf_counter() - start)
    print(f"  {label:<34} {statistics.median(times):8.3f} s", file=sys.stderr)
    return times


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10000)  # Megatron-LM: ~10k commits, 127 MB packed
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--repo", type=Path, help="where to keep the generated repository for reuse")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    daemon: GitDaemon | None = None
    try:
        base = work / "srv"
        base.mkdir()
        upstream = args.repo or work / "upstream.git"
        if not upstream.exists():
            print(f"generating {args.commits} commits x {args.files} files ...", file=sys.stderr)
            start = time.perf_counter()
            fast_import_repo(upstream, commits=args.commits, files=args.files)
            git("repack", "-adq", cwd=upstream)  # served as a real server would hold it: one packed history
            print(f"  generated in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        (base / "repo.git").symlink_to(upstream.resolve())
        daemon = GitDaemon(base, allow_filter=True).start()
        url = daemon.url("repo.git")
        commits = int(git("rev-list", "--count", "main", cwd=upstream))
        pinned = git("rev-parse", "main~12", cwd=upstream)
        last_tag = git("describe", "--tags", "--abbrev=0", "main", cwd=upstream)
        tag_commit = git("rev-parse", f"{last_tag}^{{commit}}", cwd=upstream)
        branch_pin = Source(name="repo", repo=url, ref="main", ref_type="branch", commit=pinned)
        tag_pin = Source(
            name="repo",
            repo=url,
            ref=last_tag,
            ref_type="tag",
            commit=tag_commit,
            tree=git("rev-parse", f"{tag_commit}^{{tree}}", cwd=upstream),
        )

        def fresh(name: str) -> Callable[[int], Path]:
            def make(i: int) -> Path:
                path = work / f"{name}-{i}"
                shutil.rmtree(path, ignore_errors=True)
                return path

            return make

        def verify(source: Source, expect: str) -> Callable[[object], object]:
            def run(root: object) -> None:
                result = verify_source(source, GitCache(Path(str(root))))
                assert result.status == expect, result

            return run

        def filtered_fetch(path: object) -> None:
            git("init", "-q", "--bare", str(path))
            git("remote", "add", "origin", url, cwd=Path(str(path)))
            git(
                "fetch",
                "-q",
                "--filter=tree:0",
                "--no-tags",
                "origin",
                "+refs/heads/main:refs/heads/main",
                cwd=Path(str(path)),
            )

        files = len(git("ls-tree", "-r", "--name-only", "main", cwd=upstream).splitlines())
        print(
            f"repository: {commits} commits, {files} files, {du(upstream) / 1e6:.1f} MB packed; served at {url}",
            file=sys.stderr,
        )
        times = {
            "full clone (git clone --bare)": measure(
                "full clone", args.repeat, fresh("clone"), lambda p: git("clone", "-q", "--bare", url, str(p))
            ),
            "filtered fetch of one ref": measure("filtered fetch", args.repeat, fresh("fetch"), filtered_fetch),
            "git ls-remote": measure("ls-remote", args.repeat, lambda i: None, lambda _: git("ls-remote", url)),
            "cold verify, branch pin": measure(
                "cold verify branch", args.repeat, fresh("cold-branch"), verify(branch_pin, "behind")
            ),
            "cold verify, tag pin with tree": measure(
                "cold verify tag+tree", args.repeat, fresh("cold-tag"), verify(tag_pin, "ok")
            ),
            "warm verify, branch pin": measure(
                "warm verify branch", args.repeat, lambda i: work / "cold-branch-0", verify(branch_pin, "behind")
            ),
        }
        sizes = {
            "full clone (git clone --bare)": du(work / "clone-0"),
            "filtered fetch of one ref": du(work / "fetch-0"),
            "cold verify, branch pin": du(work / "cold-branch-0"),
            "cold verify, tag pin with tree": du(work / "cold-tag-0"),
        }
        med = {name: statistics.median(t) for name, t in times.items()}

        print(f"\n{'operation':<34} {'median s':>9} {'min s':>8} {'on disk':>10}")
        for name, t in times.items():
            size = f"{sizes[name] / 1e6:.2f} MB" if name in sizes else ""
            print(f"{name:<34} {med[name]:9.3f} {min(t):8.3f} {size:>10}")
        clone, fetch, ls = med["full clone (git clone --bare)"], med["filtered fetch of one ref"], med["git ls-remote"]
        rows = []
        for kind in ("branch pin", "tag pin with tree"):
            cold = med[f"cold verify, {kind}"]
            rows.append((f"full clone / cold verify ({kind})", f"{clone / cold:.1f}x", ">= 10x", clone / cold >= 10))
            rows.append((f"cold verify ({kind}) / filtered fetch", f"{cold / fetch:.2f}x", "<= 2x", cold / fetch <= 2))
        warm = med["warm verify, branch pin"]
        rows.append(("warm verify / ls-remote", f"{warm / ls:.2f}x", "<= 2x", warm / ls <= 2))
        print(f"\n{'ratio (medians)':<50} {'measured':>9} {'target':>8}")
        for name, value, target, met in rows:
            print(f"{name:<50} {value:>9} {target:>8}  {'met' if met else 'MISSED'}")
        return 0
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
