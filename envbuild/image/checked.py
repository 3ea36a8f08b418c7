"""A built image, checked from inside, then normalised: the in-image check as one step of the engine's
BuildKit on the raw image (:meth:`.Engine.run_step`; no network), judged on the host
(:mod:`.inimage_verdict`), and only an image that passed it normalised (:mod:`.normalise`), with the meta
layer's parents as the check reports them.

The check and the config's load each cost the engine a tenth of a second or more: the parents the lock's
last check reported, kept in the cache (:func:`last_parents`), predict this image's, and the image is
normalised with them while the check's step runs, then again only if the check reports otherwise.
"""

from __future__ import annotations

import tarfile
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from envbuild.engine.client import Engine
from envbuild.engine.containers import RunOutput
from envbuild.errors import EngineError
from envbuild.image.assemble import BuildContext
from envbuild.image.inimage_verdict import compare_inimage, inimage_command, read_report, reported_parents
from envbuild.image.normalise import AddedLayer, CanonicalImage, meta_layer, normalise
from envbuild.image.plan import MOUNT_POINT
from envbuild.image.render import base_reference
from envbuild.progress import Progress

Parents = Mapping[str, tarfile.TarInfo]  # META_PARENTS → the header a layer keeps for each


STEP_START_WAIT = 2.0  # seconds the normalising waits for the check's step to start, at most


class InImageMismatch(EngineError):
    """The built image does not hold what the lock pins (no image was made of it, no tag set); ``problems``:
    each one line (``source beta: import beta failed: …``)."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


@dataclass(frozen=True)
class Checked:
    """An image that passed the in-image check, normalised; the meta layer's parents as the check reported
    them (:func:`parents_entry`: what the next build of the lock predicts, :func:`last_parents`)."""

    image: CanonicalImage
    parents: Parents


def parents_entry(parents: Parents) -> dict[str, list[int]]:
    """``parents`` as the check reports them (``stat``: [mode, uid, gid, mtime] by path), to be kept."""
    return {path: [info.mode, info.uid, info.gid, int(info.mtime)] for path, info in parents.items()}


def last_parents(kept: object) -> Parents | None:
    """The meta layer's parents the lock's last checked build reported (``kept``: its
    :func:`parents_entry`, as the cache keeps it), or None when there are none or they do not read as a
    report's: a prediction only, which the check confirms or corrects."""
    try:
        return reported_parents({"stat": kept}) if isinstance(kept, dict) else None
    except EngineError:
        return None


def checked_and_normalised(
    engine: Engine,
    raw_id: str,
    raw_tag: str,
    context: BuildContext,
    meta: dict[str, bytes],
    predicted: Parents | None,
    say: Progress,
) -> Checked:
    """The in-image check of ``raw_tag`` (``raw_id``), then the image normalised with the meta layer of
    ``meta`` (:func:`.assemble.meta_files` of ``context``); ``predicted``: the parents the lock's last check
    reported (:func:`last_parents`). The check's files are mounted at the mount point every image has: a mount
    there moves no directory above the meta layer. A failed check leaves no normalised image.

    The normalising with ``predicted`` waits for the check's step to start: the engine serves a load and a
    step's start one after the other (a load begun with the step held it 0.05 s); while the step runs, the
    engine is idle."""
    plan = context.plan
    started = threading.Event()

    def normalised(added: AddedLayer) -> CanonicalImage:
        started.wait(STEP_START_WAIT)  # at once after the check's step: it sets ``started`` however it ends
        return normalise(engine, raw_id, base_reference(plan), plan.epoch, say, (added,))

    guess = meta_layer(predicted, meta, plan.epoch) if predicted is not None else None
    with ThreadPoolExecutor(max_workers=1) as pool:
        early = pool.submit(normalised, guess) if guess is not None else None
        say("checking the image from inside (installed distributions, source trees)")
        try:  # in this thread: an interrupt stops the check at once
            try:
                output = engine.run_step(raw_tag, inimage_command(), meta, mount=MOUNT_POINT, started=started, say=say)
            finally:
                started.set()
            report = judged(output, context)
        except InImageMismatch:
            if early is not None and early.exception() is None:
                _remove_untagged(engine, early.result().image_id)
            raise
        parents = reported_parents(report)
        added = meta_layer(parents, meta, plan.epoch)
        first = early.result() if early is not None and early.exception() is None else None
        if first is not None and guess is not None and guess.diff_id == added.diff_id:
            return Checked(first, parents)
        if first is not None:  # the parents moved since the lock's last build: that image is not this one
            _remove_untagged(engine, first.image_id)
    return Checked(normalised(added), parents)


def judged(output: RunOutput, context: BuildContext) -> dict[str, Any]:
    """The in-image check's report, when it says the image holds what the lock pins; else InImageMismatch."""
    report, problems = read_report(output.exit_code, output.stdout, output.stderr)
    if report is not None:
        problems = compare_inimage(report, context.manifest)
    if problems or report is None:
        raise InImageMismatch(
            "the built image does not hold what the lock pins (not tagged): " + "; ".join(problems), problems
        )
    return report


def _remove_untagged(engine: Engine, image_id: str) -> None:
    image = engine.inspect(image_id)
    if image is not None and not image.get("RepoTags"):
        engine.remove(image_id, force=True)  # made by this build and not kept: nothing else refers to it
