"""Where a new user starts: an empty cache and an engine that holds none of the lock's images.

Every test here starts each command from a cache directory that nothing has touched, on an engine of
its own (a fresh dockerd: no base image, no layer cache), through the public command lines only:

    lock update → lock verify → image → check → envrun grpo-glm5 --backend docker

with one source of each ref shape: a branch at its head, a branch that moved on (``behind``), a
lightweight tag and an annotated tag. ``image`` used to fail right after a passing ``verify`` for a pin
at a branch head or a tag, because verify settles those from the ref listing alone and fetched nothing
the build needed; every earlier test warmed the cache first.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from envbuild.cli import main as envbuild
from envbuild.config import SourceOptions
from envbuild.fetch import exporter_for, fetch_inputs
from envbuild.git.treeexport import export_tree
from envbuild.lock import Lock, Package, PackageFile, Source, read_lock, write_lock
from envbuild.lock.io import LockFile
from envbuild.lock.model import BaseImage, Install, Platform, Waiver
from envbuild.verify.pins import VerifyOptions, verify_lock
from envrun.cli.main import main as envrun
from envrun.verlconfig import verl_config_dir, verl_wheel_from_lock
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint
from tests.lib.engines import ExtraEngine
from tests.lib.gitrepos import Repo, Served
from tests.lib.pyindex import PyIndex
from tests.lib.services import PushedImage
from tests.lib.tinyrun import FAKE_TRAINER, write_parquet_like

REAL_LOCK = Path(__file__).resolve().parents[1] / "lockfiles" / "glm5_2-ascend.lock.yaml"
SHAPES = ("head", "behind", "light", "annotated")


def _project(name: str) -> dict[str, str]:
    return {
        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "1.0"\n\n[tool.setuptools]\npackages = ["{name}"]\n',
        f"{name}/__init__.py": "VERSION = '1.0'\n",
    }


@dataclass
class Upstreams:
    """One repository per ref shape, served by ``git daemon``; ``ref(shape)`` is what the lock names."""

    repos: dict[str, Repo]
    urls: dict[str, str]

    REFS = {
        "head": ("main", "branch"),
        "behind": ("main", "branch"),
        "light": ("v1", "tag"),
        "annotated": ("v2", "tag"),
    }

    def source(self, shape: str, commit: str) -> Source:
        ref, kind = self.REFS[shape]
        install = Install(mode="editable") if shape == "head" else Install(mode="none")
        # What head builds with comes from the test base image (Debian's python3-setuptools), not the lock.
        waive = (Waiver("setuptools", "the base image's python3-setuptools builds it"),) if shape == "head" else ()
        return Source(
            name=shape, repo=self.urls[shape], ref=ref, ref_type=kind, commit=commit, install=install, waive=waive
        )  # type: ignore[arg-type]


def make_upstreams(served: Served, prefix: str, transport: str = "daemon-filter") -> Upstreams:
    repos = {shape: served.repo(f"{prefix}-{shape}") for shape in SHAPES}
    repos["head"].commit("a project", files=_project("headpkg"))
    # A file name that is not UTF-8 (Latin-1): upstream trees may hold one; the image must hold it too.
    repos["behind"].commit("data", files={"data.csv": "a,b\n1,2\n", os.fsdecode(b"caf\xe9.csv"): "x\n"})
    repos["light"].commit("v1", files={"README": "light\n"})
    repos["light"].tag("v1", "HEAD")
    repos["annotated"].commit("the stand-in trainer", files={"fake_trainer.py": FAKE_TRAINER.read_text()})
    repos["annotated"].tag("v2", "HEAD", annotated=True)
    repos["light"].commit("after the tag")  # a tag is not the branch head
    return Upstreams(repos, {shape: served.url(f"{prefix}-{shape}", transport) for shape in SHAPES})


# --- each ref shape, from an empty cache, up to the build's inputs (git only, fast) -------------------


@pytest.mark.gitdaemon
@pytest.mark.parametrize("transport", ["daemon-filter", "daemon-nofilter"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_passing_verify_on_an_empty_cache_leaves_a_buildable_source(
    served: Served, tmp_path: Path, shape: str, transport: str
) -> None:
    up = make_upstreams(served, f"shape-{shape}-{transport}", transport)
    repo = up.repos[shape]
    ref, kind = up.REFS[shape]
    commit = repo.rev(f"{ref}^{{commit}}")
    if shape == "behind":
        repo.commit("moves the branch on")
    lock = Lock(version=1, name="shape", sources=(up.source(shape, commit),))
    options = VerifyOptions(SourceOptions(cache_dir=tmp_path / "cache"))

    report = verify_lock(lock, "shape.lock.yaml", options)
    assert [r.status for r in report.results if r.kind == "source"] == ["behind" if shape == "behind" else "ok"]

    inputs = fetch_inputs(LockFile(Path("shape.lock.yaml"), lock, "0" * 64), options.source)
    date = int(subprocess.run(["git", "-C", str(repo.path), "log", "-1", "--format=%ct", commit],
                              capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert inputs.epoch == date
    assert [(i.kind, i.name, i.fetched) for i in inputs.inputs] == [("source", shape, True)]
    out = tmp_path / "tree"
    out.mkdir()
    assert export_tree(lock.sources[0], out, exporter_for(options.source)) == repo.tree(commit)


# --- the whole path, as a new user walks it ----------------------------------------------------------


@pytest.fixture(scope="module")
def upstreams(served: Served) -> Upstreams:
    return make_upstreams(served, "fresh")


@pytest.fixture(scope="module")
def verl_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """verl's real config (the wheel the real lock pins, from PyPI) to validate grpo-glm5's overrides."""
    lock = read_lock(REAL_LOCK).lock
    return verl_config_dir(verl_wheel_from_lock(lock, str(REAL_LOCK)), tmp_path_factory.mktemp("verl"))


def write_initial_lock(path: Path, up: Upstreams, index: PyIndex, base: PushedImage, arch: str) -> None:
    """A lock as someone starts one: refs named, commits stale (each repository's first commit)."""
    first = {shape: up.repos[shape].rev("HEAD~1") if shape == "light" else up.repos[shape].rev("HEAD")
             for shape in SHAPES}  # fmt: skip
    wheel = next(index.root.glob("tinyone-*.whl")).name
    lock = Lock(
        version=1,
        name="fresh",
        sources=tuple(up.source(shape, first[shape]) for shape in SHAPES),
        platform=Platform(os="linux", arch=arch, python="3.11", cann="9.1.0"),  # type: ignore[arg-type]
        base_image=BaseImage(name=f"{base.repository}:{base.tag}", digest=base.digest),
        index=index.url,
        requirements=("tinyone==1.0",),
        packages=(Package(name="tinyone", version="1.0", files=(PackageFile(wheel, index.sha256(wheel)),)),),
    )
    write_lock(path, lock)


def run_json(capsys: pytest.CaptureFixture[str], entry: object, argv: list[str], status: int = 0) -> dict:
    code = entry(argv)  # type: ignore[operator]
    captured = capsys.readouterr()
    assert code == status, f"{argv[:2]} exited {code}: {captured.err[-3000:]}"
    return json.loads(captured.out)


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.gitdaemon
@pytest.mark.network
@pytest.mark.slow
def test_a_new_user_goes_from_lock_update_to_a_run(
    upstreams: Upstreams,
    tiny_index: PyIndex,
    pushed_base_image: PushedImage,
    fresh_engine: ExtraEngine,
    verl_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", fresh_engine.host)
    with closing(fresh_engine.client()) as client:
        assert client.images.list(all=True) == []  # nothing of the lock's: not even its base image
    arch = docker.from_env(version="auto").info()["Architecture"]
    lock = tmp_path / "fresh.lock.yaml"
    write_initial_lock(lock, upstreams, tiny_index, pushed_base_image, "aarch64" if arch == "aarch64" else "x86_64")
    names = list(SHAPES)

    # lock update, on an empty cache, moves every pin to its ref.
    update = run_json(
        capsys, envbuild, ["lock", "update", str(lock), *names, "--json", "--cache-dir", str(tmp_path / "c1")]
    )
    assert {c["name"] for c in update["changes"]} == {"head", "behind", "light", "annotated"}
    pinned = {s.name: s.commit for s in read_lock(lock).lock.sources}
    assert pinned["light"] == upstreams.repos["light"].rev("v1^{commit}")
    assert pinned["annotated"] == upstreams.repos["annotated"].rev("v2^{commit}")
    upstreams.repos["behind"].commit("upstream moves on after the lock was made")

    # lock verify, on another empty cache: the fast path settles head and tags from the listing alone.
    verified = run_json(capsys, envbuild, ["lock", "verify", str(lock), "--json", "--cache-dir", str(tmp_path / "c2")])
    statuses = {r["name"]: r["status"] for r in verified["results"] if r["kind"] == "source"}
    assert statuses == {"head": "ok", "behind": "behind", "light": "ok", "annotated": "ok"}

    # image, with that cache, on an engine without the base image: fetches what the build needs itself.
    built = run_json(capsys, envbuild, ["image", str(lock), "--json", "--cache-dir", str(tmp_path / "c2")])
    assert built["image_id"].startswith("sha256:")

    # check, on yet another empty cache: JSON, three report files, one history line; it reproduces.
    report, history = tmp_path / "report", tmp_path / "history.jsonl"
    checked = run_json(
        capsys,
        envbuild,
        [
            "check",
            str(lock),
            "--json",
            "--report",
            str(report),
            "--history",
            str(history),
            "--cache-dir",
            str(tmp_path / "c3"),
        ],
    )
    assert checked["ok"] and checked["reproducible"], checked
    assert checked["image_ids"] == [built["image_id"], built["image_id"]]
    assert sorted(p.name for p in report.iterdir()) == ["check.html", "check.json", "check.md"]
    assert len(history.read_text().splitlines()) == 1

    # envrun grpo-glm5 --backend docker, the stand-in trainer from the image (the annotated-tag source).
    tag = built["tags"][0]
    model, data = tmp_path / "model", write_parquet_like(tmp_path / "train.parquet")
    write_checkpoint(model, CheckpointSpec(include_mtp=False))
    expect = model / "expect.json"  # the model directory is mounted into the container at the same path
    run_args = [
        "grpo-glm5", "--lock", str(lock), "--image", tag, "--backend", "docker", "--verl-config", str(verl_config),
        "--model", str(model), "--data", str(data), "--nnodes", "1", "--npus-per-node", "1", "--skip-check", "npus",
        "--skip-check", "job-probe",  # the tiny image holds a stand-in trainer, not verl (tests/test_probe.py has verl)
        "--entry-point", "python3 /opt/envbuild/src/annotated/fake_trainer.py", "--env", f"FAKE_TRAINER_EXPECT={expect}",
    ]  # fmt: skip
    run_dir = tmp_path / "run"  # the job's outputs are plain paths under it, so the plan names the same ones
    plan = run_json(capsys, envrun, [*run_args, "--run-dir", str(run_dir), "--dry-run", "--json"])
    preflight = {c["name"]: c["status"] for c in plan["preflight"]}
    assert preflight["image-lock-label"] == "ok"
    assert preflight["job-probe"] == "skip"  # skipped by name, and the plan says so
    expect.write_text(json.dumps({"args": plan["argv"][2:], "env": plan["env"]}))
    status = envrun([*run_args, "--run-dir", str(run_dir)])
    said = capsys.readouterr().err
    assert "fake trainer: ok" in (run_dir / "output.log").read_text(), said[-3000:]
    # The job ran and exited 0, but the recipe's lenient save went unaudited (only the skipped probe says
    # where verl writes its exports): the run is not passed.
    record = json.loads((run_dir / "status.json").read_text())
    exports = json.loads((run_dir / "exports.json").read_text())
    assert (status, record["status"], record["exit_code"], exports["ok"]) == (1, "failed", 0, False), said[-3000:]
    assert "no export layout (the job probe did not run; job-probe: skipped by --skip-check)" in said

    # --offline on an empty cache refuses, naming the command that fixes it; that command does.
    offline = ["image", str(lock), "--offline", "--json", "--cache-dir", str(tmp_path / "c4")]
    assert envbuild(offline) == 1
    refusal = capsys.readouterr().err
    assert len(refusal.strip().splitlines()) == 1
    advice = re.search(r"run `(envbuild lock fetch [^`]+)`", refusal)
    assert advice is not None
    assert envbuild(shlex.split(advice.group(1))[1:]) == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    again = run_json(capsys, envbuild, offline)
    assert again["image_id"] == built["image_id"]
