"""`envbuild image`: a verified lock → a reproducible, checked, tagged image and its build record.

The order is fixed: verify the lock (refuse a failing pin) → plan (pure) → assemble the context from
the verified caches (every file and tree checked before anything is installed) → legacy build, no
network → normalise (``docker save`` → rewrite → ``docker load``, the ID must be the computed one) →
the in-image check (a mismatch removes the image, no tag is set) → tag, push → write the record.

The layer cache: the raw built image keeps a private tag ``envbuild-raw/<lock name>:<sha12>`` so the
engine keeps its layers for the next build, and ``<cache_dir>/image/normalized.json`` maps each raw
image ID that passed the in-image check to its normalised ID, so a rebuild that the engine answers
from its cache skips save, normalise, load and check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.engine import BuildStep, Engine
from envbuild.errors import EngineError, EnvbuildError, InputError, RemoteError
from envbuild.filecache import FileCache
from envbuild.fileio import write_atomic
from envbuild.git.cache import GitCache
from envbuild.git.export import TreeExporter, commit_dates
from envbuild.image.context import BuildContext, assemble_context
from envbuild.image.inimage_verdict import compare_inimage, inimage_command
from envbuild.image.normalize import normalize_image
from envbuild.image.plan import ContextPlan, plan_context
from envbuild.image.record import build_record, render_record_json
from envbuild.image.render import base_reference, render_dockerfile
from envbuild.index import IndexClient
from envbuild.lock.io import read_lock
from envbuild.lock.model import Lock, Package, PackageFile
from envbuild.locking import file_lock
from envbuild.mirrors import Mirrors
from envbuild.reference import check_name_and_tag
from envbuild.results import VerifyReport
from envbuild.verify import VerifyOptions, verify_lock

Progress = Callable[[str], None]
Compare = Callable[[str, dict], list[str]]
RAW_REPOSITORY = "envbuild-raw"


class BuildRefused(EnvbuildError):
    """The lock fails verify, or an input is not what the lock pins: nothing was built."""


@dataclass(frozen=True)
class ImageOptions:
    cache_dir: Path
    mirrors: Mirrors = field(default_factory=Mirrors)
    offline: bool = False
    jobs: int = 8
    tags: tuple[str, ...] = ()
    push: bool = False
    no_cache: bool = False
    record_dir: Path | None = None
    keep_archive: Path | None = None  # keep the normalised `docker save` archive here


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    lock_sha256: str
    record_dir: Path
    diff_ids: tuple[str, ...]  # the normalised image's layers, base layers first
    raw_image_id: str
    steps: tuple[BuildStep, ...]
    reused: bool  # the engine's cache gave a raw image already normalised and checked
    pushed: tuple[tuple[str, str], ...] = ()  # (tag, manifest digest)
    archive: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "image_id": self.image_id,
            "tags": list(self.tags),
            "lock_sha256": self.lock_sha256,
            "record": str(self.record_dir),
        }


# --- stages before the engine -------------------------------------------------------------------


def require_verified(
    lock: Lock, lock_path: Path, options: ImageOptions, progress: Progress | None, verified: VerifyReport | None = None
) -> VerifyReport:
    report = verified or verify_lock(
        lock,
        str(lock_path),
        VerifyOptions(cache_dir=options.cache_dir, mirrors=options.mirrors, offline=options.offline, jobs=options.jobs),
        progress,
    )
    if not report.ok:
        failing = [
            f"{r.kind.replace('_', ' ')} {r.name}: {r.status} ({r.detail})"
            for r in report.results
            if not r.passes(report.strict)
        ]
        raise BuildRefused(
            f"{lock_path}: refusing to build, the lock fails verify: "
            + "; ".join(failing)
            + " — run `envbuild lock verify` for details"
        )
    return report


def build_epoch(lock: Lock, cache: GitCache, mirrors: Mirrors) -> int | None:
    """The lock's source_date_epoch, else the newest pinned commit's committer date (from the cache)."""
    if lock.source_date_epoch is not None:
        return lock.source_date_epoch
    dates, missing = [], []
    for source in lock.sources:
        found = commit_dates(cache, mirrors.rewrite(source.repo), [source.commit])
        if source.commit in found:
            dates.append(found[source.commit])
        else:
            missing.append(source.name)
    if missing:
        raise BuildRefused(
            f"the commits of {', '.join(missing)} are not in the cache ({cache.root}); "
            "run `envbuild lock verify` without --offline first"
        )
    return max(dates) if dates else None


def plan_image(
    lock_path: Path, options: ImageOptions, progress: Progress | None = None, verified: VerifyReport | None = None
) -> tuple[Lock, ContextPlan]:
    read = read_lock(lock_path)
    lock, lock_sha256 = read.lock, read.sha256
    check_tags(options.tags)
    require_verified(lock, lock_path, options, progress, verified)
    epoch = build_epoch(lock, GitCache(options.cache_dir / "git"), options.mirrors)
    return lock, plan_context(lock, lock_sha256=lock_sha256, epoch=epoch)


def dry_run(lock_path: Path, options: ImageOptions, progress: Progress | None = None) -> tuple[ContextPlan, str]:
    """The plan and the Dockerfile a build of this lock would use: a rendering of the lock alone, with no
    network, no verify and no engine. What would stop a real build is said through ``progress``."""
    say = progress or (lambda message: None)
    read = read_lock(lock_path)
    lock, lock_sha256 = read.lock, read.sha256
    check_tags(options.tags)
    unresolved = [p for p in lock.packages if not p.files]
    for package in unresolved:
        say(
            f"warning: {package.name} {package.version} has no files in the lock: a build refuses it "
            "(run `envbuild lock update` where its index is reachable); left out below"
        )
    if lock.base_image is not None and lock.base_image.digest is None:
        say(f"warning: base image {lock.base_image.name} is not pinned by digest: a build refuses it")
    try:
        epoch = build_epoch(lock, GitCache(options.cache_dir / "git"), options.mirrors)
    except BuildRefused as exc:
        say(f"warning: {exc}; SOURCE_DATE_EPOCH shown as 0")
        epoch = 0
    renderable = dataclasses.replace(lock, packages=tuple(p for p in lock.packages if p.files))
    plan = plan_context(renderable, lock_sha256=lock_sha256, epoch=epoch, allow_unpinned=True)
    return plan, render_dockerfile(plan)


def plan_json(plan: ContextPlan) -> dict[str, Any]:
    """``envbuild image --dry-run --json``: the plan and the Dockerfile it renders to."""
    return {**plan.to_json(), "dockerfile": render_dockerfile(plan)}


def check_tags(tags: tuple[str, ...]) -> None:
    """Every ``--tag`` is ``[registry[:port]/]path[:tag]`` in docker's grammar, checked before anything is
    built (a bad one would otherwise fail only at tagging, leaving an untagged image)."""
    problems = [f"--tag: {problem}" for tag in tags if (problem := check_name_and_tag(tag)) is not None]
    if problems:
        raise InputError("\n".join(problems))


def default_tag(plan: ContextPlan) -> str:
    return f"envbuild/{plan.lock_name}:{plan.lock_sha256[:12]}"


def file_fetcher(lock: Lock, cache: FileCache, client: IndexClient) -> Callable[[Package, PackageFile], Path]:
    """``file_for`` for :func:`assemble_context`: the cached file, downloaded once on a miss."""

    def file_for(package: Package, file: PackageFile) -> Path:
        if found := cache.get(file.sha256):
            return found
        page = client.project(lock.index_for(package), package.name)
        listed = page.file(file.filename)
        if listed is None:
            raise RemoteError(f"package {package.name} {package.version}: {page.index} no longer lists {file.filename}")
        try:
            return cache.fetch(listed.url, file.sha256, file.filename, client.download)
        except RemoteError as exc:
            raise RemoteError(f"package {package.name} {package.version}: {exc}") from None

    return file_for


@contextmanager
def context_dir(cache_dir: Path) -> Iterator[Path]:
    """A scratch directory under ``<cache_dir>/image/work``, held by an flock while in use; the ones a
    killed build left behind (their lock no longer held) are removed on the way in."""
    root = cache_dir / "image" / "work"
    root.mkdir(parents=True, exist_ok=True)
    for lock_file in root.glob("*.lock"):
        with file_lock(lock_file, blocking=False) as held:
            if held:
                shutil.rmtree(lock_file.with_suffix(""), ignore_errors=True)
                lock_file.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    lock_file = work.with_name(work.name + ".lock")
    try:
        with file_lock(lock_file, blocking=True):
            yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        lock_file.unlink(missing_ok=True)


# --- the raw → normalised map -------------------------------------------------------------------


def _map_path(cache_dir: Path) -> Path:
    return cache_dir / "image" / "normalized.json"


def read_map(cache_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(_map_path(cache_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # a missing or damaged map only costs a normalisation
    return data if isinstance(data, dict) else {}


def remember(cache_dir: Path, raw_id: str, entry: dict[str, Any]) -> None:
    path = _map_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_suffix(".lock"), blocking=True):
        data = read_map(cache_dir)
        data[raw_id] = entry
        write_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


# --- the build -----------------------------------------------------------------------------------


def build_image(
    lock_path: Path,
    options: ImageOptions,
    *,
    progress: Progress | None = None,
    engine: Engine | None = None,
    verified: VerifyReport | None = None,
    inimage_compare: Compare = compare_inimage,
) -> BuildResult:
    """Build the lock's image; see the module docstring for the stages. ``verified`` skips verifying
    again (for `envbuild check`); ``inimage_compare`` judges the in-image report (tests replace it)."""
    say = progress or (lambda message: None)
    lock_path = Path(lock_path)
    lock, plan = plan_image(lock_path, options, progress, verified)
    tags = options.tags or (default_tag(plan),)
    own_engine = engine is None
    engine = engine or Engine.connect()  # before any download: no engine, one line, nothing fetched
    try:
        with context_dir(options.cache_dir) as work:
            say(f"assembling the build context: {len(plan.sources)} sources, {len(plan.files)} package files")
            files = file_fetcher(lock, FileCache(options.cache_dir), IndexClient())
            exporter = TreeExporter(options.cache_dir, mirrors=options.mirrors, offline=options.offline)
            try:
                context = assemble_context(
                    plan, render_dockerfile(plan), work / "context", export_source=exporter, file_for=files
                )
            except EnvbuildError as exc:
                raise BuildRefused(f"{lock_path}: refusing to build: {exc}") from None
            return _build(lock_path, plan, context, tags, options, engine, work, say, inimage_compare)
    finally:
        if own_engine:
            engine.close()


def _build(
    lock_path: Path,
    plan: ContextPlan,
    context: BuildContext,
    tags: tuple[str, ...],
    options: ImageOptions,
    engine: Engine,
    work: Path,
    say: Progress,
    compare: Compare,
) -> BuildResult:
    say(f"building {plan.lock_name} (legacy builder, no network{', no cache' if options.no_cache else ''})")
    outcome = engine.build(context.path, nocache=options.no_cache, progress=say)
    engine.tag(outcome.image_id, f"{RAW_REPOSITORY}/{plan.lock_name}:{plan.lock_sha256[:12]}")

    known = read_map(options.cache_dir).get(outcome.image_id)
    image = engine.inspect(known["image_id"]) if known and known.get("lock_sha256") == plan.lock_sha256 else None
    archive: Path | None = None
    if image is not None and options.keep_archive is None:
        assert known is not None
        image_id, diff_ids, reused = known["image_id"], tuple(image["RootFS"]["Layers"]), True
        say(f"the engine's cache gave an image already normalised and checked: {image_id}")
    else:
        image_id, diff_ids, archive = _normalise(plan, outcome.image_id, options, engine, work, say)
        _check_in_image(image_id, context, engine, compare, say)
        remember(options.cache_dir, outcome.image_id, {"image_id": image_id, "lock_sha256": plan.lock_sha256})
        reused = False

    for tag in tags:
        engine.tag(image_id, tag)
    say(f"tagged {image_id} as {', '.join(tags)}")
    pushed = tuple((tag, engine.push(tag, say)) for tag in tags) if options.push else ()
    record_dir = write_record(lock_path, plan, context, image_id, tags, diff_ids, pushed, options.record_dir)
    return BuildResult(
        image_id, tags, plan.lock_sha256, record_dir, diff_ids, outcome.image_id, outcome.steps, reused, pushed, archive
    )


def _normalise(
    plan: ContextPlan, raw_id: str, options: ImageOptions, engine: Engine, work: Path, say: Progress
) -> tuple[str, tuple[str, ...], Path | None]:
    base = base_reference(plan)
    info = engine.inspect(base)
    if info is None:
        raise EngineError(f"the engine has no {base} after building on it")
    say("normalising the image (docker save → rewrite → docker load)")
    saved, normalised = work / "raw.tar", work / "normalised.tar"
    engine.save(raw_id, saved)
    result = normalize_image(
        saved,
        normalised,
        base_diff_ids=info["RootFS"]["Layers"],
        epoch=plan.epoch,
        base_history=engine.history_length(base),
        tags=[],
    )
    saved.unlink()
    loaded = engine.load(normalised)
    if result.image_id not in loaded and (engine.inspect(result.image_id) is None or loaded):
        raise EngineError(f"docker load gave {', '.join(loaded) or 'no image'}, not the computed {result.image_id}")
    archive = None
    if options.keep_archive is not None:
        archive = Path(options.keep_archive)
        archive.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(normalised), archive)
    return result.image_id, result.diff_ids, archive


def _check_in_image(image_id: str, context: BuildContext, engine: Engine, compare: Compare, say: Progress) -> None:
    say("checking the image from inside (installed distributions, source trees)")
    output = engine.run(image_id, inimage_command())
    if output.exit_code != 0:
        tail = output.stderr.strip().splitlines()[-1:] or ["no message"]
        problems = [f"the in-image check exited with status {output.exit_code}: {tail[0]}"]
    else:
        problems = compare(output.stdout, context.manifest)
    if problems:
        image = engine.inspect(image_id)
        if image is not None and not image.get("RepoTags"):
            engine.remove(image_id, force=True)  # an untagged image that failed: nothing else refers to it
        raise EngineError(
            "the built image does not hold what the lock pins (removed, not tagged): " + "; ".join(problems)
        )


def write_record(
    lock_path: Path,
    plan: ContextPlan,
    context: BuildContext,
    image_id: str,
    tags: tuple[str, ...],
    diff_ids: tuple[str, ...],
    pushed: tuple[tuple[str, str], ...],
    record_dir: Path | None,
) -> Path:
    """provenance.intoto.json, sbom.cdx.json and build.json, each written atomically."""
    directory = Path(record_dir) if record_dir else lock_path.parent / "build" / plan.lock_name
    directory.mkdir(parents=True, exist_ok=True)
    trees = dict(context.trees)
    dockerfile_sha256 = hashlib.sha256(context.dockerfile.encode()).hexdigest()
    files = build_record(
        plan, image_id=image_id, lock_path=str(lock_path), tags=tags, trees=trees, dockerfile_sha256=dockerfile_sha256
    ).files()
    files["build.json"] = render_record_json(
        build_summary(lock_path, plan, trees, image_id, tags, diff_ids, pushed, dockerfile_sha256)
    )
    for name, data in sorted(files.items()):
        write_atomic(directory / name, data)
    return directory


def build_summary(
    lock_path: Path,
    plan: ContextPlan,
    trees: dict[str, str],
    image_id: str,
    tags: tuple[str, ...],
    diff_ids: tuple[str, ...],
    pushed: tuple[tuple[str, str], ...],
    dockerfile_sha256: str,
) -> dict:
    inputs: list[dict[str, Any]] = [{"kind": "base_image", "name": plan.base_name, "digest": plan.base_digest}]
    inputs += [
        {
            "kind": "source",
            "name": s.name,
            "repo": s.repo,
            "ref": s.ref,
            "ref_type": s.ref_type,
            "commit": s.commit,
            "tree": trees.get(s.name, s.tree),
            "install": s.mode,
        }
        for s in plan.sources
    ]
    inputs += [
        {"kind": "package_file", "name": f.package, "version": f.version, "filename": f.filename, "sha256": f.sha256}
        for f in plan.files
    ]
    inputs.append({"kind": "dockerfile", "name": "Dockerfile", "sha256": dockerfile_sha256})
    return {
        "lock": {"path": str(lock_path), "sha256": plan.lock_sha256, "name": plan.lock_name},
        "image_id": image_id,
        "tags": sorted(tags),
        "diff_ids": list(diff_ids),
        "source_date_epoch": plan.epoch,
        "inputs": inputs,
        "pushed": [{"tag": tag, "digest": digest} for tag, digest in sorted(pushed)],
    }
