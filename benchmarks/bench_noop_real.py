"""The pre-engine part of a cached no-op `envbuild image` on the real lock (lockfiles/, 229 packages).

    python benchmarks/bench_noop_real.py [--repeat 5]

The real lock's base and half its sources cannot be had here, so no image of it can be built: this times
what a no-op does before it asks the engine for the recorded image, on the real lock's bytes. The cache's
record of the lock built and checked (:mod:`envbuild.image.cache.ledger`) is written by this script for an
image ID that no engine holds (the record is read and checked against the lock and the rendered
Dockerfile, as a no-op does). The refs are re-checked for real, through ``--mirror`` rules to a ``git
daemon`` on 127.0.0.1 serving the snapshots under ``/work/.mirror/*/repo`` (read-only): Megatron-LM,
Megatron-Bridge (its Megatron-LM submodule), MindSpeed and vllm-ascend; vllm, MegatronAdaptor,
TransformerEngineNPU, MindSpeed-Ops and MindSpeed-Bridge have no snapshot and answer "not found" at
once, so GitHub's round trip is not in these figures (about one per repository, in parallel). Two of the
served pins are absent from their snapshots (MindSpeed, vllm-ascend: ``missing-commit``), so the build
would refuse here; the time is what it would take. Prints, never fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project and its test helpers

from envbuild.config import SourceOptions  # noqa: E402
from envbuild.errors import EnvbuildError  # noqa: E402
from envbuild.git.mirrors import Mirrors  # noqa: E402
from envbuild.image.build import ImageOptions  # noqa: E402
from envbuild.image.cache.answer import built_before  # noqa: E402
from envbuild.image.cache.ledger import BUILDER, BuiltImage, write_built  # noqa: E402
from envbuild.image.plan import plan_context  # noqa: E402
from envbuild.image.render import render_dockerfile  # noqa: E402
from envbuild.lock.io import read_lock, write_lock  # noqa: E402
from envbuild.verify.buildcheck import require_buildable  # noqa: E402
from envbuild.verify.pins import VerifyOptions, verify_for_build  # noqa: E402
from tests.lib.gitrepos import GitDaemon  # noqa: E402

LOCK = Path(__file__).resolve().parents[1] / "lockfiles" / "glm5_2-ascend.lock.yaml"
SNAPSHOTS = Path("/work/.mirror")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-noop-real-") as tmp:
        root = Path(tmp)
        served = root / "served"
        for snapshot in sorted(SNAPSHOTS.glob("*+*/repo")):
            owner, name = snapshot.parent.name.split("+", 1)
            (served / owner).mkdir(parents=True, exist_ok=True)
            (served / owner / f"{name}.git").symlink_to(snapshot)
        daemon = GitDaemon(served, allow_filter=True).start()
        try:
            mirrors = Mirrors.parse([f"https://github.com/=git://127.0.0.1:{daemon.port}/"])
            options = ImageOptions(VerifyOptions(SourceOptions(cache_dir=root / "cache", mirrors=mirrors)))
            # A package the lock holds no file of cannot be built (the real lock has one, triton-ascend):
            # the lock is timed without it, as a lock that builds would be.
            real = read_lock(LOCK).lock
            lock_path = root / LOCK.name
            # Nor is its base pinned by digest (the registry is out of reach): a stand-in digest pins it.
            assert real.base_image is not None
            base = dataclasses.replace(real.base_image, digest=real.base_image.digest or "sha256:" + "a" * 64)
            kept = tuple(p for p in real.packages if p.files)
            write_lock(lock_path, dataclasses.replace(real, packages=kept, base_image=base))
            read = read_lock(lock_path)
            print(
                f"{LOCK.name}: {len(real.packages)} packages, {len(read.lock.packages)} with files; "
                f"{len(read.lock.sources)} sources",
                file=sys.stderr,
            )
            epoch = read.lock.source_date_epoch or 1767225600
            plan = plan_context(read.lock, lock_sha256=read.sha256, epoch=epoch)
            write_built(
                options.cache_dir,
                BuiltImage(
                    lock_sha256=read.sha256,
                    builder=BUILDER,
                    base_digest=plan.base_digest,
                    image_id="sha256:" + "0" * 64,
                    raw_image_id="sha256:" + "1" * 64,
                    epoch=epoch,
                    dockerfile_sha256=hashlib.sha256(render_dockerfile(plan).encode()).hexdigest(),
                    trees=tuple(sorted((s.name, s.tree or "") for s in read.lock.sources)),
                ),
            )
            rows: dict[str, list[float]] = {"read + record": [], "refs": [], "buildable": [], "total": []}
            statuses = ""
            for run in range(args.repeat + 1):  # the first run fills the git cache: reported apart
                t0 = time.perf_counter()
                read = read_lock(lock_path)
                before = built_before(read, options.cache_dir)
                t1 = time.perf_counter()
                report = verify_for_build(read.lock, str(lock_path), options.verify, inputs=before is None)
                t2 = time.perf_counter()
                try:
                    require_buildable(read.lock, str(lock_path))
                except EnvbuildError as exc:  # a figure, not a verdict
                    if run == 0:
                        print(f"  (require_buildable refuses: {str(exc)[:120]})", file=sys.stderr)
                t3 = time.perf_counter()
                if run == 0:
                    assert before is not None, "the record did not match the lock"
                    statuses = ", ".join(f"{r.name} {r.status}" for r in report.results)
                    print(f"  cold (empty git cache): refs {t2 - t1:.2f} s; {statuses}", file=sys.stderr)
                    continue
                for key, seconds in zip(rows, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                    rows[key].append(seconds)
            print(f"  warm, median of {args.repeat}:", file=sys.stderr)
            for key, times in rows.items():
                print(f"    {key:<14} {statistics.median(times):6.3f} s", file=sys.stderr)
        finally:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
