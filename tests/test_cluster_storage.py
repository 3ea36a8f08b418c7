"""Checkpoints where a resume can read them (envrun.cluster.storage and .onstore): the verdicts on the
nodes' answers, and the node side's rounds run here on real directories (tests/test_cluster_ray.py asks
real nodes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from envrun.cluster import onstore
from envrun.cluster.onstore import MARKERS, listing, remove_marker, seen_markers, write_marker
from envrun.cluster.storage import storage_line, unseen_files, walk_order
from envrun.exports import ExportSearch, export_verdict
from envrun.probe.report import ExportLayout


def answer(name: str, sees: list[str], error: str | None = None) -> dict[str, Any]:
    return {"name": name, "node_id": f"id-{name}", "storage": {"path": "/runs", "error": error, "sees": sees}}


def test_a_directory_every_node_sees_is_one_storage() -> None:
    line = storage_line([answer("n1", ["id-n1", "id-n2"]), answer("n2", ["id-n1", "id-n2"])], "/runs")
    assert line.status == "ok" and "one storage for all 2 nodes" in line.detail
    assert storage_line([answer("n1", ["id-n1"])], "/runs").status == "ok"  # one node: nothing to share


def test_a_directory_each_node_has_alone_is_refused_naming_what_each_sees() -> None:
    line = storage_line([answer("n1", ["id-n1"]), answer("n2", ["id-n2"]), {"name": "n3", "error": "x"}], "/runs")
    assert line.status == "fail"
    assert (
        "/runs is not one storage for the job's nodes: node n1 sees the files of n1 there; node n2 sees" in line.detail
    )
    assert "common.pt, .metadata and metadata.json on the saving node only" in line.detail
    unwritable = storage_line([answer("n1", [], "cannot write under /runs here: Read-only file system"),
                               answer("n2", ["id-n2"])], "/runs")  # fmt: skip
    assert unwritable.status == "fail" and "node n1: cannot write under /runs here: Read-only" in unwritable.detail


def test_the_rounds_leave_nothing_behind(tmp_path: Path) -> None:
    root = str(tmp_path / "runs")
    assert write_marker(root, "t0k3n", "a") == {"error": None}
    assert write_marker(root, "t0k3n", "b") == {"error": None}
    assert write_marker(root, "other", "c") == {"error": None}  # another run's check, at the same time
    assert seen_markers(root, "t0k3n", "a") == ["a", "b"]
    for node in ("a", "b"):
        remove_marker(root, "t0k3n", node)
    assert os.listdir(os.path.join(root, MARKERS)) == ["other-c"]
    remove_marker(root, "other", "c")
    assert os.listdir(root) == []
    (tmp_path / "file").write_text("")  # a path under a file: not a directory anyone can write under
    assert "cannot write under" in str(write_marker(str(tmp_path / "file" / "x"), "t", "a")["error"])


def test_files_some_node_cannot_see_fail_the_post_run_audit(tmp_path: Path) -> None:
    step = tmp_path / "global_step_1" / "actor"
    step.mkdir(parents=True)
    for name in ("common.pt", ".metadata", "metadata.json", "__0_0.distcp"):
        (step / name).write_bytes(b"x")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1")
    saving = listing(str(tmp_path))
    assert saving["present"] and "global_step_1/actor/common.pt" in saving["files"]
    other = {"present": True, "files": {"global_step_1/actor/__0_0.distcp": 1}, "truncated": False}
    answers = [{"name": "n1", "checkpoints": saving}, {"name": "n2", "checkpoints": other}]
    (failure,) = unseen_files(answers, "/runs/ckpts")
    assert failure.startswith("n2: a resume there would not find global_step_1/actor/.metadata, ")
    assert "(written where n1 sees them: not shared storage)" in failure
    assert unseen_files([answers[0], {"name": "n2", "checkpoints": saving}], "/runs/ckpts") == ()
    layout = ExportLayout("/runs/ckpts", "global_step_*/actor/huggingface", False, "trainer.save_freq=-1", False)
    verdict = export_verdict(layout, ExportSearch("2 node(s)", True, (), (failure,)))
    assert not verdict.ok and verdict.failures == (failure,)


def test_listings_cut_at_their_bound_are_compared_only_as_far_as_every_walk_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose walk stopped at the bound has not seen the files past it: they are not missing there; a
    file before the cut that a node lacks still is."""
    for path in ("b.txt", "a/2.pt", "a/1.pt", "a/sub/x.pt", "c/y.pt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"x")
    whole = listing(str(tmp_path))
    monkeypatch.setattr(onstore, "MAX_FILES", 3)
    cut = listing(str(tmp_path))
    # b.txt first (the root's files), then a/ (1.pt, 2.pt): where every node's walk stops at 3 files
    assert cut["truncated"] and list(cut["files"]) == ["a/1.pt", "a/2.pt", "b.txt"]
    assert walk_order("b.txt") < walk_order("a/1.pt") < walk_order("a/sub/x.pt") < walk_order("c/y.pt")

    answers = [{"name": "n1", "checkpoints": whole}, {"name": "n2", "checkpoints": cut}]
    assert unseen_files(answers, "/runs/ckpts") == ()  # a/sub/x.pt and c/y.pt: past n2's cut, not missing
    lacking = {**cut, "files": {p: s for p, s in cut["files"].items() if p != "a/1.pt"}}
    (failure,) = unseen_files([answers[0], {"name": "n2", "checkpoints": lacking}], "/runs/ckpts")
    assert failure.startswith("n2: a resume there would not find a/1.pt under /runs/ckpts"), failure
