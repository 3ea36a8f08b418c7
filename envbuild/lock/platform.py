"""Everything a lock's platform means, written once: the lock pins packages for ``platform`` (os, arch,
python), which need not be this machine's.

- the glibc floor it promises (:data:`GLIBC`) and so the uv target triple (:func:`uv_platform`);
- the wheel tags CPython on it installs (:func:`supported_tags`), and which files are a distribution's;
- the PEP 508 environment its markers are evaluated in (:func:`marker_environment`, :func:`applies`);
- the OCI platform a base image must be for (:func:`oci_platform`).

``lock update`` resolves for it, ``lock verify`` judges requirements in it, ``envbuild image`` checks the
base against it; none of them spells it out again. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from packaging.markers import UndefinedComparison, default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from envbuild.lock.model import Platform

# The glibc floor the lock's platform promises; uv resolves for the same (`<arch>-manylinux_2_28`).
GLIBC = (2, 28)
SDIST_SUFFIXES = (".tar.gz", ".zip")
# The lock's (and the kernel's) machine names, as OCI image configs and docker's platforms spell them.
OCI_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}

Environment = dict[str, str]


def marker_environment(platform: Platform | None) -> Environment:
    """The PEP 508 environment of CPython ``platform.python`` on Linux of ``platform.arch`` (glibc, as the
    resolver targets). A lock without a platform is for the machine it is used on: this interpreter's."""
    if platform is None:
        return {key: str(value) for key, value in default_environment().items()}
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{platform.python}.0",
        "os_name": "posix",
        "platform_machine": platform.arch,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{platform.python}.0",
        "python_version": platform.python,
        "sys_platform": "linux",
    }


_PARSED: dict[str, Requirement] = {}
_PARSED_MAX = 65536


def parsed(text: str) -> Requirement:
    """A requirement recorded in a lock or read from core metadata (valid PEP 508: checked before), each
    text parsed once (packaging's parser: ~70 µs a requirement; torch and ray declare hundreds)."""
    found = _PARSED.get(text)
    if found is None:
        found = Requirement(text)
        if len(_PARSED) < _PARSED_MAX:
            _PARSED[text] = found
    return found


def normalised(text: str) -> str:
    """``str(Requirement(text))``: the requirement as packaging writes it, remembered under that text too
    (what is normalised is parsed next)."""
    requirement = parsed(text)
    written = str(requirement)
    if len(_PARSED) < _PARSED_MAX:
        _PARSED.setdefault(written, requirement)
    return written


def try_parse(text: str) -> Requirement | None:
    try:
        return parsed(text)
    except InvalidRequirement:
        return None


def applies(requirement: Requirement, environment: Environment, extras: Iterable[str] = ("",)) -> bool:
    """Whether the requirement holds in ``environment`` when any of ``extras`` is requested ("" is the
    distribution without extras). A marker that cannot be compared (a version marker against a
    non-version) does not apply, as pip treats it."""
    if requirement.marker is None:
        return True
    for extra in extras:
        try:
            if requirement.marker.evaluate({**environment, "extra": extra}):
                return True
        except UndefinedComparison:
            continue
    return False


def without_marker(requirement: Requirement) -> str:
    """``name[extras]specifier``: a requirement already evaluated for the platform, for the resolver."""
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    return f"{requirement.name}{extras}{requirement.specifier}"


def uv_platform(platform: Platform) -> str:
    """The target uv resolves for: ``aarch64-manylinux_2_28``."""
    return f"{platform.arch}-manylinux_{GLIBC[0]}_{GLIBC[1]}"


@cache
def supported_tags(platform: Platform) -> frozenset[Tag]:
    """Every wheel tag CPython ``platform.python`` on glibc-``GLIBC`` Linux of that arch installs."""
    major, minor = (int(x) for x in platform.python.split("."))
    arch = platform.arch
    platforms = [f"manylinux_{GLIBC[0]}_{m}_{arch}" for m in range(GLIBC[1], 4, -1)]
    # The legacy aliases name glibc 2.17 (manylinux2014), 2.12 (manylinux2010) and 2.5 (manylinux1);
    # the latter two only ever existed for x86 arches.
    platforms.append(f"manylinux2014_{arch}")
    if arch == "x86_64":
        platforms += [f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    platforms.append(f"linux_{arch}")
    interpreter = f"cp{major}{minor}"
    tags = list(cpython_tags((major, minor), abis=[interpreter], platforms=platforms))
    tags += compatible_tags((major, minor), interpreter=interpreter, platforms=platforms)
    return frozenset(tags)


def wheel_fits(filename: str, platform: Platform) -> bool:
    """Whether the wheel ``filename`` installs on ``platform`` (one of its tags is one CPython there takes)."""
    return not parse_wheel_filename(filename)[3].isdisjoint(supported_tags(platform))


def file_version(filename: str, name: str) -> Version | None:
    """The version a distribution file carries, or None if it is not a wheel/sdist of ``name``."""
    try:
        if filename.endswith(".whl"):
            file_name, version, _, _ = parse_wheel_filename(filename)
        elif filename.endswith(SDIST_SUFFIXES):
            file_name, version = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return version if file_name == canonicalize_name(name) else None


def oci_platform(arch: str) -> str:
    """``linux/arm64`` for the lock's ``aarch64``: how docker and image indexes name the platform."""
    return f"linux/{OCI_ARCH.get(arch, arch)}"
