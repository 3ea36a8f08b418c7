"""Checkpoints where a resume can read them: the verdicts on what the nodes said of the job's output
directory (:mod:`envrun.cluster.onstore`), pure functions.

Before a job on several nodes, its output directory must be one storage for all of them: every node
sees the file every other wrote there. After it, every file under the checkpoint directory must be seen
from every node: a file on one node only is what a resume elsewhere misses (verl saves a Megatron
checkpoint's ``common.pt``, ``.metadata`` and ``metadata.json`` from one rank).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envrun.preflightline import PreflightLine

CHECK = "storage"
SHOWN = 5


def _name(answer: Mapping[str, Any]) -> str:
    return str(answer.get("name") or answer.get("node_id"))


def storage_line(answers: Sequence[Mapping[str, Any]], path: str) -> PreflightLine:
    """``path`` is one storage for every node that answered."""
    alive = [a for a in answers if not a.get("error")]
    names = {str(a.get("node_id")): _name(a) for a in alive}
    if len(alive) < 2:
        return PreflightLine(CHECK, "ok", f"{path}: one node, its own storage")
    fix = (
        f"mount shared storage at {path} on every node (the cluster file's volumes, mode: rw) or give "
        "--output-dir a path on it: a checkpoint saved elsewhere has common.pt, .metadata and metadata.json "
        "on the saving node only, and a resume on another node fails"
    )
    problems = []
    for answer in alive:
        found = answer.get("storage")
        if not isinstance(found, dict):
            problems.append(f"node {_name(answer)}: no answer")
        elif found.get("error"):
            problems.append(f"node {_name(answer)}: {found['error']}")
        elif set(found.get("sees") or ()) != set(names):
            seen = sorted(names.get(str(n), str(n)) for n in found.get("sees") or ())
            problems.append(f"node {_name(answer)} sees the files of {', '.join(seen) or 'no node'} there")
    if problems:
        shown = "; ".join(problems[:SHOWN]) + (f"; … and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
        return PreflightLine(CHECK, "fail", f"{path} is not one storage for the job's nodes: {shown}: {fix}")
    return PreflightLine(CHECK, "ok", f"{path}: one storage for all {len(alive)} nodes (each saw every node's file)")


def walk_order(path: str) -> tuple[tuple[int, str], ...]:
    """Where a listing's walk reaches ``path`` (:func:`envrun.cluster.onstore.listing`): a directory's files
    by name, then its subdirectories by name."""
    *directories, name = path.split("/")
    return (*((1, d) for d in directories), (0, name))


def unseen_files(answers: Sequence[Mapping[str, Any]], root: str) -> tuple[str, ...]:
    """A failure per node that misses files under ``root`` another node holds (what a resume there misses).
    Where a node's listing stopped at its bound, only what every walk reached is compared: a file past that
    node's last is not known to be missing there."""
    checkpoints = [
        (_name(a), a["checkpoints"]) for a in answers if not a.get("error") and isinstance(a.get("checkpoints"), dict)
    ]
    listed = {node: dict(found.get("files") or {}) for node, found in checkpoints}
    cuts = [
        max(map(walk_order, found["files"]))
        for _, found in checkpoints
        if found.get("truncated") and found.get("files")
    ]
    if cuts:
        cut = min(cuts)
        listed = {
            node: {p: size for p, size in files.items() if walk_order(p) <= cut} for node, files in listed.items()
        }
    everything: dict[str, str] = {}
    for node, files in sorted(listed.items()):
        for path in files:
            everything.setdefault(path, node)
    failures = []
    for node, files in sorted(listed.items()):
        missing = sorted(path for path in everything if path not in files)
        if missing:
            where = sorted({everything[path] for path in missing})
            shown = ", ".join(missing[:SHOWN]) + (f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else "")
            failures.append(
                f"{node}: a resume there would not find {shown} under {root} (written where {', '.join(where)} "
                "sees them: not shared storage)"
            )
    return tuple(failures)
