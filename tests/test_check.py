"""`envbuild check` end to end: real upstreams that move, a real engine and registry, the history file.

Scenarios of the nightly check: upstream moves on (drift reported, still ok), a tag moved upstream
(fails), the pinned commit dropped by a force-push and gc upstream (fails), and a source whose build
writes the build time into a file (not reproducible; the report names that file)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import docker
import pytest

from envbuild.check.history import HistoryEntry, append_history, read_history
from envbuild.check.run import CheckOptions, previous_reference, run_check
from envbuild.cli import main
from envbuild.config import SourceOptions
from envbuild.engine.claim import EngineClaim
from envbuild.engine.client import Engine
from envbuild.errors import EngineError
from envbuild.lock.io import read_lock
from envbuild.verify.pins import VerifyOptions, verify_lock
from tests.lib.claims import Beside, held_elsewhere
from tests.lib.gitrepos import GitDaemon, git, make_repo
from tests.lib.imagelock import ImageLockEnv, lock_env, with_source
from tests.lib.services import PushedImage, remove_lock_images

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.gitdaemon, pytest.mark.slow]

STAMP_SETUP = textwrap.dedent("""\
    import pathlib
    import time

    # A build that is not reproducible: it records when it ran.
    pathlib.Path("stamp").mkdir(exist_ok=True)
    pathlib.Path("stamp/BUILD_TIME").write_text(f"built at {time.time_ns()}\\n")

    from setuptools import setup

    setup(name="stamp", version="1.0", packages=["stamp"])
    """)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, GitDaemon]]:
    base = tmp_path_factory.mktemp("check-upstream")
    daemon = GitDaemon(base, allow_filter=True).start()
    try:
        yield base, daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def env(
    upstream: tuple[Path, GitDaemon], pushed_base_image: PushedImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ImageLockEnv]:
    base, daemon = upstream
    wheels = tmp_path_factory.mktemp("check-wheels")
    name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    with lock_env(base, daemon.url, wheels, "test_check", name, pushed_base_image.digest) as env:
        yield env


@pytest.fixture(scope="module")
def engine(docker_client: docker.DockerClient) -> Iterator[Engine]:
    yield Engine(docker_client)
    remove_lock_images(docker_client, "drift", "moved", "dropped", "stamp", "waits", "cancelled")


def night(day: int) -> datetime:
    return datetime(2026, 11, day, 2, 17, tzinfo=timezone.utc)


def test_upstream_drift_is_reported_and_the_image_still_reproduces(
    env: ImageLockEnv, engine: Engine, tmp_path: Path
) -> None:
    lock = env.write(tmp_path / "drift.lock.yaml", env.lock(name="drift"))  # a name of its own: see LANES
    options = CheckOptions(
        VerifyOptions(SourceOptions(cache_dir=tmp_path / "cache")), history=tmp_path / "history.jsonl"
    )

    first = run_check(read_lock(lock), options, engine=engine, now=night(1))  # no history: two builds compared
    assert first.ok and first.reproducible, (first.image_ids, first.differences)  # names what differed
    assert first.compared_with == "second build"
    assert first.image_ids[0] == first.image_ids[1] and first.differences == ()

    env.repos["beta"].commit("beta moves on", files={"NEWS": "more\n"})
    second = run_check(read_lock(lock), options, engine=engine, now=night(2))  # one build, compared with night 1
    beta = next(r for r in second.verify.results if r.name == "beta")
    assert beta.status == "behind" and beta.facts["ahead"] == 1
    assert second.compared_with == "history" and second.image_ids == (first.image_ids[0],) * 2, second.differences
    assert second.ok

    history = read_history(tmp_path / "history.jsonl")
    assert [e.pins["source:beta"] for e in history] == ["ok", "behind"]
    assert [e.image_id for e in history] == [first.image_ids[0]] * 2


def test_a_moved_tag_fails_before_any_build(
    env: ImageLockEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock_data = env.lock(name="moved")
    alpha = env.repos["alpha"]
    pinned = alpha.rev("v1.0^{commit}")
    lock = env.write(tmp_path / "moved.lock.yaml", lock_data)
    alpha.commit("alpha 1.0.1", files={"alpha/__init__.py": 'VERSION = "1.0.1"\n'})
    git("tag", "-f", "v1.0", "HEAD", cwd=alpha.path)  # someone re-tags the release
    try:
        report_dir = tmp_path / "report"
        code = main(
            [
                "check",
                str(lock),
                "--json",
                "--report",
                str(report_dir),
                "--cache-dir",
                str(tmp_path / "c"),
                "--history",
                str(tmp_path / "h.jsonl"),
                "-q",
            ]
        )
        data = json.loads(capsys.readouterr().out)
    finally:
        git("tag", "-f", "v1.0", pinned, cwd=alpha.path)
    assert code == 1 and data["ok"] is False and data["reproducible"] is False and data["image_ids"] == []
    assert next(r for r in data["verify"]["results"] if r["name"] == "alpha")["status"] == "tag-moved"
    assert "tag-moved" in (report_dir / "check.md").read_text()
    assert "tag-moved" in (report_dir / "check.html").read_text()
    assert json.loads((report_dir / "check.json").read_text()) == data


def test_a_commit_dropped_by_force_push_and_gc_fails(env: ImageLockEnv, tmp_path: Path) -> None:
    beta = env.repos["beta"]
    doomed = beta.commit("a commit that will be force-pushed away", files={"doomed": "x\n"})
    lock = env.write(
        tmp_path / "dropped.lock.yaml",
        with_source(env.lock(name="dropped"), "beta", commit=doomed, tree=beta.tree(doomed)),
    )
    options = CheckOptions(VerifyOptions(SourceOptions(cache_dir=tmp_path / "cache")))
    # Before the force-push the lock verifies, and the check's cache holds the commit (a whole check
    # would also build twice: what it does after a passing verify is the drift test's).
    before = verify_lock(read_lock(lock).lock, str(lock), options.verify)
    assert next(r for r in before.results if r.name == "beta").status == "ok"

    beta.force_branch("main", beta.rev(f"{doomed}^"))  # force-push, reflog expired, gc --prune=now
    report = run_check(read_lock(lock), options)
    assert not report.ok and report.image_ids == ()
    assert next(r for r in report.verify.results if r.name == "beta").status == "missing-commit"


def test_a_build_that_stamps_the_time_does_not_reproduce_and_the_file_is_named(
    env: ImageLockEnv,
    upstream: tuple[Path, GitDaemon],
    engine: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, daemon = upstream
    repo = make_repo(base / "stamp")
    commit = repo.commit("stamp 1.0", files={"setup.py": STAMP_SETUP, "stamp/__init__.py": "", "README": "stamp\n"})
    repo.tag("v1.0", commit)
    base_lock = env.lock(name="stamp")
    stamp = replace(
        base_lock.source("alpha"), name="stamp", repo=daemon.url("stamp"), commit=commit, tree=repo.tree(commit)
    )
    lock = env.write(
        tmp_path / "stamp.lock.yaml",
        replace(base_lock, sources=tuple(stamp if s.name == "alpha" else s for s in base_lock.sources)),
    )
    report_dir, history, cache = tmp_path / "report", tmp_path / "history.jsonl", tmp_path / "cache"
    code = main(
        ["check", str(lock), "--report", str(report_dir), "--history", str(history), "--cache-dir", str(cache), "-q"]
    )
    out = capsys.readouterr().out
    data = json.loads((report_dir / "check.json").read_text())
    assert code == 1 and data["verify"]["ok"] is True and data["reproducible"] is False
    assert len(set(data["image_ids"])) == 2
    changed = [f for d in data["differences"] for f in d["files"]]
    stamp_file = next(f for f in changed if f["path"].endswith("stamp/BUILD_TIME"))
    assert "content" in stamp_file["aspects"] and "built at" in stamp_file["first_difference"]
    assert "stamp/BUILD_TIME" in out and "did not reproduce" in out  # the Markdown on stdout

    # The next nights compare one build with the history's image. Night 3's is night 2's only build, held
    # by no tag once night 3's build takes the check's tag: the check holds it itself, and names the file.
    options = CheckOptions(VerifyOptions(SourceOptions(cache_dir=cache)), history=history)
    for day in (2, 3):
        night_report = run_check(read_lock(lock), options, engine=engine, now=night(day))
        assert night_report.compared_with == "history" and not night_report.reproducible
        named = [f.path for d in night_report.differences for f in d.files]
        assert any(path.endswith("stamp/BUILD_TIME") for path in named), (day, night_report.differences)
    assert [entry.reproducible for entry in read_history(history)] == [False, False, False]
    assert engine.inspect("envbuild-check/stamp:previous") is None  # the hold goes with the check


def test_a_check_of_the_lock_running_on_the_engine_is_waited_for(
    env: ImageLockEnv, engine: Engine, tmp_path: Path
) -> None:
    """The check's tags are the lock's (`envbuild-check/<lock name>:first`, …): a second check of the lock
    on the engine, from another cache, starts its builds only once the first has ended, and compares with
    the build the first recorded in the history meanwhile (one build, not two)."""
    lock = env.write(tmp_path / "waits.lock.yaml", env.lock(name="waits"))
    history = tmp_path / "history.jsonl"
    options = CheckOptions(VerifyOptions(SourceOptions(cache_dir=tmp_path / "cache")), history=history)
    claim = EngineClaim(engine.address, of=("check", "waits"))
    recorded = "sha256:" + "e" * 64  # the first check's image, gone from the engine since
    with held_elsewhere(claim):  # the first check, at its builds
        second = Beside(lambda say: run_check(read_lock(lock), options, say, engine=engine, now=night(2)))
        waited = second.waiting(60)
        assert waited == f"waiting: another `envbuild check` of waits on {engine.address} holds {claim.path}"
        assert "rebuilding without cache" not in second.said  # nothing fetched or built beside it
        first = HistoryEntry(night(1).strftime("%Y-%m-%dT%H:%M:%SZ"), str(lock), read_lock(lock).sha256, True, True,
                             recorded)  # fmt: skip
        append_history(history, first)  # as the first check does as it ends
    report = second.result(600)
    assert report.compared_with == "history" and report.image_ids[0] == recorded, report
    assert not any(line.startswith("no earlier build") for line in second.said)  # built once
    assert second.said.index("rebuilding without cache") > second.said.index(waited)


def test_a_check_stopped_by_sigterm_while_it_explains_leaves_no_scratch_and_no_hold(
    env: ImageLockEnv, engine: Engine, pushed_base_image: PushedImage, tmp_path: Path
) -> None:
    """A CI job cancelled while the check saves the two images to explain a mismatch (GBs of layers for the
    real lock): a real SIGTERM to a real `envbuild check` unwinds it as it does a build, so its scratch and
    its hold on the history's image go with it, and it exits 130 without a history line."""
    lock = env.write(tmp_path / "cancelled.lock.yaml", env.lock(name="cancelled"))
    history, cache = tmp_path / "history.jsonl", tmp_path / "cache"
    base = engine.inspect(f"{pushed_base_image.repository}:{pushed_base_image.tag}")
    assert base is not None
    # The history's image is the base: the night's build differs from it, and the check explains how.
    recorded = HistoryEntry("2026-11-01T02:17:00Z", str(lock), read_lock(lock).sha256, True, True, base["Id"])
    append_history(history, recorded)
    argv = ["check", str(lock), "--history", str(history), "--cache-dir", str(cache), "--report", str(tmp_path / "r")]
    check = subprocess.Popen(
        [sys.executable, "-c", "import sys; from envbuild.cli import main; sys.exit(main())", *argv],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert check.stderr is not None
    try:
        said = []
        for line in check.stderr:
            said.append(line)
            if line.startswith("envbuild: saving "):  # one image saved; the other is being saved
                break
        assert list(cache.rglob("check-*")), "".join(said)  # explaining, in its scratch
        assert engine.inspect(previous_reference("cancelled")) is not None  # holding the history's image
        os.kill(check.pid, signal.SIGTERM)
        _, err = check.communicate(timeout=120)
        assert check.returncode == 130, "".join(said) + err
        assert "envbuild: interrupted" in err and "Traceback" not in err
        assert list(cache.rglob("check-*")) == [] and list((cache / "image" / "work").iterdir()) == []
        assert engine.inspect(previous_reference("cancelled")) is None
        assert read_history(history) == [recorded]  # an interrupted check records nothing
    finally:
        if check.poll() is None:
            check.kill()
            check.wait()
        with contextlib.suppress(EngineError):
            engine.remove(previous_reference("cancelled"))
