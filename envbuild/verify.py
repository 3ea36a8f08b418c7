"""`lock verify`: every pin of a lock checked against its upstream, as one typed report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from envbuild.git.cache import GitCache
from envbuild.lock.model import Lock
from envbuild.mirrors import Mirrors
from envbuild.packages import verify_packages
from envbuild.results import PinResult, VerifyReport
from envbuild.sources import verify_sources

Progress = Callable[[str], None]


@dataclass(frozen=True)
class VerifyOptions:
    cache_dir: Path
    mirrors: Mirrors = field(default_factory=Mirrors)
    offline: bool = False
    strict: bool = False
    jobs: int = 8


def verify_base_image(lock: Lock) -> list[PinResult]:
    image = lock.base_image
    if image is None:
        return []
    if image.digest is None:
        return [
            PinResult(
                "base_image", image.name, "unpinned", "no digest recorded: the tag can move; add base_image.digest"
            )
        ]
    return [PinResult("base_image", image.name, "ok", f"pinned by {image.digest}", {"digest": image.digest})]


def verify_lock(lock: Lock, lock_path: str, options: VerifyOptions, progress: Progress | None = None) -> VerifyReport:
    cache = GitCache(options.cache_dir / "git")
    results = verify_sources(
        lock.sources, cache, mirrors=options.mirrors, offline=options.offline, jobs=options.jobs, progress=progress
    )
    if lock.packages:
        if options.offline:
            results += [
                PinResult("package", p.name, "unreachable", "offline: the package index was not asked")
                for p in lock.packages
            ]
        else:
            results += verify_packages(lock, jobs=options.jobs, progress=progress)
    results += verify_base_image(lock)
    return VerifyReport(lock_path, tuple(results), strict=options.strict)
