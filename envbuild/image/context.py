"""The build context: planned from a lock (pure), then assembled on disk from the verified caches.

Layout of an assembled context (everything the Dockerfile COPYs, nothing else)::

    Dockerfile
    wheels/<filename>                 every package file of the lock, checked against its sha256
    envbuild/requirements.txt         name==version --hash=sha256:... for pip --require-hashes
    envbuild/manifest.json            what the in-image check compares against
    envbuild/inimage_check.py         the in-image check itself
    src/<name>/...                    each source: the exact tree of its pinned commit
    src/<name>/.envbuild-commit       the commit, for people; the check recomputes the tree instead

Every file and directory gets a fixed mode and the lock's epoch as mtime, so the same inputs give a
byte-identical context and the engine's COPY cache keys do not depend on when the context was made.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from envbuild.errors import EnvbuildError, InputError
from envbuild.filecache import sha256_file
from envbuild.image import inimage_check
from envbuild.lock.model import Lock, Package, PackageFile, Source

MANIFEST_VERSION = 1
IMAGE_ROOT = "/opt/envbuild"
IMAGE_SRC = f"{IMAGE_ROOT}/src"
IMAGE_META = f"{IMAGE_ROOT}/meta"
IMAGE_WHEELS = f"{IMAGE_ROOT}/wheels"
COMMIT_MARKER = inimage_check.COMMIT_MARKER

ExportSource = Callable[[Source, Path], None]
FileFor = Callable[[Package, PackageFile], Path]


class ContextError(EnvbuildError):
    """The build context cannot be made: a package file or a source tree is not what the lock pins."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = sorted(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class SourcePlan:
    """One source as the image gets it, in layer order."""

    name: str
    repo: str
    ref: str
    ref_type: str
    commit: str
    tree: str | None
    mode: str  # editable | wheel | none
    env: tuple[tuple[str, str], ...]
    context_path: str  # src/<name>
    image_path: str  # /opt/envbuild/src/<name>
    source: Source  # what export_source is called with


@dataclass(frozen=True)
class FilePlan:
    package: str
    version: str
    filename: str
    sha256: str
    context_path: str  # wheels/<filename>
    entry: tuple[Package, PackageFile]  # what file_for is called with


@dataclass(frozen=True)
class ContextPlan:
    """Everything the context and the Dockerfile are made from; a pure function of the lock."""

    lock_name: str
    lock_sha256: str
    epoch: int
    base_name: str
    base_digest: str | None
    allow_unpinned: bool
    python: str | None
    cann: str | None
    sources: tuple[SourcePlan, ...]
    files: tuple[FilePlan, ...]
    requirements: str  # the text of envbuild/requirements.txt


@dataclass(frozen=True)
class BuildContext:
    """An assembled context directory and what was checked while making it."""

    path: Path
    plan: ContextPlan
    dockerfile: str
    manifest: dict
    trees: tuple[tuple[str, str], ...]  # (source name, git tree SHA of the exported files)


def layer_order(sources: tuple[Source, ...]) -> tuple[Source, ...]:
    """Tags first (they do not move), then branches; the lock's order within each.

    A moved pin rebuilds its own layer and every layer after it, so the pins least likely to move
    go first. The lock's order is kept otherwise, as it may encode a build-time dependency.
    """
    return tuple(sorted(sources, key=lambda s: s.ref_type != "tag"))


def requirements_text(lock: Lock) -> str:
    lines = ["# envbuild: installed with pip --no-index --require-hashes --no-deps; do not edit"]
    for package in sorted(lock.packages, key=lambda p: canonicalize_name(p.name)):
        hashes = " ".join(f"--hash=sha256:{f.sha256}" for f in sorted(package.files, key=lambda f: f.sha256))
        lines.append(f"{canonicalize_name(package.name)}=={package.version} {hashes}".rstrip())
    return "\n".join(lines) + "\n"


def plan_context(
    lock: Lock, *, lock_sha256: str, epoch: int | None = None, allow_unpinned: bool = False
) -> ContextPlan:
    """Decide what goes where. ``epoch`` is used when the lock fixes no ``source_date_epoch``
    (the caller computes the newest pinned commit's date from git)."""
    problems = []
    if lock.base_image is None:
        problems.append("the lock has no base_image: add base_image.name and base_image.digest")
    elif lock.base_image.digest is None and not allow_unpinned:
        problems.append(
            f"base_image {lock.base_image.name} is not pinned: add base_image.digest "
            "(`envbuild lock update` records it)"
        )
    chosen = lock.source_date_epoch if lock.source_date_epoch is not None else epoch
    if chosen is None:
        problems.append("no build epoch: set source_date_epoch in the lock or pass the newest commit's date")
    packages_without_files = [p.name for p in lock.packages if not p.files]
    if packages_without_files:
        problems.append(
            f"packages without files (run `envbuild lock update`): {', '.join(sorted(packages_without_files))}"
        )
    if problems:
        raise InputError("cannot plan the image: " + "; ".join(problems))
    assert lock.base_image is not None and chosen is not None
    sources = tuple(
        SourcePlan(
            name=s.name,
            repo=s.repo,
            ref=s.ref,
            ref_type=s.ref_type,
            commit=s.commit,
            tree=s.tree,
            mode=(s.install.mode if s.install else "editable"),
            env=tuple(sorted((s.install.env if s.install else {}).items())),
            context_path=f"src/{s.name}",
            image_path=f"{IMAGE_SRC}/{s.name}",
            source=s,
        )
        for s in layer_order(lock.sources)
    )
    files = tuple(
        FilePlan(p.name, p.version, f.filename, f.sha256, f"wheels/{f.filename}", (p, f))
        for p in sorted(lock.packages, key=lambda p: canonicalize_name(p.name))
        for f in sorted(p.files, key=lambda f: f.filename)
    )
    return ContextPlan(
        lock_name=lock.name,
        lock_sha256=lock_sha256,
        epoch=chosen,
        base_name=lock.base_image.name,
        base_digest=lock.base_image.digest,
        allow_unpinned=allow_unpinned,
        python=lock.platform.python if lock.platform else None,
        cann=lock.platform.cann if lock.platform else None,
        sources=sources,
        files=files,
        requirements=requirements_text(lock),
    )


def manifest_for(plan: ContextPlan, file_lists: dict[str, list[str]], trees: dict[str, str]) -> dict:
    return {
        "manifest_version": MANIFEST_VERSION,
        "lock_name": plan.lock_name,
        "lock_sha256": plan.lock_sha256,
        "epoch": plan.epoch,
        "python": plan.python,
        "cann": plan.cann,
        "packages": [
            {"name": canonicalize_name(n), "version": v}
            for n, v in sorted(
                {(f.package, f.version) for f in plan.files}, key=lambda item: canonicalize_name(item[0])
            )
        ],
        "sources": [
            {
                "name": s.name,
                "repo": s.repo,
                "ref": s.ref,
                "ref_type": s.ref_type,
                "commit": s.commit,
                "tree": trees[s.name],
                "mode": s.mode,
                "path": s.image_path,
                "files": file_lists[s.name],
            }
            for s in plan.sources
        ],
    }


def _json_bytes(data: object) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode()


def assemble_context(
    plan: ContextPlan, dest: str | os.PathLike[str], export_source: ExportSource, file_for: FileFor
) -> BuildContext:
    """Write the context into *dest* (absent or empty). Every package file is re-hashed and every
    source tree compared with the lock's ``tree`` before anything is written; all problems are
    reported at once, naming the package file or source."""
    from envbuild.image.render import (
        render_dockerfile,  # render imports this module's types
    )

    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise InputError(f"{dest}: the build context directory must be empty")
    dockerfile = render_dockerfile(plan)
    problems: list[str] = []

    cached: dict[str, Path] = {}
    for item in plan.files:
        try:
            path = Path(file_for(*item.entry))
            actual = sha256_file(path)
        except OSError as exc:
            problems.append(f"package {item.package} {item.version}: {item.filename}: cannot read: {exc}")
            continue
        if actual != item.sha256:
            problems.append(
                f"package {item.package} {item.version}: {item.filename} has sha256 {actual}, "
                f"the lock pins {item.sha256}"
            )
        cached[item.filename] = path

    dest.mkdir(parents=True, exist_ok=True)
    file_lists: dict[str, list[str]] = {}
    trees: dict[str, str] = {}
    for source in plan.sources:
        target = dest / source.context_path
        target.mkdir(parents=True)
        export_source(source.source, target)
        files = inimage_check.list_files(str(target))
        if COMMIT_MARKER in files:
            problems.append(f"source {source.name}: the tree holds {COMMIT_MARKER}, a name envbuild reserves")
        tree, unreadable = inimage_check.git_tree_sha(str(target), files)
        if unreadable:
            problems.append(f"source {source.name}: exported entries that are not files: {', '.join(unreadable[:5])}")
        if source.tree is not None and tree != source.tree:
            problems.append(
                f"source {source.name}: the exported tree of {source.commit} is {tree}, "
                f"the lock pins tree {source.tree}"
            )
        file_lists[source.name], trees[source.name] = files, tree
        (target / COMMIT_MARKER).write_text(source.commit + "\n", encoding="ascii")
    if problems:
        shutil.rmtree(dest / "src", ignore_errors=True)  # nothing half-made is left to be built
        raise ContextError(problems)

    wheels = dest / "wheels"
    wheels.mkdir()
    for item in plan.files:
        _link_or_copy(cached[item.filename], dest / item.context_path)
    meta = dest / "envbuild"
    meta.mkdir()
    manifest = manifest_for(plan, file_lists, trees)
    (meta / "manifest.json").write_bytes(_json_bytes(manifest))
    (meta / "requirements.txt").write_text(plan.requirements, encoding="utf-8")
    shutil.copyfile(inimage_check.__file__, meta / "inimage_check.py")
    (dest / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    _fix_metadata(dest, plan.epoch)
    return BuildContext(dest, plan, dockerfile, manifest, tuple(sorted(trees.items())))


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link a cached file (cheap for multi-GB wheels); copy across file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _fix_metadata(root: Path, epoch: int) -> None:
    """Fixed modes and mtimes: 0755 for directories and executables, 0644 for other files, 0444 for
    wheels (they may be hard links into the cache, which must stay read-only)."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames + dirnames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                os.utime(path, (epoch, epoch), follow_symlinks=False)
                continue
            if stat.S_ISDIR(info.st_mode):
                mode = 0o755
            elif os.path.basename(dirpath) == "wheels" and os.path.dirname(dirpath) == str(root):
                mode = 0o444
            else:
                mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
            os.chmod(path, mode)
            os.utime(path, (epoch, epoch))
    os.chmod(root, 0o755)
    os.utime(root, (epoch, epoch))
