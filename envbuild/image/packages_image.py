"""The packages image: the base plus the lock's installed packages, with no package file in any layer.

On BuildKit (:func:`ensure_packages_image_buildkit`, the default): ``images/Dockerfile.packages.in``
builds the tools layer, then one ``RUN`` that bind-mounts the package files from the build context and
installs them; ``stage_packages.py`` writes its report into the layer, read back through a container
that is never started. Nothing is committed from a container.

On the legacy builder (:func:`ensure_packages_image`, ``ENVBUILD_BUILDER=legacy``), which can only bring
files in through a ``COPY`` layer, the packages image is made in a container instead:

1. a container of the base is created, the package files are copied into its ``/tmp`` (streamed,
   :func:`.stream.packages_archive`), and it runs :func:`.render.render_packages_script`: pip installs
   the files, ``stage_packages.py`` names what of the base the lock replaces, the package files are
   removed, every mtime is clamped;
2. the container is committed: one layer, what pip wrote — the same bytes on every build.

Either way, the config is composed like any other (:mod:`.normalise`) and loaded, with the base's
replaced distributions (pip's, and a Debian-family base's distro copies) removed by a layer envbuild
writes on top when there are any; tagged ``envbuild-pkg/<lock name>:<packages key>``. A later build whose
packages key is the same (builder, base, package files, scripts) reuses the packages image and sends no
package file at all; ``--no-cache`` makes it again.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from envbuild.engine.client import BuildStep, Engine
from envbuild.engine.transfer import Heartbeat, Meter, human_bytes
from envbuild.errors import EngineError
from envbuild.image.assemble import BuildContext
from envbuild.image.normalise import load_packages_image
from envbuild.image.plan import DISTRO_REMOVED_LABEL, LOCK_NAME_LABEL, ROLE_LABEL
from envbuild.image.render import PACKAGES_REPORT, base_reference, packages_reference, render_packages_script
from envbuild.image.stream import packages_archive, packages_context
from envbuild.interrupts import deferred_interrupts
from envbuild.progress import Progress

HEARTBEAT = 15.0  # seconds between "still running" lines while the packages install or commit


@dataclass(frozen=True)
class PackagesImage:
    reference: str  # envbuild-pkg/<lock name>:<packages key>
    image_id: str
    built: bool  # False: reused from an earlier build
    steps: tuple[BuildStep, ...] = ()  # the packages image is not built by the builder: always ()
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


def ensure_packages_image_buildkit(
    engine: Engine, context: BuildContext, *, no_cache: bool, say: Progress
) -> PackagesImage:
    """The packages image on BuildKit: the package files are bind-mounted into the install step (sent
    in the build context, in no layer); the report is read from the built image; the config is composed
    as on the legacy path, the removal layer on top."""
    plan = context.plan
    reference = packages_reference(plan)
    found = None if no_cache else engine.inspect(reference)
    if found is not None:
        say(f"packages: {reference} is the base with these package files installed already; reused")
        return PackagesImage(reference, found["Id"], False, distro_removed=_distro_removed(found))
    stream = packages_context(context)
    base = base_reference(plan)  # on the engine, for the lock's platform: ensure_base made sure of it
    say(f"packages: installing {len(plan.files)} package files ({human_bytes(stream.payload)}; BuildKit, no network)")
    outcome = engine.buildkit_build(stream, nocache=no_cache, progress=say, what="the package files")
    try:
        report = _report(engine.read_file(outcome.image_id, PACKAGES_REPORT).decode("utf-8", "replace"))
        if report["remove"]:
            say(
                f"packages: the base holds {len(report['replaced'])} distributions the lock replaces "
                f"({', '.join(report['replaced'][:6])}{', …' if len(report['replaced']) > 6 else ''}); "
                f"a layer removes {len(report['remove'])} paths of theirs"
            )
        image_id = load_packages_image(
            engine,
            base,
            outcome.image_id,
            plan.lock_name,
            len(plan.files),
            report,
            reference,
            say,
            tools_layers=("envbuild: the tools layer (mount points, clamp-mtimes, /etc/hosts, /etc/resolv.conf)",),
        )
    finally:
        try:
            engine.remove(outcome.image_id)  # untagged: only its config goes, the layers are shared
        except EngineError:
            pass
    say(f"packages: {reference} ({image_id[:19]})")
    _say_kept(report, say)
    distro = tuple(d for d in report.get("distro", []) if isinstance(d, dict))
    return PackagesImage(reference, image_id, True, outcome.steps, tuple(report["replaced"]), stream.payload, distro)


def _say_kept(report: dict[str, Any], say: Progress) -> None:
    for kept in report.get("kept", []):
        say(
            f"packages: warning: the base's {kept.get('name')} {kept.get('version')} at {kept.get('path')} lists no "
            "files (no RECORD, installed-files.txt or dpkg file list), so it stays, shadowed by the lock's"
        )


def ensure_packages_image(engine: Engine, context: BuildContext, *, no_cache: bool, say: Progress) -> PackagesImage:
    plan = context.plan
    reference = packages_reference(plan, "legacy")
    found = None if no_cache else engine.inspect(reference)
    if found is not None:
        say(f"packages: {reference} is the base with these package files installed already; reused")
        return PackagesImage(reference, found["Id"], False, distro_removed=_distro_removed(found))
    archive = packages_archive(context)
    say(f"packages: installing {len(plan.files)} package files ({human_bytes(archive.payload)}) in a container")
    base = base_reference(plan)  # on the engine, for the lock's platform: ensure_base made sure of it
    since = int(time.time()) - 1  # before anything reaches the container: its clamp starts here
    labels = {LOCK_NAME_LABEL: plan.lock_name, ROLE_LABEL: "packages"}
    container: str | None = None
    committed = None
    try:
        with deferred_interrupts():  # Ctrl-C while the engine creates it: taken once its ID is known
            container = engine.create(
                base,
                ["sh", "-c", render_packages_script(plan), "envbuild-packages", str(since)],
                labels,
                name=f"envbuild-packages-{plan.lock_name}-{secrets.token_hex(6)}",  # `docker ps` tells whose
            )
        engine.put_archive(
            container, "/tmp", Meter(say, "sent the package files", archive.payload).wrap(archive.chunks())
        )
        say("packages: checking the platform, installing (pip, no index, hashes checked)")
        started = time.monotonic()
        with Heartbeat(say, "packages: installing", every=HEARTBEAT) as beat:
            output = engine.start_and_wait(container, beat.output)
        if output.exit_code != 0:
            tail = "".join(f"\n    | {line}" for line in output.stderr.strip().splitlines()[-20:])
            raise EngineError(f"installing the package files failed (exit status {output.exit_code}){tail}")
        report = _report(output.stdout)
        say(f"packages: installed in {time.monotonic() - started:.0f} s; committing the container as one layer")
        started = time.monotonic()
        with Heartbeat(say, "packages: committing", every=HEARTBEAT):
            committed = engine.commit(container)
        size = (engine.inspect(committed) or {}).get("Size", 0) - (engine.inspect(base) or {}).get("Size", 0)
        say(f"packages: committed in {time.monotonic() - started:.0f} s: a layer of {human_bytes(size)}")
        if report["remove"]:
            say(
                f"packages: the base holds {len(report['replaced'])} distributions the lock replaces "
                f"({', '.join(report['replaced'][:6])}{', …' if len(report['replaced']) > 6 else ''}); "
                f"a layer removes {len(report['remove'])} paths of theirs"
            )
        image_id = load_packages_image(engine, base, committed, plan.lock_name, len(plan.files), report, reference, say)
    finally:
        if container is not None:
            _tidy(engine, container, committed)
    say(f"packages: {reference} ({image_id[:19]})")
    _say_kept(report, say)
    distro = tuple(d for d in report.get("distro", []) if isinstance(d, dict))
    return PackagesImage(reference, image_id, True, (), tuple(report["replaced"]), archive.payload, distro)


def _tidy(engine: Engine, container: str, committed: str | None) -> None:
    try:
        engine.remove_container(container, stop_timeout=0)
        if committed is not None:
            engine.remove(committed)  # the packages image shares its layer; this is only its config
    except EngineError:
        pass  # the engine went away: the next build of the lock removes what is left (retention)


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
