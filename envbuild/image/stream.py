"""What the engine's BuildKit receives, streamed from an assembled context directory (:mod:`.assemble`);
each build gets only what it reads (:mod:`.render`): the tools image's (:func:`tools_context`), the
packages image's on it (:func:`packages_context`: no package file reaches a layer), and the image's
(:func:`buildkit_context`; the in-image check's files are a layer envbuild writes at normalising: :mod:`.normalise`).

Headers carry a fixed mode and mtime, owner 0:0 and no owner names; every RUN that reads them sets the
times of what it writes itself, so no mtime here reaches a layer (BuildKit's cache keys leave them out
too). Through the Engine API nothing is written to disk: the tar is made as the engine reads it; the
docker CLI's transport reads a directory instead (:func:`write_entries`).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from envbuild.engine.calls import chunks_of
from envbuild.engine.transfer import ContextStream, TarSink
from envbuild.fileio import content_mtime_ns, link_or_copy
from envbuild.image.assemble import BuildContext
from envbuild.image.plan import INSTALLER_DIR, UV_BINARY, ContextPlan
from envbuild.image.render import (
    PACKAGES_EPOCH,
    load_template,
    render_buildkit_packages_script,
    render_packages_dockerfile,
    render_tools_dockerfile,
    render_tools_script,
)

_DIR_MODE = 0o755


@dataclass(frozen=True)
class Entry:
    """One member of a context tar: a directory, a file (from disk or bytes) or a symlink."""

    name: str
    kind: str  # dir | file | symlink
    mode: int
    mtime: int
    path: Path | None = None  # a file's data on disk
    data: bytes | None = None  # or in memory
    target: str = ""  # a symlink's
    size: int = 0
    linkable: bool = False  # a file of the file cache: its content never changes under its name


def _dirs_to(name: str, mtime: int, have: set[str]) -> list[Entry]:
    """The directory entries on the way to ``name`` that ``have`` lacks (added to it)."""
    out = []
    parts = PurePosixPath(name).parts[:-1]
    for depth in range(1, len(parts) + 1):
        directory = "/".join(parts[:depth])
        if directory not in have:
            have.add(directory)
            out.append(Entry(directory, "dir", _DIR_MODE, mtime))
    return out


def _tree(root: Path, prefix: str) -> list[Entry]:
    """Every entry under ``root`` (a kept tree, :mod:`.treestore`) as ``prefix/<relative path>``, with its
    own mode and mtime; links are never followed, files are hard-linked into a sync directory (a kept
    tree's files never change, and their mtimes are made from their content)."""
    entries = [Entry(prefix, "dir", _DIR_MODE, int(root.lstat().st_mtime))]  # the tree's own directory
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            info = path.lstat()
            inside = f"{prefix}/{path.relative_to(root).as_posix()}"
            mode, mtime = stat.S_IMODE(info.st_mode), int(info.st_mtime)
            if stat.S_ISLNK(info.st_mode):
                entries.append(Entry(inside, "symlink", mode, mtime, target=str(path.readlink())))
            elif stat.S_ISDIR(info.st_mode):
                entries.append(Entry(inside, "dir", mode, mtime))
            elif stat.S_ISREG(info.st_mode):
                entries.append(Entry(inside, "file", mode, mtime, path=path, size=info.st_size, linkable=True))
    return entries


def _file(name: str, path: Path, mode: int, mtime: int, *, linkable: bool = False) -> Entry:
    return Entry(name, "file", mode, mtime, path=path, size=path.stat().st_size, linkable=linkable)


def _data(name: str, data: bytes, mode: int, mtime: int) -> Entry:
    return Entry(name, "file", mode, mtime, data=data, size=len(data))


def stream(entries: list[Entry]) -> ContextStream:
    """The entries (with every missing parent directory) as a tar made on demand, sorted by name."""
    have = {e.name for e in entries if e.kind == "dir"}
    complete = list(entries)
    for entry in entries:
        complete += _dirs_to(entry.name, entry.mtime, have)
    ordered = sorted(complete, key=lambda e: e.name.encode("utf-8", "surrogateescape"))

    def chunks() -> Iterator[bytes]:
        sink = TarSink()
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for entry in ordered:
                info = tarfile.TarInfo(entry.name)  # owner 0:0 and no owner names: a TarInfo's own
                info.mode, info.mtime, info.size = entry.mode, entry.mtime, entry.size  # size: 0 but for a file
                if entry.kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif entry.kind == "symlink":
                    info.type, info.linkname = tarfile.SYMTYPE, entry.target
                    tar.addfile(info)
                elif entry.data is not None:
                    tar.addfile(info, io.BytesIO(entry.data))
                else:
                    assert entry.path is not None
                    with open(entry.path, "rb") as data:
                        tar.addfile(info, data)
                yield from sink.drain()
        yield from sink.drain()

    return ContextStream(chunks, sum(e.size for e in ordered), write_to=lambda root: write_entries(ordered, root))


def write_entries(entries: list[Entry], root: Path) -> None:
    """The entries (sorted, parents first) as files under the empty directory ``root``, for the docker
    CLI's transport, each with the entry's mode. The CLI syncs a directory into BuildKit's copy of the
    last one at the same path and sends only the files whose size, mode or mtime changed, so every file
    here has an mtime that changes with its content: a package file is hard-linked from the cache (its
    content never changes under its name there, and the cache's inode keeps the time it was written),
    every other file is written with an mtime made from its sha256. No mtime here reaches a layer:
    every RUN sets the times of what it writes."""
    directories = []
    for entry in entries:
        target = root / entry.name
        if entry.kind == "dir":
            target.mkdir(exist_ok=True)
            directories.append(entry)
        elif entry.kind == "symlink":
            target.symlink_to(entry.target)  # compared by its target
            os.utime(target, (entry.mtime, entry.mtime), follow_symlinks=False)
        elif entry.linkable and entry.path is not None:
            link_or_copy(entry.path, target)
        else:
            digest, content = hashlib.sha256(), entry.path if entry.data is None else (entry.data,)
            assert content is not None
            with target.open("wb") as out:
                for chunk in chunks_of(content):
                    digest.update(chunk)
                    out.write(chunk)
            target.chmod(entry.mode)
            stamp = content_mtime_ns(digest.digest())
            os.utime(target, ns=(stamp, stamp))
    for entry in reversed(directories):  # children first: writing into a directory moves its mtime
        (root / entry.name).chmod(entry.mode)
        os.utime(root / entry.name, (entry.mtime, entry.mtime))


def sync_dir(cache_dir: Path, lock_name: str, build: str) -> Path:
    """Where the docker CLI's transport writes one build's context (``build``: tools, packages, image),
    while ``lock_name_held``: one path per lock and build, by which the CLI names BuildKit's synced copy
    of the context, so that a rebuild sends only what changed (:func:`write_entries`)."""
    return cache_dir / "image" / "sync" / lock_name / build


def buildkit_context(context: BuildContext, dockerfile: str) -> ContextStream:
    """The image's build context on BuildKit: ``Dockerfile``, ``tools/`` (the tools stage's script and
    clamp-mtimes) and each source's tree as ``src/<name>/``, each bind-mounted by the RUN that reads it."""
    plan, epoch = context.plan, context.plan.epoch
    entries = [_data("Dockerfile", dockerfile.encode(), 0o644, epoch), *_tools_entries()]
    if plan.installer is not None and any(source.mode != "none" for source in plan.sources):
        entries.append(_file(UV_BINARY, context.path / UV_BINARY, 0o555, epoch, linkable=True))
        script = load_template("stage_packages.py.in").encode()
        entries.append(_data(f"{INSTALLER_DIR}/stage_packages.py", script, 0o644, epoch))
    for source in plan.sources:
        entries += _tree(context.source_dir(source.name), source.context_path)
    return stream(entries)


def _tools_entries() -> list[Entry]:
    return [
        _data("tools/tools.sh", render_tools_script().encode(), 0o644, PACKAGES_EPOCH),
        _data("tools/clamp-mtimes", load_template("clamp-mtimes.sh.in").encode(), 0o755, PACKAGES_EPOCH),
    ]


def tools_context(plan: ContextPlan) -> ContextStream:
    """The tools image's build context: ``Dockerfile`` and ``tools/`` (a few kilobytes)."""
    return stream(
        [_data("Dockerfile", render_tools_dockerfile(plan).encode(), 0o644, PACKAGES_EPOCH), *_tools_entries()]
    )


def packages_context(context: BuildContext) -> ContextStream:
    """The packages image's build context on BuildKit: ``Dockerfile`` and ``packages/`` (``wheels/<file>``,
    ``requirements.txt``, ``stage_packages.py``, ``packages.sh``, the lock's ``uv``), which its install step
    bind-mounts."""
    plan, epoch, top = context.plan, PACKAGES_EPOCH, "packages"
    entries = [_data("Dockerfile", render_packages_dockerfile(plan).encode(), 0o644, epoch)]
    entries += [
        _file(f"{top}/wheels/{p.name}", p, 0o444, epoch, linkable=True)
        for p in sorted((context.path / "wheels").iterdir())
    ]
    entries += [
        _file(f"{top}/requirements.txt", context.path / "envbuild" / "requirements.txt", 0o644, epoch),
        _data(f"{top}/stage_packages.py", load_template("stage_packages.py.in").encode(), 0o644, epoch),
        _data(f"{top}/packages.sh", render_buildkit_packages_script(plan).encode(), 0o644, epoch),
    ]
    if plan.installer is not None:
        entries.append(_file(f"{top}/uv", context.path / UV_BINARY, 0o555, epoch, linkable=True))
    return stream(entries)
