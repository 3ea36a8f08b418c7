"""`envbuild image`: a verified lock → a reproducible, checked, tagged image and its build record.

The order is fixed: read the lock → check what a build must (:func:`verify_for_build`: every source's ref
upstream, one ``ls-remote`` per repository, a moved commit fetched meanwhile; the closure, beside it; the
index only about package files the cache lacks — refuse a failing pin), the engine asked meanwhile (no
engine: one line, nothing fetched) → fetch the inputs into the caches (every source's tree, every package
file; :mod:`envbuild.fetch`) → plan (pure) → assemble the context from the caches (every file and
tree checked before anything is installed; each source's tree exported once per commit and kept,
:mod:`.treestore`, and dropped when the in-image check fails) → the base image on the engine, pulled for the lock's
platform and refused when it is another's (:mod:`.base`) → the packages image (:mod:`.packages_image`: built
by BuildKit with the package files bind-mounted, in no layer; or reused) → the image on it, BuildKit, no
network, sending the sources alone (:mod:`.stream`) → the in-image check (a BuildKit step on the raw image,
:meth:`.Engine.run_step`; a mismatch makes no image and sets no tag) → normalise the config
(:mod:`.normalise`: the layers are the same bytes on every build, so only the config is rewritten and
loaded, with the in-image check's files as one small layer envbuild writes, its parents as the check
reports them; the ID must be the computed one; begun once the check's step starts, with the parents the
lock's last check reported, :mod:`.checked`) → tag, push → write the record → tidy the engine
(:mod:`.cache.retention`).

The build fetches what it needs itself, whatever ``lock verify`` fetched: a cold cache and a warm one
give the same image. ``--offline`` fetches nothing and names what is missing and the command that
fetches it (``envbuild lock fetch``).

A rebuild of a lock built and checked before is answered from the cache's record of it once the refs are
re-checked (:mod:`envbuild.image.cache.answer`: tagged, its record written, nothing assembled or sent;
``noop``, not with ``--no-cache``), and a raw image the engine's layer cache gives again skips normalising
and checking (:mod:`envbuild.image.cache.normalised_map`). The raw image keeps a private tag
``envbuild-raw/<lock name>:<sha12>`` so that the engine keeps its layers (shared with the normalised image)
for the next build. Scratch (the context directory) is removed when the build ends, however
it ends; SIGTERM is taken as an interrupt while a build runs, so that it unwinds the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.config import SourceOptions
from envbuild.engine.buildkit import LostLayer
from envbuild.engine.claim import EngineClaim
from envbuild.engine.client import Engine
from envbuild.errors import EnvbuildError
from envbuild.fetch import Inputs, exporter_for, fetch_inputs, newest_commit_date
from envbuild.git.treeexport import TreeExporter
from envbuild.image.assemble import BuildContext, assemble_context, meta_files
from envbuild.image.base import ensure_base
from envbuild.image.cache.answer import answer_from_record, built_before
from envbuild.image.cache.ledger import BUILDER, BuiltImage, write_built
from envbuild.image.cache.normalised_map import kept_parents, read_map, remember
from envbuild.image.cache.retention import empty_build_cache, tidy
from envbuild.image.cache.scratch import context_dir, lock_name_held
from envbuild.image.checked import InImageMismatch, checked_and_normalised, last_parents, parents_entry
from envbuild.image.installer import binaries_dir, uv_binary_file
from envbuild.image.options import check_image_options, check_tags
from envbuild.image.packages_image import ensure_packages_image
from envbuild.image.plan import ContextPlan, plan_context
from envbuild.image.record import RecordedBuild
from envbuild.image.render import (
    RAW_REPOSITORY,
    base_reference,
    raw_reference,
    render_buildkit_image_dockerfile,
    render_dockerfile,
)
from envbuild.image.result import BuildResult, default_tag, write_record
from envbuild.image.stream import buildkit_context, sync_dir
from envbuild.image.treestore import TreeStore, tree_key
from envbuild.index.filecache import FileCache
from envbuild.interrupts import sigterm_interrupts
from envbuild.lock.io import LockFile
from envbuild.progress import Progress, silent
from envbuild.verify.buildcheck import build_requirement_problems, require_buildable
from envbuild.verify.pins import VerifyOptions, verify_build_inputs, verify_for_build
from envbuild.verify.results import VerifyReport

__all__ = [
    "RAW_REPOSITORY",
    "BuildRefused",
    "BuildResult",
    "ImageOptions",
    "PinsUnreachable",
    "build_image",
    "check_tags",
    "dry_run",
]


class BuildRefused(EnvbuildError):
    """The lock fails verify: nothing was fetched or built."""


class PinsUnreachable(BuildRefused):
    """The lock fails verify because a pin could not be checked (its upstream or index out of reach, or
    offline and not in the cache): the machine's fault, not the lock's; nothing was fetched or built."""


@dataclass(frozen=True)
class ImageOptions:
    """How to verify and fetch (the options of `lock verify`), and what to make of the image."""

    verify: VerifyOptions
    tags: tuple[str, ...] = ()
    push: bool = False
    no_cache: bool = False
    record_dir: Path | None = None

    @property
    def source(self) -> SourceOptions:
        return self.verify.source

    @property
    def cache_dir(self) -> Path:
        return self.verify.source.cache_dir


# --- stages before the engine -------------------------------------------------------------------


def require_verified(
    read: LockFile, options: VerifyOptions, progress: Progress, verified: VerifyReport | None = None
) -> VerifyReport:
    """The report (a build's own check, :func:`verify_for_build`, unless given), or BuildRefused
    (:class:`PinsUnreachable` when a pin that fails could not be checked at all)."""
    report = verified or verify_for_build(read.lock, str(read.path), options, progress)
    if not report.ok:
        failing = [
            f"{r.kind.replace('_', ' ')} {r.name}: {r.status} ({r.detail})"
            for r in report.results
            if not r.passes(report.strict)
        ]
        unreachable = any(r.status == "unreachable" for r in report.results)
        source = options.source
        advice = (
            f"run `{source.lock_command('fetch', read.path)}` where the upstreams are reachable, then build offline again"
            if source.offline and unreachable
            else f"run `{source.lock_command('verify', read.path, *_verify_flags(source.offline, report.strict))}` for details"
        )
        refused = PinsUnreachable if unreachable else BuildRefused
        raise refused(f"{read.path}: refusing to build, the lock fails verify: {'; '.join(failing)} — {advice}")
    return report


def _verify_flags(offline: bool, strict: bool) -> list[str]:
    """The flags of the `lock verify` that fails as this build's check did."""
    return [*(["--offline"] if offline else []), *(["--strict"] if strict else [])]


def check_options(read: LockFile, options: ImageOptions) -> None:
    """:func:`~envbuild.image.options.check_image_options` of ``options``: what would make the build fail only
    at its end (or after everything is fetched), refused before anything starts, exit 2."""
    check_image_options(
        read, tags=options.tags, push=options.push, record_dir=options.record_dir, source=options.source
    )


@dataclass(frozen=True)
class DryRun:
    """What ``envbuild image --dry-run`` shows: the plan, its Dockerfile, and each reason a real build of
    this lock would be refused (the dry run renders it anyway, with what can be rendered)."""

    plan: ContextPlan
    dockerfile: str
    refusals: tuple[str, ...]


def dry_run(read: LockFile, options: ImageOptions, progress: Progress = silent) -> DryRun:
    """The plan and the Dockerfile a build of this lock would use: a rendering of the lock alone, with no
    network, no verify and no engine. What would stop a real build is said through ``progress`` and
    returned."""
    lock = read.lock
    check_tags(options.tags)
    refusals = [
        f"{package.name} {package.version} has no files in the lock (run "
        f"`{options.source.lock_command('update', read.path, '--packages')}` where its index is reachable); left out below"
        for package in lock.packages
        if not package.files
    ]
    if lock.base_image is not None and lock.base_image.digest is None:
        refusals.append(
            f"base image {lock.base_image.name} is not pinned by digest "
            f"(`{options.source.lock_command('update', read.path, '--base')}` pins it)"
        )
    refusals += build_requirement_problems(lock)
    for refusal in refusals:
        progress(f"warning: {refusal}: a build refuses it")
    epoch = lock.source_date_epoch
    if epoch is None:
        try:
            epoch = newest_commit_date(lock, exporter_for(options.source))
        except EnvbuildError:
            progress(
                "note: the pinned commits are not in the cache yet, so this dry run shows SOURCE_DATE_EPOCH as 0 "
                "where a build writes the newest pinned commit's date; `envbuild lock fetch` (or the build) "
                "fetches them"
            )
            epoch = 0
    renderable = dataclasses.replace(lock, packages=tuple(p for p in lock.packages if p.files))
    plan = plan_context(renderable, lock_sha256=read.sha256, epoch=epoch, allow_unpinned=True)
    return DryRun(plan, render_dockerfile(plan), tuple(refusals))


def plan_json(dry: DryRun) -> dict[str, Any]:
    """``envbuild image --dry-run --json``: the plan, the Dockerfile it renders to, and what a build refuses."""
    return {**dry.plan.to_json(), "dockerfile": dry.dockerfile, "refusals": list(dry.refusals)}


# --- the build -----------------------------------------------------------------------------------


def build_image(
    read: LockFile,
    options: ImageOptions,
    *,
    progress: Progress = silent,
    engine: Engine | None = None,
    verified: VerifyReport | None = None,
    inputs: Inputs | None = None,
    exporter: TreeExporter | None = None,
) -> BuildResult:
    """Build the lock's image; see the module docstring for the stages. ``verified`` skips verifying
    again and ``inputs`` fetching again (`envbuild check` verifies and fetches once, then builds twice
    from the same value: one lock verified, fetched and built). ``exporter``: the build's, for
    ``options.source``, its verify begun (:func:`envbuild.image.early.begin_build`)."""
    check_options(read, options)
    before = None if options.no_cache else built_before(read, options.cache_dir)
    exporter = exporter or exporter_for(options.source)  # one for the whole build: it remembers what it found
    # The engine is asked whether it answers while the lock is verified.
    with _connecting(engine, warm=before is None) as connecting:
        report = verified or verify_for_build(
            read.lock, str(read.path), options.verify, progress, inputs=before is None, exporter=exporter
        )
        require_verified(read, options.verify, progress, report)
        require_buildable(read.lock, str(read.path))  # every source's build requirements, before the engine starts
        with sigterm_interrupts():
            connected = connecting()
            if before is not None:
                answered = answer_from_record(
                    read,
                    *before,
                    connected,
                    tags=options.tags,
                    push=options.push,
                    cache_dir=options.cache_dir,
                    record_dir=options.record_dir,
                    say=progress,
                )
                if answered is not None:
                    return answered
                if verified is None:  # what was left out above for a lock built before: it is built again
                    checked = verify_build_inputs(read.lock, str(read.path), options.verify, progress)
                    report = dataclasses.replace(report, results=report.results + tuple(checked))
                    require_verified(read, options.verify, progress, report)
            if inputs is None:
                inputs = fetch_inputs(read, options.source, progress=progress, exporter=exporter)
            files = FileCache(options.cache_dir)
            epoch = read.lock.source_date_epoch if read.lock.source_date_epoch is not None else inputs.epoch
            plan = plan_context(read.lock, lock_sha256=read.sha256, epoch=epoch)
            tags = options.tags or (default_tag(plan),)
            store = TreeStore(options.cache_dir)
            with (
                context_dir(options.cache_dir) as work,
                lock_name_held(options.cache_dir, plan.lock_name, connected.address, progress),
                store.in_use(),
            ):
                progress(f"assembling the build context: {len(plan.sources)} sources, {len(plan.files)} package files")
                context = assemble_context(
                    plan,
                    render_dockerfile(plan),
                    work / "context",
                    export_source=exporter,
                    file_for=lambda package, file: _cached(files, file.sha256),
                    store=store,
                    rehash=False,  # the file cache is content-addressed; pip --require-hashes checks what it installs
                    installer_binary=_kept_binary(plan, options.cache_dir),
                )
                claim = EngineClaim(connected.address)
                try:
                    built = _build_claimed(_Assembled(read, plan, context, tags, options, connected, progress), claim)
                except InImageMismatch:  # a kept tree changed on disk would fail it: the next build exports again
                    for source in plan.sources:
                        store.forget(source)
                    raise
                kept = {raw_reference(plan)} | ({built.packages.reference} if built.packages else set())
                tidy(connected, plan.lock_name, kept, built.image_id, base_reference(plan), claim, progress)
            store.prune({tree_key(source) for source in plan.sources})
            return built


@contextmanager
def _connecting(engine: Engine | None, *, warm: bool = True) -> Iterator[Callable[[], Engine]]:
    """How to get the engine: ``engine``, or one connected to (a ping) in a thread from the start, while the
    caller works; no engine is one :class:`EngineError`, raised where the engine is asked for. ``warm``: what
    every build asks of it is asked in that thread too; not for a lock built before, which the record
    answers without (the CLI's ``docker version`` alone takes 0.05 s). A block that ends without asking (a
    refused lock) does not wait for the ping (a host that does not answer takes
    :data:`~envbuild.engine.calls.CONNECT_TIMEOUT`): the engine is closed whenever it answers."""
    if engine is not None:
        yield lambda: engine
        return
    connected: Future[Engine] = Future()

    def connect() -> None:
        try:
            found = Engine.connect()
        except BaseException as exc:  # handed to whoever asks for the engine
            connected.set_exception(exc)
            return
        if warm:
            with suppress(EnvbuildError):  # what every build asks (its base's platform, the CLI it builds
                found.machine()  # with: `docker version`), asked here while the caller works
                found.build_cli  # noqa: B018
        connected.set_result(found)

    threading.Thread(target=connect, name="envbuild-engine-connect", daemon=True).start()

    def close(done: Future[Engine]) -> None:
        if done.exception() is None:
            done.result().close()

    try:
        yield connected.result
    finally:
        connected.add_done_callback(close)


def _kept_binary(plan: ContextPlan, cache_dir: Path) -> Callable[[Path], Path] | None:
    """The lock's uv binary, read out of its wheel once and kept (:func:`.installer.uv_binary_file`)."""
    installer = plan.installer
    if installer is None:
        return None
    return lambda wheel: uv_binary_file(wheel, installer, binaries_dir(cache_dir))


def _cached(files: FileCache, sha256: str) -> Path:
    found = files.get(sha256)
    if found is None:  # fetch_inputs put it there a moment ago: the cache was changed under us
        raise EnvbuildError(f"{files.path_for(sha256)} left the file cache during the build; build again")
    return found


@dataclass(frozen=True)
class _Assembled:
    """A build up to the engine: the lock, its plan, the context assembled from it, and where it goes."""

    lock: LockFile
    plan: ContextPlan
    context: BuildContext
    tags: tuple[str, ...]
    options: ImageOptions
    engine: Engine
    say: Progress


def _build_claimed(build: _Assembled, claim: EngineClaim) -> BuildResult:
    """:func:`_build` holding the engine's ``claim`` shared (beside other builds, never beside a prune of
    BuildKit's cache); once more after emptying that cache if it met :class:`LostLayer` (the engine's
    cache, not the lock)."""
    try:
        with claim.shared():
            return _build(build)
    except LostLayer as fault:
        empty_build_cache(build.engine, claim, fault, build.say)
    with claim.shared():
        return _build(build)


def _build(build: _Assembled) -> BuildResult:
    plan, context, options, engine, say = build.plan, build.context, build.options, build.engine, build.say
    ensure_base(engine, plan, say)
    packages = (
        ensure_packages_image(engine, context, no_cache=options.no_cache, cache_dir=options.cache_dir, say=say)
        if plan.files
        else None
    )
    raw_tag = raw_reference(plan)
    stream = buildkit_context(context, render_buildkit_image_dockerfile(plan))
    say(f"building {plan.lock_name} (BuildKit, no network{', no cache' if options.no_cache else ''})")
    outcome = engine.buildkit_build(
        stream,
        nocache=options.no_cache,
        progress=say,
        tag=raw_tag,
        what="the sources",
        context_dir=sync_dir(options.cache_dir, plan.lock_name, "image"),
    )

    meta = meta_files(context)
    meta_sha256 = hashlib.sha256(b"".join(name.encode() + b"\0" + data for name, data in meta.items())).hexdigest()
    normalised_map = read_map(options.cache_dir)
    known = normalised_map.get(outcome.image_id)
    image = (
        engine.inspect(known["image_id"])
        if known and known.get("lock_sha256") == plan.lock_sha256 and known.get("meta_sha256") == meta_sha256
        else None
    )
    if image is not None and known is not None:
        image_id, diff_ids, reused = known["image_id"], tuple(image["RootFS"]["Layers"]), True
        say(f"the engine's cache gave an image already normalised and checked: {image_id}")
    else:
        predicted = last_parents(kept_parents(normalised_map, plan.lock_name))
        checked = checked_and_normalised(engine, outcome.image_id, raw_tag, context, meta, predicted, say)
        image_id, diff_ids = checked.image.image_id, checked.image.diff_ids
        # BuildKit may give a new raw ID to a rebuild it answers from its cache: the normalised ID, which
        # is the same for the same layers, says that this image passed the in-image check before.
        reused = not options.no_cache and any(
            isinstance(entry, dict)
            and entry.get("image_id") == image_id
            and entry.get("lock_sha256") == plan.lock_sha256
            for entry in normalised_map.values()
        )
        if reused:
            say(f"{image_id[:19]} passed the in-image check before")
        remember(
            options.cache_dir,
            outcome.image_id,
            {
                "image_id": image_id,
                "lock_sha256": plan.lock_sha256,
                "lock_name": plan.lock_name,
                "meta_sha256": meta_sha256,
                "parents": parents_entry(checked.parents),
            },
        )

    for tag in build.tags:
        engine.tag(image_id, tag)
    say(f"tagged {image_id} as {', '.join(build.tags)}")
    pushed = tuple((tag, engine.push(tag, say)) for tag in build.tags) if options.push else ()
    dockerfile_sha256 = hashlib.sha256(context.dockerfile.encode()).hexdigest()
    distro_removed = packages.distro_removed if packages else ()
    record_dir = write_record(
        RecordedBuild(
            lock_path=build.lock.path,
            plan=plan,
            trees=dict(context.trees),
            dockerfile_sha256=dockerfile_sha256,
            image_id=image_id,
            tags=build.tags,
            diff_ids=diff_ids,
            pushed=pushed,
            distro_removed=distro_removed,
        ),
        options.record_dir,
    )
    # Only now, the image checked and tagged: the next build of these lock bytes is answered from it.
    write_built(
        options.cache_dir,
        BuiltImage(
            lock_sha256=plan.lock_sha256,
            builder=BUILDER,
            base_digest=plan.base_digest,
            image_id=image_id,
            raw_image_id=outcome.image_id,
            epoch=plan.epoch,
            dockerfile_sha256=dockerfile_sha256,
            trees=context.trees,
            distro_removed=distro_removed,
        ),
    )
    return BuildResult(
        image_id=image_id,
        tags=build.tags,
        lock_sha256=plan.lock_sha256,
        record_dir=record_dir,
        diff_ids=diff_ids,
        raw_image_id=outcome.image_id,
        steps=(packages.steps if packages else ()) + outcome.steps,
        reused=reused,
        pushed=pushed,
        packages=packages,
        sent=(packages.sent if packages else 0) + stream.payload,
    )
