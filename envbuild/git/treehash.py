"""Git tree SHAs of files on disk, computed as ``git add`` and ``git write-tree`` would: standard library
only, so the same code runs on the host (checking an exported tree, :mod:`envbuild.git.treeexport`) and
in the image (the in-image check, :mod:`envbuild.image.inimage_probe`, ships this file beside itself).

A submodule is recorded as git records it in its parent's tree: an entry of mode 160000 naming its commit
(a *gitlink*); the files at or below it belong to the submodule's own tree.
"""

from __future__ import annotations

import hashlib
import os
import stat


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


def _below(rel: str, gitlinks: dict) -> bool:
    """Is *rel* at or below one of *gitlinks*' paths?"""
    parts = rel.split("/")
    return any("/".join(parts[: i + 1]) in gitlinks for i in range(len(parts)))


def git_tree_sha(root: str, paths: list[str], gitlinks: dict | None = None) -> tuple[str, list[str]]:
    """The git tree SHA of the files *paths* (relative, '/'-separated) under *root*, with *gitlinks*
    ({path: commit}) as git records a submodule in its parent's tree: an entry of mode 160000 naming the
    commit. Listed files at or below a gitlink belong to the submodule's tree and are left out.

    Returns the SHA and the paths that could not be read (missing, or not a file or symlink); those
    are left out of the tree, so the SHA then differs from the commit's.
    """
    gitlinks = gitlinks or {}
    entries = {path: ("160000", bytes.fromhex(commit)) for path, commit in gitlinks.items()}
    unreadable: list[str] = []
    for rel in paths:
        if gitlinks and _below(rel, gitlinks):
            continue
        try:
            entries[rel] = _entry(root, rel)
        except OSError:
            unreadable.append(rel)
    nested: dict = {}
    for path, entry in entries.items():
        node = nested
        *dirs, name = path.split("/")
        for part in dirs:
            node = node.setdefault(part, {})
        node[name] = entry

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


def git_trees(root: str, paths: list[str], gitlinks: dict, written: set) -> tuple[dict, list[str]]:
    """The tree SHA of *root* ("") and of each submodule in *written* whose files are under it: *paths*
    are every listed file (relative to *root*), *gitlinks* every level's {path from *root*: commit}. Each
    level is a tree with its own submodules as gitlinks. Returns ({path: tree}, unreadable paths)."""
    trees: dict = {}
    unreadable: list[str] = []

    def level(prefix: str) -> None:
        inside = {p[len(prefix) :]: c for p, c in gitlinks.items() if p.startswith(prefix)}
        direct = {p: c for p, c in inside.items() if not _below(p.rpartition("/")[0], inside)}
        files = [f[len(prefix) :] for f in paths if f.startswith(prefix)]
        sha, bad = git_tree_sha(os.path.join(root, prefix) if prefix else root, files, direct)
        trees[prefix.rstrip("/")] = sha
        unreadable.extend(prefix + b for b in bad)
        for path in sorted(direct):
            if prefix + path in written:
                level(prefix + path + "/")

    level("")
    return trees, sorted(unreadable)


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
