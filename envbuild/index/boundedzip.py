"""A zip opened for reading one small member, with every read bounded before it allocates.

``zipfile`` believes the central directory's size as its end record states it and reads it in one
``read(size)``: a zip64 end record claiming a terabyte makes that one allocation, a ``MemoryError``, from
a 64 KiB answer. So the archive is read through :class:`BoundedInput`, which clamps each read to what the
file holds (a claim past the end then reads short, and ``zipfile`` refuses it as truncated) and refuses
any single read above a budget (``MAX_READ``: more than a real wheel's central directory ever needs)
before anything is allocated.
"""

from __future__ import annotations

import zipfile
from typing import BinaryIO

from envbuild.errors import EnvbuildError

# The largest single read a zip needs here: a central directory (torch's is about 2 MB; 400,000 entries
# make about 40 MB) or one metadata member (4 MiB at most).
MAX_READ = 64 << 20


class ZipBoundError(EnvbuildError):
    """The archive asks for a read larger than what reading one member from it may cost."""


class BoundedInput:
    """``handle`` (seekable) as ``zipfile`` reads it: reads clamped to the file's size and to ``limit``."""

    def __init__(self, handle: BinaryIO, what: str, limit: int = MAX_READ) -> None:
        self.handle, self.what, self.limit = handle, what, limit
        self.size = handle.seek(0, 2)
        handle.seek(0)

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)

    def tell(self) -> int:
        return self.handle.tell()

    def read(self, n: int | None = -1) -> bytes:
        left = max(0, self.size - self.handle.tell())
        wanted = left if n is None or n < 0 else min(n, left)
        if wanted > self.limit:
            raise ZipBoundError(
                f"{self.what}: the archive asks for {wanted} bytes in one read (its central directory as "
                f"its end record states it), more than the {self.limit} reading its metadata may take; refused"
            )
        return self.handle.read(wanted)

    def close(self) -> None:
        self.handle.close()


def open_zip(handle: BinaryIO, what: str, limit: int = MAX_READ) -> zipfile.ZipFile:
    """``zipfile.ZipFile`` over ``handle`` through :class:`BoundedInput`."""
    return zipfile.ZipFile(BoundedInput(handle, what, limit))
