"""`lock update`: move pins to what their refs name upstream now, and re-resolve the package closure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from envbuild.errors import InputError, RemoteError
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitError, UnsupportedRepository
from envbuild.git.upstream import Upstream, check_inputs
from envbuild.lock.model import LOCK_VERSION, BaseImage, Lock, Source
from envbuild.progress import Progress, silent
from envbuild.update.read_requirements import read_source_requirements
from envbuild.update.read_submodules import SubmodulesRefused, Walked, read_source_submodules
from envbuild.update.resolve import resolve_packages


def update_lock(
    lock: Lock,
    names: Sequence[str],
    cache: GitCache,
    *,
    mirrors: Mirrors = Mirrors(),
    packages: bool | None = None,
    progress: Progress = silent,
) -> Lock:
    """A new lock, at the current lock version: the named sources (all when none are named) moved to their
    ref's current commit and tree; every source's requirements and submodules read from its pinned tree;
    when no source was named, the package closure re-resolved with them (or as ``packages`` says) and the
    base image pinned to the digest its registry serves now. Submodules the lock cannot record refuse the
    update (:class:`SubmodulesRefused`), every source's at once, before anything is resolved."""
    known = {s.name for s in lock.sources}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"{unknown[0]}: no such source in lock {lock.name!r} (sources: {', '.join(sorted(known))})")
    selected = set(names) or known
    sources = tuple(_update_source(s, cache, mirrors, progress) if s.name in selected else s for s in lock.sources)
    # Every source's requirements are read from its (new) pinned tree: a moved pin brings new ones, and an
    # unmoved one is re-read from the cache, where its objects stay once fetched.
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
    updated = dataclasses.replace(lock, version=LOCK_VERSION, sources=sources)
    everything = not names
    if packages if packages is not None else everything:
        declared = any(s.requires or s.build_requires for s in sources)
        if lock.requirements or lock.packages or (declared and lock.platform is not None):
            updated = dataclasses.replace(updated, packages=resolve_packages(updated, progress=progress))
        elif declared:
            progress("warning: the lock has no platform: the sources' requirements are recorded, not resolved")
    if everything and lock.base_image is not None:
        arch = lock.platform.arch if lock.platform else None
        updated = dataclasses.replace(updated, base_image=pin_base_image(lock.base_image, arch, progress))
    return updated


def pin_base_image(image: BaseImage, arch: str | None = None, progress: Progress = silent) -> BaseImage:
    """The base image pinned to the manifest digest its registry serves for the tag now, asked over the
    registry's HTTP API with the docker config's credentials (:mod:`envbuild.registry`: no container
    engine needed). Without a registry answer, or when what it serves has no image for the lock's
    platform (``arch``: a build would refuse it), the recorded pin stays and a warning says why."""
    from envbuild.lock.platform import oci_platform
    from envbuild.registry.client import RegistryError, served_manifest

    say = progress
    try:
        served = served_manifest(image.name)
    except RegistryError as exc:
        say(f"warning: base image {image.name} not re-pinned: {exc}")
        return image
    digest, platforms = served.digest, served.platforms
    if not platforms:  # an index without manifests, a config without os and architecture
        say(
            f"warning: base image {image.name} not re-pinned: its registry serves {digest}, which names no "
            "platform (an index without manifests, or an image config without os and architecture); "
            "a build would refuse it"
        )
        return image
    if arch is not None and oci_platform(arch) not in platforms:
        say(
            f"warning: base image {image.name} not re-pinned: its registry serves {digest} with images for "
            f"{', '.join(platforms)}, none for the lock's platform linux/{arch} ({oci_platform(arch)}); "
            "a build would refuse it"
        )
        return image
    say(f"base image {image.name} is {digest}")
    return BaseImage(name=image.name, digest=digest)


def _update_source(source: Source, cache: GitCache, mirrors: Mirrors, progress: Progress) -> Source:
    progress(f"resolving {source.name} {source.ref_type} {source.ref}")
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


def resolve_ref(
    source: Source, cache: GitCache, *, mirrors: Mirrors = Mirrors(), progress: Progress = silent
) -> ResolvedRef:
    """Where ``source.ref`` points upstream now (the recorded type first, else the other one).

    Raises :class:`MissingRefError` when it is neither, :class:`GitError` (a RemoteError) when the
    remote cannot be read."""
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
            space = "heads" if kind == "branch" else "tags"
            trees = up.commits(
                [],
                need=[commit],
                refspecs=[f"+refs/{space}/{source.ref}:refs/upstream/{space}/{source.ref}"],
                name=source.name,
            )
            if commit not in trees:
                raise GitError("fetch", f"{source.ref} moved while fetching; try again")
            return ResolvedRef(kind, commit, trees[commit])
    raise MissingRefError(f"{url}: no branch or tag named {source.ref!r} upstream ({source.name})")
