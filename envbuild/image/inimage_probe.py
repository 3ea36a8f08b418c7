#!/usr/bin/env python3
"""The in-image check: what is really installed, printed as JSON. Standard library only.

Shipped into the image as ``/opt/envbuild/meta/inimage_probe.py`` and run with the image's
``python3`` against ``/opt/envbuild/meta/manifest.json``. It reports facts only; judging them against
the lock is :func:`envbuild.image.inimage_verdict.compare_inimage`, on the host.

Each source is checked by content, not by trusting a marker: the git tree SHA of the files the
manifest lists is recomputed from the installed directory, so a source is "its pinned commit" when
that SHA equals the commit's tree. Files the build added (``*.egg-info``, ``build/``) are not listed
and so do not count; a listed file that is missing or changed does.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys

REPORT_VERSION = 1
DEFAULT_MANIFEST = "/opt/envbuild/meta/manifest.json"
COMMIT_MARKER = ".envbuild-commit"


def _blob_sha(data: bytes) -> bytes:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).digest()


def _entry(root: str, rel: str) -> tuple[str, bytes]:
    """Git mode and blob SHA of one file or symlink, as ``git add`` would record it."""
    path = os.path.join(root, rel)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "120000", _blob_sha(os.fsencode(os.readlink(path)))
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path} is not a regular file or symlink")
    with open(path, "rb") as handle:
        data = handle.read()
    return ("100755" if info.st_mode & stat.S_IXUSR else "100644"), _blob_sha(data)


def git_tree_sha(root: str, paths: list[str]) -> tuple[str, list[str]]:
    """The git tree SHA of the files *paths* (relative, '/'-separated) under *root*.

    Returns the SHA and the paths that could not be read (missing, or not a file or symlink); those
    are left out of the tree, so the SHA then differs from the commit's.
    """
    nested: dict = {}
    unreadable: list[str] = []
    for rel in paths:
        try:
            mode, sha = _entry(root, rel)
        except OSError:
            unreadable.append(rel)
            continue
        node = nested
        *dirs, name = rel.split("/")
        for part in dirs:
            node = node.setdefault(part, {})
        node[name] = (mode, sha)

    def tree(node: dict) -> bytes:
        entries = []
        for name, value in node.items():
            if isinstance(value, dict):
                entries.append((name + "/", b"40000 " + os.fsencode(name) + b"\0" + tree(value)))
            else:
                entries.append((name, value[0].encode() + b" " + os.fsencode(name) + b"\0" + value[1]))
        # git orders a tree's entries by name, comparing a subtree's name as if it ended in '/'.
        body = b"".join(e for _, e in sorted(entries, key=lambda item: os.fsencode(item[0])))
        return hashlib.sha1(b"tree %d\0" % len(body) + body).digest()

    return tree(nested).hex(), sorted(unreadable)


def list_files(root: str) -> list[str]:
    """Every regular file and symlink under *root*, relative and sorted, not following symlinks."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if name in dirnames and not os.path.islink(path):
                continue
            found.append(name if rel_dir == "." else f"{rel_dir.replace(os.sep, '/')}/{name}")
    return sorted(found)


def distributions() -> tuple[dict[str, list[str]], dict[str, str]]:
    """Installed distributions by normalised name (every version found) and where each lives."""
    from importlib import metadata

    found: dict[str, list[str]] = {}
    where: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))
        found.setdefault(key, []).append(dist.version)
        where.setdefault(key, str(getattr(dist, "_path", "")))
    return {k: sorted(v) for k, v in sorted(found.items())}, dict(sorted(where.items()))


def source_report(entry: dict) -> dict:
    path = entry["path"]
    report: dict = {"path": path, "exists": os.path.isdir(path), "commit_marker": None, "tree": None, "unreadable": []}
    if not report["exists"]:
        return report
    try:
        with open(os.path.join(path, COMMIT_MARKER), encoding="utf-8") as handle:
            report["commit_marker"] = handle.read().strip()
    except OSError:
        pass
    report["tree"], report["unreadable"] = git_tree_sha(path, entry["files"])
    return report


def main(argv: list[str]) -> int:
    manifest_path = argv[1] if len(argv) > 1 else DEFAULT_MANIFEST
    with open(manifest_path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    found, where = distributions()
    report = {
        "report_version": REPORT_VERSION,
        "manifest": manifest_path,
        "lock_sha256": manifest.get("lock_sha256"),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "distributions": found,
        "locations": where,
        "sources": {s["name"]: source_report(s) for s in manifest.get("sources", [])},
    }
    json.dump(report, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
