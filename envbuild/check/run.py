"""`envbuild check`: verify every pin, rebuild without cache, compare the image with the last recorded
build of the same lock (or with a second build), explain a mismatch, report and append to the history."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from envbuild.check.explain import explain
from envbuild.check.history import (
    HistoryEntry,
    append_history,
    last_image_id,
    read_history,
)
from envbuild.check.report import CheckReport, Difference
from envbuild.engine import Engine
from envbuild.errors import LockfileError, Problem
from envbuild.image.build import BuildResult, ImageOptions, build_image
from envbuild.lock import read_lock
from envbuild.results import VerifyReport
from envbuild.verify import VerifyOptions, verify_lock

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CheckOptions:
    """How to verify (the same options as `lock verify`) and where the history lives."""

    verify: VerifyOptions
    history: Path | None = None


def run_check(
    lock_path: Path,
    options: CheckOptions,
    progress: Progress | None = None,
    *,
    engine: Engine | None = None,
    now: datetime | None = None,
) -> CheckReport:

    say = progress or (lambda message: None)
    lock = read_lock(lock_path).lock
    try:
        lock_sha256 = hashlib.sha256(lock_path.read_bytes()).hexdigest()
    except OSError as exc:
        raise LockfileError([Problem(str(lock_path), 0, "", f"cannot read: {exc}")]) from None
    history = read_history(options.history, say) if options.history else []

    say(f"verifying {lock_path}")
    verified = verify_lock(lock, str(lock_path), options.verify, progress)
    if not verified.ok:
        report = CheckReport(verified, False, note="verify failed, so no image was built")
        _record(options.history, lock_path, lock_sha256, report, None, now)
        return report

    source = options.verify
    work = Path(tempfile.mkdtemp(prefix="check-", dir=_ensure(source.cache_dir)))
    own = engine is None
    engine = engine or Engine.connect()
    try:
        image_options = ImageOptions(
            cache_dir=source.cache_dir,
            mirrors=source.mirrors,
            offline=source.offline,
            jobs=source.jobs,
            no_cache=True,
            record_dir=work / "record-1",
            keep_archive=work / "first.tar",
            tags=(f"envbuild-check/{lock.name}:first",),
        )
        say("rebuilding without cache")
        first = build_image(lock_path, image_options, progress=progress, engine=engine, verified=verified)
        previous = last_image_id(history, lock_sha256)
        if previous is not None:
            report = _against_history(verified, first, previous, engine, work, say)
        else:
            say("no earlier build of this lock in the history: building a second time to compare")
            second = build_image(
                lock_path,
                replace(
                    image_options,
                    record_dir=work / "record-2",
                    keep_archive=work / "second.tar",
                    tags=(f"envbuild-check/{lock.name}:second",),
                ),
                progress=progress,
                engine=engine,
                verified=verified,
            )
            differences = () if first.image_id == second.image_id else explain(work / "first.tar", work / "second.tar")
            report = CheckReport(
                verified,
                first.image_id == second.image_id,
                (first.image_id, second.image_id),
                differences,
                compared_with="second build",
            )
        _record(options.history, lock_path, lock_sha256, report, first.image_id, now)
        return report
    finally:
        if own:
            engine.close()
        shutil.rmtree(work, ignore_errors=True)


def _against_history(
    verified: VerifyReport, first: BuildResult, previous: str, engine: Engine, work: Path, say: Progress
) -> CheckReport:
    ids = (previous, first.image_id)
    if previous == first.image_id:
        return CheckReport(verified, True, ids, compared_with="history")
    if engine.inspect(previous) is not None:
        engine.save(previous, work / "previous.tar")
        differences = explain(work / "previous.tar", work / "first.tar")
    else:
        say(f"the recorded image {previous} is no longer in the engine: comparing image IDs only")
        differences = (Difference("image", previous, first.image_id),)
    return CheckReport(verified, False, ids, differences, compared_with="history")


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _record(
    history: Path | None,
    lock_path: Path,
    lock_sha256: str,
    report: CheckReport,
    image_id: str | None,
    now: datetime | None,
) -> None:
    if history is None:
        return
    when = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    pins = {f"{r.kind}:{r.name}": r.status for r in report.verify.results}
    append_history(
        history,
        HistoryEntry(
            when, str(lock_path), lock_sha256, report.ok, None if report.note else report.reproducible, image_id, pins
        ),
    )
