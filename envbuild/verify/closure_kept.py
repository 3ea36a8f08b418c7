"""The closure's verdict, kept for the lock it judged: a build whose packages and recorded requirements did
not change since the last (one source's commit moved) reads the verdict instead of reading and parsing
every package's core metadata again. At the real lock's size (226 packages, 2,628 requirements) that is
0.15 s of CPU in a fresh process, the longest part of a rebuild's verify.

The verdict is a function of the lock and of the metadata its package files hold. It is kept only when
every package's metadata came from this machine's caches, which hold only what a pin or a hash-checked file
vouches for (:meth:`.MetadataReader.in_cache`), and nothing was read from an index: then the lock fixes it,
each file by its sha256. The key is the lock with each source's pin (commit, tree) left out, which the
check never reads, and the code that judges (the sources of the modules that read and judge, so that a
changed check never answers with an old verdict). One file per lock name,
``<cache>/verify/closure/<lock name>.json``, replaced by the next verdict of another key: the cache holds
one verdict a lock. An entry that does not read as one (truncated, edited, not a regular file) is a miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, get_args

from envbuild.errors import EnvbuildError
from envbuild.fileio import open_regular, write_atomic
from envbuild.index import wheelmeta
from envbuild.lock import platform as lock_platform
from envbuild.lock.model import Lock
from envbuild.verify import closure, metadata
from envbuild.verify.closure import PackageMetadata, check_closure
from envbuild.verify.results import PinResult, RequirementStatus

FORMAT = 1
MAX_ENTRY = 64 << 20  # bytes: the real lock's verdict is ~0.2 MB
_STATUSES = frozenset(get_args(RequirementStatus))


def closure_dir(cache_dir: Path) -> Path:
    return Path(cache_dir) / "verify" / "closure"


def kept_closure(
    lock: Lock,
    cache_dir: Path,
    *,
    vouched: bool,
    read: Callable[[], Mapping[str, PackageMetadata]],
    network_reads: Callable[[], int],
) -> list[PinResult]:
    """:func:`.check_closure` of the lock on the metadata ``read`` returns, or the verdict kept for this
    lock when ``vouched`` (every package's metadata is in the caches). A vouched verdict is kept when the
    read asked no index (``network_reads``: how many it did)."""
    path = closure_dir(cache_dir) / f"{lock.name}.json"
    key = closure_key(lock)
    if vouched:
        kept = _read(path, key)
        if kept is not None:
            return kept
    results = check_closure(lock, read())
    if vouched and network_reads() == 0:
        _write(path, key, results)
    return results


def closure_key(lock: Lock) -> str:
    """sha256 of the format, the judging code, and the lock with its sources' pins left out."""
    unpinned = dataclasses.replace(
        lock, sources=tuple(dataclasses.replace(s, commit="0" * 40, tree=None) for s in lock.sources)
    )
    return hashlib.sha256(f"{FORMAT}\0{_code_digest()}\0{unpinned!r}".encode()).hexdigest()


@cache
def _code_digest() -> str:
    digest = hashlib.sha256()
    for module in (closure, metadata, wheelmeta, lock_platform):
        digest.update(Path(module.__file__ or "").read_bytes())
    return digest.hexdigest()


def _read(path: Path, key: str) -> list[PinResult] | None:
    try:
        with open_regular(path) as handle:
            data = json.loads(handle.read(MAX_ENTRY + 1))
    except (OSError, EnvbuildError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("results"), list):
        return None
    results = [_result(entry) for entry in data["results"]]
    return None if any(r is None for r in results) else results  # type: ignore[return-value]


def _result(entry: Any) -> PinResult | None:
    """One kept result, ``[requirer, status, detail, requirement, build]``, as :func:`.closure._result`
    made it; None when it is not one."""
    if not isinstance(entry, list) or len(entry) != 5:
        return None
    name, status, detail, requirement, build = entry
    if not (isinstance(name, str) and status in _STATUSES and isinstance(detail, str)):
        return None
    if not (requirement is None or isinstance(requirement, str)) or not isinstance(build, bool):
        return None
    return PinResult("requirement", name, status, detail, {"requirement": requirement, "build": build})


def _write(path: Path, key: str, results: list[PinResult]) -> None:
    rows = [[r.name, r.status, r.detail, r.facts.get("requirement"), r.facts.get("build")] for r in results]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"key": key, "results": rows}, separators=(",", ":")))
    except OSError:
        pass  # a cache that cannot be written costs the next build the check, nothing else
