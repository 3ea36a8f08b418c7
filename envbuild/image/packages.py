"""The packages image: the base plus the lock's installed packages, with no package file in any layer.

1. The packages stage (:func:`.render.render_stage_dockerfile`) receives the package files, installs
   them into ``/staging`` and reports (``stage_packages.py``) what the base holds that the lock replaces.
2. When there is such a thing, the base gets a layer that removes it, written by envbuild
   (:func:`.canonical.load_removal_image`): a removal the engine makes carries the clock's time.
3. The packages image copies ``/staging`` onto that (``COPY --from``): one deterministic layer, the
   installed files alone. It is tagged ``envbuild-pkg/<lock name>:<packages key>``.
4. The stage goes, whatever happened: its package files and ``/staging`` never stay in the engine.

A later build whose packages key is the same (same base, package files, recipe) reuses the packages image
and sends no package file at all; ``--no-cache`` builds it again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from envbuild.engine import BuildStep, Engine
from envbuild.errors import EngineError
from envbuild.image.canonical import load_removal_image
from envbuild.image.context import BuildContext
from envbuild.image.contexts import dockerfile_context, stage_context
from envbuild.image.render import (
    PACKAGES_EPOCH,
    STAGE_REPORT,
    base_reference,
    packages_reference,
    render_packages_dockerfile,
    render_stage_dockerfile,
)
from envbuild.image.retention import prune_dangling
from envbuild.progress import Progress
from envbuild.transfer import human_bytes


@dataclass(frozen=True)
class PackagesImage:
    reference: str  # envbuild-pkg/<lock name>:<packages key>
    image_id: str
    built: bool  # False: reused from an earlier build
    steps: tuple[BuildStep, ...] = ()
    replaced: tuple[str, ...] = ()  # "<name> <version>" of each base distribution the lock replaced
    sent: int = 0  # bytes of package files sent to the engine


def ensure_packages_image(engine: Engine, context: BuildContext, *, no_cache: bool, say: Progress) -> PackagesImage:
    plan = context.plan
    reference = packages_reference(plan)
    found = None if no_cache else engine.inspect(reference)
    if found is not None:
        say(f"packages: {reference} is the base with these package files installed already; reused")
        return PackagesImage(reference, found["Id"], False)
    stage_tag, removal_tag = f"{reference}-stage", f"{reference}-base"
    stage_stream = stage_context(context, render_stage_dockerfile(plan))
    say(f"packages: installing {len(plan.files)} package files ({human_bytes(stage_stream.payload)}) in a stage")
    done = False
    try:
        stage = engine.build(stage_stream, nocache=no_cache, progress=say, tag=stage_tag, what="the package files")
        report = _stage_report(engine, stage.image_id)
        base = base_reference(plan)
        if report["remove"]:
            say(
                f"packages: the base holds {len(report['replaced'])} distributions the lock replaces "
                f"({', '.join(report['replaced'][:6])}{', …' if len(report['replaced']) > 6 else ''}); "
                f"removing {len(report['remove'])} paths of theirs in a layer of their own"
            )
            load_removal_image(
                engine,
                base,
                report["remove"],
                report["directories"],
                PACKAGES_EPOCH,
                "envbuild: remove the base's own " + ", ".join(report["replaced"]),
                removal_tag,
                say,
            )
            base = removal_tag
        dockerfile = render_packages_dockerfile(plan, base, stage_tag, removes=bool(report["remove"]))
        image = engine.build(
            dockerfile_context(dockerfile),
            nocache=no_cache,
            progress=say,
            tag=reference,
            what="the packages Dockerfile",
        )
        done = True
    finally:
        _tidy(engine, stage_tag, removal_tag, plan.lock_name, done)
    return PackagesImage(
        reference,
        image.image_id,
        True,
        stage.steps + image.steps,
        tuple(report["replaced"]),
        stage_stream.payload,
    )


def _tidy(engine: Engine, stage_tag: str, removal_tag: str, lock_name: str, done: bool) -> None:
    try:
        engine.remove(stage_tag)  # the stage, its package files and /staging go with their only tag
        engine.remove(removal_tag)  # a tag only: the removal layer's image is the packages image's parent
        if not done:
            prune_dangling(engine, lock_name)  # the steps of a failed or interrupted stage
    except EngineError:
        if done:
            raise
        # the engine went away mid-build: the next build tidies up; the build's own error is the one to see


def _stage_report(engine: Engine, stage_id: str) -> dict[str, Any]:
    output = engine.run(stage_id, ["cat", STAGE_REPORT])
    try:
        report = json.loads(output.stdout)
        if output.exit_code != 0 or not isinstance(report, dict):
            raise ValueError(output.stderr.strip()[-300:])
        for key in ("remove", "replaced", "directories"):
            report.setdefault(key, [] if key != "directories" else {})
    except ValueError as exc:
        raise EngineError(f"the packages stage left no readable report at {STAGE_REPORT}: {exc}") from None
    return report
