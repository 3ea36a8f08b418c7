"""A built image, checked from inside, then normalised: the in-image check as one step of the engine's
BuildKit on the raw image (:meth:`.Engine.run_step`; no network), judged on the host
(:mod:`.inimage_verdict`), and only an image that passed it normalised (:mod:`.normalise`), with the meta
layer's parents as the check reports them.

The check and the config's load each cost the engine a few tenths of a second: where the engine still
holds the lock's last raw image, its parents are read while BuildKit builds (:func:`last_parents`), and
the image is normalised with them beside the check, then again only if the check reports otherwise.
"""

from __future__ import annotations

import tarfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envbuild.engine.client import Engine
from envbuild.engine.containers import RunOutput
from envbuild.errors import EngineError, EnvbuildError
from envbuild.image.assemble import BuildContext
from envbuild.image.inimage_verdict import compare_inimage, inimage_command, read_report, reported_parents
from envbuild.image.normalise import AddedLayer, CanonicalImage, meta_layer, normalise
from envbuild.image.plan import META_PARENTS, MOUNT_POINT
from envbuild.image.render import RAW_REPOSITORY, base_reference
from envbuild.progress import Progress

Parents = Mapping[str, tarfile.TarInfo]  # META_PARENTS → the header a layer keeps for each


class InImageMismatch(EngineError):
    """The built image does not hold what the lock pins (no image was made of it, no tag set)."""


def last_parents(engine: Engine, lock_name: str) -> Parents | None:
    """The meta layer's parents in the raw image of the lock's last build, when the engine holds one."""
    try:
        tags = [tag for image in engine.images(name=f"{RAW_REPOSITORY}/{lock_name}") for tag in image["RepoTags"]]
        return engine.entry_headers(tags[0], META_PARENTS) if tags else None
    except EnvbuildError:  # removed meanwhile: nothing to begin with, the check says them
        return None


def checked_and_normalised(
    engine: Engine,
    raw_id: str,
    raw_tag: str,
    context: BuildContext,
    meta: dict[str, bytes],
    predicted: Parents | None,
    say: Progress,
) -> CanonicalImage:
    """The in-image check of ``raw_tag`` (``raw_id``), then the image normalised with the meta layer of
    ``meta`` (:func:`.assemble.meta_files` of ``context``); ``predicted``: the parents of the lock's last raw
    image (:func:`last_parents`). The check's files are mounted at the mount point every image has: a mount
    there moves no directory above the meta layer. A failed check leaves no normalised image."""
    plan = context.plan

    def layer(parents: Parents) -> AddedLayer:
        return meta_layer(parents, meta, plan.epoch)

    def normalised(added: AddedLayer) -> CanonicalImage:
        return normalise(engine, raw_id, base_reference(plan), plan.epoch, say, (added,))

    guess = layer(predicted) if predicted is not None else None
    with ThreadPoolExecutor(max_workers=1) as pool:
        early = pool.submit(normalised, guess) if guess is not None else None
        say("checking the image from inside (installed distributions, source trees)")
        try:  # in this thread: an interrupt stops the check at once
            report = judged(engine.run_step(raw_tag, inimage_command(), meta, mount=MOUNT_POINT), context)
        except InImageMismatch:
            if early is not None and early.exception() is None:
                _remove_untagged(engine, early.result().image_id)
            raise
        added = layer(reported_parents(report))
        first = early.result() if early is not None and early.exception() is None else None
        if first is not None and guess is not None and guess.diff_id == added.diff_id:
            return first
        if first is not None:  # the parents moved since the lock's last build: that image is not this one
            _remove_untagged(engine, first.image_id)
    return normalised(added)


def judged(output: RunOutput, context: BuildContext) -> dict[str, Any]:
    """The in-image check's report, when it says the image holds what the lock pins; else InImageMismatch."""
    report, problems = read_report(output.exit_code, output.stdout, output.stderr)
    if report is not None:
        problems = compare_inimage(report, context.manifest)
    if problems or report is None:
        raise InImageMismatch("the built image does not hold what the lock pins (not tagged): " + "; ".join(problems))
    return report


def _remove_untagged(engine: Engine, image_id: str) -> None:
    image = engine.inspect(image_id)
    if image is not None and not image.get("RepoTags"):
        engine.remove(image_id, force=True)  # made by this build and not kept: nothing else refers to it
