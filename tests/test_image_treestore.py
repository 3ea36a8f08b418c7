"""Kept source trees (envbuild.image.treestore): exported once per commit, complete or absent, shared by
builds made at once, checked against each lock's pins on every build, pruned when unused."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from envbuild.errors import EnvbuildError
from envbuild.image.assemble import ContextError, assemble_context
from envbuild.image.plan import SourcePlan, plan_context
from envbuild.image.render import render_dockerfile
from envbuild.image.treestore import KEEP_UNUSED, TreeStore, tree_key
from envbuild.lock import Source
from tests.lib.tinylock import LOCK_SHA, tiny_lock


class Export:
    """A stand-in for the git export (tested against real git in test_image_build): writes a few files
    per source, counting its calls; ``fail`` makes the next one raise half-way, as a dropped fetch does."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail = False
        self.gate: threading.Barrier | None = None

    def __call__(self, source: Source, dest: Path) -> None:
        self.calls.append(source.name)
        (dest / "pkg").mkdir()
        (dest / "pkg" / "__init__.py").write_text(f"NAME = {source.name!r}\n")
        (dest / "run.sh").write_text("#!/bin/sh\n")
        (dest / "run.sh").chmod(0o700)
        if self.gate is not None:
            self.gate.wait(timeout=30)
        if self.fail:
            raise EnvbuildError(f"source {source.name}: the connection dropped")


def sources() -> list[SourcePlan]:
    return list(plan_context(tiny_lock(packages=()), lock_sha256=LOCK_SHA).sources)


def test_a_kept_tree_is_made_once_and_read_from_then_on(tmp_path: Path) -> None:
    store, export = TreeStore(tmp_path / "cache"), Export()
    source = sources()[0]
    first = store.kept(source, export)
    again = TreeStore(tmp_path / "cache").kept(source, export)  # another build: nothing exported again
    assert export.calls == [source.name] and again == first
    assert first.path == tmp_path / "cache" / "image" / "trees" / tree_key(source)
    assert (first.path / ".envbuild-commit").read_text() == source.commit + "\n"
    assert first.files == ("pkg/__init__.py", "run.sh")  # as exported: the marker is envbuild's
    assert stat.S_IMODE((first.path / "run.sh").stat().st_mode) == 0o755  # fixed modes, as the image gets
    assert stat.S_IMODE((first.path / "pkg" / "__init__.py").stat().st_mode) == 0o644
    assert not [p for p in first.path.parent.iterdir() if p.name.startswith(".scratch-")]


def test_an_interrupted_export_keeps_nothing_and_the_next_build_exports_again(tmp_path: Path) -> None:
    store, export = TreeStore(tmp_path / "cache"), Export()
    source = sources()[0]
    export.fail = True
    with pytest.raises(EnvbuildError, match="connection dropped"):
        store.kept(source, export)
    assert sorted(p.name for p in store.root.iterdir()) == []  # no entry, no scratch, no record
    export.fail = False
    assert store.kept(source, export).files == ("pkg/__init__.py", "run.sh")
    # a record without its directory (a crash between the two) is no kept tree either
    (store.root / tree_key(source)).rename(tmp_path / "moved-away")
    store.kept(source, export)
    assert export.calls == [source.name] * 3


def test_two_builds_making_one_kept_tree_at_once_share_it(tmp_path: Path) -> None:
    export = Export()
    export.gate = threading.Barrier(2)  # both are exporting before either keeps its tree
    source, found, errors = sources()[0], [], []

    def build() -> None:
        try:
            found.append(TreeStore(tmp_path / "cache").kept(source, export))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and len(export.calls) == 2 and found[0] == found[1]
    # one kept tree, and neither build's scratch: the second rename found the first's in place
    assert sorted(p.name for p in found[0].path.parent.iterdir()) == [tree_key(source), f"{tree_key(source)}.json"]


def test_every_build_checks_a_kept_tree_against_its_own_lock(tmp_path: Path) -> None:
    """Another lock may pin another tree for the same commit: what the export found is compared with
    each lock's pins, without exporting again."""
    export, store = Export(), TreeStore(tmp_path / "cache")
    lock = tiny_lock(packages=())
    plan = plan_context(lock, lock_sha256=LOCK_SHA)
    context = assemble_context(
        plan, render_dockerfile(plan), tmp_path / "one", export, lambda p, f: tmp_path, store=store
    )
    first = plan.sources[0]
    assert dict(context.trees)[first.name] == json.loads((store.root / f"{tree_key(first)}.json").read_text())["tree"]
    wrong = dataclasses.replace(
        lock, sources=tuple(dataclasses.replace(s, tree="1" * 40) if s.name == first.name else s for s in lock.sources)
    )
    calls = len(export.calls)
    wrong_plan = plan_context(wrong, lock_sha256=LOCK_SHA)
    with pytest.raises(
        ContextError,
        match=rf"source {first.name}: the exported tree of {first.commit} is [0-9a-f]{{40}}, the lock pins tree 1{{40}}",
    ):
        assemble_context(
            wrong_plan, render_dockerfile(wrong_plan), tmp_path / "two", export, lambda p, f: tmp_path, store=store
        )
    assert len(export.calls) == calls and not (tmp_path / "two").exists()


def test_unused_kept_trees_go_and_a_busy_store_is_left_alone(tmp_path: Path) -> None:
    store, export = TreeStore(tmp_path / "cache"), Export()
    old, recent, kept = sources()[:3]
    for source in (old, recent, kept):
        store.kept(source, export)
    stale = time.time() - KEEP_UNUSED - 60
    for source in (old, kept):
        os.utime(store.root / f"{tree_key(source)}.json", (stale, stale))  # when a build last read it
    (store.root / ".scratch-left-by-a-killed-build").mkdir()
    with store.in_use():  # another build reads kept trees: nothing is removed under it
        assert store.prune(set()) == 0
        assert (store.root / tree_key(old)).is_dir()
    assert store.prune({tree_key(kept)}) == 1  # the one this build used stays, however old
    assert not (store.root / tree_key(old)).exists() and not (store.root / f"{tree_key(old)}.json").exists()
    assert (store.root / tree_key(recent)).is_dir() and (store.root / tree_key(kept)).is_dir()
    assert not (store.root / ".scratch-left-by-a-killed-build").exists()
    store.kept(old, export)  # used again: exported again
    assert export.calls.count(old.name) == 2
