"""The build context, assembled on disk from a plan (:mod:`envbuild.image.plan`) and the verified caches.

Layout of an assembled context (everything the Dockerfile COPYs, nothing else)::

    Dockerfile
    wheels/<filename>                 every package file of the lock, checked against its sha256
    installer/<filename>              the lock's uv wheel, when it pins an installer (the packages step runs it)
    envbuild/requirements.txt         name==version --hash=sha256:... for pip --require-hashes
    envbuild/manifest.json            what the in-image check compares against
    envbuild/inimage_probe.py         the in-image check itself
    envbuild/treehash.py              the tree hashing it uses (envbuild.git.treehash)

and each source's tree (``src/<name>`` in the streamed context): the exact tree of its pinned commit,
with the exact tree of every submodule the image gets at its path (a skipped one: the empty directory
of its gitlink) and ``.envbuild-commit`` (the commit, for people; the check recomputes the trees),
kept once per commit in the tree store and read from there (:mod:`.treestore`).

Every file and directory gets a fixed mode and the lock's epoch as mtime (a wheel keeps the cache's
mtime: it is a hard link; a kept tree's files, mtimes made from their content), so the same inputs give
the same context and the engine's cache keys do not depend on when the context was made.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from envbuild.errors import InputError, ProblemsError
from envbuild.fileio import link_or_copy, settle_tree, sha256_file, write_atomic
from envbuild.git import treehash
from envbuild.image import inimage_probe
from envbuild.image.installer import uv_binary
from envbuild.image.plan import MANIFEST_VERSION, UV_BINARY, ContextPlan, SourcePlan
from envbuild.image.treestore import COMMIT_MARKER, ExportSource, KeptTree, StoreError, TreeStore
from envbuild.lock.model import Package, PackageFile

__all__ = ["COMMIT_MARKER", "BuildContext", "ContextError", "ExportSource", "FileFor", "assemble_context"]

FileFor = Callable[[Package, PackageFile], Path]


class ContextError(ProblemsError):
    """The build context cannot be made: a package file or a source tree is not what the lock pins, or
    (``fault``) a file of the cache cannot be read: the machine's fault, not the lock's."""

    def __init__(self, problems: list[str], *, fault: bool = False) -> None:
        super().__init__(problems)
        self.fault = fault


@dataclass(frozen=True)
class BuildContext:
    """An assembled context directory and what was checked while making it."""

    path: Path
    plan: ContextPlan
    dockerfile: str
    manifest: dict
    trees: tuple[tuple[str, str], ...]  # (source name, git tree SHA of the exported files)
    source_dirs: tuple[tuple[str, Path], ...] = ()  # (source name, its kept tree's directory)

    def source_dir(self, name: str) -> Path:
        return dict(self.source_dirs)[name]


def manifest_for(plan: ContextPlan, kept: dict[str, KeptTree]) -> dict:
    """What the in-image check compares against: the plan, with each source's files and trees as ``kept``
    (exported and checked)."""
    return {
        "manifest_version": MANIFEST_VERSION,
        "lock_name": plan.lock_name,
        "lock_sha256": plan.lock_sha256,
        "epoch": plan.epoch,
        "python": plan.python,
        "cann": plan.cann,
        "packages": _package_entries(plan),
        "sources": [
            {
                "name": s.name,
                "repo": s.repo,
                "ref": s.ref,
                "ref_type": s.ref_type,
                "commit": s.commit,
                "tree": kept[s.name].tree,
                "mode": s.mode,
                "path": s.image_path,
                "files": list(kept[s.name].files),
                "distribution": s.distribution,
                "waive": [{"name": n, "reason": r} for n, r in s.waive],
                "skip_imports": [{"name": n, "reason": r} for n, r in s.skip_imports],
            }
            | ({"submodules": _submodule_entries(s, kept[s.name].submodule_trees)} if s.submodules else {})
            for s in plan.sources
        ],
    }


def _submodule_entries(source: SourcePlan, trees: dict[str, str]) -> list[dict[str, Any]]:
    """A source's submodules, every level (only for a source that has any: the manifest of a lock without
    submodules stays as it was)."""
    return [
        {"path": sub.path, "commit": sub.commit, "tree": trees.get(sub.path), "skip": sub.skip}
        for sub in source.submodules
    ]


def _package_entries(plan: ContextPlan) -> list[dict[str, Any]]:
    """One entry per package the image installs, by normalised name, with the requirements it waives (the
    in-image check forgives these, as it does a source's) when it waives any: the manifest of a lock
    without package waivers stays as it was."""
    packages = {canonicalize_name(f.package): f.entry[0] for f in plan.files}
    return [
        {"name": name, "version": package.version}
        | ({"waive": [{"name": w.name, "reason": w.reason} for w in package.waive]} if package.waive else {})
        for name, package in sorted(packages.items())
    ]


def assemble_context(
    plan: ContextPlan,
    dockerfile: str,
    dest: str | os.PathLike[str],
    export_source: ExportSource,
    file_for: FileFor,
    *,
    store: TreeStore,
    rehash: bool = True,
    installer_binary: Callable[[Path], Path] | None = None,
) -> BuildContext:
    """Write the context into *dest* (absent or empty): ``dockerfile`` (rendered from ``plan``) and the
    package files, and take each source's tree from ``store`` (exported there first where it has none).
    Every package file is re-hashed (unless ``rehash=False``: files from the content-addressed cache,
    checked when they entered it, and checked again by ``pip --require-hashes`` where they are installed)
    and every source tree compared with the lock's ``tree`` before anything is written; all problems are
    reported at once, naming the package file or source. The lock's installer: its wheel and its binary
    (``installer/uv``), linked from ``installer_binary(wheel)`` (the kept one,
    :func:`.installer.uv_binary_file`), or read out of the wheel into the context."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise InputError(f"{dest}: the build context directory must be empty")
    problems: list[str] = []
    fault = False

    cached: dict[str, Path] = {}
    for item in (*plan.files, *((plan.installer,) if plan.installer else ())):
        try:
            path = Path(file_for(*item.entry))
            if rehash:
                actual = sha256_file(path)
            else:
                path.stat()  # there and readable: its name in the cache is its checked sha256
                actual = item.sha256
        except OSError as exc:
            problems.append(f"package {item.package} {item.version}: {item.filename}: cannot read: {exc}")
            fault = True
            continue
        if actual != item.sha256:
            problems.append(
                f"package {item.package} {item.version}: {item.filename} has sha256 {actual}, "
                f"the lock pins {item.sha256}"
            )
        cached[item.filename] = path

    kept: dict[str, KeptTree] = {}
    for source in plan.sources:
        try:
            tree = store.kept(source, export_source)
        except StoreError as exc:  # names the source; kept with the other problems
            problems.append(str(exc))
            continue
        found = _tree_problems(source, tree)
        if found:
            problems += found
        else:
            kept[source.name] = tree
    if problems:
        raise ContextError(problems, fault=fault)

    dest.mkdir(parents=True, exist_ok=True)
    wheels = dest / "wheels"
    wheels.mkdir()
    for item in plan.files:
        link_or_copy(cached[item.filename], dest / item.context_path)
    if plan.installer is not None:
        (dest / "installer").mkdir()
        wheel = cached[plan.installer.filename]
        link_or_copy(wheel, dest / plan.installer.context_path)
        if installer_binary is not None:
            link_or_copy(installer_binary(wheel), dest / UV_BINARY)
        else:
            write_atomic(dest / UV_BINARY, uv_binary(wheel, plan.installer), mode=0o555)
    meta = dest / "envbuild"
    meta.mkdir()
    manifest = manifest_for(plan, kept)
    (meta / "manifest.json").write_bytes((json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    (meta / "requirements.txt").write_text(plan.requirements, encoding="utf-8")
    shutil.copyfile(inimage_probe.__file__, meta / "inimage_probe.py")
    shutil.copyfile(treehash.__file__, meta / "treehash.py")  # the probe imports it from beside itself
    (dest / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    _fix_metadata(dest, plan.epoch)
    return BuildContext(
        dest,
        plan,
        dockerfile,
        manifest,
        tuple(sorted((name, tree.tree) for name, tree in kept.items())),
        tuple((name, tree.path) for name, tree in kept.items()),
    )


def _tree_problems(source: SourcePlan, kept: KeptTree) -> list[str]:
    """What of a kept tree the lock does not pin: checked on every build (another lock may pin other trees
    for the same commit)."""
    problems = []
    if COMMIT_MARKER in kept.files:  # listed before envbuild wrote its own: the commit's tree holds one
        problems.append(f"source {source.name}: the tree holds {COMMIT_MARKER}, a name envbuild reserves")
    if kept.unreadable:
        problems.append(f"source {source.name}: exported entries that are not files: {', '.join(kept.unreadable[:5])}")
    if source.tree is not None and kept.tree != source.tree:
        problems.append(
            f"source {source.name}: the exported tree of {source.commit} is {kept.tree}, the lock pins tree {source.tree}"
        )
    for sub in source.submodules:
        if sub.skip is None and sub.tree is not None and kept.submodule_trees.get(sub.path) != sub.tree:
            problems.append(
                f"submodule {source.name}/{sub.path}: the exported tree of {sub.commit} is "
                f"{kept.submodule_trees.get(sub.path)}, the lock pins tree {sub.tree}"
            )
    return problems


META_FILES = ("inimage_probe.py", "treehash.py", "manifest.json", "requirements.txt")


def meta_files(context: BuildContext) -> dict[str, bytes]:
    """What the image holds in its metadata directory (the in-image check's probe and manifest, the
    requirements), by name, from the assembled context."""
    return {name: (context.path / "envbuild" / name).read_bytes() for name in META_FILES}


def _fix_metadata(root: Path, epoch: int) -> None:
    """Fixed modes and mtimes: 0755 for directories and executables, 0644 for other files, the epoch;
    wheels 0444 and the installer's files 0444 or 0555 (its binary), with their own mtimes (they may be
    hard links into the cache, which stays read-only, and whose times say when a file came: the stream
    gives each the epoch)."""
    epoch_ns = epoch * 10**9
    settle_tree(
        root,
        dir_ns=epoch_ns,
        file_ns=lambda path: epoch_ns,
        read_only=lambda path: path.parent in (root / "wheels", root / "installer"),  # the cache's inodes
    )
