"""`envbuild image` and its stages at the edges no other test reached: the dry run's JSON, a source whose
tree holds the name envbuild writes its commit under, an image the engine lost while a build read it, a
packages image that is not the layers the build made, a save the engine cannot finish, a packages image of
someone else's under envbuild's tag, a killed older build's container, and a build that met a lost layer
while another build holds the engine.

The engine is the real one at ``DOCKER_HOST``: each test works under a lock name of its own and removes by ID
what it made. The wait for the engine's claim is real (a child process holds it); the engine it would empty
BuildKit's cache of is a stand-in that counts the calls (emptying is tests/test_engine_buildkit.py's, on the
engine, alone)."""

from __future__ import annotations

import hashlib
import json
import textwrap
import time
from pathlib import Path

import docker
import docker.errors
import pytest

from envbuild.cli import main
from envbuild.engine.buildkit import LostLayer
from envbuild.engine.claim import EngineClaim
from envbuild.engine.client import Engine
from envbuild.errors import EngineError
from envbuild.image.assemble import BuildContext
from envbuild.image.cache import retention
from envbuild.image.cache.retention import empty_build_cache, keep_only
from envbuild.image.normalise import load_packages_image, normalise, save_added_layers
from envbuild.image.packages_image import ensure_packages_image
from envbuild.image.plan import DISTRO_REMOVED_LABEL, LOCK_NAME_LABEL, ROLE_LABEL, plan_context
from envbuild.image.render import packages_reference, raw_packages_reference
from envbuild.lock import Lock, parse_lock
from tests.lib.baseimage import BaseImage
from tests.lib.claims import Beside, held_elsewhere
from tests.lib.gitrepos import Served

DIGEST = "sha256:" + "ab" * 32
WHEEL_SHA = "e" * 64
GONE = "sha256:" + "0" * 64  # an image ID no engine holds


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def engine(docker_client: docker.DockerClient) -> Engine:
    return Engine(docker_client)


# --- the dry run -----------------------------------------------------------------------------------------


def test_the_dry_run_as_json_is_the_plan_its_dockerfile_and_what_a_build_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`image --dry-run --json`: one object on stdout, the plan (the base as the lock has it, each source and
    package file), the Dockerfile the plain dry run prints, and every reason a build refuses the lock (exit 1,
    as the plain one); no engine asked, no cache made."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # nothing may talk to an engine
    lock = tmp_path / "dry.lock.yaml"
    lock.write_text(
        textwrap.dedent(f"""\
        version: 2
        name: dryjson
        platform: {{os: linux, arch: x86_64, python: "3.11"}}
        base_image: {{name: "example.org/base:1"}}
        source_date_epoch: 1700000000
        sources:
          - {{name: data, repo: "https://example.org/data.git", ref: v1, ref_type: tag, commit: "{"1a" * 20}",
              install: {{mode: none}}}}
        packages:
          - {{name: tinyone, version: "1.0", files: [{{filename: tinyone-1.0-py3-none-any.whl, sha256: "{WHEEL_SHA}"}}]}}
          - {{name: tinytwo, version: "2.0"}}
        """)
    )
    cache = tmp_path / "cache"

    code, out, err = run(capsys, "image", str(lock), "--dry-run", "--json", "--offline", "--cache-dir", str(cache))
    plain_code, dockerfile, _ = run(capsys, "image", str(lock), "--dry-run", "--offline", "--cache-dir", str(cache))

    assert code == plain_code == 1
    shown = json.loads(out)
    update = f"envbuild lock update {lock}"
    assert shown == {
        "lock_name": "dryjson",
        "lock_sha256": shown["lock_sha256"],
        "epoch": 1700000000,
        "base_image": {"name": "example.org/base:1", "digest": None},
        "python": "3.11",
        "cann": None,
        "arch": "x86_64",
        "sources": [
            {
                "name": "data",
                "repo": "https://example.org/data.git",
                "ref": "v1",
                "ref_type": "tag",
                "commit": "1a" * 20,
                "tree": None,
                "install": "none",
                "env": {},
                "path": "/opt/envbuild/src/data",
                "distribution": "data",
                "waive": [],
                "skip_imports": [],
            }
        ],
        "files": [
            {"package": "tinyone", "version": "1.0", "filename": "tinyone-1.0-py3-none-any.whl", "sha256": WHEEL_SHA}
        ],
        "dockerfile": dockerfile,
        "refusals": [
            f"tinytwo 2.0 has no files in the lock (run `{update} --packages --cache-dir {cache}` where its index is "
            "reachable); left out below",
            f"base image example.org/base:1 is not pinned by digest (`{update} --base --cache-dir {cache}` pins it)",
        ],
    }
    assert shown["lock_sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert err.splitlines() == [
        *(f"envbuild: warning: {refusal}: a build refuses it" for refusal in shown["refusals"]),
        f"envbuild: dry run: a build refuses {lock}: 2 reason(s) above",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dry.lock.yaml"]


# --- the build context ---------------------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.gitdaemon
def test_a_tree_holding_the_commit_marker_is_refused_before_anything_is_built(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A commit whose tree holds ``.envbuild-commit`` (the file envbuild writes the commit into, in every
    source's directory of the image) would have its own file replaced by envbuild's: the build stops at the
    context, naming the source and the file, exit 1, before the engine is asked for anything but a ping: no
    scratch left, no record written."""
    repo = served.repo("image-gaps/marked")
    head = repo.commit("a tree copied out of an image", files={".envbuild-commit": "0" * 40 + "\n", "README": "x\n"})
    url = served.url("image-gaps/marked", "daemon-nofilter")
    lock = tmp_path / "marked.lock.yaml"
    lock.write_text(
        "version: 2\nname: gapsmarked\n"
        "platform: {os: linux, arch: x86_64, python: '3.11'}\n"
        f"base_image: {{name: 'example.org/base:1', digest: '{DIGEST}'}}\nsource_date_epoch: 1700000000\n"
        f"sources:\n  - {{name: data, repo: '{url}', ref: main, ref_type: branch, commit: {head}, "
        "install: {mode: none}}\n"
    )
    cache = tmp_path / "cache"

    code, out, err = run(capsys, "image", str(lock), "--cache-dir", str(cache), "-q")

    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "envbuild: error: source data: the tree holds .envbuild-commit, a name envbuild reserves"
    ]
    assert list((cache / "image" / "work").iterdir()) == []
    assert not (tmp_path / "build").exists()  # no record


# --- normalising and saving ------------------------------------------------------------------------------


@pytest.mark.docker
def test_an_image_the_engine_lost_while_the_build_ran_is_said_so(engine: Engine, base_image: BaseImage) -> None:
    with pytest.raises(EngineError) as raised:
        normalise(engine, GONE, base_image.tag, 1700000000, lambda _: None)
    assert str(raised.value) == f"the engine has no {GONE} any more (removed while the build ran?); build again"


@pytest.mark.docker
def test_a_packages_step_image_of_other_layers_is_refused_naming_its_tag(
    engine: Engine, docker_client: docker.DockerClient, base_image: BaseImage
) -> None:
    """The packages step's image must be the base, the tools layer and the install's: one that is the base
    alone (no layer added) is refused, naming the tag the build held it under, whole, and how many layers it
    has on the base; nothing is loaded or tagged."""
    plan = plan_context(_lock("gapslayers"), lock_sha256="cd" * 32)
    raw, tag = raw_packages_reference(plan), packages_reference(plan)
    repository, _, name = raw.rpartition(":")
    assert docker_client.api.tag(base_image.tag, repository, name)
    try:
        with pytest.raises(EngineError) as raised:
            load_packages_image(
                engine,
                base_image.tag,
                raw,
                plan.lock_name,
                1,
                {"remove": [], "replaced": [], "directories": {}},
                tag,
                lambda _: None,
                tools_layers=("the tools layer",),
            )
        assert engine.inspect(tag) is None
    finally:
        docker_client.api.remove_image(raw)
    assert str(raised.value) == (
        f"the packages image envbuild-raw/gapslayers:packages is not 2 layer(s) on {base_image.tag}: 0"
    )


@pytest.mark.docker
def test_a_save_the_engine_cannot_make_leaves_no_archive(engine: Engine, tmp_path: Path) -> None:
    """`envbuild check` saves an image to explain a difference; one gone from the engine meanwhile fails in
    one line, and neither the archive begun nor the spool beside it is left."""
    dest = tmp_path / "explain" / "second.tar"
    with pytest.raises(EngineError) as raised:
        save_added_layers(engine, GONE, dest, set(), lambda _: None)
    message = str(raised.value)  # the engine's own words after envbuild's (docker 20.10: its image store's path)
    assert message.startswith(f"save {GONE}: ") and message.endswith(": no such file or directory"), message
    assert "\n" not in message
    assert list(dest.parent.iterdir()) == []


# --- the packages image ------------------------------------------------------------------------------------


@pytest.mark.docker
def test_a_packages_image_under_envbuilds_tag_with_a_spoiled_label_is_not_reused(
    engine: Engine, docker_client: docker.DockerClient, base_image: BaseImage, tmp_path: Path
) -> None:
    """The packages image is reused by its tag, and what it replaced of the base read from its label: an
    image under that tag whose label is not JSON (someone else's, tagged by hand) fails the build in one
    line naming the label, rather than being taken as the lock's packages."""
    plan = plan_context(_lock("gapslabel"), lock_sha256="cd" * 32)
    container = docker_client.containers.create(base_image.tag, ["true"], network_mode="none")
    try:
        image = container.commit(changes=[f"LABEL {DISTRO_REMOVED_LABEL}=not-json {LOCK_NAME_LABEL}=gapslabel"])
    finally:
        container.remove(force=True)
    repository, _, name = packages_reference(plan).rpartition(":")
    assert docker_client.api.tag(image.id, repository, name)
    context = BuildContext(tmp_path / "context", plan, "", {}, ())
    said: list[str] = []
    try:
        with pytest.raises(EngineError) as raised:
            ensure_packages_image(engine, context, no_cache=False, cache_dir=tmp_path / "cache", say=said.append)
    finally:
        docker_client.api.remove_image(str(image.id), force=True)
    assert str(raised.value) == f"the packages image's label {DISTRO_REMOVED_LABEL} is not JSON"
    assert said == [
        f"packages: {packages_reference(plan)} is the base with these package files installed already; reused"
    ]


# --- tidying the engine ------------------------------------------------------------------------------------


@pytest.mark.docker
def test_the_packages_container_an_older_build_left_goes_and_a_job_of_the_lock_stays(
    engine: Engine, docker_client: docker.DockerClient, base_image: BaseImage
) -> None:
    """envbuild before BuildKit installed the packages in a container (labelled with its role); a build of
    it that was killed left the container running. The next build's tidying removes it, at once, and leaves a
    container of the same lock's image that a user runs (the lock's name label, no role)."""
    lock_name = "gapsretention"
    started = [
        docker_client.containers.run(
            base_image.tag, ["sleep", "300"], labels=labels, detach=True, network_mode="none"
        )  # sleep as PID 1: it ignores SIGTERM, so a stop would wait out its timeout
        for labels in ({LOCK_NAME_LABEL: lock_name, ROLE_LABEL: "packages"}, {LOCK_NAME_LABEL: lock_name})
    ]
    left, job = (str(c.id) for c in started)
    try:
        before = time.monotonic()
        keep_only(engine, lock_name, set(), lambda _: None)
        took = time.monotonic() - before
        assert [c.id for c in engine.containers({LOCK_NAME_LABEL: lock_name})] == [job]
        still = engine.container(job)
        assert still is not None and still.state == "running"
        # killed at once: a stop would wait out remove_container's 30 s, which sleep as PID 1 never ends sooner
        assert took < 25, f"{took:.1f} s: the left container was stopped, not killed"
    finally:
        for found in started:
            try:
                found.remove(force=True)
            except docker.errors.NotFound:
                pass
    assert engine.container(left) is None


class _Emptying:
    """The engine empty_build_cache asks, once it holds the engine alone: the calls, and what it reclaims."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    def prune_build_cache(self, keep: int, *, everything: bool = False) -> int:
        self.calls.append((keep, everything))
        return 5_000_000


@pytest.fixture
def lost() -> LostLayer:
    return LostLayer(
        "failed to prepare abc: open /var/lib/docker/overlay2/abc/committed: no such file or directory\nmore"
    )


@pytest.fixture
def claim(tmp_path: Path) -> EngineClaim:
    """The claim on an engine of this test's own: a directory of claims in ``tmp_path``."""
    (tmp_path / "claims").mkdir()
    return EngineClaim("unix:///gaps/engine.sock", tmp_path / "claims")


def test_a_lost_layer_while_another_build_holds_the_engine_gives_up_after_the_wait(
    lost: LostLayer, claim: EngineClaim, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache is emptied only alone; while another build holds the engine for longer than the wait, the
    build says once that it waits, then fails with the fault it met, having emptied nothing."""
    monkeypatch.setattr(retention, "LOST_LAYER_WAIT", 1.0)
    engine, said = _Emptying(), []
    with held_elsewhere(claim):
        before = time.monotonic()
        with pytest.raises(LostLayer) as raised:
            empty_build_cache(engine, claim, lost, said.append)  # type: ignore[arg-type]
        waited = time.monotonic() - before
    assert raised.value is lost and engine.calls == []
    assert 1.0 <= waited < 5
    assert said == [
        "warning: failed to prepare abc: open /var/lib/docker/overlay2/abc/committed: no such file or directory",
        "waiting for the engine's other builds to end before emptying BuildKit's cache",
    ]


def test_a_lost_layer_empties_the_cache_once_the_other_build_ends(
    lost: LostLayer, claim: EngineClaim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "LOST_LAYER_WAIT", 60.0)
    engine = _Emptying()
    with held_elsewhere(claim):
        emptying = Beside(lambda say: empty_build_cache(engine, claim, lost, say))  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while len(emptying.said) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.6)  # a turn of its wait more: still waiting, nothing emptied beside the other build
        assert engine.calls == [] and emptying.thread.is_alive()
    emptying.result(10)
    assert engine.calls == [(0, True)]
    assert emptying.said == [
        "warning: failed to prepare abc: open /var/lib/docker/overlay2/abc/committed: no such file or directory",
        "waiting for the engine's other builds to end before emptying BuildKit's cache",
        "emptied BuildKit's cache (5 MB) of the step whose layer was gone; building again",
    ]


def _lock(name: str) -> Lock:
    return parse_lock(
        textwrap.dedent(f"""\
        version: 2
        name: {name}
        platform: {{os: linux, arch: x86_64, python: "3.11"}}
        base_image: {{name: "example.org/base:1", digest: "{DIGEST}"}}
        source_date_epoch: 1700000000
        sources: []
        packages:
          - {{name: tinyone, version: "1.0", files: [{{filename: tinyone-1.0-py3-none-any.whl, sha256: "{WHEEL_SHA}"}}]}}
        """),
        f"{name}.lock.yaml",
    )
