"""A build's inputs, in the caches: the exact tree of every source and every package file of a lock, and
where the index serves each file now and its size (for a pylock.toml export).

``envbuild image`` and ``envbuild check`` call :func:`fetch_inputs` themselves, before planning, whatever
``lock verify`` did or did not fetch: verify's fast path settles a pin at a branch head or a tag from
the ref listing alone and fetches nothing, while a build needs the commit (its date is the default
epoch) and every file of its tree. ``envbuild lock fetch`` runs it alone, so that a later ``--offline``
build (an air-gapped cluster with a copied cache) finds everything.

Offline, nothing is fetched: every input that is not in the cache is named at once, with the command
that puts it there.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import requests

from envbuild.config import SourceOptions
from envbuild.data.jsonout import json_meta
from envbuild.errors import EnvbuildError, ProblemsError, RemoteError
from envbuild.git.treeexport import (
    TreeExporter,
    TreePin,
    commit_dates,
    has_commit,
    known_date,
    source_pin,
    submodule_pins,
    whole_fetched,
)
from envbuild.index.client import IndexClient, IndexFile, ProjectPage
from envbuild.index.filecache import FileCache
from envbuild.index.wheelmeta import metadata_sha256, read_wheel_metadata
from envbuild.lock.export import FileLocation
from envbuild.lock.io import LockFile
from envbuild.lock.model import Lock, Package, PackageFile
from envbuild.progress import Progress, silent
from envbuild.verify.metadata import MetadataMismatch, forget_metadata
from envbuild.verify.pins import VerifyOptions, verify_lock
from envbuild.verify.results import PinResult, VerifyReport


class InputsMissing(EnvbuildError):
    """Offline, and the cache lacks inputs of the build; names each and the command that fetches them."""


class InputFetchError(ProblemsError):
    """An input could not be fetched (a remote fault, or it is not what the lock pins); names each."""


@dataclass(frozen=True)
class FetchedInput:
    kind: Literal["source", "submodule", "package_file"]
    name: str  # the source, SOURCE/PATH of a submodule, or the package
    what: str  # the commit, or the file name
    fetched: bool  # False: it was in the cache already


@dataclass(frozen=True)
class Inputs:
    """Everything a build of the lock reads, in the caches; ``epoch`` is the newest pinned commit's
    committer date (None for a lock without sources)."""

    inputs: tuple[FetchedInput, ...]
    epoch: int | None = dataclasses.field(metadata=json_meta(key="newest_commit_date"))


def exporter_for(source: SourceOptions) -> TreeExporter:
    return TreeExporter(source.cache_dir, mirrors=source.mirrors, offline=source.offline)


def fetch_inputs(
    lock_file: LockFile,
    source: SourceOptions,
    *,
    client: IndexClient | None = None,
    progress: Progress = silent,
    exporter: TreeExporter | None = None,
    leave: frozenset[str] = frozenset(),
) -> Inputs:
    """Put every input of the lock in the caches of ``source.cache_dir`` (offline: check that they are
    there), through ``source.mirrors``; ``exporter``: the build's own (:func:`exporter_for` ``source``),
    which remembers what it found already. ``leave``: pins not to fetch, as verify names them (``source
    NAME``, ``submodule SOURCE/PATH``, ``package NAME``), with every submodule under a left tree."""
    lock, lock_path = lock_file.lock, lock_file.path
    exporter, files, jobs = exporter or exporter_for(source), FileCache(source.cache_dir), source.jobs
    if leave:
        lock = dataclasses.replace(
            lock,
            sources=tuple(s for s in lock.sources if f"source {s.name}" not in leave),
            packages=tuple(p for p in lock.packages if f"package {p.name}" not in leave),
            installer=lock.installer if lock.installer and f"package {lock.installer.name}" not in leave else None,
        )
    pins = [pin for pin in tree_pins(lock) if not _left(pin, leave)]
    if exporter.offline:
        missing = [f"{pin.what} (commit {pin.commit})" for pin in pins if not has_commit(exporter, pin)]
        missing += [
            f"package {p.name} {p.version} ({f.filename})" for p, f in lock.package_files if not files.get(f.sha256)
        ]
        if missing:
            raise InputsMissing(
                f"{lock_path}: --offline, and the cache ({exporter.cache_dir}) lacks {'; '.join(missing)}; run "
                f"`{source.lock_command('fetch', lock_path)}` where the upstreams are reachable"
            )
    fetched_sources = _fetch_trees(pins, exporter, jobs, progress)
    fetched_files = _fetch_files(lock, files, client or IndexClient(), progress, source.cache_dir)
    return Inputs((*fetched_sources, *fetched_files), newest_commit_date(lock, exporter))


@dataclass(frozen=True)
class VerifiedInputs:
    """``lock fetch``: the lock verified online, then every input whose pin verifies fetched. ``failing``:
    the pins that fail verify; ``left``: those of them not fetched (a source, submodule or package: a build
    would refuse them)."""

    report: VerifyReport
    inputs: Inputs
    failing: tuple[PinResult, ...]
    left: tuple[PinResult, ...]

    @property
    def complete(self) -> bool:
        """Every pin verifies, but an unpinned base image (not an input fetched here: a build pulls it by
        digest): ``envbuild image --offline`` can build from the caches."""
        return all(row.kind == "base_image" for row in self.failing)


def verify_and_fetch(lock_file: LockFile, options: VerifyOptions, progress: Progress = silent) -> VerifiedInputs:
    """Verify online (the ref listings and commits ``--offline`` verifies against), then fetch every
    source's tree and package file whose pin verifies; the rest is fetched all the same, so that the advice
    ``lock verify --offline`` gives ends here."""
    report = verify_lock(lock_file.lock, str(lock_file.path), options, progress)
    failing = tuple(row for row in report.results if not row.passes(report.strict))
    left = tuple(row for row in failing if row.kind in ("source", "submodule", "package"))
    leave = frozenset(f"{row.kind} {row.name}" for row in left)
    return VerifiedInputs(
        report, fetch_inputs(lock_file, options.source, progress=progress, leave=leave), failing, left
    )


def _left(pin: TreePin, leave: frozenset[str]) -> bool:
    """Whether ``pin`` or a tree it lies in is to be left (a submodule's name is SOURCE/PATH/…)."""
    parts = pin.name.split("/")
    return f"source {parts[0]}" in leave or any(
        f"submodule {'/'.join(parts[:n])}" in leave for n in range(2, len(parts) + 1)
    )


def newest_commit_date(lock: Lock, exporter: TreeExporter) -> int | None:
    """The newest committer date of the pinned commits, read from the export cache or, for a commit only
    `lock verify` has fetched so far, from the verify cache (no network): a commit's date is the same
    wherever its object lies."""
    dates = []
    for source in lock.sources:
        url = exporter.mirrors.rewrite(source.repo)
        date = known_date(exporter, url, source.commit)  # what this build's export found, else git
        if date is None:
            found = commit_dates(exporter.cache, url, [source.commit]) or commit_dates(
                exporter.verify_cache, url, [source.commit]
            )
            if source.commit not in found:
                raise EnvbuildError(f"source {source.name}: commit {source.commit} is not in {exporter.cache.root}")
            date = found[source.commit]
        dates.append(date)
    return max(dates) if dates else None


def tree_pins(lock: Lock) -> list[TreePin]:
    """Every tree a build writes: each source's, then each submodule's the image gets (every level)."""
    sources = [source_pin(s) for s in lock.sources]
    return sources + [pin for s in lock.sources for _, pin in submodule_pins(s)]


def _fetch_trees(pins: list[TreePin], exporter: TreeExporter, jobs: int, say: Progress) -> list[FetchedInput]:
    def one(pin: TreePin) -> FetchedInput:
        _, fetched = whole_fetched(exporter, pin, say)
        return FetchedInput(pin.kind, pin.name, pin.commit, fetched)

    problems: list[str] = []
    results: list[FetchedInput] = []
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(pins) or 1))) as pool:
        for pin, future in [(p, pool.submit(one, p)) for p in pins]:
            try:
                results.append(future.result())
            except EnvbuildError as exc:
                problems.append(str(exc) if str(exc).startswith(pin.what) else f"{pin.what}: {exc}")
    if problems:
        raise InputFetchError(problems)
    return results


def _fetch_files(
    lock: Lock, files: FileCache, client: IndexClient, say: Progress, cache_dir: Path
) -> list[FetchedInput]:
    """Every package file into the file cache by sha256; each wheel's own METADATA, hash-checked with
    it, is then compared with the digest the lock pins for it (a mismatch: the index lied when the lock
    was updated, and the metadata cached under that pin is dropped)."""
    results: list[FetchedInput] = []
    problems: list[str] = []
    for package, file in lock.package_files:
        try:
            if path := files.get(file.sha256):
                check_metadata_pin(path, file, cache_dir)
                results.append(FetchedInput("package_file", package.name, file.filename, False))
                continue
            say(f"downloading {file.filename}")
            page = client.project(lock.index_for(package), package.name)
            listed = page.file(file.filename)
            if listed is None:
                raise RemoteError(f"{page.index} no longer lists {file.filename}")
            check_metadata_pin(files.fetch(listed.url, file.sha256, file.filename, client.download), file, cache_dir)
        except EnvbuildError as exc:
            problems.append(f"package {package.name} {package.version}: {exc}")
            continue
        results.append(FetchedInput("package_file", package.name, file.filename, True))
    if problems:
        raise InputFetchError(problems)
    return results


def check_metadata_pin(path: Path, file: PackageFile, cache_dir: Path) -> None:
    """The wheel at ``path`` (hash-checked) holds the METADATA the lock pins for it, or MetadataMismatch."""
    if file.metadata_sha256 is None or not file.filename.endswith(".whl"):
        return
    with open(path, "rb") as handle:
        actual = metadata_sha256(read_wheel_metadata(handle, file.filename))
    if actual != file.metadata_sha256:
        forget_metadata(cache_dir, file.metadata_sha256)
        raise MetadataMismatch(file.filename, file.metadata_sha256, actual, by_index=False)


def package_file_locations(
    lock: Lock,
    *,
    cache_dir: Path | None = None,
    offline: bool = False,
    jobs: int = 8,
    session: requests.Session | None = None,
    client: IndexClient | None = None,
) -> dict[str, FileLocation]:
    """Where each of the lock's files is downloaded from, as the index lists it now (no URL ``offline``;
    an index out of reach, or one that no longer lists a file the lock pins, is RemoteError), and its
    size: that of its copy in the file cache under ``cache_dir`` (the bytes the lock's sha256 pins: checked
    when they entered), else the size the index states (PEP 700) when it lists the lock's sha256, else
    unknown. For a pylock.toml export."""
    listed: dict[str, IndexFile] = {}
    if not offline:
        index_client = client or IndexClient(session)

        def page(package: Package) -> ProjectPage:
            try:
                return index_client.project(lock.index_for(package), package.name)
            except RemoteError as exc:  # a path where a URL was asked for would fail only where it is installed
                raise RemoteError(f"{exc} (`--offline` refers to every file as files/<name>)") from None

        with_files = [p for p in lock.packages if p.files]
        index_client.prefetch(((lock.index_for(p), p.name) for p in with_files), jobs)  # then parsed one by one
        for package, found in zip(with_files, map(page, with_files)):
            files = {f.filename: f for f in found.files}
            if gone := [f.filename for f in package.files if f.filename not in files]:
                raise RemoteError(
                    f"{lock.index_for(package)} no longer lists {', '.join(gone)} of {package.name} {package.version}, "
                    "which the lock pins: `envbuild lock verify` says what moved, `envbuild lock update` moves the lock "
                    "(`--offline` refers to every file as files/<name>)"
                )
            listed |= files
    cache = FileCache(cache_dir) if cache_dir is not None else None
    locations: dict[str, FileLocation] = {}
    # The packages' files (an export lists the installer nowhere: it installs, it is not installed).
    for file in sorted((f for p in lock.packages for f in p.files), key=lambda f: f.filename):
        at = listed.get(file.filename)
        cached = cache.get(file.sha256) if cache is not None else None
        size = cached.stat().st_size if cached is not None else None
        if size is None and at is not None and at.sha256 in (None, file.sha256):
            size = at.size  # a size stated for other bytes than the lock's would be wrong in the export
        locations[file.filename] = FileLocation(at.url if at is not None else None, size)
    return locations
