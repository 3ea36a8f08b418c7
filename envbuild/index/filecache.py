"""A content-addressed cache of package files: ``<cache_dir>/files/sha256/<hex>``.

A file enters the cache only after its sha256 has been checked, by an atomic rename of a temporary
file written in the same directory (:func:`envbuild.fileio.atomic_output`), so a reader sees a whole,
verified file or nothing. Concurrent fetches of one file are serialised by an advisory lock per hash
(released by the kernel when a process dies); temporary files left by a killed download are removed
by the next fetch of that hash, and are never mistaken for cache entries because their names are not
64-hex. A failed write (a full disk) removes its temporary file and is a :class:`CacheError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from envbuild.errors import RemoteError
from envbuild.fileio import atomic_output, sha256_file
from envbuild.locking import cache_fault, file_lock

Download = Callable[[str, BinaryIO], None]

_HEX64 = re.compile(r"[0-9a-f]{64}")
# atomic_output names its temporary file ".<target>.<random>.tmp"; ".tmp-<sha>-*" is the older scheme.
_TEMPORARY = re.compile(r"\.(?:tmp-)?([0-9a-f]{64})[.-].*")


class FileHashError(RemoteError):
    """A downloaded or cached file does not have the sha256 the lock records."""

    def __init__(self, filename: str, url: str, expected: str, actual: str) -> None:
        super().__init__(
            f"{filename}: sha256 {actual} does not match the lock's {expected} (from {url}); "
            "nothing was cached — check the index or the lock"
        )


class _HashingWriter(io.RawIOBase):
    """Passes writes to a file while hashing them, so a download is read once. A failed write is the
    cache's fault (a full disk), not the download's, and says so."""

    def __init__(self, out: BinaryIO, directory: Path) -> None:
        self._out = out
        self._directory = directory
        self.digest = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += len(view)
        try:
            self._out.write(view)
        except OSError as exc:
            raise cache_fault(self._directory, exc) from None
        return len(view)


class FileCache:
    """Package files by sha256 under ``root/files/sha256``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.dir = self.root / "files" / "sha256"

    def path_for(self, sha256: str) -> Path:
        if not _HEX64.fullmatch(sha256):
            raise ValueError(f"not a full lowercase sha256: {sha256!r}")
        return self.dir / sha256

    def get(self, sha256: str, *, size: int | None = None, verify: bool = False) -> Path | None:
        """The cached file, or None. ``size`` is a cheap check; ``verify`` re-hashes the whole file.

        A file that fails either check is removed, so the next :meth:`fetch` downloads it again.
        """
        path = self.path_for(sha256)
        try:
            info = path.stat()
        except FileNotFoundError:
            return None
        bad = (size is not None and info.st_size != size) or (verify and sha256_file(path) != sha256)
        if bad:
            with self._locked(sha256):
                path.unlink(missing_ok=True)
            return None
        return path

    def fetch(self, url: str, sha256: str, filename: str, download: Download) -> Path:
        """The verified file for *sha256*, calling ``download(url, out)`` only when it is not cached."""
        if found := self.get(sha256):
            return found
        with self._locked(sha256):
            target = self.path_for(sha256)
            if target.exists():  # another process finished it while we waited
                return target
            for stale in self.temporary_files(sha256):
                stale.unlink(missing_ok=True)
            downloading = False
            try:
                with atomic_output(target, mode=0o444) as out:
                    writer = _HashingWriter(out, self.dir)
                    downloading = True
                    download(url, writer)  # type: ignore[arg-type]
                    downloading = False
                    actual = writer.digest.hexdigest()
                    if actual != sha256:
                        raise FileHashError(filename, url, sha256, actual)
            except OSError as exc:
                if downloading:
                    raise  # the download's own error (reading its source), not the cache's
                raise cache_fault(self.dir, exc) from None
            return target

    def temporary_files(self, sha256: str | None = None) -> list[Path]:
        """Temporary files of unfinished fetches (of ``sha256``, or of any hash)."""
        return [path for path, sha in self._temporaries() if sha256 in (None, sha)]

    def clean_temporary(self) -> int:
        """Remove temporary files no running fetch holds; returns how many were removed."""
        removed = 0
        for stale, sha in self._temporaries():
            with self._locked(sha, blocking=False) as held:
                if held:
                    stale.unlink(missing_ok=True)
                    removed += 1
        return removed

    def _temporaries(self) -> list[tuple[Path, str]]:
        if not self.dir.is_dir():
            return []
        matches = ((entry, _TEMPORARY.fullmatch(entry.name)) for entry in sorted(self.dir.iterdir()))
        return [(entry, match[1]) for entry, match in matches if match]

    def _locked(self, sha256: str, blocking: bool = True) -> contextlib.AbstractContextManager[bool]:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cache_fault(self.dir, exc) from None
        return file_lock(self.dir / f".lock-{sha256}", blocking=blocking)
