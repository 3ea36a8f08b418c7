"""The lockfile model, version 1: plain frozen dataclasses, no I/O.

The field metadata (patterns, checks, descriptions) is the single source of truth for both
validation (:mod:`envbuild.lock.io`) and the committed JSON schema (:mod:`envbuild.lock.schema`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from envbuild.lock.typed import meta, mfield

LOCK_VERSION = 1
PYPI_SIMPLE = "https://pypi.org/simple"

HEX40 = r"[0-9a-f]{40}"
HEX64 = r"[0-9a-f]{64}"
SAFE_NAME = r"[a-z0-9][a-z0-9._-]*"
# A branch or tag short name, following git-check-ref-format closely enough to refuse anything that
# could be read as an option, a path escape or a revision expression.
REF_NAME = r"(?!-)(?!refs/)(?!.*\.\.)(?!.*//)(?!.*@\{)(?!.*\.lock(/|$))(?!.*/\.)(?!\.)[A-Za-z0-9._/+-]+(?<![/.])"
PACKAGE_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
DIST_FILENAME = r"[A-Za-z0-9][A-Za-z0-9._+!-]*\.(?:whl|tar\.gz|zip)"
IMAGE_NAME = r"[a-z0-9][a-z0-9._-]*(?::[0-9]+)?(?:/[a-z0-9][a-z0-9._-]*)*(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?"
IMAGE_DIGEST = r"sha256:[0-9a-f]{64}"
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"

_SAFE = "a safe name: lowercase letters, digits, '.', '_', '-', starting with a letter or digit"
_SHA = "40 lowercase hex characters (a full SHA; short SHAs are not allowed)"

REPO_SCHEMES = ("https", "ssh", "git", "file")
_SCP_LIKE = re.compile(r"[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:(?!/?-)[A-Za-z0-9._~/-]+")


def check_repo_url(url: str) -> str | None:
    """Refuse anything git could treat as an option, a transport helper or a local path."""
    if url.startswith("-"):
        return f"{url!r} starts with '-' and would be read as an option"
    if "::" in url.split("/", 1)[0] or url.startswith("ext:"):
        return f"{url!r} names a git remote helper; only {', '.join(REPO_SCHEMES)} URLs are allowed"
    if any(c.isspace() or ord(c) < 32 for c in url):
        return f"{url!r} contains whitespace or control characters"
    if _SCP_LIKE.fullmatch(url):
        return None
    parts = urlsplit(url)
    if parts.scheme not in REPO_SCHEMES:
        return f"{url!r}: scheme must be one of {', '.join(REPO_SCHEMES)}"
    if parts.scheme != "file" and not parts.hostname:
        return f"{url!r} has no host"
    if parts.password:
        return f"{url!r} carries a password; use a credential helper, not the lockfile"
    return None


def check_index_url(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "file") or any(c.isspace() for c in url):
        return f"{url!r}: a package index must be an https, http or file URL"
    if parts.username or parts.password:
        return f"{url!r} carries credentials; use netrc or keyring, not the lockfile"
    if parts.scheme != "file" and not parts.hostname:
        return f"{url!r} has no host"
    return None


def check_version(value: str) -> str | None:
    try:
        Version(value)
    except InvalidVersion:
        return f"{value!r} is not a valid PEP 440 version"
    return None


def check_requirement(value: str) -> str | None:
    try:
        Requirement(value)
    except InvalidRequirement as exc:
        return f"{value!r} is not a PEP 508 requirement: {exc}"
    return None


def check_env(env: dict[str, str]) -> str | None:
    for key, value in env.items():
        if not re.fullmatch(ENV_NAME, key):
            return f"{key!r} is not a valid environment variable name"
        if value is not None and ("\n" in value or "\0" in value):
            return f"value of {key} contains a newline or NUL"
    return None


@dataclass(frozen=True)
class Platform:
    """The platform the lock's packages and image target."""

    os: Literal["linux"]
    arch: Literal["aarch64", "x86_64"]
    python: str = field(
        metadata=meta(
            pattern=r"3\.[0-9]{1,2}",
            expect='a quoted Python version such as "3.12"',
            description="CPython major.minor, quoted",
        )
    )
    cann: str | None = mfield(
        None,
        pattern=r"[0-9]+\.[0-9]+\.[0-9]+(?:\.[A-Za-z0-9]+)*",
        expect='a CANN version such as "9.1.0"',
        description="CANN toolkit version",
    )


@dataclass(frozen=True)
class BaseImage:
    """The image everything is installed into, pinned by manifest digest."""

    name: str = field(
        metadata=meta(
            pattern=IMAGE_NAME,
            expect="registry/repository:tag (no digest, lowercase)",
            description="registry/repository:tag, without a digest",
        )
    )
    digest: str | None = mfield(
        None,
        pattern=IMAGE_DIGEST,
        expect="sha256:<64 lowercase hex>",
        description="sha256 manifest digest; absent means unpinned",
    )


@dataclass(frozen=True)
class Install:
    """How the builder installs a source into the image."""

    mode: Literal["editable", "wheel", "none"] = "editable"
    env: dict[str, str] = mfield(default_factory=dict, check=check_env, description="build environment")


@dataclass(frozen=True)
class Source:
    """One git repository pinned to a commit, with the ref it is supposed to be on."""

    name: str = field(metadata=meta(pattern=SAFE_NAME, expect=_SAFE, description="a safe path component"))
    repo: str = field(metadata=meta(check=check_repo_url, description="https, ssh, git or file URL"))
    ref: str = field(
        metadata=meta(
            pattern=REF_NAME,
            expect="a branch or tag short name (no leading '-', no '..', not refs/...)",
            description="branch or tag short name",
        )
    )
    ref_type: Literal["branch", "tag"]
    commit: str = field(metadata=meta(pattern=HEX40, expect=_SHA, description="full 40-hex commit SHA"))
    tree: str | None = mfield(None, pattern=HEX40, expect=_SHA, description="git tree SHA of the commit: a content pin")
    install: Install | None = None


@dataclass(frozen=True)
class PackageFile:
    """One distribution file the lock allows, by sha256."""

    filename: str = field(metadata=meta(pattern=DIST_FILENAME, expect="a wheel or sdist file name, no path"))
    sha256: str = field(metadata=meta(pattern=HEX64, expect="64 lowercase hex characters (a full sha256)"))


@dataclass(frozen=True)
class Package:
    """One Python distribution at one version, with every file allowed for the lock's platform."""

    name: str = field(metadata=meta(pattern=PACKAGE_NAME, expect="a Python distribution name"))
    version: str = field(metadata=meta(check=check_version))
    files: tuple[PackageFile, ...] = ()
    index: str | None = mfield(
        None, check=check_index_url, description="PEP 691 index serving it; default the lock's index"
    )


@dataclass(frozen=True)
class Lock:
    """A whole environment: sources, packages and base image."""

    version: Literal[1]
    name: str = field(metadata=meta(pattern=SAFE_NAME, expect=_SAFE))
    sources: tuple[Source, ...]
    platform: Platform | None = None
    base_image: BaseImage | None = None
    index: str | None = mfield(None, check=check_index_url, description="default PEP 691 index; PyPI when absent")
    source_date_epoch: int | None = mfield(
        None, description="clamp for build timestamps; default the newest pinned commit"
    )
    requirements: tuple[str, ...] = mfield(
        (),
        check=lambda reqs: next(filter(None, map(check_requirement, reqs)), None),
        description="PEP 508 roots the package closure is resolved from",
    )
    packages: tuple[Package, ...] = ()

    def source(self, name: str) -> Source:
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(name)

    def index_for(self, package: Package) -> str:
        return (package.index or self.index or PYPI_SIMPLE).rstrip("/")
