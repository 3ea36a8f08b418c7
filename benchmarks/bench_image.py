"""`envbuild image` against a hand-written Dockerfile, side by side, on the test lock of tests/lib/imagelock.py.

    . /run/envbuild-test/env; python benchmarks/bench_image.py [--repeat 1]

Needs the test services (``scripts/services start``). Serves three git repositories with ``git daemon``
and two wheels from a local PEP 691 index on 127.0.0.1, pushes the test base image to the local
registry to pin it by digest, then times:

- envbuild: a full build (empty caches, ``--no-cache``), a no-op rebuild, and a rebuild after moving
  one source pin (gamma, the last layer group), counting the steps the engine answered from its cache;
- by hand: ``docker build`` of the Dockerfile upstream would write (``git clone --depth 1 --branch``,
  ``pip install``, from the same daemon and index over the host network), built ``--no-cache``, then
  rebuilt with the cache, then rebuilt after the pin moved — where the cache silently keeps the old
  clone, so the only correct hand rebuild is another ``--no-cache`` one.

The hand-written build needs git in the image: ``envbuild-bench/gitbase`` (the base plus Debian's git)
is made once, outside the timings, with the host network. Targets (issue 3): a no-op rebuild under
5% of a full build; a one-pin change rebuilds only what depends on that pin. Prints, never fails.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project and its test helpers

import docker  # noqa: E402

from envbuild.engine import Engine  # noqa: E402
from envbuild.image.build import BuildResult, ImageOptions, build_image  # noqa: E402
from envbuild.verify import VerifyOptions  # noqa: E402
from tests.lib.baseimage import ensure_base_image  # noqa: E402
from tests.lib.gitrepos import GitDaemon  # noqa: E402
from tests.lib.imagelock import ImageLockEnv, make_sources, make_wheels  # noqa: E402
from tests.lib.pyindex import PyIndex  # noqa: E402
from tests.lib.services import push_as  # noqa: E402

GIT_BASE = "envbuild-bench/gitbase:1"
LOCK_NAME = "imagebench"
HAND_IMAGES: list[str] = []  # removed at the end


def push_base(client: docker.DockerClient, registry: str) -> tuple[str, str]:
    base = ensure_base_image(client)
    repository, tag = f"{registry}/envbuild-bench/base", base.tag.rsplit(":", 1)[1]
    return f"{repository}:{tag}", push_as(client, base.tag, repository, tag)


def git_base(client: docker.DockerClient, base: str) -> None:
    try:
        client.images.get(GIT_BASE)
        return
    except docker.errors.ImageNotFound:
        pass
    print("making the git base for the hand-written build (once)", file=sys.stderr)
    dockerfile = (
        f"FROM {base}\nRUN apt-get update -qq && apt-get install -y -qq --no-install-recommends git "
        "ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*\n"
    )
    hand_build(client, dockerfile, nocache=False, tag=GIT_BASE)


def hand_dockerfile(env: ImageLockEnv) -> str:
    index = env.index.url
    return "\n".join(
        [
            f"FROM {GIT_BASE}",
            "ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
            f"RUN pip install --index-url {index} tinyone==1.0 tinytwo==2.0",
            f"RUN git clone -q --depth 1 --branch v1.0 {env.urls['alpha']} /src/alpha"
            " && pip install --no-build-isolation --no-deps -e /src/alpha",
            f"RUN git clone -q --depth 1 --branch main {env.urls['beta']} /src/beta"
            " && pip wheel --no-build-isolation --no-deps -w /tmp/w /src/beta && pip install /tmp/w/*.whl",
            f"RUN git clone -q --depth 1 --branch main {env.urls['gamma']} /src/gamma",
            "",
        ]
    )


def hand_build(
    client: docker.DockerClient, dockerfile: str, *, nocache: bool, tag: str | None = None
) -> tuple[str, int]:
    """Build with the host network (the hand-written Dockerfile fetches); (image ID, cached steps)."""
    data = dockerfile.encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image, cached = None, 0
    for event in client.api.build(
        fileobj=context,
        custom_context=True,
        nocache=nocache,
        rm=True,
        forcerm=True,
        network_mode="host",
        decode=True,
        tag=tag,
    ):
        if "error" in event:
            raise SystemExit(f"hand build failed: {event['error']}")
        cached += "Using cache" in str(event.get("stream", ""))
        image = (event.get("aux") or {}).get("ID", image)
    assert image
    if tag is None:
        HAND_IMAGES.append(image)
    return image, cached


def timed(label: str, repeat: int, run: Callable[[int], object]) -> tuple[float, object]:
    times, result = [], None
    for i in range(repeat):
        start = time.perf_counter()
        result = run(i)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"  {label:<58} {median:8.2f} s", file=sys.stderr)
    return median, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement (median reported)")
    parser.add_argument("--stages", action="store_true", help="print envbuild's progress with elapsed times")
    args = parser.parse_args(argv)
    start = time.perf_counter()

    def stages(message: str) -> None:
        print(f"    {time.perf_counter() - start:7.2f} s  {message[:90]}", file=sys.stderr)

    registry = os.environ.get("ENVBUILD_TEST_REGISTRY")
    if not os.environ.get("DOCKER_HOST") or not registry:
        raise SystemExit("start the services: scripts/services start; . /run/envbuild-test/env")
    client = docker.from_env(version="auto", timeout=3600)
    engine = Engine(client)
    root = Path(tempfile.mkdtemp(prefix="bench-image-"))
    daemon = GitDaemon(root / "upstream", allow_filter=True)
    (root / "upstream").mkdir()
    daemon.start()
    try:
        repos = make_sources(root / "upstream")
        make_wheels(root / "wheels")
        base_name, base_digest = push_base(client, registry)
        git_base(client, base_name)
        with PyIndex(root / "wheels") as index:
            env = ImageLockEnv(repos, {n: daemon.url(n) for n in repos}, index, base_name, base_digest)
            lock = env.write(root / "bench.lock.yaml", env.lock(name=LOCK_NAME))
            caches = iter(range(10**6))

            def full(_: int) -> BuildResult:
                nonlocal start
                start = time.perf_counter()
                return build_image(
                    lock,
                    ImageOptions(VerifyOptions(root / f"cache{next(caches)}"), no_cache=True),
                    engine=engine,
                    progress=stages if args.stages else None,
                )

            print("envbuild image:", file=sys.stderr)
            t_full, first = timed("full build (empty caches, --no-cache)", args.repeat, full)
            assert isinstance(first, BuildResult)
            cache = root / f"cache{next(caches) - 1}"
            t_noop, noop = timed(
                "no-op rebuild",
                args.repeat,
                lambda _: build_image(lock, ImageOptions(VerifyOptions(cache)), engine=engine),
            )
            assert isinstance(noop, BuildResult) and noop.image_id == first.image_id

            moved_locks = []
            for i in range(args.repeat):
                commit = repos["gamma"].commit(f"move {i}", files={"data/table.csv": f"a,b\n1,{i + 3}\n"})
                moved_locks.append(
                    env.write(root / f"moved{i}.lock.yaml", env.lock(name=LOCK_NAME, pins={"gamma": commit}))
                )
            t_moved, moved = timed(
                "rebuild after moving one pin (gamma)",
                args.repeat,
                lambda i: build_image(moved_locks[i], ImageOptions(VerifyOptions(cache)), engine=engine),
            )
            assert isinstance(moved, BuildResult)
            rebuilt = [s.instruction[:40] for s in moved.steps if not s.cached]
            print(
                f"    steps from the layer cache: {sum(s.cached for s in moved.steps)}/{len(moved.steps)}; "
                f"rebuilt: {rebuilt}",
                file=sys.stderr,
            )
            same = sum(a == b for a, b in zip(moved.diff_ids, first.diff_ids))
            print(f"    layers identical to the first build: {same}/{len(first.diff_ids)}", file=sys.stderr)

            print("hand-written Dockerfile (git clone --depth 1 --branch, pip install):", file=sys.stderr)
            dockerfile = hand_dockerfile(env)
            t_hand, _ = timed(
                "full build (--no-cache)", args.repeat, lambda _: hand_build(client, dockerfile, nocache=True)
            )
            t_hand_noop, _ = timed(
                "rebuild with the cache", args.repeat, lambda _: hand_build(client, dockerfile, nocache=False)
            )
            repos["gamma"].commit("move again", files={"data/table.csv": "a,b\n9,9\n"})
            _, (_, hand_cached) = timed(
                "rebuild with the cache after the pin moved (stale!)",
                1,
                lambda _: hand_build(client, dockerfile, nocache=False),
            )  # type: ignore[misc]
            print(
                f"    steps from the cache: {hand_cached} (every step after FROM) — the moved branch is not seen; "
                "only --no-cache gets it",
                file=sys.stderr,
            )
            ids = {hand_build(client, dockerfile, nocache=True)[0] for _ in range(2)}
            print(f"    two --no-cache hand builds: {len(ids)} different image IDs; envbuild: one", file=sys.stderr)

        print("\nsummary", file=sys.stderr)
        print(
            f"  no-op rebuild / full build (envbuild):        {t_noop / t_full:6.1%}   (target < 5%)", file=sys.stderr
        )
        print(f"  one-pin rebuild / full build (envbuild):      {t_moved / t_full:6.1%}", file=sys.stderr)
        print(f"  envbuild full / hand full:                    {t_full / t_hand:6.2f}x", file=sys.stderr)
        print(f"  envbuild no-op / hand cached rebuild:         {t_noop / t_hand_noop:6.2f}x", file=sys.stderr)
        print(f"  envbuild one-pin / hand --no-cache (correct): {t_moved / t_hand:6.2f}x", file=sys.stderr)
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
        for image in client.images.list():  # what this run made; the git base stays for the next run
            for tag in image.tags:
                if tag.rsplit(":", 1)[0].endswith((f"envbuild-raw/{LOCK_NAME}", f"envbuild/{LOCK_NAME}")):
                    try:
                        client.images.remove(tag)
                    except docker.errors.APIError:
                        pass
        for image_id in dict.fromkeys(HAND_IMAGES):
            try:
                client.images.remove(image_id, force=True)
            except docker.errors.APIError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
