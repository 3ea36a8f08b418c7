"""`envbuild bisect` against the size of the range it searches, on the test lock of tests/lib/imagelock.py.

    . /run/envbuild-test/env; python benchmarks/bench_bisect.py [--ranges 10 40 160]

Needs the test services (``scripts/services start``). Serves the three sources with ``git daemon`` and the
two wheels from a local index, pins the test base image in the local registry, builds GOOD once (as the
nightly did; not timed), then for each range size N gives source beta N commits on a branch of its own, the
one at 23/40 of the way making ``import beta`` raise, and bisects GOOD → BAD (``--assume-good``, as the
nightly's pass is known), one line per range: the builds against ``ceil(log2 N)`` and the plan logged
ahead, the wall time, the time the builds took and the planning (the branch's history fetched and
listed), and beside it what walking every commit would cost at this run's mean build time. Prints, never
fails.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project and its test helpers

import docker  # noqa: E402

from envbuild.bisect.run import BisectOptions, run_bisect  # noqa: E402
from envbuild.config import SourceOptions  # noqa: E402
from envbuild.engine.client import Engine  # noqa: E402
from envbuild.image.build import ImageOptions, build_image  # noqa: E402
from envbuild.lock.io import read_lock  # noqa: E402
from envbuild.verify.pins import VerifyOptions  # noqa: E402
from tests.lib.baseimage import ensure_base_image  # noqa: E402
from tests.lib.gitrepos import GitDaemon, git  # noqa: E402
from tests.lib.imagelock import ImageLockEnv, make_sources, make_wheels, with_source  # noqa: E402
from tests.lib.pyindex import PyIndex  # noqa: E402
from tests.lib.services import push_as, remove_lock_images  # noqa: E402

LOCK_NAME = "bisectbench"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranges", type=int, nargs="+", default=[10, 40, 160], help="commits in each range")
    args = parser.parse_args(argv)
    registry = os.environ.get("ENVBUILD_TEST_REGISTRY")
    if not os.environ.get("DOCKER_HOST") or not registry:
        raise SystemExit("start the services: scripts/services start; . /run/envbuild-test/env")
    client = docker.from_env(version="auto", timeout=3600)
    engine = Engine(client)
    root = Path(tempfile.mkdtemp(prefix="bench-bisect-"))
    (root / "upstream").mkdir()
    daemon = GitDaemon(root / "upstream", allow_filter=True).start()
    try:
        repos = make_sources(root / "upstream")
        make_wheels(root / "wheels", "bench_bisect")
        base = ensure_base_image(client)
        repository, tag = f"{registry}/envbuild-bench/base", base.tag.rsplit(":", 1)[1]
        digest = push_as(client, base.tag, repository, tag)
        with PyIndex(root / "wheels") as index:
            env = ImageLockEnv(repos, {n: daemon.url(n) for n in repos}, index, f"{repository}:{tag}", digest)
            verify = VerifyOptions(SourceOptions(root / "cache"))
            beta = repos["beta"]
            start = beta.rev("main")
            good_path = env.write(root / "good.lock.yaml", env.lock(name=LOCK_NAME))
            print("building GOOD once, as the nightly did (not timed)", file=sys.stderr)
            build_image(read_lock(good_path), ImageOptions(verify), engine=engine)
            for size in args.ranges:
                breaks = max(1, round(size * 23 / 40))
                beta.checkout(f"range-{size}", create_at=start)
                commits = []
                for number in range(1, size + 1):
                    files = {"beta/history.txt": f"commit {number}\n"}
                    if number == breaks:
                        files["beta/__init__.py"] = 'raise ImportError("beta lost a module")\n'
                    commits.append(beta.commit(f"beta commit {number}", files=files))
                good = with_source(env.lock(name=LOCK_NAME), "beta", ref=f"range-{size}")
                bad = with_source(good, "beta", commit=commits[-1], tree=beta.tree(commits[-1]))
                good_file = env.write(root / f"good-{size}.lock.yaml", good)
                bad_file = env.write(root / f"bad-{size}.lock.yaml", bad)
                began = time.perf_counter()
                result = run_bisect(
                    read_lock(good_file), read_lock(bad_file), BisectOptions(verify, assume_good=True), engine=engine
                )
                wall = time.perf_counter() - began
                assert result.culprit is not None and result.culprit.commit is not None
                assert result.culprit.commit.commit == commits[breaks - 1], "the bisect named the wrong commit"
                built = sum(step.seconds for step in result.steps)
                mean = built / len(result.steps)
                print(
                    f"range {size:4d} commits: {len(result.steps)} builds (at most {result.planned} logged ahead: "
                    f"BAD and ceil(log2 N) = {math.ceil(math.log2(size))}), {wall:5.1f} s wall "
                    f"({built:4.1f} s building, {wall - built:4.1f} s planning); every commit built: "
                    f"~{size * mean:5.0f} s ({wall / (size * mean):.2f}x)"
                )
                git("checkout", "-q", "main", cwd=beta.path)
    finally:
        daemon.stop()
        remove_lock_images(client, LOCK_NAME, all_images=True)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
