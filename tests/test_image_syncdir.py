"""envbuild.image.syncdir: a context's entries kept in a stable directory, each file's mtime made from its
content's identity, so that the docker CLI's file sync (size and mtime, never content) sends exactly
what changed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from envbuild.image.stream import Entry
from envbuild.image.syncdir import stamp, sync_directory, synced_context


def data(name: str, text: str, mode: int = 0o644) -> Entry:
    raw = text.encode()
    return Entry(name, "file", mode, 0, data=raw, size=len(raw), identity=hashlib.sha256(raw).hexdigest())


def on_disk(name: str, path: Path, identity: str, mode: int = 0o644) -> Entry:
    return Entry(name, "file", mode, 0, path=path, size=path.stat().st_size, identity=identity)


def state(root: Path) -> dict[str, tuple[int, int, bytes]]:
    return {
        p.relative_to(root).as_posix(): (p.lstat().st_mode & 0o7777, p.lstat().st_mtime_ns, p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_directory_holds_the_entries_with_mtimes_from_their_identities(tmp_path: Path) -> None:
    cached = tmp_path / "cache" / "tiny-1.0-py3-none-any.whl"
    cached.parent.mkdir()
    cached.write_bytes(b"wheel bytes")
    sha = hashlib.sha256(b"wheel bytes").hexdigest()
    entries = [
        data("Dockerfile", "FROM scratch\n"),
        data("tools/clamp-mtimes", "#!/bin/sh\n", 0o755),
        on_disk("packages/wheels/tiny-1.0-py3-none-any.whl", cached, sha, 0o444),
        Entry("src/a/link", "symlink", 0o777, 0, target="../b", identity="ab" * 32),
    ]
    dest = tmp_path / "ctx" / "packages"
    first = sync_directory(entries, dest)
    assert (first.written, first.kept, first.removed) == (4, 0, 0)
    found = state(dest)
    assert found["Dockerfile"] == (0o644, stamp(entries[0].identity), b"FROM scratch\n")
    assert found["tools/clamp-mtimes"][0] == 0o755
    wheel = dest / "packages/wheels/tiny-1.0-py3-none-any.whl"
    assert wheel.stat().st_ino == cached.stat().st_ino  # a hard link into the cache, not a copy
    assert wheel.stat().st_mtime_ns == stamp(sha) and wheel.stat().st_mode & 0o777 == 0o444
    assert (dest / "src/a/link").readlink() == Path("../b")
    assert not (tmp_path / "ctx" / "packages.staging").exists()

    again = sync_directory(entries, dest)
    assert (again.written, again.kept, again.removed) == (0, 4, 0)
    assert state(dest) == found


def test_a_same_size_edit_gets_another_mtime_and_what_left_the_context_goes(tmp_path: Path) -> None:
    """What fixed mtimes would get wrong: "X = 1" and "X = 2" have one size; at one epoch the file sync
    would keep the old file (measured: the image got the old commit's marker)."""
    dest = tmp_path / "image"
    sync_directory([data("src/beta/extra.py", "X = 1\n"), data("src/gone/old.py", "old\n")], dest)
    before = (dest / "src/beta/extra.py").stat().st_mtime_ns
    synced = sync_directory([data("src/beta/extra.py", "X = 2\n")], dest)
    assert (synced.written, synced.kept, synced.removed) == (1, 0, 1)
    assert (dest / "src/beta/extra.py").read_text() == "X = 2\n"
    assert (dest / "src/beta/extra.py").stat().st_mtime_ns != before
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == ["src", "src/beta", "src/beta/extra.py"]


def test_the_cache_file_s_mtime_set_back_is_found_as_it_was(tmp_path: Path) -> None:
    """The scratch context's assembly sets the cache file's mtime to the lock's epoch; the stable
    directory's link gets the sha256's time back, which is what the file sync saw last time."""
    cached = tmp_path / "w.whl"
    cached.write_bytes(b"w")
    sha = hashlib.sha256(b"w").hexdigest()
    entries = [on_disk("wheels/w.whl", cached, sha, 0o444)]
    dest = tmp_path / "ctx"
    sync_directory(entries, dest)
    os.utime(cached, (1_700_000_000, 1_700_000_000))
    assert sync_directory(entries, dest).written == 1
    assert (dest / "wheels/w.whl").stat().st_mtime_ns == stamp(sha)


def test_an_interrupted_sync_is_completed_by_the_next(tmp_path: Path) -> None:
    dest = tmp_path / "ctx"
    staging = tmp_path / "ctx.staging"
    staging.mkdir()
    (staging / "0").write_text("half written")
    dest.mkdir()
    (dest / "Dockerfile").write_text("FROM old\n")  # the old file, whole: the rename never happened
    synced = sync_directory([data("Dockerfile", "FROM new\n")], dest)
    assert synced.written == 1 and (dest / "Dockerfile").read_text() == "FROM new\n"
    assert not staging.exists()


def test_either_transport_takes_the_same_entries(tmp_path: Path) -> None:
    entries = [data("Dockerfile", "FROM scratch\n")]
    source = synced_context(entries, tmp_path / "ctx")
    assert source.payload == len("FROM scratch\n")
    assert b"FROM scratch" in b"".join(source.stream().chunks())
    assert not (tmp_path / "ctx").exists()  # nothing written until the CLI needs it
    assert (source.directory() / "Dockerfile").read_text() == "FROM scratch\n"
