"""Environment markers evaluated for the lock's platform, which need not be this machine's."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from packaging.markers import UndefinedComparison, default_environment
from packaging.requirements import InvalidRequirement, Requirement

from envbuild.lock.model import Platform

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


@lru_cache(maxsize=65536)
def parsed(text: str) -> Requirement:
    """A requirement recorded in a lock or read from core metadata (valid PEP 508: checked before)."""
    return Requirement(text)


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
