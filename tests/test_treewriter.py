"""Writing a git tree into a directory: exact for real trees, and nothing ever lands outside for hostile ones.

The hostile archives are written here with ``tarfile`` as an upstream could make ``git archive`` emit
them (or worse); each must be refused with one line naming the member, and the directory beside the
destination — where an escape would land — must stay empty.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild.git import treehash
from envbuild.git.treewriter import TreeWriteError, write_tar_tree
from tests.lib.gitrepos import git, make_repo

Member = tuple[str, str, bytes | str]  # (name, kind, data or link target)


def archive(members: list[Member]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(data, bytes)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
                "chardev": tarfile.CHRTYPE,
            }[kind]
            if kind in ("symlink", "hardlink"):
                assert isinstance(data, str)
                info.linkname = data
            tar.addfile(info)
    buffer.seek(0)
    return buffer


@pytest.fixture()
def box(tmp_path: Path) -> tuple[Path, Path]:
    """(dest, outside): the destination, and a directory beside it where an escape would write."""
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    return dest, outside


def everything_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_a_real_tree_is_written_exactly(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "up")
    files = {
        "pkg/__init__.py": "x = 1\n",
        "run.sh": "#!/bin/sh\necho hi\n",
        "data/deep/er/table.csv": "a,b\n",
        "ünïcode.txt": "utf-8 names\n",
    }
    repo.commit("files", files=files)
    (repo.path / "run.sh").chmod(0o755)
    os.symlink("pkg/__init__.py", repo.path / "link")
    os.symlink("../../outside/anything", repo.path / "dangling")  # data only: never followed
    commit = repo.commit("exec bit and links", files={})
    blob = subprocess.run(
        ["git", "-C", str(repo.path), "archive", "--format=tar", commit], capture_output=True, check=True
    ).stdout
    dest = tmp_path / "dest"
    dest.mkdir()
    written = write_tar_tree(io.BytesIO(blob), dest)
    listed = treehash.list_files(str(dest))
    assert written == len(listed) >= 6
    tree, unreadable = treehash.git_tree_sha(str(dest), listed)
    assert (tree, unreadable) == (repo.tree(commit), [])
    assert os.readlink(dest / "dangling") == "../../outside/anything"
    assert os.access(dest / "run.sh", os.X_OK)


def test_a_file_name_that_is_not_utf8_is_written_byte_for_byte(tmp_path: Path) -> None:
    name = os.fsdecode(b"caf\xe9.txt")  # Latin-1: not UTF-8
    dest = tmp_path / "dest"
    dest.mkdir()
    write_tar_tree(archive([(name, "file", b"x\n")]), dest)
    assert os.listdir(os.fsencode(dest)) == [b"caf\xe9.txt"]


HOSTILE: dict[str, Callable[[Path], list[Member]]] = {
    "write through a symlink to a directory outside": lambda out: [
        ("a", "symlink", str(out)),
        ("a/evil", "file", b"pwned"),
    ],
    "a symlink and a directory of one name": lambda out: [
        ("a", "symlink", str(out)),
        ("a/", "dir", b""),
        ("a/evil", "file", b"pwned"),
    ],
    "a relative symlink up and out": lambda out: [
        ("up", "symlink", "../outside"),
        ("up/evil", "file", b"pwned"),
    ],
    "a duplicate file": lambda out: [("x", "file", b"one"), ("x", "file", b"two")],
    "a file then a symlink of the same name": lambda out: [("x", "file", b"one"), ("x", "symlink", str(out))],
    "a dot-dot path": lambda out: [("../outside/evil", "file", b"pwned")],
    "a dot-dot inside the path": lambda out: [("a/../../outside/evil", "file", b"pwned")],
    "an absolute path": lambda out: [(str(out / "evil"), "file", b"pwned")],
    "a .git directory": lambda out: [(".git/hooks/post-checkout", "file", b"#!/bin/sh\n")],
    "a .GIT directory in any case": lambda out: [("sub/.GiT/config", "file", b"[core]\n")],
    "a hard link": lambda out: [("x", "file", b"one"), ("y", "hardlink", "x")],
    "a hard link to a file outside": lambda out: [("y", "hardlink", str(out / "target"))],
    "a fifo": lambda out: [("pipe", "fifo", b"")],
    "a device": lambda out: [("dev", "chardev", b"")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_archive_is_refused_and_nothing_lands_outside(case: str, box: tuple[Path, Path]) -> None:
    dest, outside = box
    (outside / "target").write_bytes(b"original")
    with pytest.raises(TreeWriteError) as refused:
        write_tar_tree(archive(HOSTILE[case](outside)), dest)
    assert "\n" not in str(refused.value)
    assert everything_under(outside) == ["target"]
    assert (outside / "target").read_bytes() == b"original"


def test_the_path_max_symlink_chain_cannot_write_outside(box: tuple[Path, Path]) -> None:
    """The shape of CVE-2025-4517: directories with long names, a symlink per level, and a final link
    whose expansion passes PATH_MAX, so a lexical realpath stops resolving and calls the escape inside.
    Nothing here resolves a path: the first member that goes through a symlink is refused."""
    dest, outside = box
    component = "d" * 247
    steps = "abcdefghijklmnop"
    members: list[Member] = []
    path = ""
    for step in steps:
        members.append((f"{path}{component}/", "dir", b""))
        members.append((f"{path}{step}", "symlink", component))
        path = f"{path}{component}/"
    link = "/".join(steps) + "/" + "l" * 254
    members.append((link, "symlink", "/".join([".."] * len(steps))))
    members.append(("escape", "symlink", f"{link}/../{'../' * 2}outside"))
    members.append(("escape/evil", "file", b"pwned"))
    with pytest.raises(TreeWriteError, match=r": a is a file or symlink in the tree and also a directory$"):
        write_tar_tree(archive(members), dest)
    assert everything_under(outside) == []


def test_refusals_name_the_member_without_a_traceback(box: tuple[Path, Path]) -> None:
    dest, _ = box
    name = os.fsdecode(b"bad\xff/name")
    with pytest.raises(TreeWriteError, match=r"^bad\\xff/name: a duplicate entry"):
        write_tar_tree(archive([(name, "file", b"1"), (name, "file", b"2")]), dest)


def test_git_fsck_refuses_a_tree_with_duplicate_entries_at_the_fetch(tmp_path: Path) -> None:
    """The first line of defence: the export fetch runs with fetch.fsckObjects, and git calls a tree
    with two entries of one name malformed (the tree writer is the second line)."""
    up = make_repo(tmp_path / "up")
    up.commit("base")
    blob = git("hash-object", "-w", "--stdin", cwd=up.path, stdin=b"pwned\n")
    entry = b"100644 x\0" + bytes.fromhex(blob)
    tree = git("hash-object", "-w", "-t", "tree", "--literally", "--stdin", cwd=up.path, stdin=entry + entry)
    commit = git("commit-tree", tree, "-m", "duplicate entries", cwd=up.path)
    git("update-ref", "refs/heads/evil", commit, cwd=up.path)
    down = tmp_path / "down.git"
    git("init", "--bare", "-q", str(down))
    refused = subprocess.run(
        ["git", "-C", str(down), "-c", "fetch.fsckObjects=true", "fetch", "-q", up.path.as_uri(), "evil"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0
    assert "duplicateEntries" in refused.stderr
