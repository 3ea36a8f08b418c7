"""Which objects of a bare repository git cannot read whole, from the files alone (no git): a damaged cache
repository (a pack cut short by an interrupted copy, a loose object a lost write emptied) is one git
believes holds objects it cannot read, so that every later fetch into it fails
(:meth:`envbuild.git.cache.GitCache.renewed_if_damaged` replaces it)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path


def damaged_objects(repo: Path) -> list[Path]:
    """The packs and loose objects of a bare repository git cannot read whole: a pack shorter than its
    header and trailer or ending in another checksum than its index names for it (an index shorter than
    its own trailer), and a loose object that does not inflate to its end. A pack without its index is
    not counted (git ignores it; :func:`envbuild.git.cache.remove_stale_files` and git's own rules see to it)."""
    damaged: list[Path] = []
    for index in sorted((repo / "objects" / "pack").glob("pack-*.idx")):
        pack = index.with_suffix(".pack")
        try:
            with open(index, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 40))
                named = handle.read(20) if size >= 40 else b""
            with open(pack, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 20))
                trailer = handle.read(20) if size >= 32 else b""
        except FileNotFoundError:
            continue
        except OSError:
            damaged.append(pack)
            continue
        if not named or trailer != named:
            damaged.append(pack)
    for path in sorted((repo / "objects").glob("[0-9a-f][0-9a-f]/*")):
        inflate = zlib.decompressobj()
        try:
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 16):
                    inflate.decompress(chunk, 1 << 16)
                    while inflate.unconsumed_tail:
                        inflate.decompress(inflate.unconsumed_tail, 1 << 16)
        except FileNotFoundError:
            continue
        except (OSError, zlib.error):
            damaged.append(path)
            continue
        if not inflate.eof:
            damaged.append(path)
    return damaged
