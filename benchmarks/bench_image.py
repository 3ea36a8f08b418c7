"""`envbuild image` against a hand-written Dockerfile, side by side, on the test lock of tests/lib/imagelock.py.

    . /run/envbuild-test/env; python benchmarks/bench_image.py [--repeat 1]
    . /run/envbuild-test/env; python benchmarks/bench_image.py --scale [--large-gb 4.25] [--stages]

``--scale`` (below) measures at the real stack's size instead: GBs of real wheels on a base of 0.15 and
of several GB. Without it:

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
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project and its test helpers

import docker  # noqa: E402

from envbuild.config import SourceOptions  # noqa: E402
from envbuild.engine.client import Engine  # noqa: E402
from envbuild.image.build import BuildResult, ImageOptions, build_image  # noqa: E402
from envbuild.image.cache.ledger import forget_built  # noqa: E402
from envbuild.lock.io import read_lock  # noqa: E402
from envbuild.lock.model import Package, Waiver  # noqa: E402
from envbuild.progress import silent  # noqa: E402
from envbuild.verify.pins import VerifyOptions  # noqa: E402
from tests.lib.baseimage import ensure_base_image  # noqa: E402
from tests.lib.gitrepos import GitDaemon, Repo  # noqa: E402
from tests.lib.imagelock import ImageLockEnv, make_sources, make_wheels  # noqa: E402
from tests.lib.legacybuild import dockerfile_context, legacy_build  # noqa: E402
from tests.lib.pyindex import PyIndex  # noqa: E402
from tests.lib.services import push_as  # noqa: E402

GIT_BASE = "envbuild-bench/gitbase:1"
LOCK_NAME = "imagebench"
HAND_IMAGES: list[str] = []  # removed at the end
# Every hand build is tagged here, so that an image whose build was finishing when a run was stopped (its
# ID never returned) is not left for good: the run's cleanup, and the next run's start, remove every tag.
HAND_REPOSITORY = "envbuild-bench/hand"
_HAND_BUILDS = itertools.count(1)


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


def hand_pinned_dockerfile(env: ImageLockEnv, pins: dict[str, str]) -> str:
    """The fair peer for "a pin moved": each source fetched at its pinned commit (``git fetch --depth 1 URL
    SHA``), so the step's text names the commit and the cache rebuilds from the moved source on."""

    def fetch(name: str) -> str:
        return (
            f"git init -q /src/{name} && git -C /src/{name} fetch -q --depth 1 {env.urls[name]} {pins[name]}"
            f" && git -C /src/{name} checkout -q FETCH_HEAD"
        )

    index = env.index.url
    return "\n".join(
        [
            f"FROM {GIT_BASE}",
            "ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
            f"RUN pip install --index-url {index} tinyone==1.0 tinytwo==2.0",
            f"RUN {fetch('alpha')} && pip install --no-build-isolation --no-deps -e /src/alpha",
            f"RUN {fetch('beta')} && pip wheel --no-build-isolation --no-deps -w /tmp/w /src/beta"
            " && pip install /tmp/w/*.whl",
            f"RUN {fetch('gamma')}",
            "",
        ]
    )


def hand_build(
    client: docker.DockerClient, dockerfile: str, *, nocache: bool, tag: str | None = None
) -> tuple[str, int]:
    """Build with the host network (the hand-written Dockerfile fetches); (image ID, cached steps)."""
    context = dockerfile_context(dockerfile)
    image, cached = legacy_build(client, context, nocache=nocache, network="host", tag=tag)
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
    # A watchdog's or a user's SIGTERM unwinds like Ctrl-C, so every `finally` runs: the git daemon stopped,
    # the scratch directory and the run's images removed (killed outright, two closure runs left their git
    # daemons serving and their images on the engine).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement (median reported)")
    parser.add_argument(
        "--stages",
        action="store_true",
        help="print envbuild's progress with elapsed times (--scale: and the hand peers' steps)",
    )
    parser.add_argument("--scale", action="store_true", help="GBs of real wheels, on a small and a multi-GB base")
    parser.add_argument("--large-gb", type=float, default=4.25, help="--scale: GB of filler on the large base")
    parser.add_argument("--save-load", action="store_true", help="--scale: also time docker save/load of each base")
    parser.add_argument("--legacy-hand", action="store_true", help="--scale: also the hand build on the legacy builder")
    parser.add_argument("--only", choices=("small", "large"), default="", help="--scale: one base only")
    parser.add_argument("--full-repeat", type=int, default=3, help="--scale: full builds a side (median reported)")
    parser.add_argument(
        "--closure",
        type=Path,
        metavar="FILE",
        help="--scale: install this closure (name==version lines, e.g. benchmarks/closure-226.txt) instead of "
        "the 27 wheels",
    )
    args = parser.parse_args(argv)
    if args.scale:
        return scale(
            args.large_gb,
            stages=args.stages,
            save_load=args.save_load,
            legacy_hand=args.legacy_hand,
            only=args.only,
            repeat=args.repeat,
            full_repeat=args.full_repeat,
            work=closure_workload(args.closure) if args.closure else WHEELS_27,
        )
    start = time.perf_counter()

    def stages(message: str) -> None:
        print(f"    {time.perf_counter() - start:7.2f} s  {message[:90]}", file=sys.stderr)

    registry = os.environ.get("ENVBUILD_TEST_REGISTRY")
    if not os.environ.get("DOCKER_HOST") or not registry:
        raise SystemExit("start the services: scripts/services start; . /run/envbuild-test/env")
    client = docker.from_env(version="auto", timeout=3600)
    engine = Engine(client)
    if leftover := _remove_hand_images(client):
        print(f"removed {leftover} hand-build image(s) a stopped run left", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="bench-image-"))
    daemon = GitDaemon(root / "upstream", allow_filter=True)
    (root / "upstream").mkdir()
    daemon.start()
    try:
        repos = make_sources(root / "upstream")
        make_wheels(root / "wheels", "bench_image")
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
                    read_lock(lock),
                    ImageOptions(VerifyOptions(SourceOptions(root / f"cache{next(caches)}")), no_cache=True),
                    engine=engine,
                    progress=stages if args.stages else silent,
                )

            print("envbuild image:", file=sys.stderr)
            t_full, first = timed("full build (empty caches, --no-cache)", args.repeat, full)
            assert isinstance(first, BuildResult)
            cache = root / f"cache{next(caches) - 1}"
            t_noop, noop = timed(
                "no-op rebuild",
                args.repeat,
                lambda _: build_image(
                    read_lock(lock), ImageOptions(VerifyOptions(SourceOptions(cache))), engine=engine
                ),
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
                lambda i: build_image(
                    read_lock(moved_locks[i]), ImageOptions(VerifyOptions(SourceOptions(cache))), engine=engine
                ),
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

            print("hand-written Dockerfile pinning each commit (git fetch --depth 1 URL SHA):", file=sys.stderr)
            pinned = hand_pinned_dockerfile(env, env.pins())
            t_pin_full, _ = timed(
                "full build (--no-cache)", args.repeat, lambda _: hand_build(client, pinned, nocache=True)
            )
            t_pin_noop, _ = timed(
                "rebuild with the cache", args.repeat, lambda _: hand_build(client, pinned, nocache=False)
            )
            pinned_moves = []
            for i in range(args.repeat):
                commit = repos["gamma"].commit(f"pinned move {i}", files={"data/table.csv": f"p,q\n1,{i}\n"})
                pinned_moves.append(hand_pinned_dockerfile(env, {**env.pins(), "gamma": commit}))
            t_pin_moved, (_, pin_cached) = timed(
                "rebuild after moving one pin (gamma), with the cache",
                args.repeat,
                lambda i: hand_build(client, pinned_moves[i], nocache=False),
            )  # type: ignore[misc]
            print(f"    steps from the cache: {pin_cached} (all before gamma's)", file=sys.stderr)

        print("\nsummary", file=sys.stderr)
        print(
            f"  no-op rebuild / full build (envbuild):        {t_noop / t_full:6.1%}   (target < 5%)", file=sys.stderr
        )
        print(f"  one-pin rebuild / full build (envbuild):      {t_moved / t_full:6.1%}", file=sys.stderr)
        print(f"  envbuild full / hand full:                    {t_full / t_hand:6.2f}x", file=sys.stderr)
        print(f"  envbuild no-op / hand cached rebuild:         {t_noop / t_hand_noop:6.2f}x", file=sys.stderr)
        print(f"  envbuild one-pin / hand --no-cache (correct): {t_moved / t_hand:6.2f}x", file=sys.stderr)
        print(f"  envbuild full / hand pinned full:             {t_full / t_pin_full:6.2f}x", file=sys.stderr)
        print(f"  envbuild no-op / hand pinned cached rebuild:  {t_noop / t_pin_noop:6.2f}x", file=sys.stderr)
        print(f"  envbuild one-pin / hand pinned one-pin:       {t_moved / t_pin_moved:6.2f}x", file=sys.stderr)
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
        _remove_hand_images(client)
        empty_build_cache()  # as _remove_scale_images does, and why: the removed images' steps are recorded there
    return 0


# --- --scale: the real stack's size -----------------------------------------------------------------
#
# Real wheels (torch, pyarrow, ray, numpy and what `import ray` needs; 1.06 GB for linux/x86_64/cp311),
# downloaded once into /var/cache/envbuild-test/wheels and served by the local index; the same three
# sources; two bases: the test base (0.15 GB) and the test base plus --large-gb of filler (made once, kept
# by the engine). For each base, side by side: envbuild image (inputs already in its cache, as the hand
# build's files are on disk; the engine's cache off) against a hand-written Dockerfile doing the same
# installs from the same local files (the wheels bind-mounted, pip --require-hashes, COPY + install
# each source) through the docker CLI as a user runs it (`DOCKER_BUILDKIT=1 /usr/bin/docker build`, which
# syncs only what changed: the peer), BuildKit's cache emptied before each full build; then a
# no-op rebuild (envbuild's answered from its record, and again with the record removed, the engine's
# cache answering), each with the engine's cache; then rebuilds after one source moved (beta, the middle
# layer group), in alternation so both sides meet the same machine: `envbuild image` from its CLI in a
# process of its own (what users run: Python's start and imports are in it), and the hand side's
# update of its copy of beta (a git fetch into a clone and `git archive | tar -x`, timed apart) then its
# `docker build`; the image sizes against base + what the installs write; the bytes each build sent
# the engine; the host floor (pip install + a copy).

SCALE_LOCK = "imagescale"
SCALE_WHEELS = (
    "torch==2.9.1",
    "pyarrow==26.0.1",
    "ray==2.60.0",
    "numpy==2.4.6",
    # what `import ray` needs (ray installed --no-deps), and torch's pure-Python requirements
    "attrs==26.1.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "filelock==4.3.1",
    "fsspec==2026.9.0",
    "idna==3.20",
    "jinja2==3.1.6",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "markupsafe==3.0.4",
    "mpmath==1.3.0",  # sympy 1.14 requires mpmath<1.4 (verify found it)
    "msgpack==1.2.4",
    "networkx==3.6.1",
    "packaging==26.4",
    "protobuf==7.36.2",
    "pyyaml==6.0.4",
    "referencing==0.37.0",
    "requests==2.34.2",
    "rpds-py==2026.9.1",
    "sympy==1.14.0",
    "typing-extensions==4.16.0",
    "urllib3==2.8.0",
)
IMPORT_CHECK = "import numpy, pyarrow, ray, sympy, jinja2; print('imports ok')"


@dataclasses.dataclass(frozen=True)
class Workload:
    """The wheels a scale run installs: ``pins`` (``name==version``), downloaded once into the test cache's
    ``cache`` directory; the imports checked in each image; whether torch's CUDA requirements are waived
    (the 27-wheel set leaves them out; a whole closure has them)."""

    label: str
    pins: tuple[str, ...]
    cache: str = "wheels"
    import_check: str = IMPORT_CHECK
    waive_cuda: bool = True
    floor: bool = True  # the host floor: an install and a copy of it on the host's disk, twice the installed size


WHEELS_27 = Workload("27 wheels", SCALE_WHEELS)


def closure_workload(path: Path) -> Workload:
    """A whole closure as ``uv pip compile`` writes it (benchmarks/closure-226.txt: vllm, transformers,
    ray[default], datasets, accelerate, peft, pandas, scikit-learn and matplotlib for CPython 3.11 on
    x86_64 manylinux_2_28, wheels only): the real lock's size."""
    pins = tuple(
        line.split(";")[0].split()[0] for line in path.read_text().splitlines() if line.strip() and line[0] != "#"
    )
    check = "import torch, transformers, ray, datasets, accelerate, peft, pandas, sklearn; print('imports ok')"
    return Workload(f"{len(pins)}-package closure", pins, "closure", check, waive_cuda=False, floor=False)


CUDA_ONLY = "the CUDA build's libraries: the benchmark never runs torch on a GPU (installed --no-deps)"


def waive_cuda(packages: tuple[Package, ...], wheels: list[Path]) -> tuple[Package, ...]:
    """torch from PyPI for linux/x86_64 is the CUDA build: the lock waives, by name, the CUDA libraries
    and triton it requires (read from the wheel's metadata), as the real lock waives its CUDA-only ones."""
    from email.parser import BytesHeaderParser

    from packaging.requirements import Requirement

    from envbuild.verify.metadata import read_wheel_metadata

    wheel = next(w for w in wheels if w.name.startswith("torch-"))
    metadata = BytesHeaderParser().parsebytes(read_wheel_metadata(wheel.open("rb"), wheel.name))
    requires = [Requirement(str(text)).name for text in metadata.get_all("Requires-Dist") or []]
    cuda = sorted({name for name in requires if name.startswith(("nvidia-", "triton"))})
    waive = tuple(Waiver(n, CUDA_ONLY) for n in cuda)
    return tuple(dataclasses.replace(p, waive=waive) if p.name == "torch" else p for p in packages)


def scale_wheels(into: Path, work: Workload = WHEELS_27) -> list[Path]:
    """The pinned wheels, downloaded once (pip download, no dependencies) and hard-linked into ``into``."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    from tests.lib.baseimage import CACHE_DIR

    cache = CACHE_DIR / work.cache
    cache.mkdir(parents=True, exist_ok=True)

    def present() -> dict[str, Path]:
        found = {}
        for path in cache.glob("*.whl"):
            name, version, _, _ = parse_wheel_filename(path.name)
            found[f"{name}=={version}"] = path
        return found

    wanted = [f"{canonicalize_name(r.split('==')[0])}=={r.split('==')[1]}" for r in work.pins]
    missing = [r for r in wanted if r not in present()]
    if missing:
        print(f"downloading {len(missing)} wheels into {cache} (once)", file=sys.stderr)
        _download(missing, cache)
    into.mkdir(parents=True, exist_ok=True)
    links = []
    for requirement in wanted:
        source = present()[requirement]
        os.link(source, into / source.name)
        links.append(into / source.name)
    return links


def _download(pins: list[str], into: Path) -> None:
    """Each ``name==version``'s wheel for CPython 3.11 on x86_64 (glibc 2.28), as envbuild picks a lock's
    files (the index's PEP 691 page, the platform's tags), downloaded from PyPI and checked by sha256."""
    from concurrent.futures import ThreadPoolExecutor

    from envbuild.index.client import IndexClient
    from envbuild.lock.model import PYPI_SIMPLE, Platform
    from envbuild.update.resolve import select_files

    client, platform = IndexClient(), Platform(os="linux", arch="x86_64", python="3.11")

    def one(pin: str) -> None:
        name, version = pin.split("==")
        chosen = [f for f in select_files(client.project(PYPI_SIMPLE, name).files, name, version, platform)]
        wheel = next(f for f in chosen if f.filename.endswith(".whl"))
        part = into / f".{wheel.filename}.part"
        digest = hashlib.sha256()
        with open(part, "wb") as out:
            client.download(wheel.url, out)
        with open(part, "rb") as done:
            for chunk in iter(lambda: done.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != wheel.sha256:
            raise SystemExit(f"{wheel.filename}: sha256 {digest.hexdigest()}, the index lists {wheel.sha256}")
        part.rename(into / wheel.filename)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, pins))


def export_tree(repo: Path, commit: str, dest: Path) -> None:
    """The commit's files, as a user would copy them: git archive | tar x."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


# Both hand peers install the same 3 sources after the wheels, one step per source, each by its installer:
# one pip builds and installs a source; uv, bind-mounted, as a user who knows uv writes it.
SCALE_HAND_SOURCE_STEPS = (
    "COPY src/alpha /src/alpha",
    "RUN pip install --no-build-isolation --no-deps --no-index -e /src/alpha",
    "COPY src/beta /src/beta",
    "RUN pip install --no-build-isolation --no-deps --no-index /src/beta",
    "COPY src/gamma /src/gamma",
    "",
)
HAND_UV = "/uv/uv pip install --system --break-system-packages --offline --no-index --no-deps"
SCALE_HAND_UV_SOURCE_STEPS = (
    "COPY src/alpha /src/alpha",
    f"RUN --mount=type=bind,source=uv,target=/uv {HAND_UV} --no-build-isolation --no-cache -e /src/alpha",
    "COPY src/beta /src/beta",
    f"RUN --mount=type=bind,source=uv,target=/uv {HAND_UV} --no-build-isolation --no-cache /src/beta",
    "COPY src/gamma /src/gamma",
    "",
)


def scale_hand_dockerfile(base: str, requirements: list[str]) -> str:
    return "\n".join(
        [
            f"FROM {base}",
            "ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1",
            "COPY wheels/ /wheels/",
            f"RUN pip install --no-index --no-deps --no-compile --find-links /wheels {' '.join(requirements)}",
            *SCALE_HAND_SOURCE_STEPS,
        ]
    )


def scale_hand_buildkit_dockerfile(base: str, installer: str = "pip") -> str:
    """The strongest hand peers: BuildKit, the wheels bind-mounted (never in a layer), hashes checked; installed
    by pip, or (``installer="uv"``) by uv bind-mounted from the context as a user who knows uv writes it
    (``--system``, no cache, straight into the site). The sources by the same installer, one step each."""
    if installer == "uv":
        install = (
            "RUN --mount=type=bind,source=wheels,target=/wheels --mount=type=bind,source=uv,target=/uv"
            f" {HAND_UV} --require-hashes --no-cache --find-links /wheels -r /wheels/requirements.txt"
        )
    else:
        install = (
            "RUN --mount=type=bind,source=wheels,target=/wheels"
            " pip install --no-index --require-hashes --no-deps --no-compile --find-links /wheels"
            " -r /wheels/requirements.txt"
        )
    return "\n".join(
        [
            f"FROM {base}",
            "ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1",
            install,
            *(SCALE_HAND_UV_SOURCE_STEPS if installer == "uv" else SCALE_HAND_SOURCE_STEPS),
        ]
    )


DOCKER_CLI = "/usr/bin/docker"  # Debian's docker.io client; /usr/local/bin/docker here fails with BuildKit
PEERS = {"cli": "pip", "uv": "uv"}  # each hand peer's prefix in the figures → its installer, as printed
# Issue 45's goals: the bound of each, as the summary prints it beside the figure and judges it (goals()).
BOUND_PIP, BOUND_UV, BOUND_MOVED, BOUND_NOOP, BOUND_SIZE = 0.8, 1.05, 1.2, 0.5, 0.02


def cli_build(context: Path, *extra: str, stages: bool = False) -> str:
    """``DOCKER_BUILDKIT=1 docker build``, as a user runs it; the image ID. With ``stages``, BuildKit's plain
    progress instead of ``-q``, and each step's time and the layers' export printed (what ``--stages`` prints
    of envbuild's build, for the peer)."""
    done = subprocess.run(
        [
            DOCKER_CLI,
            "build",
            "--progress=plain" if stages else "-q",
            "--network=none",
            "--tag",
            f"{HAND_REPOSITORY}:{os.getpid()}-{next(_HAND_BUILDS)}",
            *extra,
            str(context),
        ],
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{DOCKER_CLI} build failed: {done.stderr.strip()[-400:]}")
    if not stages:
        return done.stdout.strip().splitlines()[-1]
    names: dict[str, str] = {}
    for line in done.stderr.splitlines():
        number, _, rest = line.partition(" ")
        if rest.startswith("[") or rest.startswith("exporting"):
            names.setdefault(number, rest)
        elif rest.startswith("DONE ") and not names.get(number, "[internal]").startswith("[internal]"):
            print(f"      {rest[5:]:>6}  {names[number][:100]}", file=sys.stderr)
        elif rest.startswith("transferring context: ") and rest.endswith(" done") and len(rest.split()) == 5:
            size, seconds = rest.split()[2:4]
            print(f"      {seconds:>6}  the context sent: {size}", file=sys.stderr)
    return re.findall(r"writing image (sha256:[0-9a-f]{64})", done.stderr)[-1]


def _drop_image(image_id: str) -> None:
    subprocess.run([DOCKER_CLI, "image", "rm", "-f", image_id], check=False, capture_output=True)


def empty_build_cache() -> None:
    """Before each full build, outside its timing: BuildKit's cache emptied (``docker builder prune -af``),
    so each peer sends its context and runs every step from nothing, and envbuild's own bound on that
    cache finds no other build's records to prune."""
    subprocess.run([DOCKER_CLI, "builder", "prune", "-af"], check=True, capture_output=True)


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of the full builds: ``prefix`` of its figures (``""`` for envbuild's), what it is, its full
    build (→ the image ID), how its image is removed, and what is timed right after its last full build
    (its no-op, while BuildKit's cache still holds its steps)."""

    prefix: str
    label: str
    build: Callable[[], str]
    drop: Callable[[str], None]
    after_last: Callable[[], None]


def settle() -> None:
    """``sync``, outside a timing: the last build's and the last removal's writes reach the disk before the
    clock starts, not during the next measurement."""
    subprocess.run(["sync"], check=True)


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def forget_deletions(warm: tuple[Path, ...]) -> bool:
    """The page cache dropped (after :func:`settle`: only clean pages go), then every file under ``warm``
    read back (each inode once: the hand contexts hard-link the wheels), so each build starts with its inputs in memory and without the file system's cached metadata of
    the last builds' deletions. This machine's disk is ext4 without a journal, where creating a file skips
    every free inode freed in the last 60 s whose inode table block is still cached, or in the last 360 s
    while that block is dirty (``recently_deleted`` in ``fs/ext4/ialloc.c``; a journaled ext4, Debian's
    default, never checks). The build cache emptied before each build frees the last build's tens of
    thousands of inodes, and the next build's installer met them: ``perf`` put the time in ``ext4_create``
    → ``recently_deleted``, and uv took 13.7 s where it takes 7 s once the page cache is dropped
    (docs/benchmarks.md, "Deletions"). False where the cache cannot be dropped (not root, a read-only
    /proc): the builds then carry that effect."""
    try:
        DROP_CACHES.write_text("1\n")
    except OSError:
        return False
    read: set[tuple[int, int]] = set()
    for root in warm:
        for path in sorted(root.rglob("*")):
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) in read:
                continue
            read.add((info.st_dev, info.st_ino))
            with open(path, "rb") as handle:
                while handle.read(1 << 20):
                    pass
    return True


def quiet_start(warm: tuple[Path, ...] = ()) -> None:
    """Before each full build: :func:`empty_build_cache`, :func:`settle`, then :func:`forget_deletions` with
    the sides' inputs ``warm`` (a warning the first time it cannot)."""
    empty_build_cache()
    settle()
    if warm and not forget_deletions(warm):
        _cannot_drop()


@functools.cache
def _cannot_drop() -> None:
    """Said once a run: the page cache cannot be dropped (:func:`forget_deletions`)."""
    print(
        f"    warning: cannot write {DROP_CACHES} (not root?): each build may meet the last ones' deletions "
        '(docs/benchmarks.md, "Deletions")',
        file=sys.stderr,
    )


# Three sides' rounds in an order that balances what each build follows, not only its place in the round:
# each round begins with the side the last one ended with, so over six rounds (and the warm-up's last
# build) every side follows every side, itself included, exactly twice and holds each place twice. The
# turning order gave each side each place but always the same two predecessors (stop 63: every side built
# fastest right after hand pip's build, and the turned order put envbuild there in four rounds of six).
BALANCED_3 = ((0, 1, 2), (2, 1, 0), (0, 2, 1), (1, 0, 2), (2, 0, 1), (1, 2, 0))


def round_orders(rounds: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """The warm-up's order and each round's, as indices into the three sides: :data:`BALANCED_3` repeated
    (balanced for each whole six rounds), after a warm-up that ends with the first round's first side."""
    return (1, 2, 0), [BALANCED_3[r % 6] for r in range(rounds)]


def full_rounds(sides: list[Side], rounds: int, out: dict[str, float], warm: tuple[Path, ...] = ()) -> dict[str, str]:
    """The full builds, in rounds, after an untimed warm-up round: each round builds every side once, in
    the orders of :func:`round_orders`, so that the machine's drift over the minutes (page cache, writeback,
    the disk's own state) and what one build leaves to the next fall on every side alike. Every timed
    image is removed right after its build. Then, untimed, each side builds once more and keeps its image,
    and what it times after its last full build (its no-op) runs right after it: the rounds all end alike,
    none of them with the others' images kept or their no-ops run. Each build starts as :func:`quiet_start`
    leaves the machine, with the sides' inputs ``warm``. The median of each side's runs is its figure; the
    image each kept, by prefix."""
    times: dict[str, list[float]] = {side.prefix: [] for side in sides}
    assert len(sides) == len(BALANCED_3[0]), "the rounds' orders are for three sides"
    warm_up, orders = round_orders(rounds)
    for index in warm_up:  # one untimed round first: the first build after the setup ran 20-40 % slower (cold
        side = sides[index]  # context files, the engine's first build of the day), whichever side it was
        quiet_start(warm)
        start = time.perf_counter()
        side.drop(side.build())
        print(
            f"    warm-up, {side.label}: full build (--no-cache, untimed) {time.perf_counter() - start:6.1f} s",
            file=sys.stderr,
        )
    for round_, order in enumerate(orders):
        for side in (sides[i] for i in order):
            quiet_start(warm)
            start = time.perf_counter()
            image_id = side.build()
            times[side.prefix].append(time.perf_counter() - start)
            print(
                f"    round {round_ + 1}, {side.label}: full build (--no-cache) {times[side.prefix][-1]:6.1f} s",
                file=sys.stderr,
            )
            side.drop(image_id)
    kept: dict[str, str] = {}
    for side in sides:
        quiet_start(warm)
        kept[side.prefix] = side.build()
        print(f"    {side.label}: built again (untimed), kept", file=sys.stderr)
        side.after_last()
    for side in sides:
        runs = times[side.prefix]
        key = f"{side.prefix}_full" if side.prefix else "full"
        out[key], out[f"{key}_runs"] = statistics.median(runs), runs  # type: ignore[assignment]
    return kept


def _peer_noop(context: Path, out: dict[str, float], prefix: str) -> None:
    """A hand peer's no-op: ``docker build`` again right after its last full build, timed from the CLI as a
    user runs it; its full build's GBs written (:func:`settle`) before the clock starts, as before envbuild's."""
    settle()
    start = time.perf_counter()
    cli_build(context)
    out[f"{prefix}_noop"] = time.perf_counter() - start
    print(
        f"    hand {PEERS[prefix]}: no-op rebuild {out[f'{prefix}_noop']:8.2f} s",
        file=sys.stderr,
    )


def _cli_env() -> dict[str, str]:
    """The environment a user's shell gives ``envbuild``: bytecode written as Python writes it by default. A
    shell (this machine's, CI runners') that sets PYTHONDONTWRITEBYTECODE would make every run compile
    envbuild's modules again (0.45 s here)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def warm_bytecode() -> None:
    """envbuild's modules compiled once, untimed, before the first run from its CLI: an installed wheel has
    its bytecode from the install, but this editable checkout gets it from its first run (a first no-op
    timed 0.98 s against 0.3 s on 2026-12-06, all of it compiling)."""
    code = "import envbuild.cli, envbuild.cli.image, envbuild.image.build, envbuild.image.early"
    subprocess.run([sys.executable, "-c", code], check=True, env=_cli_env())
    print("    (envbuild's bytecode written once, untimed, as an installed wheel has it)", file=sys.stderr)


def runs_text(runs: list[float]) -> str:
    return ", ".join(f"{t:.2f}" for t in runs)


def envbuild_cli(lock: Path, cache_dir: Path, stages: bool, *extra: str) -> tuple[float, str]:
    """``envbuild image LOCK --json [extra]`` in a process of its own, as a user runs it: (seconds, image
    ID). With ``stages``, its progress lines, each at its time since the start."""
    command = [sys.executable, "-c", "import sys; from envbuild.cli import main; sys.exit(main())"]
    command += ["image", str(lock), "--cache-dir", str(cache_dir), "--json", *extra]
    env = _cli_env()
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None and process.stdout is not None
    said = []
    for line in process.stderr:
        said.append(f"    {time.perf_counter() - start:7.2f} s  {line.rstrip()[:110]}")
    stdout = process.stdout.read()
    seconds = time.perf_counter() - start
    if process.wait() != 0:
        raise SystemExit("envbuild image failed:\n" + "\n".join(said[-5:]))
    if stages:
        print("\n".join(said), file=sys.stderr)
    return seconds, json.loads(stdout)["image_id"]


def moved_rounds(
    env: ImageLockEnv,
    packages: tuple[Package, ...],
    beta: Repo,
    beta_url: str,
    root: Path,
    peers: dict[str, Path],
    cache_dir: Path,
    out: dict[str, float],
    repeat: int,
    stages: bool,
) -> str:
    """The one-source rebuild, side by side in alternation (each round moves beta to a commit of its own;
    the median is the figure): ``envbuild image`` of the moved lock, from its CLI; each peer's user (``peers``:
    its prefix, ``cli`` for hand pip, ``uv``, → its context) brings its copy of beta to the commit (a fetch
    into a clone kept from the start, ``git archive | tar -x``: "update", timed on its own), then ``docker
    build``. The image ID of envbuild's last run."""
    print(
        "  one source moved (beta), alternating: envbuild image (its CLI) | each hand peer: update beta + docker build",
        file=sys.stderr,
    )
    clone = root / "hand-clone" / "beta"
    subprocess.run(["git", "clone", "-q", beta_url, str(clone)], check=True)
    # Each peer's full build began by emptying BuildKit's cache (envbuild's steps and the other peer's with
    # it): one untimed build of each as it was (envbuild's not answered from its record) brings its steps
    # back, as a user's cache would be.
    forget_built(cache_dir, read_lock(root / "scale.lock.yaml").sha256)
    envbuild_cli(root / "scale.lock.yaml", cache_dir, stages=False)
    for context in peers.values():
        cli_build(context)
    runs: list[float] = []
    updates: list[float] = []
    builds: dict[str, list[float]] = {prefix: [] for prefix in peers}
    image_id = ""
    for i in range(repeat):
        commit = beta.commit(f"beta moves {i}", files={"beta/extra.py": f"X = {i + 1}\n"})
        moved_lock = env.write(
            root / "moved.lock.yaml", env.lock(name=SCALE_LOCK, packages=packages, pins={"beta": commit})
        )
        seconds, image_id = envbuild_cli(moved_lock, cache_dir, stages)
        runs.append(seconds)
        start = time.perf_counter()
        subprocess.run(["git", "-C", str(clone), "fetch", "-q", "origin"], check=True)
        export_tree(clone, commit, peers["cli"] / "src" / "beta")
        updates.append(time.perf_counter() - start)
        said = []
        for prefix, context in peers.items():
            if prefix != "cli":
                export_tree(clone, commit, context / "src" / "beta")
            start = time.perf_counter()
            HAND_IMAGES.append(cli_build(context))
            builds[prefix].append(time.perf_counter() - start)
            said.append(f"{PEERS[prefix]} {builds[prefix][-1]:4.2f} s")
        print(
            f"    round {i + 1}: envbuild {runs[-1]:5.2f} s | hand: update {updates[-1]:4.2f} s, " + ", ".join(said),
            file=sys.stderr,
        )
    out["moved"], out["moved_runs"] = statistics.median(runs), runs  # type: ignore[assignment]
    for prefix, times in builds.items():
        out[f"{prefix}_moved"], out[f"{prefix}_moved_runs"] = statistics.median(times), times  # type: ignore[assignment]
    out["cli_update"] = statistics.median(updates)
    return image_id


def host_floor(wheels: list[Path], root: Path) -> tuple[float, float]:
    """The floor on this machine: pip install of the same wheels on the host, then a copy of the result.
    ``--ignore-installed``: without it, pip uninstalls from the running environment (the project's venv)
    every distribution it installs into the prefix in another version (filelock went, and Ray with it)."""
    prefix, copy = root / "floor" / "prefix", root / "floor" / "copy"
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--ignore-installed"]
        + ["--disable-pip-version-check", "--prefix", str(prefix), *map(str, wheels)],
        check=True,
    )
    pip_seconds = time.perf_counter() - start
    start = time.perf_counter()
    subprocess.run(["cp", "-a", str(prefix), str(copy)], check=True)
    return pip_seconds, time.perf_counter() - start


def _gb(count: float) -> str:
    from envbuild.engine.transfer import human_bytes

    return human_bytes(count)


def scale_one(
    client: docker.DockerClient,
    engine: Engine,
    registry: str,
    root: Path,
    base_tag: str,
    stages: bool,
    save_load: bool,
    legacy_hand: bool = False,
    repeat: int = 1,
    full_repeat: int = 3,
    work: Workload = WHEELS_27,
) -> dict[str, float]:
    """Every measurement on one base; returns the figures by name. ``repeat``: runs of the one-source
    rebuild on each side (each moves beta to a commit of its own; the median is the figure), and of the no-op
    from envbuild's CLI."""
    from envbuild.engine.transfer import directory_context
    from envbuild.fetch import fetch_inputs
    from envbuild.image.installer import uv_binary
    from envbuild.image.plan import FilePlan
    from envbuild.lock.io import read_lock
    from tests.lib.imagelock import served_packages
    from tests.lib.uvwheel import serve_uv

    out: dict[str, float] = {}
    base = client.images.get(base_tag)
    out["base_size"] = base.attrs["Size"]
    print(f"\nbase {base_tag}: {_gb(out['base_size'])}", file=sys.stderr)
    if save_load:  # what normalising cost before: docker save and docker load of the whole image, base included
        saved = root / "base-save.tar"
        t0 = time.perf_counter()
        engine.save(base_tag, saved)
        out["save"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        engine.load(saved)
        out["load"] = time.perf_counter() - t0
        saved.unlink()
        print(f"  docker save of the base {out['save']:.1f} s, docker load {out['load']:.1f} s", file=sys.stderr)
    t0 = time.perf_counter()
    repository, tag = f"{registry}/envbuild-bench/scalebase", base_tag.rsplit(":", 1)[1]
    digest = push_as(client, base_tag, repository, tag)
    print(f"  pushed to the local registry to pin it by digest: {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    clock = [time.perf_counter()]  # the start of envbuild's build under way: its --stages lines count from it

    def say(message: str) -> None:
        if stages:
            print(f"    {time.perf_counter() - clock[0]:7.2f} s  {message[:110]}", file=sys.stderr)

    upstream = root / "upstream"
    upstream.mkdir()
    daemon = GitDaemon(upstream, allow_filter=True).start()
    try:
        repos = make_sources(upstream)
        wheels = scale_wheels(root / "wheels", work)
        uv = serve_uv(root / "wheels")  # the lock's installer (ImageLockEnv.lock pins it)
        with PyIndex(root / "wheels") as index:
            for wheel in [*wheels, uv]:  # once: the test index would hash every file it lists on each request
                index.hashes[wheel.name] = hashlib.sha256(wheel.read_bytes()).hexdigest()
            index.sha256 = index.hashes.__getitem__  # type: ignore[method-assign]
            packages = served_packages(index)
            if work.waive_cuda:
                packages = waive_cuda(packages, wheels)
            env = ImageLockEnv(repos, {n: daemon.url(n) for n in repos}, index, f"{repository}:{tag}", digest)
            lock = env.write(root / "scale.lock.yaml", env.lock(name=SCALE_LOCK, packages=packages))
            pins = env.pins()
            options = VerifyOptions(SourceOptions(root / "cache"))
            t0 = time.perf_counter()
            fetch_inputs(read_lock(lock), options.source)
            out["fetch"] = time.perf_counter() - t0
            wheel_bytes = sum(w.stat().st_size for w in wheels)
            print(
                f"  {len(wheels)} wheels, {_gb(wheel_bytes)}; fetched into an empty cache in {out['fetch']:.1f} s "
                "(before the timings: the hand build's files are on disk too)",
                file=sys.stderr,
            )

            bk = root / "hand-bk"
            for name in ("alpha", "beta", "gamma"):
                export_tree(repos[name].path, pins[name], bk / "src" / name)
            (bk / "wheels").mkdir()
            for wheel in wheels:
                os.link(wheel, bk / "wheels" / wheel.name)
            (bk / "wheels" / "requirements.txt").write_text(
                "".join(f"{p.name}=={p.version} --hash=sha256:{p.files[0].sha256}\n" for p in packages)
            )
            (bk / "Dockerfile").write_text(scale_hand_buildkit_dockerfile(f"{repository}@{digest}"))
            bkuv = root / "hand-bk-uv"  # the same, installed by uv: its binary bind-mounted from the context
            shutil.copytree(bk, bkuv, copy_function=os.link)
            (bkuv / "uv").mkdir()
            installer = read_lock(lock).lock.installer
            assert installer is not None
            binary = uv_binary(uv, FilePlan("uv", installer.version, uv.name, "", "", (installer, installer.files[0])))
            (bkuv / "uv" / "uv").write_bytes(binary)
            (bkuv / "uv" / "uv").chmod(0o755)
            (bkuv / "Dockerfile").unlink()  # a link to the pip peer's: written anew, not through the link
            (bkuv / "Dockerfile").write_text(scale_hand_buildkit_dockerfile(f"{repository}@{digest}", "uv"))

            def envbuild_full() -> str:  # from its CLI, as a user runs it (and as the peers' are run)
                full.append(envbuild_cli(lock, options.source.cache_dir, stages, "--no-cache")[1])
                return full[-1]

            def envbuild_noops() -> None:
                settle()  # the full build's GBs written before the clock starts
                start = clock[0] = time.perf_counter()
                noop = build_image(read_lock(lock), ImageOptions(options), engine=engine, progress=say)
                out["noop"] = time.perf_counter() - start
                out["sent_noop"] = noop.sent
                assert noop.image_id == full[-1]
                assert noop.noop, "the no-op was not answered from the build record"
                print(f"    no-op rebuild                {out['noop']:8.2f} s  sent {_gb(noop.sent)}", file=sys.stderr)
                noop_runs = [
                    envbuild_cli(lock, options.source.cache_dir, stages=False)[0] for _ in range(max(repeat, 1))
                ]
                out["noop_cli"], out["noop_cli_runs"] = statistics.median(noop_runs), noop_runs  # type: ignore[assignment]
                print(
                    f"    no-op rebuild, its CLI       {out['noop_cli']:8.2f} s  (runs {runs_text(noop_runs)})",
                    file=sys.stderr,
                )
                forget_built(options.source.cache_dir, noop.lock_sha256)
                start = clock[0] = time.perf_counter()
                engine_noop = build_image(read_lock(lock), ImageOptions(options), engine=engine, progress=say)
                out["noop_engine"] = time.perf_counter() - start
                assert engine_noop.image_id == full[-1] and not engine_noop.noop
                print(
                    f"    no-op, no record (the engine's cache answers) {out['noop_engine']:5.2f} s  "
                    f"sent {_gb(engine_noop.sent)}",
                    file=sys.stderr,
                )

            full: list[str] = []
            sides = [
                Side(
                    "uv",
                    "hand uv (DOCKER_BUILDKIT=1 docker build, uv bind-mounted)",
                    lambda: cli_build(bkuv, "--no-cache", stages=stages),
                    _drop_image,
                    lambda: _peer_noop(bkuv, out, "uv"),
                ),
                Side(
                    "cli",
                    "hand pip (DOCKER_BUILDKIT=1 docker build, pip)",
                    lambda: cli_build(bk, "--no-cache", stages=stages),
                    _drop_image,
                    lambda: _peer_noop(bk, out, "cli"),
                ),
                Side(
                    "",
                    f"envbuild image (installer: uv {uv.name.split('-')[1]})",
                    envbuild_full,
                    lambda _: _remove_envbuild_images(client),
                    envbuild_noops,
                ),
            ]
            warm_bytecode()
            kept = full_rounds(sides, full_repeat, out, warm=(root,))
            HAND_IMAGES.extend([kept["uv"], kept["cli"]])
            peers = {"cli": bk, "uv": bkuv}
            if not work.floor:  # the closure: three images of 9 GB and their caches do not fit beside each other
                _drop_image(HAND_IMAGES.pop(0))  # the uv peer's; the one-pip peer's stays, its cache warm
                del peers["uv"]
            moved_id = moved_rounds(
                env,
                packages,
                repos["beta"],
                daemon.url("beta"),
                root,
                peers,
                options.source.cache_dir,
                out,
                repeat,
                stages,
            )
            image = engine.inspect(moved_id)
            assert image is not None
            out["size"] = image["Size"]
            checked = engine.run(moved_id, ["python3", "-c", work.import_check])
            print(
                f"    import check (envbuild): {checked.stdout.strip() or checked.stderr.strip()[-200:]}",
                file=sys.stderr,
            )
            hand_image = engine.inspect(HAND_IMAGES[-1])
            assert hand_image is not None
            out["base_plus_installed"] = hand_image["Size"]  # nothing but what the installs wrote
            print(
                f"    image {_gb(out['size'])}, hand pip (base + installed) {_gb(out['base_plus_installed'])}",
                file=sys.stderr,
            )
            checked = engine.run(HAND_IMAGES[-1], ["python3", "-c", work.import_check])
            print(f"    import check: {checked.stdout.strip() or checked.stderr.strip()[-200:]}", file=sys.stderr)
            if work.floor:
                out["floor_pip"], out["floor_copy"] = host_floor(wheels, root)
                print(
                    f"  host floor: pip install {out['floor_pip']:.1f} s + a copy of the result {out['floor_copy']:.1f} s",
                    file=sys.stderr,
                )
            out["engine_layers"] = engine.disk_usage().get("LayersSize", 0)
            if not legacy_hand:
                return out

            print("  hand-written Dockerfile (COPY wheels/, pip install, COPY + install each source):", file=sys.stderr)
            hand = root / "hand"
            for name in ("alpha", "beta", "gamma"):
                export_tree(repos[name].path, pins[name], hand / "src" / name)
            (hand / "wheels").mkdir()
            for wheel in wheels:
                os.link(wheel, hand / "wheels" / wheel.name)
            requirements = [f"{p.name}=={p.version}" for p in packages]
            (hand / "Dockerfile").write_text(scale_hand_dockerfile(f"{repository}@{digest}", requirements))
            sent = directory_context(hand).payload
            start = time.perf_counter()
            hand_full, _ = legacy_build(client, directory_context(hand).chunks(), nocache=True)
            out["hand_full"] = time.perf_counter() - start
            HAND_IMAGES.append(hand_full)
            print(f"    full build (--no-cache)      {out['hand_full']:8.1f} s  sent {_gb(sent)}", file=sys.stderr)
            start = time.perf_counter()
            legacy_build(client, directory_context(hand).chunks())
            out["hand_noop"] = time.perf_counter() - start
            print(f"    no-op rebuild                {out['hand_noop']:8.1f} s  sent {_gb(sent)}", file=sys.stderr)
            legacy_moved = repos["beta"].commit("beta moves for the legacy build", files={"beta/extra.py": "X = 0\n"})
            export_tree(repos["beta"].path, legacy_moved, hand / "src" / "beta")
            start = time.perf_counter()
            hand_moved, _ = legacy_build(client, directory_context(hand).chunks())
            out["hand_moved"] = time.perf_counter() - start
            HAND_IMAGES.append(hand_moved)
            print(f"    one source moved (beta)      {out['hand_moved']:8.1f} s  sent {_gb(sent)}", file=sys.stderr)
            out["sent_hand"] = sent
            hand_image = engine.inspect(hand_moved)
            assert hand_image is not None
            out["hand_size"] = hand_image["Size"]
            checked = engine.run(hand_moved, ["python3", "-c", work.import_check])
            print(f"    import check: {checked.stdout.strip() or checked.stderr.strip()[-200:]}", file=sys.stderr)
            out["engine_layers"] = engine.disk_usage().get("LayersSize", 0)
    finally:
        daemon.stop()
    return out


def scale(
    large_gb: float,
    *,
    stages: bool,
    save_load: bool,
    legacy_hand: bool = False,
    only: str = "",
    repeat: int = 1,
    full_repeat: int = 3,
    work: Workload = WHEELS_27,
) -> int:
    from tests.lib.baseimage import ensure_filler_base

    registry = os.environ.get("ENVBUILD_TEST_REGISTRY")
    if not os.environ.get("DOCKER_HOST") or not registry:
        raise SystemExit("start the services: scripts/services start; . /run/envbuild-test/env")
    client = docker.from_env(version="auto", timeout=7200)
    engine = Engine(client)
    if leftover := _remove_hand_images(client):
        print(f"removed {leftover} hand-build image(s) a stopped run left", file=sys.stderr)
    small = ensure_base_image(client).tag
    large = ""
    if only != "small":
        print(f"making the large base (once; kept by the engine): {large_gb:g} GB of filler", file=sys.stderr)
        large = ensure_filler_base(client, large_gb).tag
    figures = {}
    for label, base in (("small", small), ("large", large)):
        if only and label != only:
            continue
        root = Path(tempfile.mkdtemp(prefix=f"bench-scale-{label}-"))
        try:
            figures[label] = scale_one(
                client, engine, registry, root, base, stages, save_load, legacy_hand, repeat, full_repeat, work
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)
            _remove_scale_images(client)
    print(
        f"\nsummary ({work.label}), against the hand BuildKit peers in the same run (goal in brackets)", file=sys.stderr
    )
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} (2 cores)", file=sys.stderr)

    def runs(values: list[float]) -> str:
        return ", ".join(f"{v:.1f}" for v in values)

    for f in figures.values():
        print(f"  base {_gb(f['base_size'])}:", file=sys.stderr)
        print(
            f"    full build, envbuild / hand pip:       {f['full'] / f['cli_full']:6.2f}x  [<= {BOUND_PIP:g}x]  "
            f"{f['full']:.1f} s ({runs(f['full_runs'])}) / {f['cli_full']:.1f} s ({runs(f['cli_full_runs'])})",
            file=sys.stderr,
        )
        print(
            f"    full build, envbuild / hand uv:        {f['full'] / f['uv_full']:6.2f}x  [<= {BOUND_UV:g}x]  "
            f"{f['full']:.1f} s / {f['uv_full']:.1f} s ({runs(f['uv_full_runs'])})",
            file=sys.stderr,
        )
        for peer, name in PEERS.items():
            paired = by_round(f["full_runs"], f[f"{peer}_full_runs"])  # type: ignore[arg-type]
            ahead = sum(r < 1 for r in paired)
            print(
                f"      paired by round, envbuild / hand {name}: median {statistics.median(paired):.2f}x "
                f"({', '.join(f'{r:.2f}' for r in paired)}; envbuild ahead in {ahead} of {len(paired)})",
                file=sys.stderr,
            )
        print(
            f"    no-op rebuild: envbuild's CLI {f['noop_cli']:.2f} s, median of {runs_text(f['noop_cli_runs'])} (in process {f['noop']:.2f} s; no record: "
            f"{f['noop_engine']:.2f} s), hand pip {f['cli_noop']:.2f} s, hand uv {f['uv_noop']:.2f} s  [<= {BOUND_NOOP:g} s]",
            file=sys.stderr,
        )
        spread = (
            f" (runs {runs_text(f['moved_runs'])} / {runs_text(f['cli_moved_runs'])})"
            if len(f["moved_runs"]) > 1
            else ""
        )
        print(
            f"    one source moved, envbuild / hand pip: {f['moved'] / f['cli_moved']:6.2f}x  [<= {BOUND_MOVED:g}x]  "
            f"{f['moved']:.2f} s / {f['cli_moved']:.2f} s{spread}",
            file=sys.stderr,
        )
        if "uv_moved" in f:
            print(
                f"    one source moved, envbuild / hand uv:  {f['moved'] / f['uv_moved']:6.2f}x  "
                f"{f['moved']:.2f} s / {f['uv_moved']:.2f} s (runs {runs_text(f['uv_moved_runs'])})",
                file=sys.stderr,
            )
        with_update = f["cli_update"] + f["cli_moved"]
        print(
            f"    ... against the hand's update + build:  {f['moved'] / with_update:6.2f}x  "
            f"{f['moved']:.2f} s / ({f['cli_update']:.2f} + {f['cli_moved']:.2f} s)",
            file=sys.stderr,
        )
        print(
            f"    image {_gb(f['size'])}, hand BuildKit (base + installed) {_gb(f['base_plus_installed'])}: "
            f"{f['size'] / f['base_plus_installed'] - 1:+.1%}  [within {BOUND_SIZE:.0%}]",
            file=sys.stderr,
        )
        if "floor_pip" in f:
            floor = f["floor_pip"] + f["floor_copy"]
            print(f"    full build / host floor ({floor:.1f} s):   {f['full'] / floor:6.2f}x", file=sys.stderr)
        if "hand_full" in f:
            print(f"    full build / hand legacy builder:      {f['full'] / f['hand_full']:6.2f}x", file=sys.stderr)
        judged = goals(f)
        print(
            f"    goals (issue 45), read on the paired medians: {sum(g.met for g in judged)} of {len(judged)} met",
            file=sys.stderr,
        )
        for g in judged:
            print(
                f"      {'met    ' if g.met else 'NOT MET'} {g.name}: {g.value:.3f}{g.unit} (bound {g.bound:g}{g.unit})",
                file=sys.stderr,
            )
    if len(figures) == 2:
        growth = figures["large"]["base_size"] / figures["small"]["base_size"]
        ratio = figures["large"]["moved"] / figures["small"]["moved"]
        print(f"  one-source rebuild, base {growth:.0f}x larger: {ratio:.2f}x  [flat: <= 1.5x]", file=sys.stderr)
    return 0


@dataclasses.dataclass(frozen=True)
class Goal:
    """One goal of issue 45 as read from a base's figures: its name, the figure, the bound it must not pass."""

    name: str
    value: float
    bound: float
    unit: str = "x"

    @property
    def met(self) -> bool:
        return self.value <= self.bound


def by_round(ours: list[float], theirs: list[float]) -> list[float]:
    """Each round's ratio, ours over theirs (the rounds pair up: :func:`paired_median`)."""
    return [o / t for o, t in zip(ours, theirs, strict=True)]


def paired_median(ours: list[float], theirs: list[float]) -> float:
    """The median of the per-round ratios (:func:`by_round`). Each round builds every side once (:func:`round_orders`; the
    one-source alternations: envbuild, then each peer), so a round's pair shares the machine's state of
    those minutes; the ratio within a round cancels the drift between rounds that a ratio of two sides'
    medians keeps."""
    return statistics.median(by_round(ours, theirs))


def goals(f: dict) -> list[Goal]:  # type: ignore[type-arg]
    """Issue 45's goals for one base, read by a rule fixed before the run it reads (2026-12-06, stop 63):
    every ratio on the paired median by round (:func:`paired_median`), the no-op on the median of its CLI
    runs, the size on the one image. The ratio of the sides' medians is printed above it, not judged."""
    return [
        Goal("full build / hand pip", paired_median(f["full_runs"], f["cli_full_runs"]), BOUND_PIP),
        Goal("full build / hand uv", paired_median(f["full_runs"], f["uv_full_runs"]), BOUND_UV),
        Goal("one source moved / hand pip", paired_median(f["moved_runs"], f["cli_moved_runs"]), BOUND_MOVED),
        Goal("no-op from the CLI", f["noop_cli"], BOUND_NOOP, " s"),
        Goal("size / (base + installed) - 1", abs(f["size"] / f["base_plus_installed"] - 1), BOUND_SIZE, ""),
    ]


def _remove_scale_images(client: docker.DockerClient) -> None:
    """What a scale run made: envbuild's images of the lock, the hand builds; the bases stay."""
    _remove_envbuild_images(client)
    _remove_hand_images(client)
    client.images.prune(filters={"dangling": True})
    # BuildKit's cache keeps records of those builds' steps (the tools step on the base among them, which the
    # test suite's locks share): removed images can take a recorded step's layer with them, and a later build
    # answered from that record fails ("failed to prepare …: committed: no such file or directory").
    empty_build_cache()


def _remove_envbuild_images(client: docker.DockerClient) -> None:
    """envbuild's images of the lock removed after each of its timed full builds but the last round's, as each
    hand peer's image is: a ``--no-cache`` build whose layer the engine already holds under another image
    leaves BuildKit's copy of that layer on disk for good (docker 20.10, docs/image.md#disk: 2.2 GB a build
    at 27 wheels, 8.9 GB at the closure), and would find its layers registered already."""
    for image in client.images.list(filters={"label": f"io.envbuild.lock.name={SCALE_LOCK}"}):
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(image.id, force=True)


def _remove_hand_images(client: docker.DockerClient) -> int:
    """The hand builds' images: those recorded, and every one tagged :data:`HAND_REPOSITORY` (a stopped run's
    too); how many were removed."""
    tagged = [image.id for image in client.images.list(name=HAND_REPOSITORY)]
    removed = 0
    for image_id in dict.fromkeys([*HAND_IMAGES, *tagged]):
        try:
            client.images.remove(image_id, force=True)
            removed += 1
        except docker.errors.APIError:
            pass
    HAND_IMAGES.clear()
    return removed


if __name__ == "__main__":
    sys.exit(main())
