"""The packages image: the base plus the lock's installed packages, with no package file in any layer.

Two builds by the engine's BuildKit. ``images/Dockerfile.tools.in`` makes the tools image (the base and
the tools layer), tagged while the second reads it; ``images/Dockerfile.packages.in`` runs on it one
``RUN`` that bind-mounts the package files from the build context and installs them (the lock's uv,
bind-mounted too, or the base's pip where the lock pins no installer; no index, hashes checked);
``stage_packages.py`` names what of the base the lock replaces and writes its report into the layer,
read back through a container that is never started. Nothing is committed from a container.

Why two builds: the engine writes a step's layer by walking what the step changed (depth first) only
when the step ran on the layer the engine registered as its parent. In one build, the install step's
parent was the tools step, whose layer every lock on that base shares; when another build had
registered that layer first, the engine compared the step with it instead and wrote the same entries
sorted by path: another diff ID, the image not reproduced. ``FROM`` a built image, the parent is the
registered layer itself.

The config is composed like any other (:mod:`.normalise`) and loaded, with the base's replaced
distributions (pip's, and a Debian-family base's distro copies) removed by a layer envbuild writes on top
when there are any; tagged ``envbuild-pkg/<lock name>:<packages key>``. A later build whose packages key
is the same (base, package files, scripts) reuses the packages image and sends no package file at all;
``--no-cache`` makes it again.
"""

from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.engine.client import Engine
from envbuild.engine.transfer import BuildStep, human_bytes
from envbuild.errors import EngineError
from envbuild.image.assemble import BuildContext
from envbuild.image.normalise import load_packages_image
from envbuild.image.plan import DISTRO_REMOVED_LABEL
from envbuild.image.render import (
    PACKAGES_REPORT,
    base_reference,
    packages_reference,
    raw_packages_reference,
    tools_reference,
)
from envbuild.image.stream import packages_context, sync_dir, tools_context
from envbuild.progress import Progress


@dataclass(frozen=True)
class PackagesImage:
    reference: str  # envbuild-pkg/<lock name>:<packages key>
    image_id: str
    built: bool  # False: reused from an earlier build
    steps: tuple[BuildStep, ...] = ()  # its build's steps (none when reused)
    replaced: tuple[str, ...] = ()  # "<name> <version>" of each base distribution the lock replaced
    sent: int = 0  # bytes of package files sent to the engine
    # The base's distro-managed distributions the lock pins too, removed: {name, version, path, owner}
    distro_removed: tuple[dict[str, Any], ...] = ()


def _distro_removed(image: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    text = ((image.get("Config") or {}).get("Labels") or {}).get(DISTRO_REMOVED_LABEL)
    try:
        found = json.loads(text) if text else []
    except ValueError:
        raise EngineError(f"the packages image's label {DISTRO_REMOVED_LABEL} is not JSON") from None
    return tuple(d for d in found if isinstance(d, dict))


def ensure_packages_image(
    engine: Engine, context: BuildContext, *, no_cache: bool, cache_dir: Path, say: Progress
) -> PackagesImage:
    """The packages image: the package files are bind-mounted into the install step (sent in the build
    context, in no layer); the report is read from the built image; the config is composed, the removal
    layer on top. ``cache_dir``: beside the file cache, where the docker CLI's transport writes the
    contexts (the package files hard-linked)."""
    plan = context.plan
    reference = packages_reference(plan)
    found = None if no_cache else engine.inspect(reference)
    if found is not None:
        say(f"packages: {reference} is the base with these package files installed already; reused")
        return PackagesImage(reference, found["Id"], False, distro_removed=_distro_removed(found))
    base = base_reference(plan)  # on the engine, for the lock's platform: ensure_base made sure of it
    tools = tools_reference(plan)
    say(f"packages: the tools image, {tools} (BuildKit, no network)")
    made = engine.buildkit_build(
        tools_context(plan),
        nocache=no_cache,
        progress=say,
        tag=tools,
        what="the tools",
        context_dir=sync_dir(cache_dir, plan.lock_name, "tools"),
    )
    raw = raw_packages_reference(plan)
    try:
        stream = packages_context(context)
        say(
            f"packages: installing {len(plan.files)} package files ({human_bytes(stream.payload)}; "
            f"{plan.installed_by}, BuildKit, no network)"
        )
        outcome = engine.buildkit_build(
            stream,
            nocache=no_cache,
            progress=say,
            tag=raw,
            what="the package files",
            context_dir=sync_dir(cache_dir, plan.lock_name, "packages"),
        )
    finally:
        _untag(engine, tools)
    try:
        report = _report(engine.read_file(raw, PACKAGES_REPORT).decode("utf-8", "replace"))
        if report["remove"]:
            say(
                f"packages: the base holds {len(report['replaced'])} distributions the lock replaces "
                f"({', '.join(report['replaced'][:6])}{', …' if len(report['replaced']) > 6 else ''}); "
                f"a layer removes {len(report['remove'])} paths of theirs"
            )
        image_id = load_packages_image(
            engine,
            base,
            raw,
            plan.lock_name,
            len(plan.files),
            report,
            reference,
            say,
            tools_layers=("envbuild: the tools layer (mount points, clamp-mtimes, /etc/hosts, /etc/resolv.conf)",),
            installer=plan.installed_by,
        )
    finally:
        _untag(engine, raw)
    say(f"packages: {reference} ({image_id[:19]})")
    for kept in report.get("kept", []):
        say(
            f"packages: warning: the base's {kept.get('name')} {kept.get('version')} at {kept.get('path')} lists no "
            "files (no RECORD, installed-files.txt or dpkg file list), so it stays, shadowed by the lock's"
        )
    distro = tuple(d for d in report.get("distro", []) if isinstance(d, dict))
    steps = made.steps + outcome.steps
    return PackagesImage(reference, image_id, True, steps, tuple(report["replaced"]), stream.payload, distro)


def _untag(engine: Engine, reference: str) -> None:
    """Drop a tag this build held (the tag, not the ID: another lock's build may hold the same raw image,
    raw_packages_reference); when it was the last, only the config goes, the layers are shared."""
    with suppress(EngineError):
        engine.remove(reference)


def _report(stdout: str) -> dict[str, Any]:
    try:
        report = json.loads(stdout.strip().splitlines()[-1])
        if not isinstance(report, dict):
            raise ValueError("not an object")
        for key in ("remove", "replaced", "distro", "kept"):
            report.setdefault(key, [])
        report.setdefault("directories", {})
    except (ValueError, IndexError) as exc:
        raise EngineError(f"the packages step printed no report: {exc}") from None
    return report
