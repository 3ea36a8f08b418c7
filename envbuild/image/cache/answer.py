"""A rebuild of a lock built and checked before, answered from the cache's record of it
(:mod:`envbuild.image.cache.ledger`) when that record still describes what this build would make.

The refs are re-checked by the caller first (:func:`envbuild.verify.pins.verify_for_build`); here the
record is matched against the lock (its bytes, the base digest, the Dockerfile this envbuild renders) and
the engine asked whether it holds the image under the recorded ID. Nothing is assembled or sent.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from envbuild.engine.client import Engine
from envbuild.errors import EnvbuildError
from envbuild.image.cache.ledger import BUILDER, BuiltImage, read_built
from envbuild.image.cache.scratch import lock_name_held, remove_abandoned
from envbuild.image.plan import ContextPlan, plan_context
from envbuild.image.record import RecordedBuild
from envbuild.image.render import render_dockerfile
from envbuild.image.result import BuildResult, default_tag, write_record
from envbuild.lock.io import LockFile
from envbuild.progress import Progress


def built_before(read: LockFile, cache_dir: Path) -> tuple[BuiltImage, ContextPlan] | None:
    """The cache's record of this lock built and checked, with the plan it was built from, when the
    record still describes what this build would make: the same builder, base digest and Dockerfile."""
    built = read_built(cache_dir, read.sha256)
    base = read.lock.base_image
    if built is None or built.builder != BUILDER or built.base_digest != (base.digest if base else None):
        return None
    if read.lock.source_date_epoch is not None and read.lock.source_date_epoch != built.epoch:
        return None
    try:
        plan = plan_context(read.lock, lock_sha256=read.sha256, epoch=built.epoch)
    except EnvbuildError:
        return None  # the build proper says what is wrong with the lock
    dockerfile = render_dockerfile(plan)
    if hashlib.sha256(dockerfile.encode()).hexdigest() != built.dockerfile_sha256:
        return None  # another rendering: built again
    return built, plan


def answer_from_record(
    read: LockFile,
    built: BuiltImage,
    plan: ContextPlan,
    engine: Engine,
    *,
    tags: tuple[str, ...],
    push: bool,
    cache_dir: Path,
    record_dir: Path | None,
    say: Progress,
) -> BuildResult | None:
    """Tag (and push) the image this lock was built into before, and write its record; None when the
    engine no longer holds that image under that ID. ``tags``: the build's ``--tag``s (none: the default)."""
    remove_abandoned(cache_dir)  # as every build does on its way in
    # A build of this lock tidying the engine waits.
    with lock_name_held(cache_dir, plan.lock_name, engine.address, say):
        image = engine.inspect(built.image_id)
        if image is None or image.get("Id") != built.image_id:
            say(f"{built.image_id[:19]}, built from this lock before, is no longer in the engine: building it again")
            return None
        tags = tags or (default_tag(plan),)
        for tag in tags:
            engine.tag(built.image_id, tag)
        say(f"{built.image_id}: this lock was built and checked before; tagged {', '.join(tags)}")
        pushed = tuple((tag, engine.push(tag, say)) for tag in tags) if push else ()
        diff_ids = tuple(image["RootFS"]["Layers"])
        record_dir = write_record(
            RecordedBuild(
                lock_path=read.path,
                plan=plan,
                trees=dict(built.trees),
                dockerfile_sha256=built.dockerfile_sha256,
                image_id=built.image_id,
                tags=tags,
                diff_ids=diff_ids,
                pushed=pushed,
                distro_removed=built.distro_removed,
            ),
            record_dir,
        )
    return BuildResult(
        image_id=built.image_id,
        tags=tags,
        lock_sha256=read.sha256,
        record_dir=record_dir,
        diff_ids=diff_ids,
        raw_image_id=built.raw_image_id,
        steps=(),
        reused=True,
        pushed=pushed,
        noop=True,
    )
