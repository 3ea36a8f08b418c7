"""Write a git tree, streamed by ``git archive`` as a tar archive, into a directory without following links.

A pinned tree is upstream code: hostile input. ``tarfile``'s extraction filters decide whether a member
stays inside the destination by resolving its path (``os.path.realpath``), which the kernel does not
necessarily agree with: a tree holding two entries of one name (a symlink and a directory) and a chain
of symlinks whose expansion passes ``PATH_MAX`` makes the check say "inside" while ``open`` follows the
links out (CVE-2025-4517; Python 3.11 before the fix is affected). So no path is ever resolved here:

- every directory is opened relative to its parent's descriptor with ``O_DIRECTORY | O_NOFOLLOW``
  (a symlink where a directory is expected fails with ``ELOOP``), starting from the destination;
- a file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and a symlink with ``symlinkat``, so nothing
  that exists is ever replaced or written through (a duplicate name fails with ``EEXIST``);
- every member must be a regular file, a directory or a symlink whose path is relative, with no empty,
  ``.``, ``..`` or ``.git`` component; anything else (hard links, devices, FIFOs) is refused.

A symlink's target is only data: it is written, never followed, so it may point anywhere. What the
tree may do is bounded by the directory it is written into. Every refusal names the member's path.
"""

from __future__ import annotations

import errno
import os
import shutil
import tarfile
from pathlib import Path
from typing import IO, BinaryIO

from envbuild.errors import EnvbuildError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class TreeWriteError(EnvbuildError):
    """A member of the tree cannot be written safely; nothing outside the destination was touched."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{printable(path)}: {reason}")


def printable(path: str) -> str:
    """A path for a message: a name that is not UTF-8 shows its bytes escaped, not as a traceback."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def components(name: str) -> list[str]:
    """The path's components, or :class:`TreeWriteError` when it is not a safe relative path."""
    if name.startswith("/"):
        raise TreeWriteError(name, "an absolute path")
    parts = name.rstrip("/").split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise TreeWriteError(name, f"a path with a {part or 'empty'!r} component")
        if part.lower() == ".git":
            raise TreeWriteError(name, "a path with a .git component")
    return parts


class _Writer:
    """The descriptors of the directories on the current path, and every name written so far."""

    def __init__(self, root_fd: int) -> None:
        self.stack: list[tuple[str, int]] = [("", root_fd)]  # (relative path, fd), root first
        self.dirs: set[str] = {""}
        self.leaves: set[str] = set()

    def close(self) -> None:
        for _, fd in self.stack[1:]:
            os.close(fd)
        del self.stack[1:]

    def directory(self, parts: list[str], member: str) -> int:
        """The descriptor of the directory ``parts``, creating what is missing below the destination."""
        # Keep the longest prefix of the stack that is a prefix of this path; close the rest.
        depth = 0
        while depth + 1 < len(self.stack) and depth < len(parts):
            if self.stack[depth + 1][0] != "/".join(parts[: depth + 1]):
                break
            depth += 1
        for _, fd in self.stack[depth + 1 :]:
            os.close(fd)
        del self.stack[depth + 1 :]
        for index in range(depth, len(parts)):
            rel = "/".join(parts[: index + 1])
            if rel in self.leaves:
                raise TreeWriteError(member, f"{printable(rel)} is a file or symlink in the tree and also a directory")
            parent = self.stack[-1][1]
            if rel not in self.dirs:
                try:
                    os.mkdir(parts[index], 0o755, dir_fd=parent)
                except FileExistsError:
                    raise TreeWriteError(member, f"{printable(rel)} already exists") from None
                except OSError as exc:  # ENAMETOOLONG: a name git holds and the file system cannot
                    raise TreeWriteError(member, f"cannot create directory {printable(rel)}: {exc.strerror}") from None
                self.dirs.add(rel)
            try:
                fd = os.open(parts[index], _DIR_FLAGS, dir_fd=parent)
            except OSError as exc:  # ELOOP: a symlink where a directory must be; never followed
                raise TreeWriteError(member, f"cannot open directory {printable(rel)}: {exc.strerror}") from None
            self.stack.append((rel, fd))
        return self.stack[-1][1]

    def claim(self, rel: str, member: str) -> None:
        if rel in self.leaves or rel in self.dirs:
            raise TreeWriteError(member, "a duplicate entry (the tree holds this name twice)")
        self.leaves.add(rel)


def open_below(dest: Path, at: str) -> int:
    """A descriptor of the directory ``at`` below ``dest``, every component opened relative to its parent
    without following a link, and that directory empty: where a submodule's tree goes (its parent's tree
    left an empty directory for the gitlink). ``at`` empty: ``dest`` itself."""
    fd = os.open(dest, _DIR_FLAGS)
    try:
        for part in components(at) if at else []:
            try:
                below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # ELOOP: a symlink on the way; never followed
                raise TreeWriteError(at, f"cannot open directory {printable(part)}: {exc.strerror}") from None
            os.close(fd)
            fd = below
        if at and os.listdir(fd):
            raise TreeWriteError(at, "is not the empty directory of a gitlink")
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_tar_tree(archive: BinaryIO, dest: Path, *, at: str = "") -> int:
    """Write every member of the tar stream ``archive`` below ``dest`` (an existing, empty directory) or,
    with ``at``, below that directory inside it (:func:`open_below`: a submodule's place); return the
    number of files and symlinks written. On :class:`TreeWriteError` the caller removes ``dest``: what
    was written so far is below it and nowhere else."""
    root_fd = open_below(dest, at)
    writer = _Writer(root_fd)
    written = 0
    try:
        with tarfile.open(fileobj=archive, mode="r|") as tar:
            for member in tar:
                parts = components(member.name)
                rel = "/".join(parts)
                if member.isdir():
                    writer.directory(parts, member.name)
                    continue
                if not (member.isreg() or member.issym()):
                    raise TreeWriteError(
                        member.name,
                        f"an entry of tar type {member.type!r}: only files, directories and symlinks are allowed",
                    )
                parent = writer.directory(parts[:-1], member.name)
                writer.claim(rel, member.name)
                if member.issym():
                    _symlink(member, parts[-1], parent)
                else:
                    source = tar.extractfile(member)
                    assert source is not None  # a regular member always has data
                    _file(member, parts[-1], parent, source)
                written += 1
    except tarfile.TarError as exc:
        raise TreeWriteError("(archive)", f"not a readable tar stream: {exc}") from None
    finally:
        writer.close()
        os.close(root_fd)
    return written


def _symlink(member: tarfile.TarInfo, name: str, parent: int) -> None:
    try:
        os.symlink(member.linkname, name, dir_fd=parent)
    except FileExistsError:
        raise TreeWriteError(member.name, "a duplicate entry (the tree holds this name twice)") from None


def _file(member: tarfile.TarInfo, name: str, parent: int, source: IO[bytes]) -> None:
    mode = 0o755 if member.mode & 0o100 else 0o644
    try:
        fd = os.open(name, _FILE_FLAGS, mode, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise TreeWriteError(member.name, "a duplicate entry (the tree holds this name twice)") from None
        raise TreeWriteError(member.name, f"cannot create: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out, _CHUNK)
