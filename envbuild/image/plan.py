"""The image plan: where everything goes in an image, decided from the lock alone (pure).

A leaf of ``envbuild.image``: the plan types, the image's paths and labels, and :func:`plan_context`.
Rendering (``render``), assembling the context on disk (``assemble``), the build record (``record``)
and judging the in-image report (``inimage_verdict``) import from here; none of them imports another,
and only the orchestrator (``build``) puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from packaging.utils import canonicalize_name

from envbuild.data.jsonout import fields_json, jfield, json_meta, records
from envbuild.errors import InputError
from envbuild.lock.model import Lock, Package, PackageFile, Source, walk_submodules
from envbuild.lock.platform import try_parse, wheel_fits

MANIFEST_VERSION = 2
IMAGE_ROOT = "/opt/envbuild"
IMAGE_SRC = f"{IMAGE_ROOT}/src"
IMAGE_META = f"{IMAGE_ROOT}/meta"
# The directories above IMAGE_META, whose headers the meta layer keeps as the built layers left them.
META_PARENTS = tuple(str(p) for p in reversed(PurePosixPath(IMAGE_META).parents) if str(p) != "/")
# BuildKit builds: the one mount point every RUN mounts its input on, the in-image check's step too (made
# empty by the tools layer in every image, so that no RUN leaves a mount stub in its layer, and no mount
# there moves the mtime of a directory above it).
MOUNT_POINT = f"{IMAGE_ROOT}/mnt"
# The lock's uv in a build context (read out of its wheel), with stage_packages.py in the image's, and where
# a source's step mounts that directory: below the step's /tmp, a tmpfs, so its mount point is made there
# and not in the layer.
INSTALLER_DIR = "installer"
UV_BINARY = f"{INSTALLER_DIR}/uv"
INSTALLER_IN_STEP = "/tmp/envbuild-installer"

# Image labels. LOCK_LABEL is what every consumer (the runner's preflight, the docker backend, the
# cluster) checks: the sha256 of exactly the lockfile's bytes the image was built from.
LOCK_LABEL = "io.envbuild.lock.sha256"
LOCK_NAME_LABEL = "io.envbuild.lock.name"
# On the packages image (and so on the image): the distro-managed distributions the lock replaced.
DISTRO_REMOVED_LABEL = "io.envbuild.packages.distro-removed"
# Only on the container that installs a lock's packages (no image carries it, so no container a user runs
# from an envbuild image does): what the engine's tidying may remove of a killed build.
ROLE_LABEL = "io.envbuild.role"


def source_commit_label(name: str) -> str:
    return f"io.envbuild.source.{name}.commit"


@dataclass(frozen=True)
class SubmodulePlan:
    """One submodule of a source, any level, as the image gets it (or, skipped, as the empty directory of
    its gitlink); ``path`` is from the source's root."""

    path: str
    repo: str | None
    commit: str | None
    tree: str | None  # the lock's pin; the exported tree is checked against the commit's in any case
    skip: str | None


@dataclass(frozen=True)
class SourcePlan:
    """One source as the image gets it, in layer order."""

    name: str
    repo: str
    ref: str
    ref_type: str
    commit: str
    tree: str | None
    mode: str = field(metadata=json_meta(key="install"))  # editable | wheel | none
    env: tuple[tuple[str, str], ...] = field(metadata=json_meta(convert=dict))
    context_path: str = field(metadata=json_meta(skip=True))  # src/<name>
    image_path: str = field(metadata=json_meta(key="path"))  # /opt/envbuild/src/<name>
    source: Source = field(metadata=json_meta(skip=True))  # what export_source is called with
    # What it installs as (the in-image check finds it by its origin, else by this).
    distribution: str = ""
    # (requirement name, reason): the in-image check forgives these.
    waive: tuple[tuple[str, str], ...] = jfield((), convert=records("name", "reason"))
    # (module, reason): not imported in the image.
    skip_imports: tuple[tuple[str, str], ...] = jfield((), convert=records("name", "reason"))
    submodules: tuple[SubmodulePlan, ...] = jfield((), omit="empty")  # every level, parents first


@dataclass(frozen=True)
class FilePlan:
    package: str
    version: str
    filename: str
    sha256: str
    context_path: str = field(metadata=json_meta(skip=True))  # wheels/<filename>
    entry: tuple[Package, PackageFile] = field(metadata=json_meta(skip=True))  # what file_for is called with

    @classmethod
    def of(cls, package: Package, file: PackageFile, directory: str) -> FilePlan:
        return cls(
            package.name, package.version, file.filename, file.sha256, f"{directory}/{file.filename}", (package, file)
        )


@dataclass(frozen=True)
class ContextPlan:
    """Everything the context and the Dockerfile are made from; a pure function of the lock."""

    lock_name: str
    lock_sha256: str
    epoch: int
    base_name: str = field(metadata=json_meta(key="base_image"))  # shown as the lock has it: {name, digest}
    base_digest: str | None = field(metadata=json_meta(skip=True))
    allow_unpinned: bool = field(metadata=json_meta(skip=True))
    python: str | None
    cann: str | None
    arch: str | None  # the lock's platform.arch (aarch64, x86_64); None without a platform
    sources: tuple[SourcePlan, ...]
    files: tuple[FilePlan, ...]
    requirements: str = field(metadata=json_meta(skip=True))  # the text of envbuild/requirements.txt
    # The lock's installer: the uv wheel for its platform, whose binary the packages step runs from a bind
    # mount (``installer/<filename>`` in the context); None: pip, the base's own, installs.
    installer: FilePlan | None = jfield(None, omit="none")
    # The locked packages a source's build imports (:func:`build_backends`), whose bytecode the packages
    # step compiles, checked by hash: each source's step then runs its build backend without compiling it.
    compiled: tuple[str, ...] = jfield((), omit="empty")

    @property
    def installed_by(self) -> str:
        """What installs the packages, as progress and the layer's history say it: ``uv 0.13.9``, or ``pip``."""
        return f"uv {self.installer.version}" if self.installer else "pip"

    def to_json(self) -> dict[str, Any]:
        return fields_json(self, base_name={"name": self.base_name, "digest": self.base_digest})


def layer_order(sources: tuple[Source, ...]) -> tuple[Source, ...]:
    """Tags first (they do not move), then branches; the lock's order within each.

    A moved pin rebuilds its own layer and every layer after it, so the pins least likely to move
    go first. The lock's order is kept otherwise, as it may encode a build-time dependency.
    """
    return tuple(sorted(sources, key=lambda s: s.ref_type != "tag"))


def requirements_text(lock: Lock) -> str:
    installer = "uv pip" if lock.installer else "pip"
    lines = [f"# envbuild: installed with {installer} --no-index --require-hashes --no-deps; do not edit"]
    for package in sorted(lock.packages, key=lambda p: canonicalize_name(p.name)):
        hashes = " ".join(f"--hash=sha256:{f.sha256}" for f in sorted(package.files, key=lambda f: f.sha256))
        lines.append(f"{canonicalize_name(package.name)}=={package.version} {hashes}".rstrip())
    return "\n".join(lines) + "\n"


def plan_context(
    lock: Lock, *, lock_sha256: str, epoch: int | None = None, allow_unpinned: bool = False
) -> ContextPlan:
    """Decide what goes where. ``epoch`` is used when the lock fixes no ``source_date_epoch``
    (the caller computes the newest pinned commit's date from git)."""
    problems = []
    if lock.base_image is None:
        problems.append(
            "the lock has no base image: `envbuild lock update LOCK --base-image IMAGE[:TAG]` sets and pins one"
        )
    elif lock.base_image.digest is None and not allow_unpinned:
        problems.append(
            f"base image {lock.base_image.name} is not pinned by digest: `envbuild lock update LOCK --base` pins it"
        )
    chosen = lock.source_date_epoch if lock.source_date_epoch is not None else epoch
    if chosen is None and not lock.sources:
        chosen = 0  # no commit to date the build by: the epoch itself, the same on every machine
    if chosen is None:
        problems.append("no build epoch: set source_date_epoch in the lock or pass the newest commit's date")
    packages_without_files = [p.name for p in lock.packages if not p.files]
    if packages_without_files:
        problems.append(
            f"packages without files (run `envbuild lock update LOCK --packages` where their index is reachable): "
            f"{', '.join(sorted(packages_without_files))}"
        )
    installer = _installer_file(lock)
    if lock.installer is not None and installer is None:
        problems.append(
            f"installer {lock.installer.name} {lock.installer.version} has no wheel for the lock's platform "
            f"(`envbuild lock update LOCK --installer` pins one)"
        )
    if problems:
        raise InputError("cannot plan the image: " + "; ".join(problems))
    assert lock.base_image is not None and chosen is not None
    sources = tuple(
        SourcePlan(
            name=s.name,
            repo=s.repo,
            ref=s.ref,
            ref_type=s.ref_type,
            commit=s.commit,
            tree=s.tree,
            mode=(s.install.mode if s.install else "editable"),
            env=tuple(sorted((s.install.env if s.install else {}).items())),
            context_path=f"src/{s.name}",
            image_path=f"{IMAGE_SRC}/{s.name}",
            source=s,
            distribution=s.distribution,
            waive=tuple((w.name, w.reason) for w in s.waive),
            skip_imports=tuple((i.name, i.reason) for i in s.skip_imports),
            submodules=tuple(
                SubmodulePlan(path, sub.repo, sub.commit, sub.tree, sub.skip)
                for path, sub in walk_submodules(s.submodules)
            ),
        )
        for s in layer_order(lock.sources)
    )
    files = tuple(
        FilePlan.of(p, f, "wheels")
        for p in sorted(lock.packages, key=lambda p: canonicalize_name(p.name))
        for f in sorted(p.files, key=lambda f: f.filename)
    )
    return ContextPlan(
        lock_name=lock.name,
        lock_sha256=lock_sha256,
        epoch=chosen,
        base_name=lock.base_image.name,
        base_digest=lock.base_image.digest,
        allow_unpinned=allow_unpinned,
        python=lock.platform.python if lock.platform else None,
        cann=lock.platform.cann if lock.platform else None,
        arch=lock.platform.arch if lock.platform else None,
        sources=sources,
        files=files,
        requirements=requirements_text(lock),
        installer=installer,
        compiled=build_backends(lock),
    )


DEFAULT_BACKEND = "setuptools"  # PEP 517's fallback for a tree that declares no build system


def build_backends(lock: Lock) -> tuple[str, ...]:
    """The locked packages (their names as the lock has them, sorted) that an installed source's build
    requires: each one's ``build_requires`` by name, or setuptools where the lock does not know them. Each
    source's step builds with ``--no-build-isolation``, so these are imported from the packages layer in every
    source's step; a name the lock does not install is not there to compile."""
    wanted: set[str] = set()
    for source in lock.sources:
        if not source.installed:
            continue
        texts = source.build_requires if source.build_requires is not None else (DEFAULT_BACKEND,)
        wanted |= {canonicalize_name(r.name) for r in map(try_parse, texts) if r is not None}
    return tuple(sorted(p.name for p in lock.packages if canonicalize_name(p.name) in wanted))


def _installer_file(lock: Lock) -> FilePlan | None:
    """The installer's wheel the build runs: the first (by name) whose tags the lock's platform takes, or
    without a platform the first; None without an installer or a wheel for the platform."""
    if lock.installer is None:
        return None
    for file in sorted(lock.installer.files, key=lambda f: f.filename):
        if file.filename.endswith(".whl") and (lock.platform is None or wheel_fits(file.filename, lock.platform)):
            return FilePlan.of(lock.installer, file, INSTALLER_DIR)
    return None
