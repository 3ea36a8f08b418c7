"""`envbuild check`: verify every pin, rebuild without cache, compare the image with the last recorded
build of the same lock (or with a second build), explain a mismatch, report and append to the history.

The check always gives its answer once the lockfile parsed: whatever fails afterwards — the history
cannot be read, a pin fails verify, the engine is down, an input cannot be fetched, a build step fails,
the comparison fails — becomes a :class:`CheckReport` with ``ok: false`` and a
:class:`~envbuild.check.report.CheckFailure` naming the stage and the reason, which the CLI prints and
writes into the report directory like any other night's. A failing night is when the report matters
most. Only an invalid lockfile or invalid arguments stop it earlier (exit 2).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from envbuild.check.explain import explain
from envbuild.check.history import HistoryEntry, append_history, last_image_id, read_history
from envbuild.check.report import CheckFailure, CheckReport, Difference, Stage
from envbuild.engine.claim import lock_claims
from envbuild.engine.client import Engine
from envbuild.errors import EngineError, EnvbuildError
from envbuild.fetch import fetch_inputs
from envbuild.image.build import BuildResult, ImageOptions, build_image
from envbuild.image.cache.scratch import context_dir
from envbuild.image.normalise import save_added_layers
from envbuild.interrupts import sigterm_interrupts
from envbuild.lock.io import LockFile
from envbuild.progress import Progress, silent
from envbuild.verify.pins import VerifyOptions, verify_lock
from envbuild.verify.results import VerifyReport


@dataclass(frozen=True)
class CheckOptions:
    """How to verify (the same options as `lock verify`) and where the history lives."""

    verify: VerifyOptions
    history: Path | None = None


class _StageFailed(Exception):
    def __init__(self, stage: Stage, reason: str) -> None:
        self.failure = CheckFailure(stage, reason)


@contextmanager
def _stage(stage: Stage) -> Iterator[None]:
    """Turn any of the project's errors inside the block into a failure of ``stage``."""
    try:
        yield
    except EnvbuildError as exc:
        raise _StageFailed(stage, str(exc)) from None


def run_check(
    read: LockFile,
    options: CheckOptions,
    progress: Progress = silent,
    *,
    engine: Engine | None = None,
    now: datetime | None = None,
) -> CheckReport:
    """The check of the lock ``read`` (read once, by the caller: an invalid lockfile is the one thing that
    stops the check, exit 2); the same value is verified, fetched and built, twice when the history has
    no earlier build of it."""
    lock_path = read.path
    verified = VerifyReport(str(lock_path), (), strict=options.verify.strict)
    history_ok = True
    try:
        if options.history:
            with _stage("history"):  # one that is no history is refused now, not after verify; its warnings too
                read_history(options.history, progress)
        progress(f"verifying {lock_path}")
        with _stage("verify"):
            verified = verify_lock(read.lock, str(lock_path), options.verify, progress)
        if not verified.ok:
            failing = [f"{r.kind} {r.name}: {r.status}" for r in verified.results if not r.passes(verified.strict)]
            raise _StageFailed("verify", "the lock fails verify (" + "; ".join(failing) + "), so no image was built")
        report = _rebuild_and_compare(read, options, verified, engine, progress)
    except _StageFailed as failed:
        history_ok = failed.failure.stage != "history"
        report = CheckReport(verified, False, failure=failed.failure)
    if options.history is not None and history_ok:
        try:
            _record(options.history, read, report, now)
        except OSError as exc:  # the answer stands: the CLI still prints and writes it, then names the file
            report = replace(report, history_error=f"{options.history}: cannot append: {exc.strerror or exc}")
        except EnvbuildError as exc:  # a file that is no history put in its place since it was read
            report = replace(report, history_error=str(exc))
    return report


def _rebuild_and_compare(
    read: LockFile,
    options: CheckOptions,
    verified: VerifyReport,
    engine: Engine | None,
    progress: Progress,
) -> CheckReport:
    source = options.verify.source
    with _stage("engine"):
        connected = nullcontext(engine) if engine is not None else Engine.connect()
    # SIGTERM (a CI job cancelled) unwinds like Ctrl-C, as in a build: the scratch (two saved images on a
    # night that does not reproduce) and the hold on the history's image go with the check.
    with connected as live, _claimed(live, read.lock.name, progress), sigterm_interrupts():
        with _stage("history"):
            # Read once the claim is held: a check of the lock that held it has just recorded its build,
            # which this one compares with instead of building twice.
            history = read_history(options.history) if options.history else []
        with _stage("fetch"):
            # Once, here rather than inside the builds, so a fetch failure is named as one; both builds
            # start from these inputs.
            inputs = fetch_inputs(read, source, progress=progress)
        # Held while in use: a killed check's is removed by the next check or build from this cache.
        with context_dir(source.cache_dir, prefix="check-") as work:

            def build(number: int, name: str) -> BuildResult:
                tags = (f"envbuild-check/{read.lock.name}:{name}",)
                image = ImageOptions(options.verify, no_cache=True, record_dir=work / f"record-{number}", tags=tags)
                with _stage("build"):
                    return build_image(read, image, progress=progress, engine=live, verified=verified, inputs=inputs)

            previous = last_image_id(history, read.sha256)
            hold = _holding(live, previous, previous_reference(read.lock.name)) if previous else nullcontext()
            with hold:
                progress("rebuilding without cache")
                first = build(1, "first")
                if previous is not None:
                    with _stage("compare"):
                        return _against_history(verified, first, previous, live, work, progress)
            progress("no earlier build of this lock in the history: building a second time to compare")
            second = build(2, "second")
            with _stage("compare"):
                same = first.image_id == second.image_id
                differences = () if same else _explain(live, first.image_id, second.image_id, work, progress)
            return CheckReport(
                verified, same, (first.image_id, second.image_id), differences, compared_with="second build"
            )


@contextmanager
def _claimed(engine: Engine, lock_name: str, say: Progress) -> Iterator[None]:
    """One check of a lock at a time on an engine, among this user's on this machine: the tags a check
    builds, holds and compares under (``envbuild-check/<lock name>:first``, ``:second``, ``:previous``) are
    the lock's, so a second check beside it would move them, and each build's tidying would remove the
    other's untagged images before a mismatch is explained. The second waits for the first to end."""
    with ExitStack() as held:
        with _stage("engine"):
            held.enter_context(lock_claims(engine.address, "check", [lock_name], say, "`envbuild check`"))
        yield


def previous_reference(lock_name: str) -> str:
    """The tag that holds the history's image of the lock while the check rebuilds and compares. The
    check's own tags (``:first``, ``:second``) move to each night's builds, and the build's tidying removes
    the untagged images of its lock: without a hold, the image a night compares with would be gone by then
    whenever it is the previous night's only build, and a mismatch could not be explained."""
    return f"envbuild-check/{lock_name}:previous"


@contextmanager
def _holding(engine: Engine, image: str, reference: str) -> Iterator[None]:
    """Hold ``image`` under ``reference`` for the block, when the engine has it; the tag goes afterwards
    (and with it the image, when no other tag holds it: the history's newest image is the new one then)."""
    held = False
    try:
        if engine.inspect(image) is not None:
            engine.tag(image, reference)
            held = True
    except EngineError:
        pass  # gone meanwhile, or the engine refuses: the comparison says what it can without it
    try:
        yield
    finally:
        if held:
            try:
                engine.remove(reference)
            except EngineError:
                pass  # the engine went away meanwhile: the tag is moved by the next night's hold


def _against_history(
    verified: VerifyReport, first: BuildResult, previous: str, engine: Engine, work: Path, say: Progress
) -> CheckReport:
    ids = (previous, first.image_id)
    if previous == first.image_id:
        return CheckReport(verified, True, ids, compared_with="history")
    if engine.inspect(previous) is not None:
        differences = _explain(engine, previous, first.image_id, work, say)
    else:
        say(f"the recorded image {previous} is no longer in the engine: comparing image IDs only")
        differences = (Difference("image", previous, first.image_id),)
    return CheckReport(verified, False, ids, differences, compared_with="history")


def _explain(engine: Engine, old: str, new: str, work: Path, say: Progress) -> tuple[Difference, ...]:
    """Save the two images (only when they differ: a save reads every layer of an image) without the
    layers they share, which explain never reads, and compare them."""
    shared = set(engine.inspect(old)["RootFS"]["Layers"]) & set(engine.inspect(new)["RootFS"]["Layers"])  # type: ignore[index]
    archives = [
        save_added_layers(engine, image, work / f"{name}.tar", shared, say)
        for name, image in (("old", old), ("new", new))
    ]
    return explain(*archives)


def _record(history: Path, read: LockFile, report: CheckReport, now: datetime | None) -> None:
    when = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    built = bool(report.image_ids)
    append_history(
        history,
        HistoryEntry(
            when,
            str(read.path),
            read.sha256,
            report.ok,
            report.reproducible if built else None,
            report.image_ids[-1] if built else None,
            {f"{r.kind}:{r.name}": r.status for r in report.verify.results},
            failed_stage=report.failure.stage if report.failure else None,
        ),
    )
