"""What each locked package requires, from the core metadata of its locked files; nothing is installed.

For each file, the first of these that answers:

1. the metadata cache, ``<cache_dir>/metadata/sha256/<metadata_sha256>``, for a wheel whose METADATA the
   lock pins (``metadata_sha256``): content-addressed, so an entry proves itself when read, and only bytes
   matching a pin are ever written there (written atomically, once);
2. the file itself, when the file cache holds it (it entered the cache only after its sha256 was checked);
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

import tarfile
import threading
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.metadata import RawMetadata, parse_email
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from envbuild.errors import RemoteError
from envbuild.fileio import write_atomic
from envbuild.index.boundedzip import ZipBoundError, open_zip
from envbuild.index.client import MAX_METADATA, MAX_RANGE_BYTES, IndexClient
from envbuild.index.filecache import FileCache
from envbuild.index.wheelmeta import MetadataError, metadata_sha256, read_wheel_metadata
from envbuild.lock.model import Lock, Package, PackageFile
from envbuild.progress import Progress, silent
from envbuild.verify.closure import PackageMetadata

MAX_MEMBER = 1 << 20  # an sdist's requires.txt


class MetadataMismatch(MetadataError):
    """A wheel's METADATA is not the one the lock pins (``metadata_sha256``): an index lying, now (it served
    other metadata than the lock pins) or when the lock was updated (the wheel's own differs from the pin)."""

    def __init__(self, filename: str, pinned: str, actual: str, *, by_index: bool) -> None:
        self.filename, self.pinned, self.actual = filename, pinned, actual
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

    def requirements(self, lock: Lock, package: Package, file: PackageFile) -> list[str]:
        if file.filename.endswith(".whl"):
            data = self.wheel_metadata(lock, package, file)
            return _requires(data, package, file.filename, settled=True)
        path = self._sdist(lock, package, file)
        return sdist_requirements(path, package, file.filename)

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
            data = read_wheel_metadata(open(local, "rb"), file.filename)
        elif self.offline:
            raise MetadataError("offline, and neither its metadata nor the file is in the cache")
        else:
            self._counted()
            listed = self.client.project(lock.index_for(package), package.name).file(file.filename)
            if listed is None:
                raise MetadataError(f"{lock.index_for(package)} no longer lists it")
            if listed.core_metadata is not None and listed.url.startswith(("https://", "http://")):
                data = self.client.core_metadata(listed)
            else:
                remote = self.client.open_ranges(listed.url, index=lock.index_for(package))
                data = read_wheel_metadata(remote, file.filename, max_read=MAX_RANGE_BYTES)
        if pinned is not None and metadata_sha256(data) != pinned:
            raise MetadataMismatch(file.filename, pinned, metadata_sha256(data), by_index=served_by_index)
        _requires(data, package, file.filename, settled=True)  # only what names the package is kept
        if pinned is not None:  # only bytes the lock pins are kept: nothing an index says alone
            self.dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.dir / pinned, data)
        return data

    def _sdist(self, lock: Lock, package: Package, file: PackageFile) -> Path:
        local = self.files.get(file.sha256)
        if local is not None:
            return local
        if self.offline:
            raise MetadataError("offline, and the sdist is not in the file cache")
        self._counted()
        listed = self.client.project(lock.index_for(package), package.name).file(file.filename)
        if listed is None:
            raise MetadataError(f"{lock.index_for(package)} no longer lists it")
        return self.files.fetch(listed.url, file.sha256, file.filename, self.client.download)

    def _counted(self) -> None:
        with self._count:
            self.network_reads += 1


def read_metadata(
    lock: Lock,
    reader: MetadataReader,
    *,
    jobs: int = 8,
    progress: Progress = silent,
) -> dict[str, PackageMetadata]:
    """{normalised name: metadata} for every locked package, read in parallel. What could not be read is in
    the results (``requires=None`` and why), so progress only says what went to the network."""
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(lock.packages) or 1))) as pool:
        found = list(pool.map(lambda p: reader.package(lock, p), lock.packages))
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
    raw = _parse(pkg_info)
    dynamic = {d.strip().lower() for d in raw.get("dynamic", [])}
    if _metadata_version(raw) >= Version("2.2") and "requires-dist" not in dynamic:
        return _requires(pkg_info, package, filename, settled=True)
    _requires(pkg_info, package, filename, settled=False)  # name and version still checked
    if "requires.txt" in members or "egg-info" in members:
        return egg_info_requirements(members.get("requires.txt", b"").decode("utf-8", "replace"))
    raise MetadataError(
        f"PKG-INFO (metadata {raw.get('metadata_version')}) does not settle its requirements and it has no "
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


def _sdist_members(path: Path, filename: str) -> dict[str, bytes]:
    """PKG-INFO at the sdist's root and, if any, an ``*.egg-info/requires.txt`` (``egg-info`` marks that
    an egg-info directory exists at all)."""
    found: dict[str, bytes] = {}

    def consider(name: str, size: int, read: Callable[[], bytes]) -> None:
        parts = name.strip("/").split("/")
        if len(parts) == 2 and parts[1] == "PKG-INFO" and "PKG-INFO" not in found:
            found["PKG-INFO"] = _bounded(size, read)
        elif len(parts) in (3, 4) and parts[-2].endswith(".egg-info"):
            found.setdefault("egg-info", b"")
            if parts[-1] == "requires.txt" and "requires.txt" not in found:
                found["requires.txt"] = _bounded(size, read)

    try:
        if filename.endswith(".zip"):
            with open(path, "rb") as stream, open_zip(stream, filename) as zipped:
                for info in zipped.infolist():
                    consider(info.filename, info.file_size, lambda i=info: zipped.read(i))  # type: ignore[misc]
        else:
            with tarfile.open(path, "r:*") as tarred:
                for member in tarred:
                    if member.isfile():
                        handle = tarred.extractfile(member)
                        if handle is not None:
                            consider(member.name, member.size, lambda h=handle: h.read(MAX_METADATA + 1))  # type: ignore[misc]
    except ZipBoundError as exc:
        raise MetadataError(str(exc).removeprefix(f"{filename}: ")) from None
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, OverflowError) as exc:
        raise MetadataError(f"not a readable sdist: {exc}") from None
    return found


def _bounded(size: int, read: Callable[[], bytes]) -> bytes:
    if size > MAX_METADATA:
        raise MetadataError(f"a metadata member of {size} bytes; refused")
    return read()[:MAX_METADATA]


def _parse(data: bytes) -> RawMetadata:
    """The core metadata's fields as written (packaging's raw layer: nothing validated, so each check
    here sees the text the file holds). A Requires-Dist packaging could not even decode is refused, never
    dropped: a requirement silently lost is what the closure check exists to prevent."""
    raw, unparsed = parse_email(data)
    for text in unparsed.get("requires-dist", []):
        raise MetadataError(f"Requires-Dist {text!r} cannot be read")
    return raw


def _metadata_version(raw: RawMetadata) -> Version:
    try:
        return Version(raw.get("metadata_version", "1.0").strip())
    except InvalidVersion:
        return Version("1.0")


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
            found.append(str(Requirement(str(text).strip())))
        except InvalidRequirement as exc:
            raise MetadataError(f"Requires-Dist {str(text)!r} is not PEP 508: {exc}") from None
    return found
