"""Verify a lock's packages: the index still serves every recorded file with the recorded sha256."""

from __future__ import annotations

from typing import Any

import requests
from packaging.version import Version

from envbuild.errors import RemoteError
from envbuild.index.client import IndexClient, ProjectPage
from envbuild.lock.model import Lock, Package
from envbuild.lock.platform import file_version
from envbuild.progress import Progress, silent
from envbuild.verify.results import PinResult

# When one package has several problems, the verdict is the worst; a changed hash is the most alarming.
_SEVERITY = ("hash-mismatch", "missing-file", "yanked")


def verify_packages(
    lock: Lock,
    *,
    jobs: int = 8,
    progress: Progress = silent,
    session: requests.Session | None = None,
    client: IndexClient | None = None,
) -> list[PinResult]:
    """One result per package, in lock order; their pages read in parallel, ``jobs`` at a time, then
    checked one after the other (:meth:`.IndexClient.prefetch` says why)."""
    client = client or IndexClient(session)

    def check(package: Package) -> PinResult:
        result = verify_package(package, lock.index_for(package), client)
        if result.status != "ok":  # one line per problem, not per package: locks hold hundreds
            progress(f"package {package.name} {package.version}: {result.status}")
        return result

    if not lock.packages:
        return []
    indexes = sorted({lock.index_for(p) for p in lock.packages})
    progress(f"checking {len(lock.packages)} packages on {len(indexes)} index(es): {', '.join(indexes)}")
    client.prefetch(((lock.index_for(p), p.name) for p in lock.packages), jobs)
    return [check(package) for package in lock.packages]


def verify_package(package: Package, index: str, client: IndexClient) -> PinResult:
    """The verdict on one package against the project page its index serves."""
    try:
        page = client.project(index, package.name)
    except RemoteError as exc:
        return PinResult("package", package.name, "unreachable", str(exc), {"index": index, "version": package.version})
    return judge_package(package, page)


def judge_package(package: Package, page: ProjectPage) -> PinResult:
    """Pure comparison of the lock's files with what the index lists: no I/O, easy to test. An unresolved
    package's fix (`lock update` of the lock) is added where the lock's path is known."""
    facts: dict[str, Any] = {"index": page.index, "version": package.version}
    if not package.files:
        offered = [f.filename for f in page.files if file_version(f.filename, package.name) == Version(package.version)]
        listed = (
            f"the index lists {len(offered)} file(s) for that version"
            if offered
            else "the index lists no file for that version"
            if page.found
            else f"the index does not know {package.name} at all"
        )
        detail = f"the lock records no files for {package.name} {package.version} ({listed})"
        return PinResult("package", package.name, "unresolved", detail, facts)
    problems: list[dict[str, Any]] = []
    for recorded in package.files:
        entry, name = page.file(recorded.filename), recorded.filename
        if entry is None:
            where = "" if page.found else f" (the index does not know {package.name} at all)"
            detail = f"{name} is no longer listed by {page.index}{where}"
            problems.append({"status": "missing-file", "filename": name, "detail": detail})
        elif entry.sha256 != recorded.sha256:
            detail = f"{name}: lock has sha256 {recorded.sha256}, index lists {entry.sha256 or 'no sha256'}"
            hashes = {"expected": recorded.sha256, "upstream": entry.sha256}
            problems.append({"status": "hash-mismatch", "filename": name, **hashes, "detail": detail})
        elif entry.yanked:
            detail = f"{name} is yanked: {entry.yanked_reason or 'no reason given'}"
            problems.append({"status": "yanked", "filename": name, "reason": entry.yanked_reason, "detail": detail})
    if not problems:
        return PinResult(
            "package", package.name, "ok", f"{package.version}: {len(package.files)} file(s) match {page.index}", facts
        )
    status = min((p["status"] for p in problems), key=_SEVERITY.index)
    first = next(p for p in problems if p["status"] == status)
    facts.update({k: v for k, v in first.items() if k not in ("status", "filename", "detail")})
    facts["problems"] = [{k: v for k, v in p.items() if k != "detail"} for p in problems]
    detail = "; ".join(p["detail"] for p in problems)
    return PinResult("package", package.name, status, detail, facts)
