"""Whether a directory is one storage for every node, tried on the nodes (standard library and Ray).

A checkpoint saved where only the saving node sees it has ``common.pt``, ``.metadata`` and
``metadata.json`` on that node alone, and a resume on another fails (verl's NPU FAQ). So, before a job,
each node writes a marker file into the job's output directory, then each lists which nodes' markers
it sees there, then each removes its own (three rounds of tasks pinned to the nodes: a node must not
remove its marker before every other has looked). After a job, each node lists the files under the
checkpoint directory (:func:`listing`), and a file some node cannot see is one a resume there would miss.
"""

from __future__ import annotations

import os
from typing import Any

MARKERS = ".envrun-shared"  # under the directory tried; removed again when empty
MAX_FILES = 100_000  # a listing stops there (a checkpoint of 32 x 16 ranks has thousands)


def write_marker(root: str, token: str, node_id: str) -> dict[str, Any]:
    try:
        os.makedirs(os.path.join(root, MARKERS), exist_ok=True)
        with open(os.path.join(root, MARKERS, f"{token}-{node_id}"), "w", encoding="utf-8") as marker:
            marker.write(node_id + "\n")
    except OSError as exc:
        return {"error": f"cannot write under {root} here: {exc.strerror or exc}"}
    return {"error": None}


def seen_markers(root: str, token: str, node_id: str) -> list[str]:
    """The nodes whose markers this node sees under ``root`` (``node_id``: this node, unused but pinned)."""
    try:
        names = os.listdir(os.path.join(root, MARKERS))
    except OSError:
        return []
    return sorted(name[len(token) + 1 :] for name in names if name.startswith(token + "-"))


def remove_marker(root: str, token: str, node_id: str) -> None:
    directory = os.path.join(root, MARKERS)
    try:
        os.unlink(os.path.join(directory, f"{token}-{node_id}"))
        os.rmdir(directory)  # only once empty: another run's markers stay
    except OSError:
        pass


def listing(root: str) -> dict[str, Any]:
    """Every file under ``root`` here, as paths relative to it (sorted), with its size; ``truncated``: the walk
    (each directory's files, then its subdirectories, by name) stopped at :data:`MAX_FILES`."""
    if not os.path.isdir(root):
        return {"present": False, "files": {}, "truncated": False}
    files: dict[str, int] = {}
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d != MARKERS)
        for name in sorted(names):  # every node walks in one order: a listing cut short is cut at the same place
            path = os.path.join(directory, name)
            try:
                files[os.path.relpath(path, root)] = os.lstat(path).st_size
            except OSError:
                continue
            if len(files) >= MAX_FILES:
                return {"present": True, "files": dict(sorted(files.items())), "truncated": True}
    return {"present": True, "files": dict(sorted(files.items())), "truncated": False}


def shared(nodes: list[dict[str, Any]], root: str, token: str) -> dict[str, dict[str, Any]]:
    """Each node's part in the three rounds (by Ray node ID): whether it could write, whose markers it saw."""
    from envrun.cluster.onnet import on_each

    wrote = on_each(nodes, write_marker, lambda _node: (root, token))
    try:
        seen = on_each(nodes, seen_markers, lambda _node: (root, token))
    finally:
        on_each(nodes, remove_marker, lambda _node: (root, token))
    return {node: {"path": root, "error": wrote[node]["error"], "sees": seen[node]} for node in wrote}
