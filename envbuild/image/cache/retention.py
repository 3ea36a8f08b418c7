"""What envbuild leaves in the engine: what the next build's cache needs, and nothing more.

Per lock name, after a build:

- ``envbuild-raw/<lock name>:<sha12>``: the newest raw image (it keeps BuildKit's result, and so the
  layers the next build shares); raw tags of other versions of the lock go;
- ``envbuild-pkg/<lock name>:<packages key>``: the newest packages image; others go;
- ``envbuild-raw/<lock name>:packages-tools`` and ``envbuild-raw/<lock name>:packages``: the tools
  image and the packages step's raw image, only while a build reads them (a killed build's go with the
  other raw tags);
- every untagged leaf image carrying the lock's name label goes, with its untagged parents: superseded
  raw images (a ``--no-cache`` build makes a new one each time), images that failed the in-image check,
  the steps of a failed or interrupted build;
- the packages container of a killed build goes (by its role label: a container a user runs from the
  lock's image, a job or a cluster node, is never touched).

BuildKit's own cache is a second store: removing images does not shrink it, and every ``--no-cache``
build adds to it. After a BuildKit build, if no other build is using the engine
(:mod:`envbuild.engine.claim`), it is pruned, least recently used first, down to
:func:`build_cache_bound`: twice what the image adds to its base (so the next build of the lock, and one
of another lock of that size, still finds its steps), and at least :data:`BUILD_CACHE_FLOOR`. The bound is
engine-wide: BuildKit keeps no owner per record, so other builds' records count too, oldest going first.

Normalised images share every layer with the raw ones (only their configs differ), so keeping both costs
the engine a few kilobytes. Images under the tags you asked for (``--tag``, the default
``envbuild/<lock name>:<sha12>``) stay until you remove them; the base is never touched.
"""

from __future__ import annotations

import time
from contextlib import suppress

from envbuild.engine.buildkit import LostLayer
from envbuild.engine.claim import EngineClaim
from envbuild.engine.client import Engine
from envbuild.errors import EngineError
from envbuild.image.plan import LOCK_NAME_LABEL, ROLE_LABEL
from envbuild.image.render import PACKAGES_REPOSITORY, RAW_REPOSITORY
from envbuild.progress import Progress


def prune_dangling(engine: Engine, lock_name: str) -> int:
    """Remove the untagged leaf images labelled with ``lock_name`` (and their untagged parents); the
    number removed. One a container still uses is left, and one pulled or pushed by digest."""
    removed = 0
    for _ in range(3):  # removing a leaf can leave an untagged labelled parent with no children: a new leaf
        leaves = [
            image
            for image in engine.images(filters={"dangling": True, "label": f"{LOCK_NAME_LABEL}={lock_name}"})
            if not _from_a_registry(image)
        ]
        if not leaves:
            break
        for image in leaves:
            with suppress(EngineError):  # in use by a container (a job still running on it): it stays
                removed += engine.remove(image["Id"])
    return removed


def _from_a_registry(image: dict) -> bool:
    """An untagged image pulled or pushed by digest (a cluster node's copy, a pushed build whose tag moved):
    it is someone's, not a leftover of a build."""
    return any(digest != "<none>@<none>" for digest in image.get("RepoDigests") or ())


def keep_only(engine: Engine, lock_name: str, keep: set[str], say: Progress) -> None:
    """Drop envbuild's own tags of ``lock_name`` that are not in ``keep``, then prune what they held."""
    # The packages container of a killed build, by its role: a container of the lock's image (a job, a
    # cluster node) carries the lock's name label too, and is never touched.
    for container in engine.containers({LOCK_NAME_LABEL: lock_name, ROLE_LABEL: "packages"}):
        engine.remove_container(container.id, stop_timeout=0)
    dropped = []
    repositories = (f"{RAW_REPOSITORY}/{lock_name}", f"{PACKAGES_REPOSITORY}/{lock_name}")
    for image in engine.images(filters={"reference": list(repositories)}):  # one call for both
        for tag in image.get("RepoTags") or ():
            if tag.rpartition(":")[0] in repositories and tag not in keep:
                engine.remove(tag)
                dropped.append(tag)
    removed = prune_dangling(engine, lock_name)
    if dropped or removed:
        say(
            f"tidied the engine: {len(dropped)} superseded tag{'s' * (len(dropped) != 1)} of {lock_name}, "
            f"{removed} unused image{'s' * (removed != 1)} removed"
        )


BUILD_CACHE_FLOOR = 1 << 30  # bytes: BuildKit's cache is never pruned below this


def build_cache_bound(image_size: int, base_size: int) -> int:
    """How much of BuildKit's cache a build of an image of ``image_size`` on a base of ``base_size`` keeps."""
    return max(2 * max(image_size - base_size, 0), BUILD_CACHE_FLOOR)


def bound_build_cache(engine: Engine, keep: int, say: Progress) -> int:
    """Prune BuildKit's cache to at most ``keep`` bytes (records in use stay); the bytes reclaimed. BuildKit
    itself finds what is over the bound: asking first (``docker system df``, which sizes every image too)
    cost more than a prune that has nothing to do."""
    reclaimed = engine.prune_build_cache(keep)
    if reclaimed:
        say(f"tidied BuildKit's cache: {reclaimed / 1e6:.0f} MB reclaimed, at most {keep / 1e6:.0f} MB kept")
    return reclaimed


def tidy(
    engine: Engine, lock_name: str, keep: set[str], image_id: str, base: str, claim: EngineClaim, say: Progress
) -> None:
    """After a build of ``image_id`` on ``base``: :func:`keep_only` ``keep`` of the lock's images, then
    BuildKit's cache bounded, if no other build holds the engine's ``claim``; while one does, only
    :func:`keep_only` (:mod:`envbuild.engine.claim` says why). The prune runs beside nothing: not a step of
    this build, not its removals, not another build."""
    with claim.alone() as alone:
        if alone:
            keep_only(engine, lock_name, keep, say)
            built, under = engine.inspect(image_id) or {}, engine.inspect(base) or {}
            bound_build_cache(engine, build_cache_bound(int(built.get("Size") or 0), int(under.get("Size") or 0)), say)
            return
    say("BuildKit's cache left as it is: another build is using the engine (the next build to find it free prunes)")
    with claim.shared():
        keep_only(engine, lock_name, keep, say)


LOST_LAYER_WAIT = 600.0  # seconds a build that met LostLayer waits for the engine's other builds to end


def empty_build_cache(engine: Engine, claim: EngineClaim, fault: LostLayer, say: Progress) -> None:
    """After ``fault``: BuildKit's cache emptied (every record not in use), once no other build holds the
    engine's ``claim`` (an emptying beside a build is what the claim keeps out), so that the build can run
    again; ``fault`` raised if the engine is not free within :data:`LOST_LAYER_WAIT`."""
    say(f"warning: {str(fault).splitlines()[0]}")
    deadline, told = time.monotonic() + LOST_LAYER_WAIT, False
    while True:
        with claim.alone() as alone:
            if alone:
                reclaimed = engine.prune_build_cache(0, everything=True)
                say(
                    f"emptied BuildKit's cache ({reclaimed / 1e6:.0f} MB) of the step whose layer was gone; building again"
                )
                return
        if time.monotonic() > deadline:
            raise fault
        if not told:
            say("waiting for the engine's other builds to end before emptying BuildKit's cache")
            told = True
        time.sleep(0.5)
