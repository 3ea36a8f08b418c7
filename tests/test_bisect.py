"""`envbuild bisect GOOD BAD`: the search and the states (pure, fast), then bisects of real builds: three
sources served by a real git daemon, the tiny wheels from a loopback index, the base pinned in the local
registry, each candidate built by the engine's BuildKit and checked from inside.

Source beta gains 40 commits on a branch; commit 23 makes ``import beta`` raise, which the in-image check
catches. A bump that moves all three sources is bisected to beta and commit 23; commits whose
pyproject.toml pip cannot read are skipped where the search lands on them; a branch rewritten between the
locks is said, and its new history bisected from the merge base."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import docker
import pytest

from envbuild.bisect.report import render_markdown, render_text
from envbuild.bisect.run import BisectOptions, run_bisect
from envbuild.bisect.steps import Search, State, Unit, candidate, forward_lock, plan_states, plan_units, search_builds
from envbuild.cli import main
from envbuild.config import SourceOptions
from envbuild.engine.buildkit import StepFailed
from envbuild.engine.claim import EngineClaim
from envbuild.errors import EngineError
from envbuild.image.assemble import ContextError
from envbuild.image.build import PinsUnreachable
from envbuild.image.checked import InImageMismatch
from envbuild.lock.io import read_lock, write_lock
from envbuild.lock.model import BaseImage, Lock, Package, Source
from envbuild.verify.pins import VerifyOptions
from tests.lib.claims import Beside, held_elsewhere
from tests.lib.gitrepos import Repo, Served, git
from tests.lib.imagelock import ImageLockEnv, served_env, with_source
from tests.lib.services import PushedImage, remove_lock_images

LOCK_NAME = "bisecttest"
COMMITS = 40
BREAKS = 23  # the commit of beta's range that makes `import beta` raise


# --- the search and the states, pure --------------------------------------------------------------------


def searched(last: int, first_bad: int, skipped: frozenset[int] = frozenset()) -> tuple[tuple[int, ...], list[int]]:
    """The search's answer and the states it tested, with verdicts from ``first_bad`` and ``skipped``."""
    search, tested = Search(last), []
    while (index := search.next()) is not None:
        tested.append(index)
        search.mark(index, "skip" if index in skipped else "bad" if index >= first_bad else "good")
    return search.first_bad(), tested


@pytest.mark.parametrize("last", [1, 2, 3, 7, 8, 9, 42, 43, 160, 161])
def test_the_search_finds_every_first_bad_in_log2_builds(last: int) -> None:
    assert search_builds(last) == math.ceil(math.log2(last)) if last > 1 else search_builds(last) == 0
    for first_bad in range(1, last + 1):
        found, tested = searched(last, first_bad)
        assert found == (first_bad,)
        assert len(tested) <= search_builds(last), (first_bad, tested)
        assert len(set(tested)) == len(tested)


def test_a_state_that_cannot_be_built_is_skipped_for_the_nearest_untested_one() -> None:
    found, tested = searched(43, 24, frozenset({21, 22}))
    assert found == (24,)
    assert tested[:3] == [21, 22, 20]  # the middle, one above, one below
    assert 24 in tested


def test_only_skips_left_between_the_bounds_leave_the_first_bad_open() -> None:
    found, _ = searched(10, 6, frozenset({4, 5}))
    assert found == (4, 5, 6)  # 3 good, 4 and 5 cannot be built, 6 bad: git bisect's "could be any of"


def _source(name: str, commit: str, ref: str = "main") -> Source:
    return Source(name=name, repo=f"https://example.invalid/{name}.git", ref=ref, ref_type="branch", commit=commit)


def _lock(*sources: Source, base: str = "a" * 64, packages: tuple[Package, ...] = (), name: str = "x") -> Lock:
    return Lock(
        version=1,
        name=name,
        sources=sources,
        base_image=BaseImage(name="example.invalid/base:1", digest=f"sha256:{base}"),
        packages=packages,
    )


def test_the_changes_come_in_a_fixed_order_and_the_states_join_good_to_bad() -> None:
    good = _lock(_source("a", "1" * 40), _source("b", "2" * 40), _source("gone", "3" * 40))
    bad = _lock(
        _source("new", "4" * 40),
        _source("b", "5" * 40),
        _source("a", "6" * 40),
        base="b" * 64,
        packages=(Package(name="p", version="1.0"),),
        name="y",
    )
    units = plan_units(good, bad)
    assert [(u.kind, u.name) for u in units] == [
        ("base_image", "example.invalid/base:1"),
        ("packages", "packages"),
        ("source", "new"),
        ("source", "b"),
        ("source", "a"),
        ("source", "gone"),
        ("settings", "settings"),
    ]
    commits = tuple(c * 40 for c in "789") + ("5" * 40,)
    units[3] = dataclasses.replace(units[3], commits=commits, trees={c: c for c in commits})
    states = plan_states(units)
    assert len(states) == 1 + 6 + 4  # GOOD, a state per unit, b's three commits besides BAD's own
    first = candidate(good, bad, units, states[0])
    assert first.base_image == good.base_image and {s.name: s.commit for s in first.sources} == {
        "a": "1" * 40,
        "b": "2" * 40,
        "gone": "3" * 40,
    }
    assert candidate(good, bad, units, states[-1]) == bad  # sources in BAD's order
    at_eight = next(s for s in states if s.commit == "8" * 40)
    assert (at_eight.position, at_eight.of) == (2, 4)
    middle = candidate(good, bad, units, at_eight)
    assert [(s.name, s.commit) for s in middle.sources] == [
        ("new", "4" * 40),
        ("b", "8" * 40),
        ("a", "1" * 40),
        ("gone", "3" * 40),
    ]
    assert middle.base_image == bad.base_image and middle.name == "x"
    ahead = forward_lock(bad, units[3], units[3].source_at("7" * 40))
    assert ahead.source("b").commit == "7" * 40 and ahead.source("b").tree == "7" * 40
    assert dataclasses.replace(ahead, sources=bad.sources) == bad and ahead.source("a") == bad.source("a")


def test_a_unit_is_applied_whole_when_its_commits_are_not_known() -> None:
    good, bad = _lock(_source("a", "1" * 40)), _lock(_source("a", "2" * 40))
    units = plan_units(good, bad)
    assert units == [Unit("source", "a", good.sources[0], bad.sources[0])]
    assert plan_states(units) == [State(0, None), State(1, 0)]


def test_a_change_whose_pin_is_the_same_says_which_fields_changed() -> None:
    from envbuild.bisect.report import unit_row

    before = _source("a", "1" * 40)
    unit = Unit("source", "a", before, dataclasses.replace(before, requires=("tinyone>=1",)))
    assert unit_row(unit)[1].endswith(f"{'1' * 40}; changed: requires")


def test_every_field_of_the_lock_is_in_a_unit() -> None:
    """What a build uses and differs between the locks is a change: no field of the lock is left out (the
    version aside, which a candidate takes as the higher of the two)."""
    from envbuild.bisect.steps import LOCK_FIELDS

    in_units = {name for names in LOCK_FIELDS.values() for name in names}
    assert in_units | {"version", "sources"} == {f.name for f in dataclasses.fields(Lock)}


def _uv(version: str) -> Package:
    return Package(name="uv", version=version)


def test_a_new_installer_is_a_change_of_its_own() -> None:
    good = dataclasses.replace(_lock(_source("a", "1" * 40)), version=2, installer=_uv("0.13.9"))
    bad = dataclasses.replace(good, installer=_uv("0.14.0"))
    (unit,) = plan_units(good, bad)
    assert (unit.kind, unit.label, unit.before, unit.after) == (
        "installer",
        "installer",
        (("installer", _uv("0.13.9")),),
        (("installer", _uv("0.14.0")),),
    )
    from envbuild.bisect.report import unit_row

    assert unit_row(unit) == ["installer", "uv 0.13.9 → uv 0.14.0"]
    moved = dataclasses.replace(bad, sources=(_source("a", "2" * 40),))
    units = plan_units(good, moved)
    assert [u.kind for u in units] == ["installer", "source"]
    states = plan_states(units)
    assert candidate(good, moved, units, states[1]) == dataclasses.replace(good, installer=_uv("0.14.0"))
    assert forward_lock(moved, units[0], units[0].before) == dataclasses.replace(moved, installer=_uv("0.13.9"))


class Built:
    """What the fake build below returns for a lock that passes."""

    def __init__(self, image_id: str) -> None:
        self.image_id, self.tags, self.noop = image_id, ("envbuild/x:bisect",), False


def fake_builds(monkeypatch: pytest.MonkeyPatch, judge: Any) -> list[Any]:
    """``build_image`` replaced by ``judge(lock)``, which returns a :class:`Built` or raises; the lockfiles built."""
    built: list[Any] = []

    def build_image(read: Any, options: Any, **_: Any) -> Built:
        built.append(read)
        return judge(read.lock)  # type: ignore[no-any-return]

    monkeypatch.setattr("envbuild.bisect.run.build_image", build_image)
    return built


def three_changes(tmp_path: Path) -> tuple[Any, Any]:
    """GOOD and BAD differing in the base, the closure and one source (no history: offline, not cached)."""
    good = _lock(_source("a", "1" * 40))
    bad = _lock(_source("a", "2" * 40), base="b" * 64, packages=(Package(name="p", version="1.0"),))
    write_lock(tmp_path / "good.lock.yaml", good)
    write_lock(tmp_path / "bad.lock.yaml", bad)
    return read_lock(tmp_path / "good.lock.yaml"), read_lock(tmp_path / "bad.lock.yaml")


class NoEngine:
    """Stands in for the engine the faked builds never use; the bisect's claim on it is a real flock."""

    address = "unix:///run/no-engine.sock"


def options(tmp_path: Path, **changes: Any) -> BisectOptions:
    return BisectOptions(VerifyOptions(SourceOptions(cache_dir=tmp_path / "cache", offline=True)), **changes)


def test_each_failure_has_its_verdict_and_the_engine_stops_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = three_changes(tmp_path)

    def judge(lock: Lock) -> Built:
        if lock.packages and lock.sources[0].commit == "2" * 40:
            raise InImageMismatch("…", ["source a: import a failed: ImportError: gone"])
        if lock.packages:
            raise StepFailed("build failed at step …", "[stage-2 2/3] RUN pip install", ("ERROR: no wheel",))
        return Built("sha256:" + "0" * 64)

    built = fake_builds(monkeypatch, judge)
    result = run_bisect(good, bad, options(tmp_path), engine=NoEngine())  # type: ignore[arg-type]
    assert [(s.what, s.verdict) for s in result.steps] == [
        ("BAD", "bad"),
        ("GOOD", "good"),
        ("base image as BAD has it", "good"),
        ("packages as BAD has it", "skip"),
    ]
    assert built[1] is good and built[0] is bad  # their own files, as read
    assert result.steps[3].reason == "build step failed ([stage-2 2/3] RUN pip install…): ERROR: no wheel"
    assert result.outcome == "ambiguous" and result.exit_code == 1
    assert result.candidates == ("packages as BAD has it", "source a as BAD has it")
    assert [u.note for u in result.units if u.kind == "source"] == [
        "its history is not in the cache (offline): its commits are not bisected"
    ]

    def down(lock: Lock) -> Built:
        if lock.sources[0].commit == "2" * 40:
            raise InImageMismatch("…", ["source a: import a failed"])
        raise EngineError("build: the container engine at unix:///x stopped answering: connection refused")

    fake_builds(monkeypatch, down)
    result = run_bisect(good, bad, options(tmp_path, assume_good=True), engine=NoEngine())  # type: ignore[arg-type]
    assert result.outcome == "stopped" and [s.verdict for s in result.steps] == ["bad"]
    assert "connection refused" in result.stopped
    assert "after GOOD and at or before BAD (2 states between)" in result.stopped


def test_a_uv_that_breaks_the_build_is_blamed_on_the_installer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BAD moves uv and a source; uv 0.14.0 breaks the build. The installer is found, and the forward lock
    (BAD with GOOD's uv) is not said to be built: the source came after it."""
    good = dataclasses.replace(_lock(_source("a", "1" * 40)), version=2, installer=_uv("0.13.9"))
    bad = dataclasses.replace(good, sources=(_source("a", "2" * 40),), installer=_uv("0.14.0"))
    write_lock(tmp_path / "good.lock.yaml", good)
    write_lock(tmp_path / "bad.lock.yaml", bad)

    def judge(lock: Lock) -> Built:
        if lock.installer == _uv("0.14.0"):
            raise InImageMismatch("…", ["package tinyone: not installed"])
        return Built("sha256:" + "0" * 64)

    fake_builds(monkeypatch, judge)
    read = read_lock(tmp_path / "good.lock.yaml"), read_lock(tmp_path / "bad.lock.yaml")
    result = run_bisect(*read, options(tmp_path), engine=NoEngine())  # type: ignore[arg-type]
    assert result.outcome == "found" and result.culprit is not None
    assert (result.culprit.unit.kind, result.culprit.reason) == ("installer", "package tinyone: not installed")
    assert result.forward == dataclasses.replace(bad, installer=_uv("0.13.9"))
    assert result.forward_step is None
    assert result.to_json()["forward_lock"]["differs_from_bad"] == ["installer: uv 0.14.0 → uv 0.13.9"]
    assert "not built: source a came after it" in render_text(result)


def test_a_pin_out_of_reach_stops_the_search_and_is_not_a_candidate_that_cannot_be_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The network going away mid-search says nothing of the candidates: it stops the search, with what is
    known, where taking it for "cannot be built" skipped every state left into a false "ambiguous"."""
    good, bad = three_changes(tmp_path)
    offline = (
        "state.lock.yaml: refusing to build, the lock fails verify: source a: unreachable (offline and not in "
        "cache; run `envbuild lock fetch state.lock.yaml`)"
    )

    def outage(lock: Lock) -> Built:
        if lock.sources[0].commit == "2" * 40:
            raise InImageMismatch("…", ["source a: import a failed"])
        if lock.packages:
            raise PinsUnreachable(offline)
        return Built("sha256:" + "0" * 64)

    fake_builds(monkeypatch, outage)
    result = run_bisect(good, bad, options(tmp_path), engine=NoEngine())  # type: ignore[arg-type]
    assert result.outcome == "stopped" and [s.verdict for s in result.steps] == ["bad", "good", "good"]
    assert result.stopped.startswith("build 4 (packages as BAD has it) stopped the bisect: state.lock.yaml:")
    assert "after base image as BAD has it and at or before BAD (1 states between)" in result.stopped

    # a cached file that cannot be read is the machine's fault too; a tree not the lock's is the candidate's
    unreadable = ContextError(["package p 1.0: p-1.0.whl: cannot read: [Errno 5] Input/output error"], fault=True)
    mismatch = ContextError(["source a: the commit's tree is 1…, the lock pins tree 2…"])
    for raised, outcome in ((unreadable, "stopped"), (mismatch, "ambiguous")):

        def context(lock: Lock, raised: ContextError = raised) -> Built:
            if lock.sources[0].commit == "2" * 40:
                raise InImageMismatch("…", ["source a: import a failed"])
            if lock.packages:
                raise raised
            return Built("sha256:" + "0" * 64)

        fake_builds(monkeypatch, context)
        assert run_bisect(good, bad, options(tmp_path), engine=NoEngine()).outcome == outcome  # type: ignore[arg-type]


@pytest.mark.docker
def test_bad_offline_and_not_in_the_cache_stops_the_bisect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """BAD's pins not in an empty cache, offline: the machine cannot check them, which is no reason to call
    BAD one that cannot be built (`bad-unbuildable`: pip fails on it)."""
    three_changes(tmp_path)
    argv = ["bisect", str(tmp_path / "good.lock.yaml"), str(tmp_path / "bad.lock.yaml"), "--offline", "--json"]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 1
    said = json.loads(capsys.readouterr().out)
    assert said["outcome"] == "stopped" and said["builds"] == 0, said
    assert said["stopped"].startswith("build 1 (BAD) stopped the bisect: ")
    assert "source a: unreachable (offline and not in cache" in said["stopped"]


def test_bad_that_passes_leaves_nothing_to_bisect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good, bad = three_changes(tmp_path)
    fake_builds(monkeypatch, lambda lock: Built("sha256:" + "0" * 64))
    result = run_bisect(good, bad, options(tmp_path), engine=NoEngine())  # type: ignore[arg-type]
    assert (result.outcome, len(result.steps), result.exit_code) == ("bad-passes", 1, 1)
    assert "NOTHING TO BISECT" in render_text(result) and "BAD passes its checks" in render_markdown(result)


def test_a_bisect_of_the_lock_running_on_the_engine_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--run`` is handed each candidate by the lock's tag: a second bisect of the lock on the engine
    builds nothing until the first has ended."""
    good, bad = three_changes(tmp_path)
    built = fake_builds(monkeypatch, lambda lock: Built("sha256:" + "0" * 64))
    claim = EngineClaim(NoEngine.address, of=("bisect", bad.lock.name))
    with held_elsewhere(claim):
        second = Beside(lambda say: run_bisect(good, bad, options(tmp_path), progress=say, engine=NoEngine()))  # type: ignore[arg-type]
        waited = second.waiting(15)
        assert (
            waited == f"waiting: another `envbuild bisect` of {bad.lock.name} on {NoEngine.address} holds {claim.path}"
        )
        assert built == []
    result = second.result(60)
    assert result.outcome == "bad-passes" and len(built) == 1  # then it bisects as ever


@contextmanager
def unwritable(directory: Path) -> Iterator[None]:
    """No file can be made in ``directory``: immutable as root (whom a mode does not stop), else 0555."""
    root = os.geteuid() == 0
    subprocess.run(["chattr", "+i", str(directory)], check=True) if root else directory.chmod(0o555)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True) if root else directory.chmod(0o755)


def test_an_output_that_cannot_be_written_is_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = three_changes(tmp_path)
    built = fake_builds(monkeypatch, lambda lock: Built("sha256:" + "0" * 64))
    locked = tmp_path / "locked"
    locked.mkdir()
    report, forward = locked / "bisect.md", locked / "forward.lock.yaml"
    with unwritable(locked):
        status = main(
            ["bisect", str(good.path), str(bad.path), "--json", "--report", str(report), "--write-lock", str(forward)]
        )
    out, err = capsys.readouterr()
    assert (status, out, built) == (2, "", [])
    assert err.splitlines() == [
        f"envbuild: error: --report {report}: cannot be written (its directory is not writable)",
        f"envbuild: error: --write-lock {forward}: cannot be written (its directory is not writable)",
    ]


@pytest.mark.docker
def test_an_output_that_cannot_be_written_at_the_end_still_gets_the_answer_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The directory turns unwritable during the builds: the answer they cost is printed, and the error
    names the user's files, not a temporary file of theirs."""
    good, bad = three_changes(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    report, forward = locked / "bisect.md", locked / "forward.lock.yaml"
    locking: list[Path] = [locked]
    with ExitStack() as later:

        def judge(lock: Lock) -> Built:
            if locking:  # at the first build
                later.enter_context(unwritable(locking.pop()))
            if lock.sources[0].commit == "2" * 40:
                raise InImageMismatch("…", ["source a: import a failed"])
            return Built("sha256:" + "0" * 64)

        fake_builds(monkeypatch, judge)
        argv = ["bisect", str(good.path), str(bad.path), "--json", "--report", str(report)]
        status = main([*argv, "--write-lock", str(forward)])
    out, err = capsys.readouterr()
    said = json.loads(out)
    assert status == 1 and said["outcome"] == "found" and said["forward_lock_written"] is None
    assert said["culprit"]["name"] == "a"
    last = err.splitlines()[-1]
    assert last.startswith(f"envbuild: error: --write-lock {forward}: cannot be written: ")
    assert f"; --report {report}: cannot be written: " in last and last.endswith("(the bisect's result is on stdout)")
    assert ".tmp" not in err and list(locked.iterdir()) == []


# --- real builds ---------------------------------------------------------------------------------------


def needs_engine(test: Any) -> Any:
    return pytest.mark.docker(pytest.mark.registry(pytest.mark.gitdaemon(pytest.mark.slow(test))))


@pytest.fixture(scope="module")
def env(
    served: Served, pushed_base_image: PushedImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ImageLockEnv]:
    name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    with served_env(served, "bisect", name, pushed_base_image.digest, tmp_path_factory.mktemp("bisect-wheels")) as made:
        yield made


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, docker_client: docker.DockerClient) -> Iterator[Path]:
    """One cache for the module's bisects, as one machine's: its trees and the engine's layers are reused."""
    yield tmp_path_factory.mktemp("bisect")
    remove_lock_images(docker_client, LOCK_NAME, all_images=True)


PYPROJECT = (
    '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
    '[project]\nname = "beta"\nversion = "0.1"\n\n[tool.setuptools]\npackages = ["beta"]\n'
)


def beta_range(repo: Repo, count: int, *, breaks: int, unbuildable: range = range(0)) -> list[str]:
    """``count`` commits on the branch checked out: commit ``breaks`` makes ``import beta`` raise; those of
    ``unbuildable`` have a pyproject.toml pip cannot read (the next one mends it)."""
    commits = []
    for number in range(1, count + 1):
        files = {"beta/history.txt": f"commit {number}\n"}
        if number == breaks:
            files["beta/__init__.py"] = f'raise ImportError("beta lost a module the job needs in commit {number}")\n'
        if number in unbuildable:
            files["pyproject.toml"] = "[build-system\nthis is not TOML\n"
        elif unbuildable and number == unbuildable.stop:
            files["pyproject.toml"] = PYPROJECT
        commits.append(repo.commit(f"beta commit {number}", files=files))
    return commits


def write_locks(work: Path, good: Lock, bad: Lock) -> tuple[Path, Path]:
    locks = work / "locks"
    locks.mkdir(exist_ok=True)
    write_lock(locks / "good.lock.yaml", good)
    write_lock(locks / "bad.lock.yaml", bad)
    return locks / "good.lock.yaml", locks / "bad.lock.yaml"


def bisect_json(
    work: Path, good: Lock, bad: Lock, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, dict[str, Any], Path, Path]:
    """``envbuild bisect --json --report --write-lock`` of the two locks in the module's cache: its status,
    its JSON, the report and the forward lock."""
    paths = write_locks(work, good, bad)
    report, forward = work / "bisect.md", work / "forward.lock.yaml"
    for path in (report, forward):
        path.unlink(missing_ok=True)
    argv = ["bisect", *map(str, paths), "--cache-dir", str(work / "cache"), "--json", "--report", str(report)]
    status = main([*argv, "--write-lock", str(forward), *args])
    return status, json.loads(capsys.readouterr().out), report, forward


@needs_engine
def test_a_bump_of_three_sources_is_bisected_to_beta_and_its_commit_23(
    env: ImageLockEnv, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = env.lock(name=LOCK_NAME)
    alpha, beta, gamma = env.repos["alpha"], env.repos["beta"], env.repos["gamma"]
    beta.checkout("main")
    gamma.checkout("main")
    commits = beta_range(beta, COMMITS, breaks=BREAKS)
    alpha.commit("alpha 1.1", files={"alpha/__init__.py": '"""The alpha test project."""\nVERSION = "1.1"\n'})
    alpha.tag("v1.1", "HEAD")
    gamma.commit("gamma: more data", files={"data/more.csv": "c\n3\n"})
    gamma.commit("gamma: a script", files={"run.sh": "#!/bin/sh\necho gamma 2\n"})
    bad = env.lock(name=LOCK_NAME)  # beta and gamma at their branches' heads
    bad = with_source(bad, "alpha", ref="v1.1", commit=alpha.rev("v1.1"), tree=alpha.tree(alpha.rev("v1.1")))

    status, said, report, forward = bisect_json(work, good, bad, capsys, "--assume-good")

    assert status == 0, said
    culprit = said["culprit"]
    assert (culprit["kind"], culprit["name"]) == ("source", "beta")
    assert culprit["commit"]["commit"] == commits[BREAKS - 1]
    assert culprit["commit"]["subject"] == f"beta commit {BREAKS}" and culprit["commit"]["author_date"]
    assert (culprit["position"], culprit["commits"]) == (BREAKS, COMMITS)
    assert culprit["last_good_commit"] == commits[BREAKS - 2]
    assert "import beta failed" in culprit["reason"] and "lost a module" in culprit["reason"]
    # alpha (a tag: one state), beta's 40 commits, gamma's 2: 43 states; BAD, then ceil(log2(43)) = 6 at most
    assert said["states"] == 1 + COMMITS + 2 and said["planned_builds"] == 7
    assert said["builds"] == len(said["steps"]) <= 7
    assert said["steps"][0]["what"] == "BAD" and said["steps"][0]["verdict"] == "bad"
    assert [s["verdict"] for s in said["steps"]].count("skip") == 0

    ahead = read_lock(forward).lock
    assert ahead.source("alpha") == bad.source("alpha") and ahead.source("gamma") == bad.source("gamma")
    assert ahead.source("beta").commit == commits[BREAKS - 2]
    assert ahead.source("beta").tree == beta.tree(commits[BREAKS - 2])
    assert said["forward_lock"]["differs_from_bad"] == [
        f"source beta: commit {commits[-1]} → {commits[BREAKS - 2]}",
        f"source beta: tree {beta.tree(commits[-1])} → {beta.tree(commits[BREAKS - 2])}",
    ]

    markdown = report.read_text(encoding="utf-8")
    for step in said["steps"]:
        assert f"| {step['number']} | " in markdown
    assert markdown.count(" | bad | ") + markdown.count(" | good | ") == len(said["steps"])
    print(f"\nbisect of {said['states']} states: {said['builds']} builds in {said['seconds']:.1f} s")


@needs_engine
def test_commits_that_cannot_be_built_are_skipped_and_commit_23_still_found(
    env: ImageLockEnv, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    beta = env.repos["beta"]
    start = git("rev-list", "--max-parents=0", "main", cwd=beta.path)
    # 41 states (GOOD and beta's 40 commits): the search tries commit 20 first, then 21: both unbuildable
    beta.checkout("skips", create_at=start)
    commits = beta_range(beta, COMMITS, breaks=BREAKS, unbuildable=range(20, 22))
    good = with_source(env.lock(name=LOCK_NAME), "beta", ref="skips", commit=start, tree=beta.tree(start))
    bad = with_source(good, "beta", commit=commits[-1], tree=beta.tree(commits[-1]))

    status, said, _, forward = bisect_json(work, good, bad, capsys)

    assert status == 0, said
    assert said["culprit"]["commit"]["commit"] == commits[BREAKS - 1]
    skipped = [s for s in said["steps"] if s["verdict"] == "skip"]
    assert [s["commit"]["subject"] for s in skipped] == ["beta commit 20", "beta commit 21"]
    # the failed step, and its last line in the trace (pip's TOMLDecodeError, unless BuildKit ended the
    # step's log before the traceback came: the trace is not always whole when the error arrives)
    assert all(s["reason"].startswith("build step failed ([") for s in skipped), skipped
    assert all("source=src/beta" in s["reason"] for s in skipped), skipped
    assert [s["what"] for s in said["steps"][:2]] == ["BAD", "GOOD"]
    assert said["steps"][1]["verdict"] == "good"
    assert said["builds"] <= said["planned_builds"] + len(skipped)
    assert read_lock(forward).lock.source("beta").commit == commits[BREAKS - 2]


@needs_engine
def test_a_rewritten_branch_is_said_and_bisected_from_the_merge_base(
    env: ImageLockEnv, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    beta = env.repos["beta"]
    start = git("rev-list", "--max-parents=0", "main", cwd=beta.path)
    beta.checkout("rewrite", create_at=start)
    old = beta_range(beta, 5, breaks=0)
    good = with_source(env.lock(name=LOCK_NAME), "beta", ref="rewrite", commit=old[-1], tree=beta.tree(old[-1]))
    verified, _ = write_locks(work, good, good)  # the nightly verified GOOD: its commit is in the cache
    assert main(["lock", "verify", str(verified), "--cache-dir", str(work / "cache"), "-q"]) == 0
    capsys.readouterr()
    beta.force_branch("rewrite", old[1])  # a force-push: commits 3-5 dropped upstream
    new = []
    for number in range(1, 7):
        files = {"beta/rewritten.txt": f"rewritten {number}\n"}
        if number == 4:
            files["beta/__init__.py"] = 'raise ImportError("beta lost a module the job needs in the rewrite")\n'
        new.append(beta.commit(f"beta rewritten {number}", files=files))
    bad = with_source(good, "beta", commit=new[-1], tree=beta.tree(new[-1]))

    status, said, _, forward = bisect_json(work, good, bad, capsys, "--assume-good")

    assert status == 0, said
    (change,) = said["changes"]
    assert change["rewritten"] == {"good": old[-1], "bad": new[-1], "merge_base": old[1]}
    assert "was rewritten" in change["note"] and old[1] in change["note"]
    assert said["steps"][1]["what"] == f"GOOD, source beta at the merge base {old[1]}"  # built despite --assume-good
    assert said["culprit"]["commit"]["commit"] == new[3] and said["culprit"]["last_good_commit"] == new[2]
    assert read_lock(forward).lock.source("beta").commit == new[2]
    assert said["forward_lock"]["built_in_step"] is not None  # beta is the only change: the last good state is it

    # The text a person reads says it too (GOOD's and the last good state's builds answered from their records).
    argv = ["bisect", *map(str, write_locks(work, good, bad)), "--cache-dir", str(work / "cache"), "--assume-good"]
    assert main([*argv, "-q"]) == 0
    text = capsys.readouterr().out
    assert "was rewritten" in text and "FOUND: " in text and f"commit {new[3]} 'beta rewritten 4'" in text
    print(text)


# What `--run` tries in each image: exit 125 where gamma's data holds SKIP, 1 where it holds BROKEN.
RUN = (
    'docker run --rm --network none "$ENVBUILD_IMAGE" '
    "sh -c 'cd /opt/envbuild/src/gamma/data && if [ -e SKIP ]; then exit 125; fi; test ! -e BROKEN'"
)


@needs_engine
def test_run_judges_each_image_and_its_125_leaves_the_first_bad_open(
    env: ImageLockEnv, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    beta, gamma = env.repos["beta"], env.repos["gamma"]
    beta_start = git("rev-list", "--max-parents=0", "main", cwd=beta.path)
    start = git("rev-list", "--max-parents=0", "main", cwd=gamma.path)
    gamma.checkout("runs", create_at=start)
    commits = []
    for number in range(1, 9):  # BROKEN from commit 5; commit 4 cannot be tested
        files = {"data/number.txt": f"{number}\n"}
        if number == 4:
            files["data/SKIP"] = "\n"
        if number == 5:
            (gamma.path / "data" / "SKIP").unlink()
            files["data/BROKEN"] = "\n"
        commits.append(gamma.commit(f"gamma commit {number}", files=files))
    good = with_source(env.lock(name=LOCK_NAME), "beta", ref="main", commit=beta_start, tree=beta.tree(beta_start))
    good = with_source(good, "gamma", ref="runs", commit=start, tree=gamma.tree(start))
    bad = with_source(good, "gamma", commit=commits[-1], tree=gamma.tree(commits[-1]))

    status, said, _, forward = bisect_json(work, good, bad, capsys, "--assume-good", "--run", RUN)

    assert status == 1 and said["outcome"] == "ambiguous", said
    assert said["steps"][0]["what"] == "BAD" and said["steps"][0]["verdict"] == "bad"
    assert said["steps"][0]["reason"].startswith("--run exited 1")
    verdicts = {s["commit"]["subject"]: (s["verdict"], s["reason"]) for s in said["steps"][1:]}
    assert verdicts["gamma commit 4"] == ("skip", "--run exited 125")
    assert verdicts["gamma commit 3"] == ("good", "") and verdicts["gamma commit 5"][0] == "bad"
    assert said["candidates"] == [f"source gamma at {commits[3]} (4 of 8)", f"source gamma at {commits[4]} (5 of 8)"]
    assert said["culprit"]["name"] == "gamma" and said["culprit"]["commit"] is None
    assert read_lock(forward).lock.source("gamma").commit == commits[2]  # the last good one

    status, said, _, _ = bisect_json(work, good, bad, capsys, "--assume-good", "--run", "true")
    assert (status, said["outcome"], said["builds"]) == (1, "bad-passes", 1)

    # git bisect run's abort: the build it judged is counted, with its image, as the one that stopped it.
    status, said, _, _ = bisect_json(work, good, bad, capsys, "--assume-good", "--run", "echo interrupted; exit 130")
    assert (status, said["outcome"], said["builds"]) == (1, "stopped", 1), said
    ((step,),) = [said["steps"]]
    assert step["verdict"] == "stopped" and step["image_id"].startswith("sha256:")
    assert step["reason"] == "--run exited 130: interrupted; an exit status of 128 or more stops the bisect"

    status, said, _, _ = bisect_json(work, good, bad, capsys, "--deadline", "0.001")
    assert (status, said["outcome"], said["builds"]) == (1, "deadline", 0)


def marked(mark: str) -> list[int]:
    """The live processes (zombies aside) whose environment holds ``mark``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or f"ENVBUILD_TEST_MARK={mark}".encode() not in (proc / "environ").read_bytes():
                continue
            if (proc / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                found.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return found


def left(mark: str, seconds: float = 5.0) -> list[int]:
    """:func:`marked`, once the kernel has had ``seconds`` to end what was killed (a SIGKILL is delivered
    after kill() returns)."""
    deadline = time.monotonic() + seconds
    while (found := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    from envbuild.bisect.command import stop_group

    mark = uuid.uuid4().hex
    shell = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 30 & echo started; wait"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "ENVBUILD_TEST_MARK": mark},
    )
    try:
        assert shell.stdout is not None and shell.stdout.readline() == "started\n"
        assert len(marked(mark)) == 2
        started = time.monotonic()
        stop_group(shell, grace=0.5)
        assert 0.5 <= time.monotonic() - started < 10 and shell.returncode == -signal.SIGKILL
        assert left(mark) == []  # the sleep too, which SIGTERM does not reach past its shell's trap
    finally:
        for pid in marked(mark):
            os.kill(pid, signal.SIGKILL)
        shell.kill()
        shell.wait()


@needs_engine
def test_sigterm_during_run_stops_its_command_removes_the_scratch_and_reports(
    env: ImageLockEnv, work: Path, tmp_path: Path
) -> None:
    """A real SIGTERM to a real bisect while its --run command sleeps: the command's shell and the sleep it
    started are stopped, the scratch directory is gone, and what is known is on stdout and in the report."""
    beta, gamma = env.repos["beta"], env.repos["gamma"]
    beta_start = git("rev-list", "--max-parents=0", "main", cwd=beta.path)
    start = git("rev-list", "--max-parents=0", "main", cwd=gamma.path)
    gamma.checkout("term", create_at=start)
    moved = gamma.commit("gamma: term", files={"data/term.txt": "1\n"})
    good = with_source(env.lock(name=LOCK_NAME), "beta", ref="main", commit=beta_start, tree=beta.tree(beta_start))
    good = with_source(good, "gamma", ref="term", commit=start, tree=gamma.tree(start))
    bad = with_source(good, "gamma", commit=moved, tree=gamma.tree(moved))
    paths = write_locks(work, good, bad)
    scratch, report, mark = tmp_path / "tmp", tmp_path / "bisect.md", uuid.uuid4().hex
    scratch.mkdir()
    argv = ["bisect", *map(str, paths), "--cache-dir", str(work / "cache"), "--assume-good", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from envbuild.cli import main; sys.exit(main())", *argv]
        + ["--report", str(report), "--run", "echo probing; sleep 45; exit 1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch), "ENVBUILD_TEST_MARK": mark},
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "run: probing" in line:
                break
        assert list(scratch.glob("envbuild-bisect-*")), "".join(seen)  # under way, with its scratch
        time.sleep(0.5)  # the sleep started
        assert len(marked(mark)) == 3, "".join(seen)  # the bisect, the shell, the sleep
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, "".join(seen) + err
        assert left(mark) == []  # nothing it started is left running
        assert list(scratch.glob("envbuild-bisect-*")) == []
        said = json.loads(out)
        assert said["outcome"] == "stopped" and said["builds"] == 0
        assert said["stopped"] == "build 1 (BAD) was interrupted (Ctrl-C or SIGTERM)"
        assert "was interrupted (Ctrl-C or SIGTERM)" in report.read_text(encoding="utf-8")
        assert "Traceback" not in err
    finally:
        proc.kill()
        proc.wait()
        for pid in marked(mark):
            os.kill(pid, signal.SIGKILL)
