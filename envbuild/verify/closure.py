"""The whole-closure check: every requirement of the lock's roots, sources and packages, for the lock's
platform, met by a locked package or a source, or waived by name (pure; the metadata is handed in).

Each requirement is judged once per requirer, with markers evaluated for ``lock.platform`` and for the
extras someone asked of the requirer (``megatron-core[dev,mlm]`` brings in megatron-core's ``dev`` and
``mlm`` requirements, which may ask for more extras in turn, until nothing new is asked). Versions are
compared as ``pip check`` does (pre-releases count). A requirement its source or package waives is
reported as waived with the reason, and what it would be otherwise; it is never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuild.data.urls import redact_urls
from envbuild.lock.model import Lock, Package, Source
from envbuild.lock.platform import applies, marker_environment, try_parse
from envbuild.verify.results import PinResult, RequirementStatus

ROOT = "\0lock"


@dataclass(frozen=True)
class PackageMetadata:
    """What a locked package's core metadata says it needs; ``requires`` is None when it could not be read."""

    name: str
    requires: tuple[str, ...] | None
    detail: str = ""  # where the metadata came from, or why it could not be read
    status: RequirementStatus = "unknown"  # when requires is None: `metadata-mismatch` is an index lying


@dataclass(frozen=True)
class Provider:
    """Who puts a distribution in the environment: a locked package or an installed source."""

    kind: str  # "package" | "source"
    owner: str  # the package's or the source's name
    version: str | None  # None: a source whose version is not declared statically

    def describe(self, distribution: str) -> str:
        if self.kind == "package":
            return f"{distribution} {self.version} is locked"
        return f"source {self.owner} provides {distribution}" + (f" {self.version}" if self.version else "")


@dataclass
class _Requirer:
    name: str  # as results name it: the lock's name, a source's or a package's
    order: tuple[int, str]
    requirements: tuple[tuple[str, bool], ...] | None  # (PEP 508 text, build?)
    unknown: tuple[tuple[bool, str], ...] = ()  # (build?, why) for what is not recorded
    owner: Source | Package | None = None  # whose waivers apply: the lock's own requirements have none
    unknown_status: RequirementStatus = "unknown"


def providers(lock: Lock) -> dict[str, Provider]:
    """Every distribution the environment holds, by normalised name; an installed source wins over a
    package of the same name (it is installed after the packages)."""
    found: dict[str, Provider] = {
        canonicalize_name(p.name): Provider("package", p.name, p.version) for p in lock.packages
    }
    for source in lock.sources:
        if source.installed:
            version = source.provides.version if source.provides else None
            found[canonicalize_name(source.distribution)] = Provider("source", source.name, version)
    return found


def check_closure(lock: Lock, metadata: Mapping[str, PackageMetadata]) -> list[PinResult]:
    """One ``requirement`` result per requirement that applies on the platform, and one ``unknown`` per
    requirer whose requirements are not known; roots first, then sources (lock order), then packages."""
    environment = marker_environment(lock.platform)
    provided = providers(lock)
    requirers = _requirers(lock, metadata)
    requested: dict[str, set[str]] = {key: {""} for key in requirers}
    done: dict[str, set[str]] = {key: set() for key in requirers}
    results: dict[tuple[str, str, bool], tuple[tuple[int, str], int, PinResult]] = {}
    todo = list(requirers)
    while todo:
        key = todo.pop(0)
        requirer, extras = requirers[key], requested[key] - done[key]
        done[key] |= extras
        for index, (text, build) in enumerate(requirer.requirements or ()):
            requirement = try_parse(text)
            if requirement is None:
                result = _result(requirer.name, text, build, "unknown", "not a PEP 508 requirement")
                results.setdefault((key, text, build), (requirer.order, index, result))
                continue
            if not applies(requirement, environment, extras):
                continue
            result = judge(requirer.name, requirement, text, build, provided, requirer.owner)
            results.setdefault((key, text, build), (requirer.order, index, result))
            target = canonicalize_name(requirement.name)
            if result.status != "waived" and requirement.extras and target in requested:
                asked = {canonicalize_name(e) for e in requirement.extras}
                if not asked <= requested[target]:
                    requested[target] |= asked
                    todo.append(target)
    unknown = [
        (requirer.order, i - len(requirer.unknown), _result(requirer.name, None, build, requirer.unknown_status, why))
        for requirer in requirers.values()
        for i, (build, why) in enumerate(requirer.unknown)
    ]
    ordered = sorted([*results.values(), *unknown], key=lambda item: (item[0], item[1]))
    return [result for _, _, result in ordered]


def judge(
    requirer: str,
    requirement: Requirement,
    text: str,
    build: bool,
    provided: Mapping[str, Provider],
    owner: Source | Package | None = None,
) -> PinResult:
    """The verdict on one requirement that applies: ok, unmet, conflict, unknown, or waived by ``owner``
    (the source or package that requires it)."""
    status, detail = _state(requirement, provided.get(canonicalize_name(requirement.name)))
    waiver = owner.waiver(requirement.name) if owner is not None else None
    if waiver is not None:
        return _result(requirer, text, build, "waived", f"waived: {waiver.reason} ({status}: {detail})")
    return _result(requirer, text, build, status, detail)


def _state(requirement: Requirement, provider: Provider | None) -> tuple[RequirementStatus, str]:
    name = requirement.name
    if provider is None:
        return "unmet", f"no package or source in the lock provides {name}"
    describe = provider.describe(name)
    if not requirement.specifier:
        return "ok", describe
    if provider.version is None:
        return "unknown", (
            f"source {provider.owner} provides {name}, but its version is not declared statically: "
            f"{requirement.specifier} is checked in the image"
        )
    try:
        version = Version(provider.version)
    except InvalidVersion:
        return "unknown", f"{describe}, not a PEP 440 version"
    if requirement.specifier.contains(version, prereleases=True):
        return "ok", describe
    return "conflict", f"{describe}, outside {requirement.specifier}"


def _result(requirer: str, text: str | None, build: bool, status: RequirementStatus, why: str) -> PinResult:
    """The detail names the requirement, so a line quoting only the detail (a refusal) says what it is.
    A requirement from a package's metadata is the index's word: a direct URL in it is shown with its user
    part hidden, in the detail and in the ``requirement`` fact alike."""
    shown = redact_urls(text) if text is not None else None
    detail = f"{'builds with' if build else 'requires'} {shown}: {why}" if shown is not None else why
    return PinResult("requirement", requirer, status, detail, {"requirement": shown, "build": build})


def _requirers(lock: Lock, metadata: Mapping[str, PackageMetadata]) -> dict[str, _Requirer]:
    requirers: dict[str, _Requirer] = {
        ROOT: _Requirer(lock.name, (0, ""), tuple((r, False) for r in lock.requirements))
    }
    for package in sorted(lock.packages, key=lambda p: canonicalize_name(p.name)):
        key = canonicalize_name(package.name)
        found = metadata.get(key) or PackageMetadata(package.name, None, "its core metadata was not read")
        if found.requires is None:
            requirers[key] = _Requirer(package.name, (2, key), None, ((False, found.detail),), package, found.status)
        else:
            requirers[key] = _Requirer(package.name, (2, key), tuple((r, False) for r in found.requires), (), package)
    for i, source in enumerate(lock.sources):
        if not source.installed:
            continue
        unknown = []
        why = (
            f"not known: {source.requires_unknown}"
            if source.requires_unknown
            else "not recorded in the lock (`envbuild lock update` reads them from the pinned tree)"
        )
        if source.build_requires is None:
            unknown.append((True, f"build requirements {why}"))
        if source.requires is None:
            unknown.append((False, f"requirements {why}"))
        listed = tuple((r, True) for r in source.build_requires or ()) + tuple(
            (r, False) for r in source.requires or ()
        )
        requirers[canonicalize_name(source.distribution)] = _Requirer(
            source.name, (1, f"{i:06d}"), listed, tuple(unknown), source
        )
    return requirers
