"""What a build hands back (:class:`BuildResult`) and leaves beside the lock (:func:`write_record`: its
provenance, SBOM and summary), whether the image was built or answered from the cache's record."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from envbuild.data.jsonout import jfield, json_meta, records
from envbuild.engine.transfer import BuildStep
from envbuild.fileio import write_atomic
from envbuild.image.packages_image import PackagesImage
from envbuild.image.plan import ContextPlan
from envbuild.image.record import RecordedBuild, build_record, build_summary, render_record_json


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    lock_sha256: str
    record_dir: Path = field(metadata=json_meta(key="record"))
    # The normalised image's layers, base layers first.
    diff_ids: tuple[str, ...] = field(metadata=json_meta(skip=True))
    raw_image_id: str = field(metadata=json_meta(skip=True))
    # Every step of every build this one ran (the packages' first).
    steps: tuple[BuildStep, ...] = field(metadata=json_meta(skip=True))
    # The engine's cache gave a raw image already normalised and checked.
    reused: bool = field(metadata=json_meta(skip=True))
    # (tag, manifest digest): what `envrun cluster up --image` takes is REPOSITORY@DIGEST.
    pushed: tuple[tuple[str, str], ...] = jfield((), convert=records("tag", "digest"))
    # None: the lock has no packages, or nothing was built (``noop``).
    packages: PackagesImage | None = jfield(None, skip=True)
    sent: int = jfield(0, skip=True)  # bytes of files sent to the engine as build contexts
    # Answered from the cache's record of this lock built and checked: nothing sent or built.
    noop: bool = jfield(False, skip=True)


def default_tag(plan: ContextPlan) -> str:
    return f"envbuild/{plan.lock_name}:{plan.lock_sha256[:12]}"


def write_record(build: RecordedBuild, record_dir: Path | None) -> Path:
    """provenance.intoto.json, sbom.cdx.json and build.json, each written atomically into ``record_dir``
    (default: ``build/LOCK_NAME`` beside the lock)."""
    plan = build.plan
    directory = Path(record_dir) if record_dir else build.lock_path.parent / "build" / plan.lock_name
    directory.mkdir(parents=True, exist_ok=True)
    files = build_record(
        plan,
        image_id=build.image_id,
        lock_path=str(build.lock_path),
        tags=build.tags,
        trees=build.trees,
        dockerfile_sha256=build.dockerfile_sha256,
    ).files()
    files["build.json"] = render_record_json(build_summary(build))
    for name, data in sorted(files.items()):
        write_atomic(directory / name, data)
    return directory
