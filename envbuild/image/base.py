"""The base image on the engine, for the lock's platform, before anything is built on it.

A base pinned by the digest of a multi-platform index (as CANN's published images are) names one image
per platform; an engine pulls its own platform's unless asked for another. So the base is pulled for the
lock's ``platform`` (``linux/aarch64`` → ``linux/arm64``), and whatever the engine then holds under that
reference is checked: an image for another OS or architecture than the lock's is refused here, in one
line, before a package is installed — not hours later on the cluster, or never, when every locked file
happens to be pure Python. An engine on another machine than the lock's can build only with emulation
(qemu's binfmt handlers on the engine host): it is said before the first step, with what fails without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envbuild.engine.client import Engine
from envbuild.errors import EngineError, EnvbuildError
from envbuild.image.plan import ContextPlan
from envbuild.image.render import base_reference
from envbuild.lock.platform import oci_platform
from envbuild.progress import Progress


class PlatformError(EnvbuildError):
    """The base image is for another platform than the lock's (exit status 1: a check that fails)."""


@dataclass(frozen=True)
class Base:
    reference: str  # name@sha256:… (or name:tag for an unpinned test base)
    image_id: str
    platform: str  # os/arch of the image the engine holds, e.g. linux/arm64
    pulled: bool


def ensure_base(engine: Engine, plan: ContextPlan, say: Progress) -> Base:
    """The lock's base image on ``engine``, pulled for the lock's platform when absent, and checked to be
    for that platform. Raises :class:`PlatformError` when it is not, :class:`EngineError` when it cannot
    be pulled."""
    reference = base_reference(plan)
    want = None if plan.arch is None else oci_platform(plan.arch)  # None: the lock sets no platform
    image = engine.inspect(reference)
    pulled = False
    if image is not None and want is not None and _platform(image) != want:
        # The engine holds another platform's image under this reference (a tool pulled the index for
        # the engine's own platform). It cannot hold two under one digest: the reference is removed
        # (never the image by force: one a container still uses stays, and the build is refused).
        say(f"base: the engine holds the {_platform(image)} image under {reference}; pulling the {want} one")
        try:
            engine.remove(reference)
        except EngineError as exc:
            raise PlatformError(
                _mismatch(reference, _platform(image), want, plan, engine, f"; it stays: {exc}")
            ) from None
        image = None
    if image is None:  # what the builder does for a FROM it lacks, but for the lock's platform
        try:
            engine.pull(reference, say, platform=want)
        except EngineError as exc:
            raise EngineError(f"build failed: the base image cannot be pulled: {exc}") from None
        pulled = True
        image = engine.inspect(reference)
        if image is None:
            raise EngineError(f"build failed: {reference} is not on {engine.address} after it was pulled")
    have = _platform(image)
    if want is not None and have != want:
        raise PlatformError(_mismatch(reference, have, want, plan, engine, ""))
    machine = engine.machine()
    if plan.arch is not None and machine and machine != plan.arch:
        say(
            f"base: building for {want} on a {machine} engine: every step runs under emulation, which the "
            f"engine host must provide (qemu-user binfmt handlers for {plan.arch}); without them the first "
            "step fails with 'exec format error'"
        )
    return Base(reference, str(image["Id"]), have, pulled)


def _platform(image: dict[str, Any]) -> str:
    return f"{image.get('Os') or '?'}/{image.get('Architecture') or '?'}"


def _mismatch(reference: str, have: str, want: str, plan: ContextPlan, engine: Engine, why: str) -> str:
    return (
        f"the base image {reference} is {have} on {engine.address}, but the lock's platform is "
        f"linux/{plan.arch} ({want}): pin the base image's {want} image, or a multi-platform index that has "
        f"one, or correct platform.arch{why}"
    )
