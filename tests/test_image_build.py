"""`envbuild image` end to end: a real lock (git daemon, local index, base pinned by digest in the local
registry) built by the real engine. Built images are shared across the module: two ``--no-cache``
builds, one cached rebuild per changed input, interrupted builds (killed, Ctrl-C)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import requests

from envbuild.cli import main
from envbuild.config import SourceOptions
from envbuild.engine.cli_build import TRANSPORT_ENV
from envbuild.engine.client import Engine
from envbuild.errors import EngineError
from envbuild.fetch import InputFetchError, exporter_for
from envbuild.git.cache import GitCache
from envbuild.image.assemble import ContextError
from envbuild.image.build import (
    BuildRefused,
    BuildResult,
    ImageOptions,
    build_image,
    dry_run,
)
from envbuild.image.cache.ledger import forget_built
from envbuild.image.cache.normalised_map import read_map
from envbuild.image.inimage_verdict import compare_inimage
from envbuild.image.normalise import save_added_layers
from envbuild.image.plan import plan_context
from envbuild.image.render import base_reference
from envbuild.image.treestore import TreeStore, tree_key
from envbuild.lock.io import read_lock
from envbuild.progress import Progress, silent
from envbuild.verify.pins import VerifyOptions, verify_lock
from envbuild.verify.results import PinResult, VerifyReport
from tests.lib.claims import Beside, held_elsewhere
from tests.lib.engines import ExtraEngine
from tests.lib.gitrepos import Served
from tests.lib.imagediff import why_different
from tests.lib.imagelock import (
    ImageLockEnv,
    lock_env,
    with_file_hash,
    with_source,
)
from tests.lib.services import PushedImage, remove_lock_images
from tests.lib.signals import restore_sigint

pytestmark = [pytest.mark.gitdaemon, pytest.mark.slow]


def needs_engine(test):  # type: ignore[no-untyped-def]
    """The engine and the registry (the base image is pinned by its digest there)."""
    return pytest.mark.docker(pytest.mark.registry(test))


@pytest.fixture(scope="module")
def env(
    served: Served, pushed_base_image: PushedImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ImageLockEnv]:
    wheels = tmp_path_factory.mktemp("wheels")
    name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    url = lambda n: served.url(n, "daemon-filter")  # noqa: E731
    with lock_env(served.base, url, wheels, "test_image_build", name, pushed_base_image.digest) as env:
        env.build_requires = {"beta": ("tinyone>=1.0",)}  # every lock here: the packages step compiles tinyone
        yield env


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("image")


@pytest.fixture(scope="module")
def engine(docker_client: docker.DockerClient) -> Iterator[Engine]:
    yield Engine(docker_client)
    # The images this module made, raw (tagged or superseded) and normalised: the engine outlives the run.
    remove_lock_images(
        docker_client,
        "imagetest",
        "mismatch",
        "samepkga",
        "samepkgb",
        "otherpkgs",
        "keptedit",
        "nopackages",
        "pipinstalled",
    )


@pytest.fixture(scope="module")
def lock_path(env: ImageLockEnv, work: Path) -> Path:
    return env.write(work / "locks" / "imagetest.lock.yaml")


def options(work: Path, cache_dir: Path | None = None, **changes: Any) -> ImageOptions:
    return ImageOptions(VerifyOptions(SourceOptions(cache_dir=cache_dir or work / "cache")), **changes)


@pytest.fixture(scope="module")
def reference(lock_path: Path, work: Path, engine: Engine) -> BuildResult:
    """The first build of the lock, without the layer cache."""
    return build_image(read_lock(lock_path), options(work, no_cache=True), engine=engine)


@pytest.fixture(scope="module")
def reference_archive(reference: BuildResult, lock_path: Path, work: Path, engine: Engine) -> Path:
    """The reference image saved (`docker save`) without the base's layers, as `envbuild check` saves
    the images it explains."""
    plan = dry_run(read_lock(lock_path), options(work)).plan
    base = engine.inspect(base_reference(plan))
    assert base is not None
    return save_added_layers(engine, reference.image_id, work / "ref.tar", set(base["RootFS"]["Layers"]), silent)


class NoEngine:
    """Stands in for the engine where nothing may be built."""

    address = "unix:///run/no-engine.sock"  # the lock's claims on it are taken: the refusal comes after

    def build(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("a build was started")

    def close(self) -> None:
        pass


def beside_another_lock(
    env: ImageLockEnv, work: Path, engine: Engine, base_layers: int, build: Callable[[], BuildResult]
) -> BuildResult:
    """``build``'s result, run at the same time as a ``--no-cache`` build of a lock on the same base whose
    packages differ (one wheel of the two): both packages steps run on the one tools layer every lock on
    that base shares. When the install step ran in one build with the tools step, the engine wrote its
    layer in either of its two orders (docs/image.md, "The engine's two layer writers"): in 7 runs of
    the test below before the change, the second build's install layer was written in the other order
    4 times."""
    other_path = env.write(
        work / "locks" / "otherpkgs.lock.yaml", env.lock(name="otherpkgs", packages=env.lock().packages[:1])
    )
    other: list[BuildResult | BaseException] = []

    def build_other() -> None:
        try:
            other.append(build_image(read_lock(other_path), options(work, no_cache=True), engine=engine))
        except BaseException as exc:  # noqa: BLE001 - raised below, in the test's thread
            other.append(exc)

    thread = threading.Thread(target=build_other)
    thread.start()
    try:
        result = build()
    finally:
        thread.join()
    if isinstance(other[0], BaseException):
        raise other[0]
    assert other[0].packages is not None and other[0].packages.built
    # The two share the base and the tools layer and no more: the install steps differ.
    tools = base_layers + 1
    assert other[0].diff_ids[:tools] == result.diff_ids[:tools] and other[0].diff_ids[tools] != result.diff_ids[tools]
    return result


@needs_engine
def test_two_no_cache_builds_give_one_image_id(
    reference: BuildResult,
    reference_archive: Path,
    lock_path: Path,
    env: ImageLockEnv,
    work: Path,
    engine: Engine,
    pushed_base_image: PushedImage,
) -> None:
    """The second build runs beside another lock's (:func:`beside_another_lock`)."""
    base_layers = engine.inspect(pushed_base_image.by_digest)["RootFS"]["Layers"]  # type: ignore[index]
    again = beside_another_lock(
        env,
        work,
        engine,
        len(base_layers),
        lambda: build_image(read_lock(lock_path), options(work, no_cache=True), engine=engine),
    )
    if again.image_id != reference.image_id:
        why = why_different(reference_archive, engine, again.image_id, pushed_base_image.by_digest, work / "why")
        pytest.fail(f"two --no-cache builds differ: {reference.image_id} {again.image_id}\n{why}")
    assert again.diff_ids == reference.diff_ids
    assert again.raw_image_id != reference.raw_image_id  # the raw builds differ; normalising removes that
    assert again.packages is not None and again.packages.built  # --no-cache makes the packages image again too
    built = [step for step in again.steps if "] FROM " not in step.instruction]
    # The tools steps are the other lock's too: BuildKit runs an identical step once for both builds,
    # --no-cache or not, and one of them reports it cached. The lock's own steps all ran.
    own = [step for step in built if "envbuild-tools" not in step.instruction]
    cached = [step.instruction[:100] for step in own if step.cached]
    assert len(own) >= 4 and not cached, (len(own), cached)  # a FROM is resolved, not built
    # The in-image check's files: the layer envbuild writes on top, its parents as the built layers left them.
    headers = engine.entry_headers(again.image_id, ["/opt", "/opt/envbuild", "/opt/envbuild/meta/manifest.json"])
    below = engine.entry_headers(again.raw_image_id, ["/opt", "/opt/envbuild"])
    for path in ("/opt", "/opt/envbuild"):
        got, raw = headers[path], below[path]
        assert (got.mode, got.uid, got.gid, got.mtime) == (raw.mode, raw.uid, raw.gid, raw.mtime), path
    manifest = headers["/opt/envbuild/meta/manifest.json"]
    epoch = headers["/opt/envbuild"].mtime  # the lock has sources: their steps set it to the epoch
    assert (manifest.mode & 0o7777, manifest.uid, manifest.mtime) == (0o644, 0, epoch), manifest
    assert json.loads(engine.read_file(again.image_id, "/opt/envbuild/meta/manifest.json"))
    assert reference_archive.is_file()
    assert reference.image_id == "sha256:" + hashlib.sha256(_config_bytes(reference_archive)).hexdigest()
    assert reference.diff_ids[: len(base_layers)] == tuple(base_layers)
    carried = _layer_digests(reference_archive)
    assert carried and not carried & set(base_layers)  # the kept archive leaves the base's layers out
    assert carried == set(reference.diff_ids) - set(base_layers)
    # Nothing of the engine's own per-container files (clamping them would copy them into a layer).
    assert not {".dockerenv", "etc/mtab"} & _layer_entries(reference_archive)


@needs_engine
def test_a_second_engine_with_empty_caches_gives_the_same_image_id(
    reference: BuildResult,
    reference_archive: Path,
    lock_path: Path,
    work: Path,
    fresh_engine: ExtraEngine,
    pushed_base_image: PushedImage,
) -> None:
    """Another dockerd (no image, no BuildKit cache; the base pulled from the registry) and an empty
    envbuild cache: the same layers and the same image ID."""
    with Engine(fresh_engine.client(), fresh_engine.host) as other:
        assert other.images() == [] and other.build_cache_size() == 0
        again = build_image(read_lock(lock_path), options(work, cache_dir=work / "cache-second-engine"), engine=other)
        if again.image_id != reference.image_id:
            why = why_different(reference_archive, other, again.image_id, pushed_base_image.by_digest, work / "why-2")
            pytest.fail(f"the second engine built another image: {reference.image_id} {again.image_id}\n{why}")
    assert (again.image_id, again.diff_ids) == (reference.image_id, reference.diff_ids)
    assert again.raw_image_id != reference.raw_image_id


def _config_bytes(archive: Path) -> bytes:
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        return tar.extractfile(manifest[0]["Config"]).read()  # type: ignore[union-attr]


def _layer_entries(archive: Path) -> set[str]:
    names: set[str] = set()
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith("layer.tar"):
                with tarfile.open(fileobj=tar.extractfile(member)) as layer:
                    names.update(layer.getnames())
    return names


def _layer_digests(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {
            "sha256:" + hashlib.sha256(tar.extractfile(m).read()).hexdigest()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile() and m.name.endswith("layer.tar")
        }


@needs_engine
def test_the_engine_api_transport_gives_the_same_image_id(
    reference: BuildResult, lock_path: Path, work: Path, docker_client: docker.DockerClient
) -> None:
    """docs/image.md's promise: the Engine API transport (the context sent whole as a tar, the lock's uv and
    the installer's directory in it for the sources' steps) gives the image the docker CLI's gives."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TRANSPORT_ENV, "api")
        engine = Engine(docker_client)
        assert engine.build_cli is None
        again = build_image(read_lock(lock_path), options(work, no_cache=True), engine=engine)
    assert again.image_id == reference.image_id
    assert again.diff_ids == reference.diff_ids


@needs_engine
def test_the_image_holds_no_package_file_and_the_packages_one_layer(
    reference: BuildResult, env: ImageLockEnv, engine: Engine, pushed_base_image: PushedImage
) -> None:
    lock = env.lock()
    assert lock.installer is not None
    wheels = [f.filename for p in lock.pinned_packages for f in p.files]
    names = " -o ".join(f"-name {name}" for name in wheels)
    # Neither a package file nor the installer (its wheel, its binary, its stage) is in any layer.
    found = engine.run(
        reference.image_id,
        [
            "sh",
            "-c",
            f"find / -xdev \\( {names} -o -name 'envbuild-packages*' -o -name uv -o -name 'uv-*' "
            "-o -path /opt/envbuild/stage\\* \\) -print",
        ],
    )
    assert (found.exit_code, found.stdout) == (0, ""), found.stderr
    installed = engine.run(reference.image_id, ["sh", "-c", "ls /usr/local/lib/python3.11/dist-packages"])
    assert {"tinyone-1.0.dist-info", "tinytwo-2.0.dist-info"} <= set(installed.stdout.split())
    # The packages image is the base, the tools layer and the install's; no container was made.
    assert reference.packages is not None
    packages = engine.inspect(reference.packages.reference)
    base = engine.inspect(pushed_base_image.by_digest)
    assert packages is not None and base is not None
    base_layers = base["RootFS"]["Layers"]
    assert packages["RootFS"]["Layers"][: len(base_layers)] == base_layers
    assert len(packages["RootFS"]["Layers"]) == len(base_layers) + 2
    assert reference.diff_ids[: len(packages["RootFS"]["Layers"])] == tuple(packages["RootFS"]["Layers"])
    assert engine.history(reference.packages.reference)[0]["CreatedBy"] == (
        f"envbuild: install the lock's 2 package files (uv {lock.installer.version}, no index)"
    )
    # Each distribution's RECORD is true where uv's stage was moved to: every file there, every hash right.
    check = (
        "import base64, csv, hashlib, os, sys\n"
        "site = '/usr/local/lib/python3.11/dist-packages'\n"
        "for info in sorted(d for d in os.listdir(site) if d.endswith('.dist-info')):\n"
        "    for row in csv.reader(open(os.path.join(site, info, 'RECORD'))):\n"
        "        if row[1]:\n"
        "            data = open(os.path.normpath(os.path.join(site, row[0])), 'rb').read()\n"
        "            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()\n"
        "            assert row[1] == 'sha256=' + digest, row\n"
        "        print(row[0])\n"
    )
    records = engine.run(reference.image_id, ["python3", "-c", check])
    assert records.exit_code == 0 and "tinyone/__init__.py" in records.stdout.split(), records.stderr
    # beta's build requirement, tinyone, compiled in the packages step (its RECORD row checked above), checked
    # by hash; no other package's bytecode, and no source's.
    compiled = sorted(row for row in records.stdout.split() if row.endswith(".pyc"))
    assert compiled == ["tinyone/__pycache__/__init__.cpython-311.pyc"], compiled
    flags = engine.run(
        reference.image_id,
        [
            "sh",
            "-c",
            "find / -xdev \\( -path '/opt/envbuild/*' -o -path '*/tiny*' \\) -name '*.pyc' -print; "
            "od -An -tu4 -j4 -N4 /usr/local/lib/python3.11/dist-packages/tinyone/__pycache__/__init__.cpython-311.pyc",
        ],
    )
    assert flags.stdout.split() == [
        "/usr/local/lib/python3.11/dist-packages/tinyone/__pycache__/__init__.cpython-311.pyc",
        "3",
    ], flags
    # The sources, built and installed by the lock's uv: each direct_url.json names the source's directory,
    # as pip's does (the in-image check finds a source's distribution by it), and uv's uv_cache.json, which
    # holds the clock, is gone (its RECORD row too: the check above read every row).
    urls = (
        "import glob, json, os\n"
        "site = '/usr/local/lib/python3.11/dist-packages'\n"
        "print(json.dumps({os.path.basename(os.path.dirname(p)): json.load(open(p))"
        " for p in glob.glob(site + '/*.dist-info/direct_url.json')}))\n"
        "print(json.dumps(glob.glob(site + '/*.dist-info/uv_cache.json')))\n"
    )
    found = engine.run(reference.image_id, ["python3", "-c", urls])
    assert found.exit_code == 0, found.stderr
    origins, stamps = (json.loads(line) for line in found.stdout.splitlines())
    assert origins == {
        "alpha-1.0.dist-info": {"url": "file:///opt/envbuild/src/alpha", "dir_info": {"editable": True}},
        "beta-0.1.dist-info": {"url": "file:///opt/envbuild/src/beta", "dir_info": {}},
    }
    assert stamps == []
    assert engine.containers({"io.envbuild.lock.name": "imagetest", "io.envbuild.role": "packages"}) == []


def rebuilt(lock_path: Path, work: Path, engine: Engine) -> BuildResult:
    """The lock built again by BuildKit, not answered from its record: the steps of a lock an earlier test
    built are in BuildKit's cache again, for a test that asserts they are reused. An ``engine_wide`` test
    may have emptied that cache since (and every build prunes it, least recently used first); this test
    holds the engine shared until it ends, so none empties it meanwhile."""
    forget_built(work / "cache", read_lock(lock_path).sha256)
    return build_image(read_lock(lock_path), options(work), engine=engine)


@needs_engine
def test_a_no_op_rebuild_reuses_every_layer_and_the_normalised_image(
    reference: BuildResult, lock_path: Path, work: Path, engine: Engine
) -> None:
    assert rebuilt(lock_path, work, engine).image_id == reference.image_id
    forget_built(work / "cache", reference.lock_sha256)  # a cache without the record (an older envbuild's)
    again = build_image(read_lock(lock_path), options(work), engine=engine)
    assert again.image_id == reference.image_id
    built = [step for step in again.steps if "] FROM " not in step.instruction]  # a FROM is resolved, not cached
    assert again.reused and built and all(step.cached for step in built), again.steps
    assert read_map(work / "cache")[again.raw_image_id]["image_id"] == reference.image_id
    # The packages image is reused: no package file is sent again, only the sources' context.
    assert again.packages is not None and not again.packages.built and again.packages.sent == 0
    assert reference.packages is not None and again.sent == reference.sent - reference.packages.sent


@needs_engine
def test_a_build_of_the_lock_from_the_same_cache_is_waited_for_and_said(
    reference: BuildResult, lock_path: Path, work: Path, engine: Engine
) -> None:
    """Another build of the lock from this cache holds its lock-name lock: a rebuild says it waits, and
    answers from the record once that build has ended."""
    held = work / "cache" / "image" / "locks" / "imagetest.lock"
    with held_elsewhere(held):
        second = Beside(lambda say: build_image(read_lock(lock_path), options(work), engine=engine, progress=say))
        assert second.waiting(60) == f"waiting: another build of imagetest from this cache holds {held}"
    again = second.result(120)
    assert again.noop and again.image_id == reference.image_id


@needs_engine
def test_labels_tags_and_record(reference: BuildResult, lock_path: Path, env: ImageLockEnv, engine: Engine) -> None:
    image = engine.inspect(reference.image_id)
    assert image is not None
    labels = image["Config"]["Labels"]
    assert labels["io.envbuild.lock.sha256"] == hashlib.sha256(lock_path.read_bytes()).hexdigest()
    for name, commit in env.pins().items():
        assert labels[f"io.envbuild.source.{name}.commit"] == commit
    assert reference.tags == (f"envbuild/imagetest:{reference.lock_sha256[:12]}",)
    assert engine.inspect(reference.tags[0])["Id"] == reference.image_id  # type: ignore[index]

    record = lock_path.parent / "build" / "imagetest"
    assert reference.record_dir == record
    assert sorted(p.name for p in record.iterdir()) == ["build.json", "provenance.intoto.json", "sbom.cdx.json"]
    build = json.loads((record / "build.json").read_text())
    assert build["image_id"] == reference.image_id and build["lock"]["sha256"] == reference.lock_sha256
    inputs = {(i["kind"], i["name"]) for i in build["inputs"]}
    assert {("source", n) for n in env.pins()} | {
        ("package_file", "tinyone"),
        ("package_file", "tinytwo"),
        ("installer", "uv"),
        ("base_image", env.base_name),
    } <= inputs
    assert all(i.get("sha256") or i.get("commit") or i.get("digest") for i in build["inputs"])
    provenance = json.loads((record / "provenance.intoto.json").read_text())
    assert provenance["subject"][0]["digest"]["sha256"] == reference.image_id.split(":")[1]
    deps = {d["name"] for d in provenance["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert set(env.pins()) <= deps
    sbom = json.loads((record / "sbom.cdx.json").read_text())
    assert {"tinyone", "tinytwo", "alpha", "beta", "gamma"} <= {c["name"] for c in sbom["components"]}


@needs_engine
def test_the_image_holds_what_the_lock_pins(reference: BuildResult, engine: Engine) -> None:
    script = "import alpha, beta, tinyone, tinytwo; print(alpha.VERSION, beta.VERSION, tinyone.__version__, tinytwo.__version__)"
    out = engine.run(reference.image_id, ["python3", "-c", script])
    assert (out.exit_code, out.stdout.split()) == (0, ["1.0", "0.1", "1.0", "2.0"])


@needs_engine
def test_moving_one_pin_rebuilds_only_from_that_source_on(
    reference: BuildResult, lock_path: Path, env: ImageLockEnv, work: Path, engine: Engine
) -> None:
    assert rebuilt(lock_path, work, engine).image_id == reference.image_id
    moved = env.repos["gamma"].commit("gamma moves", files={"data/table.csv": "a,b\n1,3\n"})
    path = env.write(work / "locks" / "moved.lock.yaml", env.lock(pins={"gamma": moved}))
    said: list[str] = []
    result = build_image(read_lock(path), options(work), engine=engine, progress=said.append)
    assert result.image_id != reference.image_id
    # The moved commit is fetched once, whole, by the build's verify (for gamma's tree pin), and the export
    # reads it from there; the verify cache never gets it.
    gamma = next(s for s in read_lock(path).lock.sources if s.name == "gamma")
    assert gamma.tree is not None and gamma.commit == moved
    assert [m for m in said if m.startswith("fetch")] == [f"fetching the files of source gamma ({moved[:12]})"]
    assert moved in GitCache(work / "cache" / "git-export").commit_trees(gamma.repo, [moved])
    assert moved not in GitCache(work / "cache" / "git").commit_trees(gamma.repo, [moved])
    # Offline, `lock verify` reads the tree pin from the export cache: the moved pin still verifies.
    offline = VerifyOptions(SourceOptions(cache_dir=work / "cache", offline=True))
    report = verify_lock(read_lock(path).lock, str(path), offline)
    assert [(r.name, r.status) for r in report.results if r.kind == "source"] == [
        ("alpha", "ok"),
        ("beta", "ok"),
        ("gamma", "ok"),
    ]
    assert result.packages is not None and not result.packages.built  # the packages do not depend on a pin
    image = [step for step in result.steps if "] FROM " not in step.instruction]  # the packages image: reused
    # gamma (copy-only, the last source) is made in a stage of its own: that stage and its COPY ran,
    # every other step came from the cache.
    ran = [step.instruction for step in image if not step.cached]
    assert ran and all("envbuild-src-gamma" in instruction for instruction in ran), image
    assert any(i.startswith("[envbuild-src-gamma ") and "source=src/gamma," in i for i in ran), ran
    assert any("COPY --from=envbuild-src-gamma " in i for i in ran), ran
    # Layers: everything below gamma's COPY is byte-identical, gamma's layer and the ones above differ.
    same = sum(a == b for a, b in zip(result.diff_ids, reference.diff_ids))
    assert 0 < same < len(reference.diff_ids)
    assert result.diff_ids[:same] == reference.diff_ids[:same]


@needs_engine
def test_a_pin_moved_before_a_copy_only_source_reruns_its_copy_not_its_stage(
    env: ImageLockEnv, work: Path, engine: Engine
) -> None:
    """beta moves; gamma (copy-only) comes after it: beta's step and gamma's COPY run again, gamma's own
    stage (its files, their times set) comes from the cache: it depends on gamma's files alone."""
    before = rebuilt(env.write(work / "locks" / "now.lock.yaml", env.lock()), work, engine)
    moved = env.repos["beta"].commit("beta moves before gamma", files={"beta/extra.py": "X = 2\n"})
    path = env.write(work / "locks" / "beta-moved.lock.yaml", env.lock(pins={"beta": moved}))
    result = build_image(read_lock(path), options(work), engine=engine)
    steps = {step.instruction: step.cached for step in result.steps if "] FROM " not in step.instruction}
    assert [cached for i, cached in steps.items() if i.startswith("[envbuild-src-gamma ")] == [True], steps
    assert [cached for i, cached in steps.items() if "COPY --from=envbuild-src-gamma " in i] == [False], steps
    assert [cached for i, cached in steps.items() if "source=src/beta," in i] == [False], steps
    assert [cached for i, cached in steps.items() if "source=src/alpha," in i] == [True], steps
    # gamma's layer: the same bytes as before beta moved (below the meta layer, whose manifest names the lock)
    assert result.diff_ids[-2] == before.diff_ids[-2] and result.diff_ids[-3] != before.diff_ids[-3]


# A setup.py that loads its version from a module, as Megatron-LM's loads megatron/core/package_info.py.
_SETUP_READS_A_MODULE = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n',
    "setup.py": "import importlib.util, os\n"
    "from setuptools import setup\n"
    "path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'beta', 'package_info.py')\n"
    "spec = importlib.util.spec_from_file_location('package_info', path)\n"
    "info = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(info)\n"
    "setup(name='beta', version=info.VERSION, packages=['beta'])\n",
}


@needs_engine
def test_a_same_size_edit_of_a_module_the_install_imports_is_what_gets_installed(
    reference: BuildResult, env: ImageLockEnv, work: Path, engine: Engine
) -> None:
    """Python trusts a cached .pyc whose source has the same path, mtime and size: a version bump
    ``0.5`` → ``0.6`` in a module setup.py imports, built after the first on the same engine, must install
    0.6, not what the bytecode of the first build says."""
    script = "import importlib.metadata as m, beta.package_info as i; print(m.version('beta'), i.VERSION)"
    installed = []
    for version in ("0.5", "0.6"):
        files = {**_SETUP_READS_A_MODULE, "beta/package_info.py": f'VERSION = "{version}"\n'}
        moved = env.repos["beta"].commit(f"beta {version}, its version read by setup.py", files=files)
        path = env.write(work / "locks" / f"beta-{version}.lock.yaml", env.lock(pins={"beta": moved}))
        result = build_image(read_lock(path), options(work), engine=engine)
        out = engine.run(result.image_id, ["python3", "-c", script])
        installed.append((out.exit_code, out.stdout.split()))
    assert installed == [(0, ["0.5", "0.5"]), (0, ["0.6", "0.6"])]


class AnotherBuildFirst(Engine):
    """The real engine; the first time the build reads a file out of an image (the packages step's
    report, right after BuildKit made that image), ``other`` runs to its end first: two builds on one
    engine, overlapping where they share an image."""

    def __init__(self, client: docker.DockerClient, other: Callable[[], BuildResult]) -> None:
        super().__init__(client)
        self.other = other
        self.others: list[BuildResult] = []  # what ``other`` returned: run once

    def read_file(self, image: str, path: str, limit: int = 1 << 24) -> bytes:
        if not self.others:
            self.others.append(self.other())
        return super().read_file(image, path, limit)


@needs_engine
def test_two_locks_with_the_same_packages_build_at_once(
    reference: BuildResult, env: ImageLockEnv, work: Path, engine: Engine, docker_client: docker.DockerClient
) -> None:
    """BuildKit's cache gives both packages steps one raw image ID (its config names no lock): the
    build that finishes first must not remove the image the other is still reading."""
    remove_lock_images(docker_client, "samepkga", "samepkgb")  # an interrupted earlier run's: both must build
    first, second = (env.write(work / "locks" / f"{n}.lock.yaml", env.lock(name=n)) for n in ("samepkga", "samepkgb"))
    interleaved = AnotherBuildFirst(docker_client, lambda: build_image(read_lock(first), options(work), engine=engine))
    result = build_image(read_lock(second), options(work), engine=interleaved)
    (other,) = interleaved.others
    assert result.packages is not None and result.packages.built
    assert other.packages is not None and other.packages.built
    assert result.image_id != other.image_id  # two locks (their names differ), each built and checked
    for name in ("samepkga", "samepkgb"):  # each build dropped the tags it held
        assert [engine.inspect(f"envbuild-raw/{name}:{t}") for t in ("packages", "packages-tools")] == [None, None]


class AnotherBuildMeanwhile(Engine):
    """The real engine; the first time the build reads a file out of an image (the packages step's
    report), ``other`` starts beside it (:class:`~tests.lib.claims.Beside`), and the build goes on once
    ``other`` says it waits for it."""

    def __init__(self, client: docker.DockerClient, other: Callable[[Progress], BuildResult]) -> None:
        super().__init__(client)
        self.other = other
        self.beside: Beside[BuildResult] | None = None

    def read_file(self, image: str, path: str, limit: int = 1 << 24) -> bytes:
        if self.beside is None:
            self.beside = Beside(self.other)
            self.beside.waiting(300)
        return super().read_file(image, path, limit)


@needs_engine
def test_two_builds_of_one_lock_from_two_caches_take_turns_on_the_engine(
    env: ImageLockEnv, work: Path, engine: Engine, docker_client: docker.DockerClient
) -> None:
    """Two builds of a lock of one name, its packages moved in one, each from a cache of its own (two CI
    jobs, two branches, one engine): the tags a build reads and tidies are the lock's on the engine, so the
    second waits for the first; beside it, its tidying removed the first's packages image while the first
    was reading it (``no such image``)."""
    remove_lock_images(docker_client, "turns")
    first = env.write(work / "locks" / "turns-1.lock.yaml", env.lock(name="turns"))
    second = env.write(work / "locks" / "turns-2.lock.yaml", env.lock(name="turns", packages=env.lock().packages[:1]))
    meanwhile = AnotherBuildMeanwhile(
        docker_client,
        lambda say: build_image(
            read_lock(second), options(work, cache_dir=work / "cache-turns"), engine=engine, progress=say
        ),
    )
    try:
        result = build_image(read_lock(first), options(work), engine=meanwhile)
    finally:
        if meanwhile.beside is not None:
            meanwhile.beside.thread.join(timeout=600)
    assert meanwhile.beside is not None
    other, said = meanwhile.beside.result(0), meanwhile.beside.said
    waited = next(line for line in said if line.startswith("waiting:"))
    assert waited.startswith(f"waiting: another build of turns on {engine.address} holds ")
    assert said.index(waited) < next(
        i for i, line in enumerate(said) if line.startswith("assembling the build context")
    )
    assert result.packages is not None and other.packages is not None
    assert result.packages.reference != other.packages.reference and result.image_id != other.image_id
    assert engine.inspect(other.image_id) is not None  # the last build's image stays tagged


@needs_engine
def test_a_package_file_with_another_hash_is_refused_before_any_build(env: ImageLockEnv, work: Path) -> None:
    bad = with_file_hash(env.lock(), "tinytwo", "0" * 64)
    path = env.write(work / "locks" / "badhash.lock.yaml", bad)
    with pytest.raises(BuildRefused, match=r"package tinytwo: hash-mismatch"):
        build_image(read_lock(path), options(work), engine=NoEngine())  # type: ignore[arg-type]

    # The index lists the lock's (wrong) hash, so verify passes: the download itself is refused.
    wheel = next(env.index.root.glob("tinytwo-*.whl")).name
    env.index.rehash(wheel, "0" * 64)
    try:
        with pytest.raises(InputFetchError, match=r"package tinytwo 2\.0: .*does not match") as refused:
            build_image(read_lock(path), options(work, cache_dir=work / "fresh-cache"), engine=NoEngine())  # type: ignore[arg-type]
        assert len(refused.value.problems) == 1  # a download failure stays one, with its reason
    finally:
        env.index.hashes.pop(wheel)


@needs_engine
def test_a_source_whose_tree_differs_is_refused_before_any_build(
    env: ImageLockEnv, work: Path, reference: BuildResult
) -> None:
    bad = with_source(env.lock(), "beta", tree="1" * 40)
    path = env.write(work / "locks" / "badtree.lock.yaml", bad)
    with pytest.raises(BuildRefused, match=r"source beta: tree-mismatch"):
        build_image(read_lock(path), options(work), engine=NoEngine())  # type: ignore[arg-type]
    # Past verify (as when `envbuild check` hands a report in), the export refuses it too, and nothing is
    # kept; where the commit's tree is kept already (the reference build's), the lock's pin is compared
    # with what was kept.
    passing = VerifyReport(str(path), (PinResult("source", "beta", "ok"),))
    fresh = options(work, cache_dir=work / "badtree-cache")
    with pytest.raises(ContextError, match=r"source beta: the commit's tree is [0-9a-f]{40}, the lock pins tree 1{40}"):
        build_image(read_lock(path), fresh, engine=NoEngine(), verified=passing)  # type: ignore[arg-type]
    beta = next(s for s in bad.sources if s.name == "beta").commit
    markers = (work / "badtree-cache" / "image" / "trees").glob("*/.envbuild-commit")
    assert beta not in {m.read_text().strip() for m in markers}  # the other sources' kept trees only
    kept = r"source beta: the exported tree of [0-9a-f]{40} is [0-9a-f]{40}, the lock pins tree 1{40}"
    with pytest.raises(ContextError, match=kept):
        build_image(read_lock(path), options(work), engine=NoEngine(), verified=passing)  # type: ignore[arg-type]


@needs_engine
def test_an_in_image_mismatch_fails_the_build_and_leaves_no_tag(
    env: ImageLockEnv, work: Path, engine: Engine, reference: BuildResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = env.write(work / "locks" / "mismatch.lock.yaml", env.lock(name="mismatch"))
    tag = "envbuild-test/mismatch:never"

    def wrong_version(report: str, manifest: dict) -> list[str]:
        packages = [{**p, "version": "9.9"} if p["name"] == "tinyone" else p for p in manifest["packages"]]
        return compare_inimage(report, {**manifest, "packages": packages})

    monkeypatch.setattr("envbuild.image.checked.compare_inimage", wrong_version)  # the build judges with it
    with pytest.raises(EngineError, match=r"package tinyone: 1\.0 installed, the lock pins 9\.9"):
        build_image(read_lock(path), options(work, tags=(tag,)), engine=engine)
    assert engine.inspect(tag) is None
    assert not any(
        entry["lock_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        for entry in read_map(work / "cache").values()
    )


@needs_engine
def test_push_to_the_registry_and_read_the_digest_back(
    reference: BuildResult, lock_path: Path, work: Path, engine: Engine, registry: str
) -> None:
    tag = f"{registry}/envbuild-test/imagetest:{reference.lock_sha256[:12]}"
    lines: list[str] = []
    result = build_image(
        read_lock(lock_path), options(work, tags=(tag,), push=True), engine=engine, progress=lines.append
    )
    assert result.image_id == reference.image_id
    ((pushed_tag, digest),) = result.pushed
    assert pushed_tag == tag and digest.startswith("sha256:")
    # Each layer said once, and a total: the base's layer is in the registry already (pinned there).
    layer_lines = [line for line in lines if line.startswith(f"push {tag}: layer ")]
    assert len(layer_lines) == len(set(reference.diff_ids))
    assert any("already exists" in line or "mounted from" in line for line in layer_lines)
    assert any(line.startswith(f"pushed {tag} ({digest}): {len(layer_lines)} layers, ") for line in lines)
    response = requests.get(
        f"http://{registry}/v2/envbuild-test/imagetest/manifests/{reference.lock_sha256[:12]}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        timeout=10,
    )
    assert response.status_code == 200
    assert response.headers["Docker-Content-Digest"] == digest
    assert response.json()["config"]["digest"] == reference.image_id
    assert engine.distribution(tag)[0] == digest


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from envbuild.cli import main; sys.exit(main())", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).resolve().parents[1],
        preexec_fn=restore_sigint,  # the Ctrl-C tests send SIGINT: not one a shell had us ignore
    )


@needs_engine
def test_an_interrupted_build_leaves_the_caches_usable(
    reference: BuildResult, lock_path: Path, work: Path, engine: Engine
) -> None:
    proc = _cli("image", str(lock_path), "--no-cache", "--cache-dir", str(work / "cache"))
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        seen.append(line)
        if "source=src/beta," in line or time.monotonic() > deadline:  # a source's step has begun
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert any("source=src/beta," in line for line in seen), "".join(seen)
    # What the killed CLI leaves is in the cache, one per lock (its context, its --iidfile's directory,
    # cleared by the next build of the lock that builds), not in /tmp for good.
    assert sorted(p.name for p in (work / "cache" / "image" / "sync" / "imagetest").iterdir()) == ["image", "image.cli"]
    result = build_image(read_lock(lock_path), options(work), engine=engine)
    assert result.image_id == reference.image_id
    leftovers = [p.name for p in (work / "cache" / "image" / "work").iterdir()]
    assert leftovers == []


@needs_engine
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_build_removes_its_scratch_and_the_packages_container(
    reference: BuildResult, lock_path: Path, work: Path, engine: Engine, signal_number: int
) -> None:
    """Interrupted while the packages are installed: the process removes its scratch directory and the
    packages container itself, and exits 130."""
    cache = work / f"interrupted-{signal_number}"
    proc = _cli("image", str(lock_path), "--no-cache", "--cache-dir", str(cache))
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        seen.append(line)
        if "packages: installing" in line or time.monotonic() > deadline:
            break
    scratch = list((cache / "image" / "work").glob("build-*"))
    assert scratch, "".join(seen)  # the build was under way, with its scratch directory
    os.kill(proc.pid, signal_number)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + err
    assert "envbuild: interrupted" in err and "Traceback" not in err
    assert list((cache / "image" / "work").iterdir()) == []
    assert engine.containers({"io.envbuild.lock.name": "imagetest", "io.envbuild.role": "packages"}) == []
    # A step the engine was finishing as the client went away may land after the process tidied up; the
    # next build of the lock removes it.
    assert (
        build_image(read_lock(lock_path), options(work, cache_dir=cache), engine=engine).image_id == reference.image_id
    )
    assert engine.images(filters={"dangling": True, "label": "io.envbuild.lock.name=imagetest"}) == []


@needs_engine
def test_cli_json_dry_run_and_no_engine(
    reference: BuildResult,
    lock_path: Path,
    work: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = ["--cache-dir", str(work / "cache")]
    assert main(["-q", "image", str(lock_path), "--json", *cache]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "image_id": reference.image_id,
        "tags": list(reference.tags),
        "lock_sha256": reference.lock_sha256,
        "record": str(reference.record_dir),
        "pushed": [],  # no --push
    }

    assert main(["-q", "image", str(lock_path), "--dry-run", *cache]) == 0
    dockerfile = capsys.readouterr().out
    expected = dry_run(read_lock(lock_path), options(work)).dockerfile
    assert dockerfile == expected and "@sha256:" in dockerfile

    monkeypatch.setenv("DOCKER_HOST", f"unix://{work}/no-such-engine.sock")
    assert main(["-q", "image", str(lock_path), *cache]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no container engine answers at unix://" in err[0] and "Traceback" not in err[0]


def test_export_tree_writes_the_exact_tree(served: Served, tmp_path: Path) -> None:
    """Attributes that would change archived files (export-subst, export-ignore, eol) are neutralised;
    modes and symlinks survive; a second export needs no network; --offline without the files fails."""
    from envbuild.git.treeexport import ExportError, TreeExporter, export_tree
    from envbuild.lock import Source
    from tests.lib.gitrepos import make_repo

    repo = make_repo(served.base / "exact")
    commit = repo.commit(
        "tricky",
        files={
            ".gitattributes": "subst.txt export-subst\nignored.txt export-ignore\n*.txt text eol=crlf\n",
            "subst.txt": "$Format:%H$\n",
            "ignored.txt": "still here\n",
            "tool.sh": "#!/bin/sh\n",
        },
    )
    (repo.path / "tool.sh").chmod(0o755)
    (repo.path / "link").symlink_to("subst.txt")
    commit = repo.commit("modes", files={})
    source = Source(
        name="exact",
        repo=served.url("exact", "daemon-filter"),
        ref="main",
        ref_type="branch",
        commit=commit,
        tree=repo.tree(commit),
    )
    exporter = TreeExporter(tmp_path / "cache")
    dest = tmp_path / "out"
    dest.mkdir()
    assert export_tree(source, dest, exporter) == repo.tree(commit)
    assert (dest / "subst.txt").read_bytes() == b"$Format:%H$\n"
    assert (dest / "ignored.txt").exists() and os.access(dest / "tool.sh", os.X_OK)
    assert os.readlink(dest / "link") == "subst.txt"

    again = tmp_path / "again"  # from the cache alone: offline refuses to fetch
    again.mkdir()
    assert export_tree(source, again, TreeExporter(tmp_path / "cache", offline=True)) == repo.tree(commit)
    with pytest.raises(ExportError, match=r"source exact: the files of [0-9a-f]{40} are not in the cache"):
        export_tree(source, tmp_path, TreeExporter(tmp_path / "empty", offline=True))


@needs_engine
def test_a_kept_tree_changed_on_disk_fails_the_in_image_check_and_is_exported_again(
    env: ImageLockEnv, work: Path, engine: Engine, reference: BuildResult
) -> None:
    """Builds read each source's tree from the tree store (exported once per commit); the in-image check
    recomputes every tree inside the image, so a kept tree changed on disk cannot reach a tagged image:
    the build fails, drops the build's kept trees, and the next one exports them again."""
    lock = env.lock(name="keptedit")
    path = env.write(work / "locks" / "keptedit.lock.yaml", lock)
    plan = plan_context(lock, lock_sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    alpha = next(s for s in plan.sources if s.name == "alpha")
    # Kept by an earlier build of the commit, as the reference build keeps it; made here with the real
    # export, since a test before this one may have dropped it (a failed in-image check drops the
    # build's kept trees).
    store = TreeStore(work / "cache")
    kept = store.kept(alpha, exporter_for(SourceOptions(work / "cache"))).path
    assert kept == store.root / tree_key(alpha)
    assert (kept / ".envbuild-commit").read_text().strip() == alpha.commit
    edited = next(p for p in sorted(kept.rglob("*.py")) if p.is_file())
    original = edited.read_bytes()
    edited.write_bytes(original + b"# changed on disk\n")
    with pytest.raises(EngineError, match=r"source alpha"):
        build_image(read_lock(path), options(work), engine=engine)
    assert not kept.exists()  # dropped: the next build exports the commit again
    result = build_image(read_lock(path), options(work), engine=engine)
    assert (kept / edited.relative_to(kept)).read_bytes() == original
    assert (
        engine.run(result.image_id, ["cat", f"{alpha.image_path}/{edited.relative_to(kept)}"]).stdout.encode()
        == original
    )


@needs_engine
def test_a_lock_without_packages_builds_one_image_id_with_its_parents_kept(
    env: ImageLockEnv, work: Path, engine: Engine, reference: BuildResult
) -> None:
    """No packages image: the tools layer is in the image's own Dockerfile, and no layer below the meta
    layer makes ``/opt/envbuild/meta``; the files put into the check's container must not move the
    parents the meta layer records (they are read from another container of the raw image)."""
    path = env.write(
        work / "locks" / "nopackages.lock.yaml",
        with_source(env.lock(name="nopackages", packages=()), "beta", build_requires=None),
    )
    first = build_image(read_lock(path), options(work, no_cache=True), engine=engine)
    second = build_image(read_lock(path), options(work, no_cache=True), engine=engine)
    assert first.packages is None and first.image_id == second.image_id
    headers = engine.entry_headers(second.image_id, ["/opt", "/opt/envbuild"])
    below = engine.entry_headers(second.raw_image_id, ["/opt", "/opt/envbuild"])
    for name in ("/opt", "/opt/envbuild"):
        got, raw = headers[name], below[name]
        assert (got.mode, got.uid, got.gid, got.mtime) == (raw.mode, raw.uid, raw.gid, raw.mtime), name


@needs_engine
def test_a_lock_without_an_installer_installs_with_the_base_pip_and_reproduces(
    env: ImageLockEnv, work: Path, engine: Engine, reference: BuildResult
) -> None:
    """A lock written before ``installer`` (or whose index serves no uv): the base's pip installs the same
    package files, the same image ID on every ``--no-cache`` build, and what it installed is the lock's."""
    path = env.write(work / "locks" / "pipinstalled.lock.yaml", env.lock(name="pipinstalled", installer=False))
    first = build_image(read_lock(path), options(work, no_cache=True), engine=engine)
    second = build_image(read_lock(path), options(work, no_cache=True), engine=engine)
    assert first.image_id == second.image_id and first.packages is not None
    assert engine.history(first.packages.reference)[0]["CreatedBy"] == (
        "envbuild: install the lock's 2 package files (pip, no index)"
    )
    # The files pip and uv install are the wheels' own: only their installer metadata differs.
    script = "import tinyone, tinytwo; print(tinyone.__version__, tinytwo.__version__)"
    assert engine.run(first.image_id, ["python3", "-c", script]).stdout.split() == ["1.0", "2.0"]
    listing = "cd /usr/local/lib/python3.11/dist-packages && ls tinyone-1.0.dist-info"
    assert "INSTALLER" in engine.run(first.image_id, ["sh", "-c", listing]).stdout.split()
    assert "INSTALLER" not in engine.run(reference.image_id, ["sh", "-c", listing]).stdout.split()
