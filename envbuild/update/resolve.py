"""Resolve a lock's package closure for the lock's platform, which need not be this machine's.

uv does the resolution (it can target another platform with ``--python-platform``); this module then
asks the index for each pinned version's files and keeps exactly those the lock's platform can
install, with their sha256s, so the image can install with ``--require-hashes`` and no resolver, and
each wheel's METADATA by its sha256, so the closure check trusts no metadata the lock does not pin.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from envbuild.errors import EnvbuildError, InputError, RemoteError
from envbuild.index.client import MAX_RANGE_BYTES, IndexClient, IndexFile
from envbuild.index.wheelmeta import MetadataError, metadata_sha256, read_wheel_metadata
from envbuild.lock.model import PYPI_SIMPLE, Lock, Package, PackageFile, Platform
from envbuild.lock.platform import file_version, parsed, uv_platform, wheel_fits
from envbuild.progress import Progress, silent
from envbuild.update.roots import Root, explain, source_roots

UV_TIMEOUT = 900


class ResolutionError(EnvbuildError):
    """uv found no solution, or failed; the message carries uv's own explanation."""


def select_files(files: Iterable[IndexFile], name: str, version: str, platform: Platform) -> list[IndexFile]:
    """The files of ``name==version`` installable on ``platform``: its compatible wheels, else its sdists;
    of those, the ones not yanked, unless every one is (PEP 592: a yanked file is ignored where one that is
    not yanked will do; a version only yanked files give is locked as it is, and verify says so)."""
    wanted = Version(version)
    found: list[IndexFile] = [f for f in files if file_version(f.filename, name) == wanted and f.sha256]
    # (a file without a sha256 cannot be locked)
    for usable in ([f for f in found if not f.yanked], found):
        wheels = [f for f in usable if f.filename.endswith(".whl") and wheel_fits(f.filename, platform)]
        sdists = [f for f in usable if not f.filename.endswith(".whl")]
        # An sdist next to a usable wheel would only invite a build on the image; keep it only when it is all
        # there is (vllm-ascend, for one, publishes no wheel).
        if chosen := wheels or sdists:
            return sorted(chosen, key=lambda f: f.filename)
    return []


def parse_pins(text: str) -> list[tuple[str, str]]:
    """``name==version`` pins from ``uv pip compile`` output (comments, options and markers ignored)."""
    pins = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            req = Requirement(line.rstrip("\\").strip())
        except InvalidRequirement as exc:
            raise ResolutionError(f"cannot read uv's output line {raw!r}: {exc}") from None
        exact = [s.version for s in req.specifier if s.operator in ("==", "===")]
        if len(exact) != 1:
            raise ResolutionError(f"uv's output line {raw!r} is not an exact pin")
        pins.append((req.name, exact[0]))
    return pins


def run_uv_compile(
    requirements: Sequence[str],
    platform: Platform,
    index: str,
    excludes: Sequence[str] = (),
    *,
    preferences: Sequence[str] = (),
    upgrade: bool = False,
    upgrade_packages: Sequence[str] = (),
) -> str:
    """Run ``uv pip compile`` for another platform, isolated from any project or user uv config;
    ``excludes`` are distribution names left out of the resolution (the lock waives them).

    ``preferences`` (``name==version`` pins) are the versions uv keeps wherever they still satisfy: given
    as the content of the output file, which is how uv and pip-tools read the pins of the last run; uv
    lets every package move with ``upgrade`` and those of ``upgrade_packages`` with theirs, as its own
    ``--upgrade`` and ``--upgrade-package`` (which also refresh uv's cache of their index pages)."""
    from uv import find_uv_bin  # imported late: only `lock update` needs the binary

    with tempfile.TemporaryDirectory(prefix="envbuild-resolve-") as tmp:
        req_in = Path(tmp) / "requirements.in"
        req_in.write_text("".join(f"{r}\n" for r in requirements), encoding="utf-8")
        excluded = Path(tmp) / "excludes.txt"
        excluded.write_text("".join(f"{name}\n" for name in excludes), encoding="utf-8")
        output = Path(tmp) / "requirements.txt"
        output.write_text("".join(f"{pin}\n" for pin in preferences), encoding="utf-8")
        cmd = [
            find_uv_bin(),
            "pip",
            "compile",
            str(req_in),
            "--output-file",
            str(output),
            "--python-platform",
            uv_platform(platform),
            "--python-version",
            platform.python,
            "--index-url",
            index,
            "--no-header",
            "--no-annotate",
            "--no-config",
            "--no-python-downloads",
            "--color",
            "never",
            "--quiet",
            *(["--excludes", str(excluded)] if excludes else []),
            *(["--upgrade"] if upgrade else []),
            *(arg for name in upgrade_packages for arg in ("--upgrade-package", name)),
        ]
        try:
            proc = subprocess.run(
                cmd, cwd=tmp, capture_output=True, text=True, timeout=UV_TIMEOUT, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise ResolutionError(f"uv pip compile against {index} did not finish in {UV_TIMEOUT} s") from None
        compiled = output.read_text(encoding="utf-8") if proc.returncode == 0 else ""
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        shown = ", ".join(requirements[:12]) + (f" and {len(requirements) - 12} more" if len(requirements) > 12 else "")
        raise ResolutionError(
            f"uv could not resolve {shown} for {uv_platform(platform)} CPython {platform.python} against {index}:\n{tail}"
        )
    return compiled


def resolve_packages(
    lock: Lock,
    *,
    upgrade: bool = False,
    upgrade_packages: Collection[str] = (),
    keep_unmoved: bool = False,
    progress: Progress = silent,
    client: IndexClient | None = None,
    jobs: int = 8,
) -> tuple[Package, ...]:
    """The full closure of ``lock.requirements`` and of what the sources declare (:func:`source_roots`) for
    ``lock.platform``, every installable file hashed.

    The lock's packages are uv's preferences: each stays at its locked version while that still satisfies
    (as uv and pip-tools keep the pins of their last run), except with ``upgrade`` (every package may
    move) and those named in ``upgrade_packages``. With ``keep_unmoved``, a package left at its locked
    version keeps its entry as locked, its files not listed again (an update that moves only what it
    names); without, every package's files are listed anew.

    Packages the lock ties to their own ``index`` are not given to uv (that index may not speak to uv,
    or be out of reach); they are kept, their files re-listed when their index answers (with
    ``keep_unmoved``, only those named). A package keeps its ``waive``, and what packages waive is left
    out of the resolution (for everyone: a requirement of another package on it is then unmet, and
    verify says so).
    """
    if lock.platform is None:
        raise InputError(f"lock {lock.name!r} has no platform; add `platform: {{os: linux, arch: ..., python: ...}}`")
    client = client or IndexClient()
    platform = lock.platform
    default_index = (lock.index or PYPI_SIMPLE).rstrip("/")
    pinned = {canonicalize_name(p.name): p for p in lock.packages if p.index}
    from_sources = source_roots(lock)
    roots = [r for r in lock.requirements if canonicalize_name(Requirement(r).name) not in pinned]
    added = [r.requirement for r in from_sources if canonicalize_name(parsed(r.requirement).name) not in pinned]
    added = [r for r in dict.fromkeys(added) if r not in roots]
    roots += added

    waivers = {canonicalize_name(p.name): p.waive for p in lock.packages if p.waive}
    known = {(f.filename, f.sha256): f.metadata_sha256 for p in lock.packages for f in p.files if f.metadata_sha256}
    excludes = sorted({canonicalize_name(w.name) for waive in waivers.values() for w in waive})
    moving = {canonicalize_name(n) for n in upgrade_packages}
    locked = {canonicalize_name(p.name): p for p in lock.packages}
    pins: list[tuple[str, str]] = []
    if roots:
        also = f" ({len(added)} from the sources)" if added else ""
        progress(
            f"resolving {len(roots)} requirement(s){also} with uv for {uv_platform(platform)} CPython {platform.python}"
            + ("" if upgrade or not locked else ", preferring the locked versions")
        )
        try:
            compiled = run_uv_compile(
                roots,
                platform,
                default_index,
                excludes,
                preferences=[] if upgrade else [f"{p.name}=={p.version}" for p in lock.packages],
                upgrade=upgrade,
                upgrade_packages=sorted(moving),
            )
            pins = parse_pins(compiled)
        except ResolutionError as exc:
            raise ResolutionError(_with_sources(str(exc), from_sources)) from None
        progress(f"uv pinned {len(pins)} package(s); listing their files")
    for name, version in pins:
        if (own := pinned.get(canonicalize_name(name))) and own.version != version:
            progress(f"warning: uv wants {name}=={version}, the lock keeps {own.name}=={own.version} from {own.index}")

    def from_index(pin: tuple[str, str]) -> Package:
        name, version = pin
        page = client.project(default_index, name)
        chosen = select_files(page.files, name, version, platform)
        if not chosen:
            progress(
                f"warning: {default_index} lists no file of {name} {version} installable on {uv_platform(platform)} "
                "with a sha256 to lock it by"
            )
        files = pin_files(chosen, client, default_index, known, progress)
        return Package(name=name, version=version, files=files, waive=waivers.get(canonicalize_name(name), ()))

    def refresh(package: Package) -> Package:
        index = lock.index_for(package)
        try:
            page = client.project(index, package.name)
        except RemoteError as exc:
            progress(f"warning: keeping {package.name} {package.version} as locked: {exc}")
            return package
        chosen = select_files(page.files, package.name, package.version, platform)
        if not chosen:
            progress(
                f"warning: keeping {package.name} {package.version} as locked: {index} lists no installable file of it "
                "with a sha256 to lock it by"
            )
            return package
        return dataclasses.replace(package, files=pin_files(chosen, client, index, known, progress))

    def unmoved(name: str, version: str | None = None) -> Package | None:
        """The locked entry kept as it is, where an update keeps what it does not name."""
        key = canonicalize_name(name)
        entry = locked.get(key)
        if not keep_unmoved or key in moving or entry is None or not entry.files:
            return None
        return entry if version is None or Version(entry.version) == Version(version) else None

    kept = [k for p in pins if canonicalize_name(p[0]) not in pinned and (k := unmoved(*p)) is not None]
    todo = [p for p in pins if canonicalize_name(p[0]) not in pinned and unmoved(*p) is None]
    kept += [k for p in pinned.values() if (k := unmoved(p.name)) is not None]
    relisted = [p for p in pinned.values() if unmoved(p.name) is None]
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            resolved = list(pool.map(from_index, todo)) + list(pool.map(refresh, relisted))
    except RemoteError as exc:
        raise RemoteError(f"cannot list files after resolving: {exc}") from None
    return tuple(sorted(kept + resolved, key=lambda p: canonicalize_name(p.name)))


def _with_sources(message: str, roots: list[Root]) -> str:
    """uv's refusal, with the sources behind each package it names: the fix is usually a waiver there."""
    reason = message.split("\n", 1)[1] if "\n" in message else message  # uv's words, not our list of roots
    named = {
        name
        for r in roots
        if re.search(rf"(?<![\w.-]){re.escape(name := parsed(r.requirement).name)}(?![\w-])", reason)
    }
    lines = explain(roots, named)
    if not lines:
        return message
    return (
        message
        + "\nwhat the sources ask for (a requirement the lock deliberately leaves unmet is waived in the source's "
        + "`waive`, by name and with the reason):\n"
        + "\n".join(f"  {line}" for line in lines)
    )


def pin_files(
    chosen: list[IndexFile],
    client: IndexClient,
    index: str,
    known: dict[tuple[str, str], str],
    say: Progress = silent,
) -> tuple[PackageFile, ...]:
    """The chosen files as the lock pins them: each by sha256 and each wheel's METADATA by its sha256 too,
    read as uv reads it (PEP 658 where the index serves it, else from the zip by range requests; a few
    requests per wheel) unless the lock already pins that very file. A wheel whose METADATA cannot be read
    is locked without the pin, with a warning (verify then cannot tell forged metadata from the real)."""
    files = []
    for f in chosen:
        sha256 = f.sha256 or ""
        digest = known.get((f.filename, sha256))
        if digest is None and f.filename.endswith(".whl"):
            try:
                digest = metadata_sha256(_wheel_metadata(client, f, index))
            except (MetadataError, RemoteError) as exc:
                say(f"warning: {f.filename}: its METADATA is not pinned: {exc}")
        files.append(PackageFile(filename=f.filename, sha256=sha256, metadata_sha256=digest))
    return tuple(files)


def _wheel_metadata(client: IndexClient, listed: IndexFile, index: str) -> bytes:
    if listed.core_metadata is not None and listed.url.startswith(("https://", "http://")):
        return client.core_metadata(listed)
    return read_wheel_metadata(client.open_ranges(listed.url, index=index), listed.filename, max_read=MAX_RANGE_BYTES)
