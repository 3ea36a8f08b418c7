"""The whole-closure check of the real lock, cold and warm, against `uv pip compile` of the same roots.

    python benchmarks/bench_closure.py [--lock lockfiles/glm5_2-ascend.lock.yaml] [--repeat 3] [--jobs 8]

Needs PyPI. Times, each ``--repeat`` times (the median is reported):

- the closure check cold: the core metadata of every locked file read from the index into an empty
  metadata cache (PEP 658 where announced, else HTTP range requests on the wheel's central directory;
  an sdist is downloaded whole), then every requirement of every package and source judged;
- the same warm: the metadata cache answers, no request is made;
- ``uv pip compile`` of the same roots (the lock's requirements and what its sources add, as `lock update`
  gives them) for the lock's platform, with an empty uv cache, then with the cache of the previous run.

The two do different work — uv resolves (chooses versions), envbuild checks a resolution it is given — but
both answer "is this environment consistent for that platform", and a lock verify pays the check on every
run. Not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project

from envbuild.index.client import IndexClient  # noqa: E402
from envbuild.lock import read_lock  # noqa: E402
from envbuild.lock.model import PYPI_SIMPLE  # noqa: E402
from envbuild.update.resolve import run_uv_compile  # noqa: E402
from envbuild.update.roots import source_roots  # noqa: E402
from envbuild.verify.closure import check_closure  # noqa: E402
from envbuild.verify.metadata import MetadataReader, read_metadata  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=REPO / "lockfiles" / "glm5_2-ascend.lock.yaml")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=8)
    args = parser.parse_args(argv)
    lock = read_lock(args.lock).lock
    assert lock.platform is not None
    files = sum(len(p.files) for p in lock.packages)
    print(f"{args.lock}: {len(lock.packages)} packages, {files} files, {len(lock.sources)} sources", file=sys.stderr)

    work = Path(tempfile.mkdtemp(prefix="bench-closure-"))
    try:
        times: dict[str, list[float]] = {"closure check, cold": [], "closure check, warm": []}
        requests: dict[str, int] = {}
        for i in range(args.repeat):
            cache = work / f"meta-{i}"
            for label in ("closure check, cold", "closure check, warm"):
                reader = MetadataReader(cache, IndexClient())
                start = time.perf_counter()
                results = check_closure(lock, read_metadata(lock, reader, jobs=args.jobs))
                times[label].append(time.perf_counter() - start)
                requests[label] = reader.client.requests_made + reader.network_reads
        size = sum(p.stat().st_size for p in (work / "meta-0").rglob("*") if p.is_file())
        counts = Counter(r.status for r in results)

        roots = list(dict.fromkeys([*lock.requirements, *(r.requirement for r in source_roots(lock))]))
        uv: dict[str, list[float]] = {"uv pip compile, cold cache": [], "uv pip compile, warm cache": []}
        for i in range(args.repeat):
            os.environ["UV_CACHE_DIR"] = str(work / f"uv-{i}")
            for label in uv:
                start = time.perf_counter()
                run_uv_compile(roots, lock.platform, (lock.index or PYPI_SIMPLE).rstrip("/"))
                uv[label].append(time.perf_counter() - start)
        med = {name: statistics.median(t) for name, t in {**times, **uv}.items()}

        print(f"\n{'operation':<30} {'median s':>9} {'min s':>8}")
        for name, t in {**times, **uv}.items():
            print(f"{name:<30} {med[name]:9.3f} {min(t):8.3f}")
        print(
            f"\nclosure: {sum(counts.values())} requirement results ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}); "
            f"cold run: {requests['closure check, cold']} index requests, metadata cache {size / 1e6:.2f} MB; "
            f"warm run: {requests['closure check, warm']} requests"
        )
        print(f"uv: {len(roots)} roots for {lock.platform.arch} CPython {lock.platform.python}")
        cold, warm = med["closure check, cold"], med["closure check, warm"]
        uv_cold, uv_warm = med["uv pip compile, cold cache"], med["uv pip compile, warm cache"]
        print(f"\n{'ratio (medians)':<46} {'measured':>9}")
        print(f"{'closure cold / uv pip compile cold':<46} {cold / uv_cold:8.2f}x")
        print(f"{'closure warm / uv pip compile warm':<46} {warm / uv_warm:8.2f}x")
        print(f"{'closure warm / closure cold':<46} {warm / cold:8.2f}x")
        return 0
    finally:
        os.environ.pop("UV_CACHE_DIR", None)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
