"""What each locked package requires, from the core metadata of its locked files; nothing is installed.

For each file, the first of these that answers:

1. the metadata cache, ``<cache_dir>/metadata/sha256/<metadata_sha256>``, for a wheel whose METADATA the
   lock pins (``metadata_sha256``): content-addressed, so an entry proves itself when read, and only bytes
   matching a pin are ever written there (written atomically, once);
2. the file itself, when the file cache holds it (it entered the cache only after its sha256 was checked),
   its METADATA then kept by the file's sha256 (``<cache_dir>/metadata/wheel/<sha256>``; an sdist's
   requirements in ``metadata/sdist/<sha256>.json``);
3. the index's PEP 658 metadata file, checked against the sha256 the index announced for it;
4. the wheel's ``*.dist-info/METADATA``, read by HTTP range requests from the zip's central directory:
   the tail, the directory, one member (a few requests; a few MB at most, even for torch);
5. an sdist is fetched whole into the file cache (the build installs it from there anyway) and its
   ``PKG-INFO`` read; where that does not settle the requirements (metadata before 2.2, or ``Requires-Dist``
   declared dynamic), setuptools' ``*.egg-info/requires.txt`` does; otherwise they are unknown.

The lock pins a wheel by its sha256, so the index's word on the wheel's metadata (3 and 4) is believed
only when it matches the digest the lock pins; a mismatch is the index lying (:class:`MetadataMismatch`,
status ``metadata-mismatch``). A lock without metadata pins (written before they existed) has its index
metadata read each run and never cached: what is cached is what a pin or a hash-checked file vouches for.

Offline, only 1 and 2 are used. A package whose metadata cannot be read gets ``requires=None`` and the
reason; the metadata must name the package and version the lock pins, or it is not believed.
"""

from __future__ import annotations

import json
import re
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from packaging.metadata import RawMetadata, parse_email
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from envbuild.errors import RemoteError
from envbuild.fileio import write_atomic
from envbuild.index.boundedzip import ZipBoundError, open_zip
from envbuild.index.client import MAX_METADATA, MAX_RANGE_BYTES, IndexClient, IndexFile
from envbuild.index.filecache import FileCache
from envbuild.index.wheelmeta import MetadataError, metadata_sha256, read_wheel_metadata
from envbuild.lock.model import Lock, Package, PackageFile
from envbuild.lock.platform import normalised
from envbuild.progress import Progress, silent
from envbuild.verify.closure import PackageMetadata

# Members of an sdist read before its metadata must have settled its requirements: PKG-INFO and the
# egg-info come early in the sdists setuptools, hatchling, flit and maturin write; torch's has ~15,000.
MAX_MEMBERS = 50_000


class Unsettled(MetadataError):
    """The sdist's metadata does not settle its requirements: they are decided when it is built."""


class MetadataMismatch(MetadataError):
    """A wheel's METADATA is not the one the lock pins (``metadata_sha256``): an index lying, now (it served
    other metadata than the lock pins) or when the lock was updated (the wheel's own differs from the pin)."""

    def __init__(self, filename: str, pinned: str, actual: str, *, by_index: bool) -> None:
        if by_index:
            why = f"the index served METADATA with sha256 {actual}, not the {pinned} the lock pins"
        else:
            why = (
                f"its own METADATA has sha256 {actual}, not the {pinned} the lock pins (the index served other "
                "metadata when the lock was updated; run `envbuild lock update` against an index you trust)"
            )
        super().__init__(f"{filename}: {why}")


def forget_metadata(cache_dir: Path, pinned: str) -> None:
    """Drop the cached metadata the lock pins by ``pinned`` (a wheel's own METADATA proved the pin wrong)."""
    (Path(cache_dir) / "metadata" / "sha256" / pinned).unlink(missing_ok=True)


class MetadataReader:
    """Reads and caches core metadata of locked files; safe to share between threads."""

    def __init__(self, cache_dir: Path, client: IndexClient | None = None, *, offline: bool = False) -> None:
        self.dir = Path(cache_dir) / "metadata" / "sha256"
        self.files = FileCache(cache_dir)
        self.client = client or IndexClient()
        self.offline = offline
        self.network_reads = 0
        self._count = threading.Lock()

    def package(self, lock: Lock, package: Package) -> PackageMetadata:
        """The union of the requirements of every locked file of ``package`` (they normally agree)."""
        requires: list[str] = []
        if not package.files:
            return PackageMetadata(package.name, None, "the lock records no files for it")
        for file in package.files:
            try:
                requires += self.requirements(lock, package, file)
            except MetadataMismatch as exc:
                return PackageMetadata(package.name, None, str(exc), status="metadata-mismatch")
            except (MetadataError, RemoteError) as exc:
                return PackageMetadata(package.name, None, f"{file.filename}: {exc}")
        return PackageMetadata(package.name, tuple(dict.fromkeys(requires)), f"{len(package.files)} file(s)")

    def in_cache(self, package: Package) -> bool:
        """Whether every file's requirements come from this machine's caches (no index asked): a pinned
        METADATA kept, the wheel or sdist in the file cache, or an sdist's requirements kept."""
        for file in package.files:
            pinned = file.metadata_sha256
            if pinned is not None and (self.dir / pinned).is_file():
                continue
            if not file.filename.endswith(".whl") and self._sdist_entry(file).is_file():
                continue
            if self.files.get(file.sha256) is None:
                return False
        return True

    def requirements(self, lock: Lock, package: Package, file: PackageFile) -> list[str]:
        if file.filename.endswith(".whl"):
            data = self.wheel_metadata(lock, package, file)
            return _requires(data, package, file.filename, settled=True)
        return self.sdist_requirements(lock, package, file)

    def sdist_requirements(self, lock: Lock, package: Package, file: PackageFile) -> list[str]:
        """An sdist's requirements, cached by the sdist's sha256 (it is read only once hash-checked in the
        file cache, so what it settles never changes): ``<cache>/metadata/sdist/<sha256>.json`` holds
        either the requirements or why they are not settled."""
        cached = self._sdist_entry(file)
        try:
            entry = json.loads(cached.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entry = None
        if isinstance(entry, dict) and isinstance(entry.get("requires"), list):
            return [str(r) for r in entry["requires"]]
        if isinstance(entry, dict) and isinstance(entry.get("unsettled"), str):
            raise MetadataError(entry["unsettled"])
        path = self._sdist(lock, package, file)
        try:
            found: dict[str, Any] = {"requires": sdist_requirements(path, package, file.filename)}
        except Unsettled as exc:
            found = {"unsettled": str(exc)}
        _remember(cached, json.dumps(found, sort_keys=True).encode())
        if "unsettled" in found:
            raise MetadataError(found["unsettled"])
        return list(found["requires"])

    def _sdist_entry(self, file: PackageFile) -> Path:
        return self.dir.parent / "sdist" / f"{file.sha256}.json"

    def wheel_metadata(self, lock: Lock, package: Package, file: PackageFile) -> bytes:
        pinned = file.metadata_sha256
        if pinned is not None:
            try:
                data = (self.dir / pinned).read_bytes()
            except FileNotFoundError:
                pass
            else:
                if metadata_sha256(data) == pinned:  # content-addressed: an entry proves itself
                    return data
        local = self.files.get(file.sha256)
        served_by_index = local is None
        if local is not None:
            data = self.local_wheel_metadata(local, file)
        elif self.offline:
            raise MetadataError("offline, and neither its metadata nor the file is in the cache")
        else:
            listed = self._listed(lock, package, file)
            if listed.core_metadata is not None and listed.url.startswith(("https://", "http://")):
                data = self.client.core_metadata(listed)
            else:
                remote = self.client.open_ranges(listed.url, index=lock.index_for(package))
                data = read_wheel_metadata(remote, file.filename, max_read=MAX_RANGE_BYTES)
        if pinned is not None and metadata_sha256(data) != pinned:
            raise MetadataMismatch(file.filename, pinned, metadata_sha256(data), by_index=served_by_index)
        if pinned is not None:  # only bytes the lock pins are kept (nothing an index says alone), and only
            # what names the package; the caller's one parse checks the rest (a second parse of each file
            # was half of a rebuild's closure check: 0.05 s at 226 packages)
            _requires(data, package, file.filename, settled=False)
            _remember(self.dir / pinned, data)
        return data

    def local_wheel_metadata(self, local: Path, file: PackageFile) -> bytes:
        """The METADATA of a wheel in the file cache (hash-checked when it entered), cached by the wheel's
        sha256 in ``<cache>/metadata/wheel/<sha256>``: the file never changes, so neither does what it
        holds, and a zip's central directory (torch's: ~10,000 members) is read once, not on every build."""
        cached = self.dir.parent / "wheel" / file.sha256
        try:
            return cached.read_bytes()
        except FileNotFoundError:
            pass
        with open(local, "rb") as handle:
            data = read_wheel_metadata(handle, file.filename)
        _remember(cached, data)
        return data

    def _sdist(self, lock: Lock, package: Package, file: PackageFile) -> Path:
        local = self.files.get(file.sha256)
        if local is not None:
            return local
        if self.offline:
            raise MetadataError("offline, and the sdist is not in the file cache")
        listed = self._listed(lock, package, file)
        return self.files.fetch(listed.url, file.sha256, file.filename, self.client.download)

    def _listed(self, lock: Lock, package: Package, file: PackageFile) -> IndexFile:
        """What the index lists for ``file``: a network read, counted."""
        with self._count:
            self.network_reads += 1
        listed = self.client.project(lock.index_for(package), package.name).file(file.filename)
        if listed is None:
            raise MetadataError(f"{lock.index_for(package)} no longer lists it")
        return listed


def read_metadata(
    lock: Lock,
    reader: MetadataReader,
    *,
    jobs: int = 8,
    progress: Progress = silent,
) -> dict[str, PackageMetadata]:
    """{normalised name: metadata} for every locked package: what the caches answer read here, the rest
    in parallel (a pool's threads cost more than reading a few hundred cached files: 0.05 s of 0.07 s for
    27). What could not be read is in the results (``requires=None`` and why), so progress only says what
    went to the network."""
    local: list[Package] = []
    remote: list[Package] = []
    for package in lock.packages:
        (local if reader.in_cache(package) else remote).append(package)
    found = [reader.package(lock, p) for p in local]
    if remote:
        with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(remote)))) as pool:
            found += pool.map(lambda p: reader.package(lock, p), remote)
    if reader.network_reads:
        progress(f"read the core metadata of {reader.network_reads} package file(s) from the index")
    return {canonicalize_name(m.name): m for m in found}


def sdist_requirements(path: Path, package: Package, filename: str) -> list[str]:
    """An sdist's requirements, where its metadata settles them (see the module docstring)."""
    try:
        parse_sdist_filename(filename)
    except (ValueError, InvalidVersion) as exc:
        raise MetadataError(str(exc)) from None
    members = _sdist_members(path, filename)
    pkg_info = members.get("PKG-INFO")
    if pkg_info is None:
        raise MetadataError("the sdist has no PKG-INFO")
    if _settles(pkg_info):  # or it cannot be parsed, which _requires refuses
        return _requires(pkg_info, package, filename, settled=True)
    _requires(pkg_info, package, filename, settled=False)  # name and version still checked
    if "requires.txt" in members or "egg-info" in members:
        return egg_info_requirements(members.get("requires.txt", b"").decode("utf-8", "replace"))
    version = _parse(pkg_info).get("metadata_version")
    raise Unsettled(
        f"PKG-INFO (metadata {version}) does not settle its requirements and it has no "
        "*.egg-info: they are decided when it is built"
    )


def egg_info_requirements(text: str) -> list[str]:
    """setuptools' ``requires.txt``: plain lines, then ``[extra]``, ``[:marker]`` or ``[extra:marker]`` sections."""
    found: list[str] = []
    marker = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            extra, _, condition = line[1:-1].partition(":")
            parts = [f"({condition})"] if condition else []
            parts += [f'extra == "{canonicalize_name(extra)}"'] if extra else []
            marker = " and ".join(parts)
            continue
        try:
            requirement = Requirement(f"{line}; {marker}" if marker else line)
        except InvalidRequirement as exc:
            raise MetadataError(f"requires.txt: {line!r} is not a requirement: {exc}") from None
        found.append(str(requirement))
    return found


def _sdist_members(path: Path, filename: str, max_members: int = MAX_MEMBERS) -> dict[str, bytes]:
    """PKG-INFO at the sdist's root and, if any, an ``*.egg-info/requires.txt`` (``egg-info`` marks that
    an egg-info directory exists at all). Reading stops at the member that settles the question (a
    PKG-INFO that settles the requirements, or both PKG-INFO and requires.txt), and refuses an sdist
    that has not settled it within ``max_members`` members."""
    found: dict[str, bytes] = {}

    def consider(name: str, size: int, read: Callable[[], bytes]) -> bool:
        parts = name.strip("/").split("/")
        if len(parts) == 2 and parts[1] == "PKG-INFO" and "PKG-INFO" not in found:
            found["PKG-INFO"] = _bounded(size, read)
        elif len(parts) in (3, 4) and parts[-2].endswith(".egg-info"):
            found.setdefault("egg-info", b"")
            if parts[-1] == "requires.txt" and "requires.txt" not in found:
                found["requires.txt"] = _bounded(size, read)
        return "PKG-INFO" in found and ("requires.txt" in found or _settles(found["PKG-INFO"]))

    def too_many() -> MetadataError:
        return MetadataError(f"more than {max_members} members without its metadata settling its requirements; refused")

    try:
        if filename.endswith(".zip"):
            with open(path, "rb") as stream, open_zip(stream, filename) as zipped:
                for count, info in enumerate(zipped.infolist()):
                    if count >= max_members:
                        raise too_many()
                    if consider(info.filename, info.file_size, lambda i=info: zipped.read(i)):  # type: ignore[misc]
                        break
        else:
            with tarfile.open(path, "r:*") as tarred:
                count = 0
                while (member := tarred.next()) is not None:
                    tarred.members.clear()  # type: ignore[attr-defined]  # tarfile keeps every header read
                    count += 1
                    if count > max_members:
                        raise too_many()
                    handle = tarred.extractfile(member) if member.isfile() else None
                    if handle is not None and consider(
                        member.name, member.size, partial(handle.read, MAX_METADATA + 1)
                    ):
                        break
    except ZipBoundError as exc:
        raise MetadataError(str(exc).removeprefix(f"{filename}: ")) from None
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, OverflowError) as exc:
        raise MetadataError(f"not a readable sdist: {exc}") from None
    return found


def _settles(pkg_info: bytes) -> bool:
    """Whether PKG-INFO alone settles the requirements (metadata 2.2 or later, Requires-Dist not dynamic)."""
    try:
        raw = _parse(pkg_info)
    except MetadataError:
        return True  # nothing later can mend it: sdist_requirements refuses it
    dynamic = {d.strip().lower() for d in raw.get("dynamic", [])}
    try:
        version = Version(raw.get("metadata_version", "1.0").strip())
    except InvalidVersion:
        return False  # read as 1.0
    return version >= Version("2.2") and "requires-dist" not in dynamic


def _bounded(size: int, read: Callable[[], bytes]) -> bytes:
    if size > MAX_METADATA:
        raise MetadataError(f"a metadata member of {size} bytes; refused")
    return read()[:MAX_METADATA]


def _parse(data: bytes) -> RawMetadata:
    """The core metadata's fields as written (packaging's raw layer: nothing validated, so each check
    here sees the text the file holds). A Requires-Dist packaging could not even decode is refused, never
    dropped: a requirement silently lost is what the closure check exists to prevent. Only the headers
    are parsed (:func:`header_block`): the body is the long description, which no check reads."""
    raw, unparsed = parse_email(header_block(data))
    for text in unparsed.get("requires-dist", []):
        raise MetadataError(f"Requires-Dist {text!r} cannot be read")
    return raw


def header_block(data: bytes) -> bytes:
    """A core metadata file's header lines: up to its first empty line, where the email format's body
    begins (torch's body is a README of some 30 kB; the email parser reads every line of it)."""
    empty = re.search(rb"^\r?$", data, re.MULTILINE)  # a line with nothing but its line ending
    return data if empty is None else data[: empty.start()]


def _requires(data: bytes, package: Package, filename: str, *, settled: bool) -> list[str]:
    """Requires-Dist of metadata that names ``package`` at its locked version."""
    raw = _parse(data)
    name, version = raw.get("name", "").strip(), raw.get("version", "").strip()
    try:
        same = canonicalize_name(name) == canonicalize_name(package.name) and Version(version) == Version(
            package.version
        )
    except InvalidVersion:
        same = False
    if not same:
        raise MetadataError(f"its metadata is for {name or '?'} {version or '?'}, not {package.name} {package.version}")
    if not settled:
        return []
    found = []
    for text in raw.get("requires_dist", []):
        try:
            found.append(normalised(str(text).strip()))
        except InvalidRequirement as exc:
            raise MetadataError(f"Requires-Dist {str(text)!r} is not PEP 508: {exc}") from None
    return found


def _remember(path: Path, data: bytes) -> None:
    """Keep ``data`` at ``path`` for the next run, where the cache can take it: an entry here only saves a
    later read, so a full or read-only cache costs that read, not the verify (which once ended at the first
    metadata it could not keep, in one line naming no cache and with no table)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
    except OSError:
        pass  # write_atomic removed its temporary file; what was read is returned all the same
