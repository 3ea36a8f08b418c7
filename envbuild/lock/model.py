"""The lockfile model: plain frozen dataclasses, no I/O.

The field metadata (patterns, checks, descriptions) is the single source of truth for both
validation (:mod:`envbuild.lock.io`) and the committed JSON schemas (:mod:`envbuild.lock.schema`).

Versions. Version 2 adds what version 1 cannot say: a source's git submodules (``submodules``,
``submodules_unknown``), a wheel's METADATA digest (``metadata_sha256``) and the image's installer
(``installer``). A field's ``since`` is the version that introduced it: a version 1 lock may
not use it (its reader names the version the field needs), and the version 1 schema leaves it out, so
one model describes both formats exactly. A version 1 lock reads as a version 2 lock that records no
submodules, which is what it meant: a tree holding a gitlink was refused at export then, and is still.
This envbuild writes version 2 when it updates a lock (:data:`LOCK_VERSION`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuild.data import reference
from envbuild.data.typed import meta, mfield, shown
from envbuild.data.urls import check_index_url, check_repo_url, redact_urls

LOCK_VERSION: Literal[2] = 2  # what `lock update` writes
LOCK_VERSIONS = (1, 2)  # what this envbuild reads
PYPI_SIMPLE = "https://pypi.org/simple"

HEX40 = r"[0-9a-f]{40}"
HEX64 = r"[0-9a-f]{64}"
SAFE_NAME = r"[a-z0-9][a-z0-9._-]*"
# A branch or tag short name, following git-check-ref-format closely enough to refuse anything that
# could be read as an option, a path escape or a revision expression.
REF_NAME = r"(?!-)(?!refs/)(?!.*\.\.)(?!.*//)(?!.*@\{)(?!.*\.lock(/|$))(?!.*/\.)(?!\.)[A-Za-z0-9._/+-]+(?<![/.])"
PACKAGE_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
DIST_FILENAME = r"[A-Za-z0-9][A-Za-z0-9._+!-]*\.(?:whl|tar\.gz|zip)"
IMAGE_NAME = reference.NAME_AND_TAG
IMAGE_DIGEST = reference.SHA256_DIGEST
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# The lock name is the path component of the image tags envbuild sets, envbuild/<name>:<sha12> and
# envbuild-raw/<name>:<sha12>; the longer prefix leaves this much of docker's 255 for the name.
LOCK_NAME_MAX = reference.NAME_TOTAL_MAX - len("envbuild-raw/")
# SOURCE_DATE_EPOCH goes into tar headers (11 octal digits in ustar), Python's datetime and the image
# config's RFC 3339 "created" (4-digit years): the tar header is the smallest of the three.
MAX_EPOCH = 8**11 - 1  # 2242-03-16T12:56:31Z
# Source names, refs and file names become file names (in the cache, the build context, .git/refs):
# one path component, which no common filesystem allows longer than this.
NAME_MAX = 255
# A requirement read from a source's tree, a path in it, a reason: generous, but bounded.
REQUIREMENT_MAX = 1000
PATH_MAX = 4096
REASON_MAX = 500
MODULE_NAME = r"[A-Za-z_][A-Za-z0-9_]*"

_SAFE = "a safe name: lowercase letters, digits, '.', '_', '-', starting with a letter or digit"
_SHA = "40 lowercase hex characters (a full SHA; short SHAs are not allowed)"


def check_version(value: str) -> str | None:
    try:
        Version(value)
    except InvalidVersion:
        return f"{shown(value)} is not a valid PEP 440 version"
    return None


def check_requirement(value: str) -> str | None:
    """A PEP 508 requirement resolved from the index: a direct URL would bypass the index and the
    hash-pinned files (and may carry credentials), so it is refused without being quoted."""
    try:
        requirement = Requirement(value)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]  # packaging appends the input and a caret on further lines
        return f"{shown(redact_urls(value))} is not a PEP 508 requirement: {redact_urls(reason)}"
    if requirement.url is not None:
        return (
            f"{requirement.name}: a direct URL reference (name @ URL) is not allowed; the package closure is "
            "resolved from the index, so name a version (name==1.0) and give its index in `index`"
        )
    return None


def check_source_requirement(value: str) -> str | None:
    """A requirement a source declares, as read from its tree: PEP 508, by name (never a URL)."""
    if len(value) > REQUIREMENT_MAX:
        return f"{len(value)} characters long, at most {REQUIREMENT_MAX} allowed"
    return check_requirement(value)


def check_tree_path(value: str) -> str | None:
    """A file inside a source's tree: relative, '/'-separated, never leaving the tree."""
    if len(value) > PATH_MAX:
        return f"{len(value)} characters long, at most {PATH_MAX} allowed"
    parts = value.split("/")
    if value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in parts):
        return f"{shown(value)} is not a relative path inside the source's tree (no leading '/', '.', '..' or '//')"
    if not value.isprintable():
        return f"{shown(value)} holds control characters"
    return None


def check_submodule_path(value: str) -> str | None:
    """Where a gitlink sits in its parent's tree: a tree path with no ``.git`` component (in any case) and,
    as git's fsck wants of a ``.gitmodules`` path, no leading '-'."""
    if problem := check_tree_path(value):
        return problem
    if any(part.lower() == ".git" for part in value.split("/")):
        return f"{shown(value)} has a .git component"
    if value.startswith("-"):
        return f"{shown(value)} starts with '-'"
    return None


def check_reason(value: str) -> str | None:
    if not value.strip():
        return "a reason is required: say why the lock accepts this"
    if not value.isprintable():
        return "must be one line of printable text"
    return None


def check_env(env: dict[str, str]) -> str | None:
    for key, value in env.items():
        if not re.fullmatch(ENV_NAME, key):
            return f"{shown(key)} is not a valid environment variable name"
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
        max_length=64,
        expect='a CANN version such as "9.1.0"',
        description="CANN toolkit version",
    )


@dataclass(frozen=True)
class BaseImage:
    """The image everything is installed into, pinned by manifest digest."""

    name: str = field(
        metadata=meta(
            pattern=IMAGE_NAME,
            check=reference.check_name_and_tag,
            description="[registry[:port]/]repository[:tag] in docker's reference grammar, without a digest",
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
class Provides:
    """The distribution a source installs as (``[project].name``), and its version when declared statically."""

    name: str = field(metadata=meta(pattern=PACKAGE_NAME, max_length=NAME_MAX, expect="a Python distribution name"))
    version: str | None = mfield(None, check=check_version, description="absent when the version is dynamic")


@dataclass(frozen=True)
class Waiver:
    """A requirement of a source or a package the lock leaves unmet, by name and with the reason: checked
    and reported as waived, never resolved, never silently dropped."""

    name: str = field(metadata=meta(pattern=PACKAGE_NAME, max_length=NAME_MAX, expect="a Python distribution name"))
    reason: str = field(metadata=meta(check=check_reason, max_length=REASON_MAX, description="why the lock accepts it"))


def find_waiver(waive: tuple[Waiver, ...], name: str) -> Waiver | None:
    """The waiver of requirement ``name`` (compared as normalised distribution names), if any."""
    key = canonicalize_name(name)
    return next((w for w in waive if canonicalize_name(w.name) == key), None)


@dataclass(frozen=True)
class SkippedImport:
    """A top-level module of a source the in-image check does not import (it needs an NPU driver, say), and why."""

    name: str = field(metadata=meta(pattern=MODULE_NAME, max_length=NAME_MAX, expect="a top-level Python module name"))
    reason: str = field(metadata=meta(check=check_reason, max_length=REASON_MAX, description="why it is not imported"))


@dataclass(frozen=True)
class Submodule:
    """A git submodule of a source (or of another submodule): the gitlink at ``path`` in the parent's pinned
    tree, with the URL the parent's ``.gitmodules`` gives it. Written by `lock update`; verified, fetched and
    written into the image like a source. ``skip`` leaves it out of the image (the empty directory git
    leaves), by name and with the reason."""

    path: str = field(
        metadata=meta(check=check_submodule_path, description="where the gitlink is, relative to the parent's tree")
    )
    skip: str | None = mfield(
        None,
        max_length=REASON_MAX,
        check=check_reason,
        description="why the image does without it (left as the empty directory git leaves); absent: its tree is written at path",
    )
    repo: str | None = mfield(
        None,
        check=check_repo_url,
        description="its URL in the parent's .gitmodules (a relative one resolved against the parent's repo, as git does)",
    )
    commit: str | None = mfield(
        None,
        pattern=HEX40,
        expect=_SHA,
        description="the commit the parent's gitlink pins; absent only when skipped and there is no gitlink",
    )
    tree: str | None = mfield(None, pattern=HEX40, expect=_SHA, description="git tree SHA of the commit: a content pin")
    submodules: tuple[Submodule, ...] = mfield((), description="its own submodules, recorded the same way")

    @property
    def skipped(self) -> bool:
        return self.skip is not None


def walk_submodules(submodules: tuple[Submodule, ...], prefix: str = "") -> Iterator[tuple[str, Submodule]]:
    """Every submodule at every level, parents first, with its path from the source's root
    (``csrc/third_party/catlass/3rdparty/googletest``)."""
    for sub in submodules:
        path = f"{prefix}{sub.path}"
        yield path, sub
        yield from walk_submodules(sub.submodules, f"{path}/")


@dataclass(frozen=True)
class Source:
    """One git repository pinned to a commit, with the ref it is supposed to be on."""

    name: str = field(
        metadata=meta(pattern=SAFE_NAME, max_length=NAME_MAX, expect=_SAFE, description="a safe path component")
    )
    repo: str = field(metadata=meta(check=check_repo_url, description="https, ssh, git or file URL"))
    ref: str = field(
        metadata=meta(
            pattern=REF_NAME,
            max_length=NAME_MAX,
            expect="a branch or tag short name (no leading '-', no '..', not refs/...)",
            description="branch or tag short name",
        )
    )
    ref_type: Literal["branch", "tag"]
    commit: str = field(metadata=meta(pattern=HEX40, expect=_SHA, description="full 40-hex commit SHA"))
    tree: str | None = mfield(None, pattern=HEX40, expect=_SHA, description="git tree SHA of the commit: a content pin")
    install: Install | None = None
    provides: Provides | None = mfield(
        None, description="the distribution it installs as; written by `lock update`; default: the source's name"
    )
    requires_files: tuple[str, ...] = mfield(
        (),
        item_check=check_tree_path,
        description="requirement files in the tree that its packaging reads (dynamic dependencies), read by `lock update`",
    )
    build_requires: tuple[str, ...] | None = mfield(
        None,
        item_check=check_source_requirement,
        description="[build-system].requires of the pinned tree; absent: not read",
    )
    requires: tuple[str, ...] | None = mfield(
        None,
        item_check=check_source_requirement,
        description="runtime requirements of the pinned tree (extras as `extra == ...` markers); absent: not read",
    )
    requires_unknown: str | None = mfield(
        None,
        max_length=REASON_MAX,
        check=check_reason,
        description="why `lock update` could not read what is absent above",
    )
    waive: tuple[Waiver, ...] = mfield((), description="requirements of this source the lock accepts unmet, by name")
    skip_imports: tuple[SkippedImport, ...] = mfield(
        (), description="top-level modules the in-image check does not import, with the reason"
    )
    submodules: tuple[Submodule, ...] = mfield(
        (),
        since=2,
        description="the git submodules of the pinned tree, written by `lock update`: every gitlink of the tree is here",
    )
    submodules_unknown: str | None = mfield(
        None,
        since=2,
        max_length=REASON_MAX,
        check=check_reason,
        description="why `lock update` could not read the pinned tree's submodules",
    )

    @property
    def distribution(self) -> str:
        """The distribution name other requirements find this source by."""
        return self.provides.name if self.provides is not None else self.name

    def waiver(self, name: str) -> Waiver | None:
        return find_waiver(self.waive, name)

    @property
    def installed(self) -> bool:
        """Whether the build installs it (``install: none`` only copies its files)."""
        return self.install is None or self.install.mode != "none"


@dataclass(frozen=True)
class PackageFile:
    """One distribution file the lock allows, by sha256."""

    filename: str = field(
        metadata=meta(pattern=DIST_FILENAME, max_length=NAME_MAX, expect="a wheel or sdist file name, no path")
    )
    sha256: str = field(metadata=meta(pattern=HEX64, expect="64 lowercase hex characters (a full sha256)"))
    metadata_sha256: str | None = mfield(
        None,
        pattern=HEX64,
        expect="64 lowercase hex characters (a full sha256)",
        since=2,
        description="a wheel's: sha256 of its *.dist-info/METADATA, which `lock update` pins; the closure "
        "check trusts an index's metadata only when it matches, and fetch compares the wheel's own with it",
    )


@dataclass(frozen=True)
class Package:
    """One Python distribution at one version, with every file allowed for the lock's platform."""

    name: str = field(metadata=meta(pattern=PACKAGE_NAME, max_length=NAME_MAX, expect="a Python distribution name"))
    version: str = field(metadata=meta(check=check_version))
    files: tuple[PackageFile, ...] = ()
    index: str | None = mfield(
        None, check=check_index_url, description="PEP 691 index serving it; default the lock's index"
    )
    waive: tuple[Waiver, ...] = mfield(
        (),
        description="requirements of this package the lock accepts unmet (it is installed without them), by name",
    )

    def waiver(self, name: str) -> Waiver | None:
        return find_waiver(self.waive, name)


@dataclass(frozen=True)
class Lock:
    """A whole environment: sources, packages and base image."""

    version: Literal[1, 2] = field(metadata=meta(version=True))
    name: str = field(
        metadata=meta(
            pattern=reference.PATH_COMPONENT,
            max_length=LOCK_NAME_MAX,
            expect="a docker repository path component: lowercase letters and digits separated by one '.', "
            "one or two '_', or '-'s (the image is envbuild/<name>)",
            description="a docker repository path component; it names the image envbuild/<name>",
        )
    )
    sources: tuple[Source, ...]
    platform: Platform | None = None
    base_image: BaseImage | None = None
    index: str | None = mfield(None, check=check_index_url, description="default PEP 691 index; PyPI when absent")
    source_date_epoch: int | None = mfield(
        None,
        minimum=0,
        maximum=MAX_EPOCH,
        expect=f"seconds since 1970 from 0 to {MAX_EPOCH} (2242-03-16T12:56:31Z, the latest a tar header holds)",
        description="clamp for build timestamps; default the newest pinned commit",
    )
    requirements: tuple[str, ...] = mfield(
        (), item_check=check_requirement, description="PEP 508 roots the package closure is resolved from"
    )
    packages: tuple[Package, ...] = ()
    installer: Package | None = mfield(
        None,
        since=2,
        description="uv, pinned like a package: it installs the packages into the image (bind-mounted, in no "
        "layer); pip when absent",
    )

    def source(self, name: str) -> Source:
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(name)

    @property
    def pinned_packages(self) -> tuple[Package, ...]:
        """Every package whose files a build fetches and verify checks: the packages, then the installer
        (pinned and checked like them, installed never)."""
        return (*self.packages, *((self.installer,) if self.installer else ()))

    @property
    def package_files(self) -> tuple[tuple[Package, PackageFile], ...]:
        return tuple((p, f) for p in self.pinned_packages for f in sorted(p.files, key=lambda f: f.filename))

    def index_for(self, package: Package) -> str:
        return (package.index or self.index or PYPI_SIMPLE).rstrip("/")
