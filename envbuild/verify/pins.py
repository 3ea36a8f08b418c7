"""`lock verify`: every pin of a lock checked against its upstream, and the environment it describes
checked whole (every requirement met or waived), as one typed report."""

from __future__ import annotations

import dataclasses
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from envbuild.config import SourceOptions
from envbuild.git.cache import GitCache
from envbuild.git.files import OFFLINE_MISS
from envbuild.git.treeexport import TreeExporter, source_pin, whole_fetched
from envbuild.index.client import IndexClient
from envbuild.index.filecache import FileCache
from envbuild.lock.model import Lock, Package, Source
from envbuild.progress import Progress, silent
from envbuild.verify.closure_kept import kept_closure
from envbuild.verify.metadata import MetadataReader, read_metadata
from envbuild.verify.packages import verify_packages
from envbuild.verify.results import PinResult, VerifyReport
from envbuild.verify.sources import WholeCommit, verify_sources
from envbuild.verify.submodules import check_submodule_urls, verify_submodules


@dataclass(frozen=True)
class VerifyOptions:
    """Where the pins are read from, and whether a warning (a branch that moved on) fails."""

    source: SourceOptions
    strict: bool = False


def verify_base_image(lock: Lock, advice: str = "envbuild lock update LOCK --base") -> list[PinResult]:
    """The base image's pin; ``advice`` is the `lock update` command that pins an unpinned one."""
    image = lock.base_image
    if image is None:
        return []
    if image.digest is None:
        detail = f"no digest recorded: the tag can move; `{advice}` pins the digest its registry serves"
        return [PinResult("base_image", image.name, "unpinned", detail)]
    return [PinResult("base_image", image.name, "ok", f"pinned by {image.digest}", {"digest": image.digest})]


def verify_package_offline(package: Package, files: FileCache, advice: str) -> PinResult:
    """Offline, the index cannot be asked; what can be known is whether the cache holds every file the
    lock pins (stored under its sha256 only after its bytes were checked): ``cached`` (passes unless
    --strict) or ``unreachable``."""
    facts: dict[str, Any] = {"version": package.version}
    absent = [f.filename for f in package.files if files.get(f.sha256) is None]
    if package.files and not absent:
        detail = "offline: every file is in the cache by its sha256; the index was not asked"
        return PinResult("package", package.name, "cached", detail, facts)
    what = f"{', '.join(absent)} not in the cache" if absent else "no files in the lock"
    return PinResult("package", package.name, "unreachable", f"offline, and {what}; run `{advice}`", facts)


def verify_requirements(
    lock: Lock, options: VerifyOptions, client: IndexClient | None = None, progress: Progress = silent
) -> list[PinResult]:
    """The whole closure for the lock's platform, from core metadata only (nothing installed): every
    requirement of the lock's roots, its sources and its packages met by the lock, or waived by name. Its
    verdict is kept for the next check of the same packages and requirements (:mod:`.closure_kept`)."""
    source = options.source
    reader = MetadataReader(source.cache_dir, client, offline=source.offline)
    return kept_closure(
        lock,
        source.cache_dir,
        vouched=all(reader.in_cache(p) for p in lock.packages),
        read=lambda: read_metadata(lock, reader, jobs=source.jobs, progress=progress),
        network_reads=lambda: reader.network_reads,
    )


def verify_refs(
    lock: Lock,
    options: VerifyOptions,
    progress: Progress = silent,
    *,
    whole: WholeCommit | None = None,
    cache: GitCache | None = None,
) -> list[PinResult]:
    """Every source's and submodule's pin against its upstream: one ``ls-remote`` per repository, in
    parallel, and a fetch only where the listing does not settle a pin (offline: the cached listing).
    ``whole``: see :func:`envbuild.verify.sources.verify_sources`; ``cache``: the verify cache of
    ``options`` (one whose listings may be begun already: :meth:`.GitCache.begin_listings`)."""
    source = options.source
    check_submodule_urls(lock, source.mirrors)  # bad input, refused before any upstream is asked
    cache = cache or GitCache(source.cache_dir / "git")
    results = verify_sources(
        lock.sources,
        cache,
        mirrors=source.mirrors,
        offline=source.offline,
        jobs=source.jobs,
        progress=progress,
        whole=whole,
    )
    return results + verify_submodules(
        lock, cache, mirrors=source.mirrors, offline=source.offline, jobs=source.jobs, progress=progress
    )


def verify_for_build(
    lock: Lock,
    lock_path: str,
    options: VerifyOptions,
    progress: Progress = silent,
    *,
    inputs: bool = True,
    exporter: TreeExporter | None = None,
) -> VerifyReport:
    """What a build re-checks: what can move (the refs), the base's pin and, unless ``inputs=False``,
    :func:`verify_build_inputs`. ``inputs=False``: a lock built and checked before, whose image is answered
    from the cache's record (nothing is fetched or installed; its closure was checked when it was built; a
    tree pin the export cache cannot settle is checked on the commit alone, as `lock verify` does).
    Otherwise a source's tree pin is checked on its commit as the build's export fetches it (whole, into
    the export cache): a moved pin's commit is fetched once, not once for verify and again for the export.
    The inputs are checked while the refs are, in a thread of their own. ``exporter``: the build's own
    (it remembers what it found in the export cache, and its verify cache may be listing the upstreams
    already: :meth:`.GitCache.begin_listings`)."""
    with ThreadPoolExecutor(max_workers=1) as pool:  # the inputs (the caches, the closure) beside the refs (git)
        checking = pool.submit(verify_build_inputs, lock, lock_path, options, progress) if inputs else None
        whole = _fetched_whole(options.source, progress, exporter, fetch=inputs)
        results = verify_refs(
            lock, options, progress, whole=whole, cache=exporter.verify_cache if exporter is not None else None
        )
        if checking is not None:
            results += checking.result()
    results += verify_base_image(lock, options.source.lock_command("update", lock_path, "--base"))
    return _report(lock, lock_path, options, results)


def _fetched_whole(
    source: SourceOptions, progress: Progress, exporter: TreeExporter | None = None, *, fetch: bool = True
) -> WholeCommit:
    """{commit: tree} of a source's pinned commit from the export cache, fetched whole when absent
    (unless offline, or ``fetch=False``: `lock verify`, which fetches the commit alone elsewhere)."""
    exporter = exporter or TreeExporter(source.cache_dir, mirrors=source.mirrors, offline=source.offline)

    def whole(pinned: Source) -> dict[str, str]:
        if not fetch or exporter.offline:
            return exporter.cache.commit_trees(exporter.mirrors.rewrite(pinned.repo), [pinned.commit])
        tree, _ = whole_fetched(exporter, source_pin(pinned), progress)
        return {pinned.commit: tree}

    return whole


def verify_build_inputs(
    lock: Lock, lock_path: str, options: VerifyOptions, progress: Progress = silent
) -> list[PinResult]:
    """What a build installs, without the index's pages for files the cache holds: a package file is named
    by its sha256 and checked when it enters the cache (whether the index still serves it is `lock
    verify`'s question and the nightly `check`'s). The index is asked only about packages whose files the
    cache lacks (what it lists is what the build downloads); the closure is read from metadata the caches
    hold or the lock's pins vouch for."""
    source = options.source
    files, client = FileCache(source.cache_dir), IndexClient()
    absent = tuple(p for p in lock.pinned_packages if not p.files or any(files.get(f.sha256) is None for f in p.files))
    results = _verify_packages(dataclasses.replace(lock, packages=absent), lock_path, source, client, progress)
    return results + verify_requirements(lock, options, client, progress)


def verify_lock(lock: Lock, lock_path: str, options: VerifyOptions, progress: Progress = silent) -> VerifyReport:
    source = options.source
    # A tree pin is read from either cache (a commit's tree is the same wherever its object lies): a
    # commit a build fetched whole verifies offline as well.
    results = verify_refs(lock, options, progress, whole=_fetched_whole(source, progress, fetch=False))
    client = IndexClient()  # one page per package for both checks
    results += _verify_packages(
        dataclasses.replace(lock, packages=lock.pinned_packages), lock_path, source, client, progress
    )
    results += verify_requirements(lock, options, client, progress)
    results += verify_base_image(lock, source.lock_command("update", lock_path, "--base"))
    return _report(lock, lock_path, options, results)


def _verify_packages(
    lock: Lock, lock_path: str, source: SourceOptions, client: IndexClient, progress: Progress
) -> list[PinResult]:
    """The lock's packages: offline, whether the cache holds their files; online, what the index serves.
    The fix of each that needs one names this lock: `lock fetch` offline, `lock update` of an unresolved one."""
    if source.offline:
        files, fetch = FileCache(source.cache_dir), source.lock_command("fetch", lock_path)
        return [verify_package_offline(p, files, fetch) for p in lock.packages]
    update = f"envbuild lock update {shlex.quote(lock_path)}"
    return [
        dataclasses.replace(r, detail=f"{r.detail}; run `{update}`") if r.status == "unresolved" else r
        for r in verify_packages(lock, jobs=source.jobs, progress=progress, client=client)
    ]


def _report(lock: Lock, lock_path: str, options: VerifyOptions, results: list[PinResult]) -> VerifyReport:
    source = options.source
    if source.offline:
        advice = source.lock_command("fetch", lock_path)
        results = [_advise_fetch(r, advice) for r in results]
    offline = source.lock_command("verify", lock_path, "--offline") if _offline_answers(lock, source) else None
    return VerifyReport(
        lock_path,
        tuple(results),
        strict=options.strict,
        offline_command=offline,
        mirrors=tuple(f"{rule}={target}" for rule, target in source.mirrors.rules),
    )


def _advise_fetch(result: PinResult, advice: str) -> PinResult:
    """A pin the cache cannot settle offline names the command that fills the cache, as a package's does."""
    if result.status != "unreachable" or not result.detail.endswith(OFFLINE_MISS):
        return result
    return dataclasses.replace(result, detail=f"{result.detail}; run `{advice}`")


def _offline_answers(lock: Lock, source: SourceOptions) -> bool:
    """Whether `lock verify --offline` with these options can answer what online could not (a source out of
    reach): only when the cache holds a ref listing for every source."""
    if source.offline or not lock.sources:
        return False
    cache = GitCache(source.cache_dir / "git")
    return all(cache.cached_listing(source.mirrors.rewrite(s.repo)) is not None for s in lock.sources)
