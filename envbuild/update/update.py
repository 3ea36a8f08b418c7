"""`lock update`: move pins to what their refs name upstream now, and re-resolve the package closure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from packaging.utils import canonicalize_name

from envbuild.data.reference import check_name_and_tag
from envbuild.errors import InputError, RemoteError
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError, UnsupportedRepository, ref_refspec
from envbuild.git.upstream import Upstream, check_inputs
from envbuild.lock.model import LOCK_VERSION, BaseImage, Lock, Source
from envbuild.progress import Progress, silent
from envbuild.update.installer import pin_installer
from envbuild.update.read_requirements import read_source_requirements
from envbuild.update.read_submodules import SubmodulesRefused, Walked, read_source_submodules
from envbuild.update.resolve import resolve_packages


@dataclass(frozen=True)
class Moves:
    """What ``lock update`` is asked to move (see :func:`update_lock`); nothing named moves everything."""

    names: tuple[str, ...] = ()  # sources
    packages: bool | None = None  # re-resolve the closure (None: when everything moves, or packages are named)
    package_names: tuple[str, ...] = ()
    upgrade: bool = False
    base: bool = False
    base_image: str | None = None
    installer: bool = False

    @property
    def everything(self) -> bool:
        return not (self.names or self.package_names or self.base or self.base_image or self.packages or self.installer)


def update_lock(
    lock: Lock,
    moves: Moves,
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    jobs: int = 8,
    progress: Progress = silent,
) -> Lock:
    """A new lock, at the current lock version, moved as far as asked and no further.

    ``moves`` names what moves. Nothing named (no ``names``, ``package_names``, ``base``, ``base_image``,
    ``installer``, nor ``packages=True``) moves
    everything: every source to its ref's current commit and tree, the package closure re-resolved, the
    base image re-pinned to the digest its registry serves now. Otherwise only what is named moves: the
    sources ``names``; the closure with ``packages=True``, or only the packages ``package_names`` (every
    other package kept at its locked version where that still satisfies); the base image with ``base``,
    or ``base_image``, a new reference pinned by digest (a base asked for by name that cannot be pinned
    is an error, not a warning); the installer with ``installer`` (uv at the version envbuild runs, its
    wheel for the platform), which a re-resolve also pins where the lock has none (and ``upgrade``
    moves). ``packages=False`` never re-resolves; by default the closure is
    re-resolved when everything moves, packages are named, or with ``upgrade``. The resolver prefers the
    locked versions unless ``upgrade``, which lets every package move.

    Whenever a source moves, every source's requirements and submodules are read from its pinned tree;
    submodules the lock cannot record refuse the update (:class:`SubmodulesRefused`), every source's at
    once, before anything is resolved."""
    known = {s.name for s in lock.sources}
    unknown = [n for n in moves.names if n not in known]
    if unknown:
        raise InputError(f"{unknown[0]}: no such source in lock {lock.name!r} (sources: {', '.join(sorted(known))})")
    _check_package_names(lock, moves.package_names)
    everything = moves.everything
    resolve = moves.packages if moves.packages is not None else everything or bool(moves.package_names) or moves.upgrade
    if not resolve and (moves.package_names or moves.upgrade):
        option = "--package" if moves.package_names else "--upgrade"
        raise InputError(f"--no-packages with {option}: moving packages re-resolves them; give one or the other")
    if moves.base and moves.base_image is None and lock.base_image is None:
        raise InputError(f"--base: lock {lock.name!r} has no base image; set one with --base-image IMAGE[:TAG]")
    new_base = _new_base(moves.base_image)
    selected = set(moves.names) or (known if everything else set())
    updated = dataclasses.replace(lock, version=LOCK_VERSION)
    if selected or lock.version < LOCK_VERSION:  # a lock of an older version gets what the current one records
        updated = dataclasses.replace(updated, sources=_moved_sources(lock, selected, cache, mirrors, progress))
    if resolve:
        declared = any(s.requires or s.build_requires for s in updated.sources)
        if lock.requirements or lock.packages or (declared and lock.platform is not None):
            resolved = resolve_packages(
                updated,
                upgrade=moves.upgrade,
                upgrade_packages=moves.package_names,
                keep_unmoved=not everything,
                jobs=jobs,
                progress=progress,
            )
            updated = dataclasses.replace(updated, packages=resolved)
        elif declared:
            progress("warning: the lock has no platform: the sources' requirements are recorded, not resolved")
    if moves.installer:
        updated = dataclasses.replace(updated, installer=pin_installer(updated, progress=progress))
    elif resolve and updated.packages and lock.platform and (lock.installer is None or moves.upgrade):
        try:
            updated = dataclasses.replace(updated, installer=pin_installer(updated, progress=progress))
        except RemoteError as exc:  # not asked for by name: the lock keeps what installs it now
            kept = f"uv {lock.installer.version}" if lock.installer else "the base's pip"
            progress(f"warning: the installer is not pinned: {exc}; {kept} installs the packages")
    arch = lock.platform.arch if lock.platform else None
    if new_base is not None:
        updated = dataclasses.replace(updated, base_image=pin_base_image(new_base, arch, progress, required=True))
    elif (everything or moves.base) and lock.base_image is not None:
        updated = dataclasses.replace(
            updated, base_image=pin_base_image(lock.base_image, arch, progress, required=moves.base)
        )
    return updated


def _check_package_names(lock: Lock, names: Sequence[str]) -> None:
    locked = {canonicalize_name(p.name) for p in lock.packages}
    unknown = [n for n in names if canonicalize_name(n) not in locked]
    if unknown:
        shown = f"{len(locked)} packages" if locked else "none"
        raise InputError(f"--package {unknown[0]}: no such package in lock {lock.name!r} ({shown})")


def _new_base(reference: str | None) -> BaseImage | None:
    """The base image ``--base-image`` names, checked as docker reads a reference (no digest: the
    registry's answer pins it)."""
    if reference is None:
        return None
    if problem := check_name_and_tag(reference):
        raise InputError(f"--base-image: {problem}")
    return BaseImage(name=reference)


def _moved_sources(
    lock: Lock, selected: set[str], cache: GitCache, mirrors: Mirrors, progress: Progress
) -> tuple[Source, ...]:
    """The ``selected`` sources moved to their refs' current commits; every source's requirements and
    submodules read from its (new) pinned tree."""
    sources = tuple(_update_source(s, cache, mirrors, progress) if s.name in selected else s for s in lock.sources)
    # A moved pin brings new requirements, and an unmoved one is re-read from the cache, where its objects
    # stay once fetched.
    sources = tuple(
        read_source_requirements(new, cache, mirrors=mirrors, previous=old, progress=progress)
        for old, new in zip(lock.sources, sources)
    )
    refused: list[str] = []
    walked = Walked()  # each (repository, commit) read once, the records of every source counted together
    sources = tuple(
        read_source_submodules(
            new, cache, mirrors=mirrors, previous=old, progress=progress, problems=refused, walked=walked
        )
        for old, new in zip(lock.sources, sources)
    )
    if refused:
        raise SubmodulesRefused(refused)
    return sources


def pin_base_image(
    image: BaseImage, arch: str | None = None, progress: Progress = silent, *, required: bool = False
) -> BaseImage:
    """The base image pinned to the manifest digest its registry serves for the tag now, asked over the
    registry's HTTP API with the docker config's credentials (:mod:`envbuild.registry`: no container
    engine needed). Without a registry answer, or when what it serves has no image for the lock's
    platform (``arch``: a build would refuse it), the recorded pin stays and a warning says why; or, when
    the pin is ``required`` (asked for by name), :class:`BaseImageNotPinned` says it."""
    from envbuild.lock.platform import oci_platform
    from envbuild.registry.client import RegistryError, served_manifest

    def refused(reason: str) -> BaseImage:
        if required:
            raise BaseImageNotPinned(f"base image {image.name} not pinned: {reason}")
        progress(f"warning: base image {image.name} not re-pinned: {reason}")
        return image

    try:
        served = served_manifest(image.name)
    except RegistryError as exc:
        return refused(str(exc))
    digest, platforms = served.digest, served.platforms
    if not platforms:  # an index without manifests, a config without os and architecture
        return refused(
            f"its registry serves {digest}, which names no platform (an index without manifests, or an image "
            "config without os and architecture); a build would refuse it"
        )
    if arch is not None and oci_platform(arch) not in platforms:
        return refused(
            f"its registry serves {digest} with images for {', '.join(platforms)}, none for the lock's platform "
            f"linux/{arch} ({oci_platform(arch)}); a build would refuse it"
        )
    progress(f"base image {image.name} is {digest}")
    return BaseImage(name=image.name, digest=digest)


def _update_source(source: Source, cache: GitCache, mirrors: Mirrors, progress: Progress) -> Source:
    progress(f"resolving {source.name} {source.ref}")  # a branch or a tag: which one, upstream says
    resolved = resolve_ref(source, cache, mirrors=mirrors)
    return dataclasses.replace(source, ref_type=resolved.ref_type, commit=resolved.commit, tree=resolved.tree)


@dataclass(frozen=True)
class ResolvedRef:
    """Where a ref points upstream now: for ``lock update``."""

    ref_type: Literal["branch", "tag"]
    commit: str
    tree: str


class MissingRefError(RemoteError):
    """The ref is neither a branch nor a tag upstream."""


class TreeRefused(InputError):
    """git's object checks refuse what the upstream serves at the ref: the lock cannot pin it (no fetch or build
    would take it), as :class:`SubmodulesRefused` refuses what reading the tree finds."""


class BaseImageNotPinned(RemoteError):
    """A base image asked for by name (``--base``, ``--base-image``) that its registry did not pin."""


def resolve_ref(
    source: Source, cache: GitCache, *, mirrors: Mirrors = Mirrors(), progress: Progress = silent
) -> ResolvedRef:
    """Where ``source.ref`` points upstream now (the recorded type first, else the other one).

    Raises :class:`MissingRefError` when it is neither, :class:`TreeRefused` when git's object checks refuse
    what it serves there, :class:`GitError` (a RemoteError) when the remote cannot be read."""
    check_inputs([source], mirrors)
    url = mirrors.rewrite(source.repo)
    up = Upstream(cache, url, offline=False, progress=progress)
    try:
        listing = up.listing()
    except UnsupportedRepository as exc:
        raise RemoteError(f"source {source.name}: {exc.reason}") from None
    order: tuple[Literal["branch", "tag"], ...] = (
        ("branch", "tag") if source.ref_type == "branch" else ("tag", "branch")
    )
    for kind in order:
        refs = listing.heads if kind == "branch" else listing.tags
        if source.ref in refs:
            commit = refs[source.ref]
            try:
                trees = up.commits([], need=[commit], refspecs=[ref_refspec(kind, source.ref)], name=source.name)
            except GitError as exc:  # a server that sends trees with the commits: refused here, not when read
                if exc.malformed:
                    raise TreeRefused(f"{source.name}: the tree of {commit} cannot be read: {exc}") from None
                raise
            if commit not in trees:
                raise GitError("fetch", f"{source.ref} moved while fetching; try again")
            return ResolvedRef(kind, commit, trees[commit])
    raise MissingRefError(f"{url}: no branch or tag named {source.ref!r} upstream ({source.name})")
