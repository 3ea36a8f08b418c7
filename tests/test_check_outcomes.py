"""`envbuild check` gives its answer for every outcome once the lockfile parsed: JSON with `ok: false`, the
stage that failed and why, the three report files, and a history line — a failing night is when the
report matters most."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from envbuild.cli import main as envbuild
from envbuild.lock import Lock, Package, PackageFile, Source, write_lock
from envbuild.lock.model import BaseImage, Install, Platform
from tests.lib.gitrepos import Repo, Served, git
from tests.lib.pyindex import PyIndex
from tests.lib.services import PushedImage


@dataclass
class World:
    served: Served
    index: PyIndex
    base: PushedImage
    tmp: Path
    restore: Callable[[], None] = lambda: None  # undoes what a setup did to the shared index

    def repo(self, name: str, files: dict[str, str]) -> tuple[Repo, str]:
        repo = self.served.repo(name)
        return repo, repo.commit("files", files=files)

    def lock(self, *, sources: tuple[Source, ...], digest: str | None = None, name: str = "outcome") -> Path:
        wheel = next(self.index.root.glob("tinyone-*.whl")).name
        path = self.tmp / f"{name}.lock.yaml"
        write_lock(
            path,
            Lock(
                version=1,
                name=name,
                sources=sources,
                platform=Platform(os="linux", arch="x86_64", python="3.11"),  # type: ignore[arg-type]
                base_image=BaseImage(name=f"{self.base.repository}:{self.base.tag}", digest=digest or self.base.digest),
                index=self.index.url,
                source_date_epoch=1767225600,
                packages=(
                    Package(name="tinyone", version="1.0", files=(PackageFile(wheel, self.index.sha256(wheel)),)),
                ),
            ),
        )
        return path


def files_source(world: World, name: str) -> Source:
    repo, commit = world.repo(name, {"data.txt": f"{name}\n"})
    return Source(name="data", repo=world.served.url(name, "daemon-filter"), ref="main", ref_type="branch",
                  commit=commit, install=Install(mode="none"))  # fmt: skip


def tag_moved(world: World, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo, commit = world.repo("moved", {"a": "1\n"})
    repo.tag("v1", commit)
    source = Source(name="data", repo=world.served.url("moved", "daemon-filter"), ref="v1", ref_type="tag",
                    commit=commit, install=Install(mode="none"))  # fmt: skip
    path = world.lock(sources=(source,), name="tagmoved")
    repo.commit("later")
    git("tag", "-f", "v1", "HEAD", cwd=repo.path)  # retagged: the lock's pin no longer holds
    return path


def engine_down(world: World, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{world.tmp}/no-engine.sock")
    return world.lock(sources=(files_source(world, "down"),), name="down")


def download_differs(world: World, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = world.lock(sources=(files_source(world, "differs"),), name="differs")
    wheel = next(world.index.root.glob("tinyone-*.whl"))
    original = wheel.read_bytes()
    world.index.rehash(wheel.name, world.index.sha256(wheel.name))  # the index lists the locked sha256 …
    wheel.write_bytes(original + b"\0")  # … and serves other bytes

    def restore() -> None:
        wheel.write_bytes(original)
        world.index.hashes.pop(wheel.name)

    world.restore = restore
    return path


def step_fails(world: World, monkeypatch: pytest.MonkeyPatch) -> Path:
    broken = {"pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "no_such_backend"\n'}
    repo, commit = world.repo("broken", broken)
    source = Source(name="broken", repo=world.served.url("broken", "daemon-filter"), ref="main", ref_type="branch",
                    commit=commit, install=Install(mode="editable"))  # fmt: skip
    return world.lock(sources=(source,), name="broken")


def base_not_pullable(world: World, monkeypatch: pytest.MonkeyPatch) -> Path:
    return world.lock(sources=(files_source(world, "nobase"),), digest="sha256:" + "0" * 64, name="nobase")


def history_unreadable(world: World, monkeypatch: pytest.MonkeyPatch) -> Path:
    (world.tmp / "history.jsonl").write_text('{"not": "an entry"}\n{"time": "x"}\n')
    return world.lock(sources=(files_source(world, "hist"),), name="hist")


OUTCOMES: dict[str, tuple[Callable[[World, pytest.MonkeyPatch], Path], str, str, bool]] = {
    # name: (setup, failed stage, words in the error, whether a history line is appended)
    "a pin fails verify": (tag_moved, "verify", "source data: tag-moved", True),
    "the engine is down": (engine_down, "engine", "no container engine answers", True),
    "a download differs from the lock": (download_differs, "fetch", "package tinyone 1.0", True),
    "a build step fails": (step_fails, "build", "build failed at step", True),
    "the base image cannot be pulled": (base_not_pullable, "build", "build failed", True),
    "the history is unreadable": (history_unreadable, "history", "not a history entry", False),
}


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.gitdaemon
@pytest.mark.slow
@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
def test_every_failure_gives_json_reports_and_history(
    outcome: str,
    served: Served,
    tiny_index: PyIndex,
    pushed_base_image: PushedImage,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    setup, stage, words, appended = OUTCOMES[outcome]
    world = World(served, tiny_index, pushed_base_image, tmp_path)
    lock = setup(world, monkeypatch)
    history = tmp_path / "history.jsonl"
    before = history.read_text() if history.exists() else ""
    report = tmp_path / "report"
    try:
        code = envbuild(["check", str(lock), "--json", "--report", str(report), "--history", str(history),
                         "--cache-dir", str(tmp_path / "cache"), "-q"])  # fmt: skip
    finally:
        world.restore()
    out = capsys.readouterr().out
    assert code == 1
    result = json.loads(out)
    assert (result["ok"], result["failed_stage"]) == (False, stage), result
    assert words in result["error"].splitlines()[0]  # the reason first; a failed step's log tail may follow
    assert sorted(p.name for p in report.iterdir()) == ["check.html", "check.json", "check.md"]
    assert json.loads((report / "check.json").read_text()) == result
    assert f"Stopped at {stage}" in (report / "check.md").read_text()
    after = history.read_text() if history.exists() else ""
    if appended:
        line = json.loads(after[len(before) :])
        assert (line["ok"], line["failed_stage"], line["image_id"]) == (False, stage, None)
    else:
        assert after == before  # an unreadable history is left as it was, not appended to
