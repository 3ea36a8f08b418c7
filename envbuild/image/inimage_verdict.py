"""The host side of the in-image check: what to run inside the image, and judging its report (pure).

The engine runs :func:`inimage_command` in a BuildKit step on the built (not yet tagged) image, with no
network; :func:`read_report` reads the report it prints, :func:`compare_inimage` judges it against the
context's manifest, and :func:`reported_parents` says what the meta layer keeps of the directories above it. Any
mismatch fails the build: a package or a source that is not what the lock pins, a requirement of an
installed distribution that the environment does not meet (minus what the requiring source waives, by
name), or a source's top-level package that does not import (minus what the lock skips, by name).
"""

from __future__ import annotations

import json
import tarfile
from typing import Any

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuild.errors import EngineError
from envbuild.image import inimage_probe
from envbuild.image.plan import META_PARENTS, MOUNT_POINT

CHECK_SCRIPT = f"{MOUNT_POINT}/inimage_probe.py"  # where the check's step has the meta layer's files
CHECK_MANIFEST = f"{MOUNT_POINT}/manifest.json"
STAT_BOUNDS = (0o10000, 1 << 32, 1 << 32, 1 << 33)  # mode, uid, gid, mtime: what a layer's tar header holds


def inimage_command() -> list[str]:
    """The check in the image, its files mounted at :data:`MOUNT_POINT` (a directory every image has: the
    mount moves no directory above it), its report encoded for a build's log (:func:`read_report`), with
    the mode, owner and mtime of the meta layer's parents (:data:`META_PARENTS`) as the image has them."""
    stat = [arg for path in META_PARENTS for arg in (inimage_probe.STAT_FLAG, path)]
    return ["python3", "-I", CHECK_SCRIPT, inimage_probe.ENCODED_FLAG, *stat, CHECK_MANIFEST]


def read_report(exit_code: int, stdout: str, stderr: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The report in the output of :func:`inimage_command`, or None and why there is none."""
    if exit_code != 0:
        tail = stderr.strip().splitlines()[-1:] or ["no message"]
        return None, [f"the in-image check exited with status {exit_code}: {tail[0]}"]
    try:
        report = json.loads(inimage_probe.read_encoded(stdout))
    except ValueError as exc:
        return None, [f"the in-image check's report did not come whole: {exc}"]
    if not isinstance(report, dict):
        return None, ["the in-image check's report is not a JSON object"]
    return report, []


def reported_parents(report: dict[str, Any]) -> dict[str, tarfile.TarInfo]:
    """The meta layer's parents as the report says the image has them: the header a layer writes for each."""
    parents = {}
    for path in META_PARENTS:
        stat = (report.get("stat") or {}).get(path)
        if not (
            isinstance(stat, list)
            and len(stat) == 4
            and all(type(v) is int and 0 <= v < bound for v, bound in zip(stat, STAT_BOUNDS))
        ):
            raise EngineError(f"the in-image check did not report {path} of the image (got {str(stat)[:80]})")
        header = tarfile.TarInfo(path.lstrip("/"))
        header.type, (header.mode, header.uid, header.gid, header.mtime) = tarfile.DIRTYPE, stat
        parents[path] = header
    return parents


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _several(name: str, version: str, found: list[str], copies: list[list[str]]) -> str:
    """Two copies of one distribution: where each is, which one Python imports, and the fix."""
    head = f"package {name}: several versions installed ({', '.join(found)}); the lock pins {version}"
    if len(copies) < 2:
        return head
    where = "; ".join(f"{v} in {path}" for v, path in copies)
    imported_version, imported = copies[0]
    shadowed = [path for _, path in copies[1:]]
    fix = (
        f"remove {', '.join(shadowed)} from the base image (envbuild removes only what a RECORD, "
        f"installed-files.txt or dpkg file list names; for a distro package, `dpkg -S {shadowed[0]}` names the "
        "package to `apt-get remove` there)"
    )
    return f"{head}: {where}; Python imports {imported_version} from {imported} (first on sys.path) — {fix}"


def compare_inimage(report: dict | str, manifest: dict) -> list[str]:
    """Every way the image differs from the manifest, one line each; empty when it matches."""
    if isinstance(report, str):
        try:
            report = json.loads(report)
        except json.JSONDecodeError as exc:
            return [f"the in-image check printed no JSON report: {exc}"]
    assert isinstance(report, dict)
    problems: list[str] = []
    if report.get("report_version") != inimage_probe.REPORT_VERSION:
        problems.append(
            f"in-image report version {report.get('report_version')!r}, expected {inimage_probe.REPORT_VERSION}"
        )
    if report.get("lock_sha256") != manifest["lock_sha256"]:
        problems.append(f"the image's manifest is for lock {report.get('lock_sha256')}, not {manifest['lock_sha256']}")
    want_python = manifest.get("python")
    if want_python and not str(report.get("python", "")).startswith(want_python + "."):
        problems.append(f"python3 in the image is {report.get('python')}, the lock's platform.python is {want_python}")

    installed: dict[str, list[str]] = {canonicalize_name(k): v for k, v in report.get("distributions", {}).items()}
    for package in manifest.get("packages", []):
        name, version = canonicalize_name(package["name"]), package["version"]
        found = installed.get(name, [])
        if not found:
            problems.append(f"package {name}: not installed (the lock pins {version})")
        elif len(found) > 1:
            problems.append(_several(name, version, found, report.get("copies", {}).get(name, [])))
        elif not _same_version(found[0], version):
            problems.append(f"package {name}: {found[0]} installed, the lock pins {version}")

    sources = report.get("sources", {})
    for source in manifest.get("sources", []):
        name, seen = source["name"], sources.get(source["name"])
        if seen is None:
            problems.append(f"source {name}: not reported by the in-image check")
            continue
        if not seen.get("exists"):
            problems.append(f"source {name}: {source['path']} does not exist in the image")
            continue
        if seen.get("commit_marker") != source["commit"]:
            problems.append(
                f"source {name}: marker says commit {seen.get('commit_marker')}, the lock pins {source['commit']}"
            )
        if seen.get("unreadable"):
            problems.append(
                f"source {name}: files of commit {source['commit']} missing in the image: "
                f"{', '.join(seen['unreadable'][:5])}"
            )
        if seen.get("tree") != source["tree"]:
            problems.append(
                f"source {name}: the installed files have tree {seen.get('tree')}, "
                f"commit {source['commit']} has tree {source['tree']} (a file was changed at build time)"
            )
        for sub in source.get("submodules", []):
            if sub.get("skip"):
                continue
            found = seen.get("submodules", {}).get(sub["path"])
            if found != sub["tree"]:
                problems.append(
                    f"submodule {name}/{sub['path']}: the installed files have tree {found}, "
                    f"commit {sub['commit']} has tree {sub['tree']} (a file was changed at build time)"
                )
    return problems + environment_problems(report, manifest)


def consistency_problems(requires: dict) -> list[dict]:
    """``pip check`` on the probe's facts (:func:`.inimage_probe.requirements`): every problem as
    {distribution, version, requirement, kind (missing, conflict, invalid), installed}. A marker is
    evaluated against the image's environment, with no extra."""
    environment = {**(requires.get("markers") or {}), "extra": ""}
    dists = requires.get("distributions") or {}
    problems = []
    for key, dist in sorted(dists.items()):
        for text in dist.get("requires", []):
            entry = {"distribution": key, "version": dist.get("version"), "requirement": text, "installed": None}
            try:
                requirement = Requirement(text)
                if requirement.marker is not None and not requirement.marker.evaluate(environment):
                    continue
            except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
                problems.append({**entry, "kind": "invalid"})
                continue
            target = dists.get(canonicalize_name(requirement.name))
            if target is None:
                problems.append({**entry, "kind": "missing"})
                continue
            try:
                met = requirement.specifier.contains(Version(str(target.get("version"))), prereleases=True)
            except InvalidVersion:
                met = False
            if not met:
                problems.append({**entry, "kind": "conflict", "installed": target.get("version")})
    return problems


def environment_problems(report: dict, manifest: dict) -> list[str]:
    """What ``pip check`` found that the requiring source or package does not waive, and every source
    import that failed: each names the distribution, the requirement and, where one installed it, the
    source."""
    problems: list[str] = []
    sources = [s for s in manifest.get("sources", []) if s.get("mode") != "none"]
    seen = report.get("sources", {})
    owner: dict[str, dict] = {}
    for source in sources:
        found = seen.get(source["name"], {}).get("distribution") or source.get("distribution") or source["name"]
        owner[canonicalize_name(found)] = source
    package_waive = {
        canonicalize_name(p["name"]): {canonicalize_name(w["name"]) for w in p.get("waive", [])}
        for p in manifest.get("packages", [])
    }
    for problem in consistency_problems(report.get("requires") or {}):
        source = owner.get(canonicalize_name(problem["distribution"]))
        text = problem["requirement"]
        try:
            parsed = Requirement(text)
            # `tinythree (>=1)`, as older setuptools writes it, reads tinythree>=1
            name, text = parsed.name, str(parsed)
        except InvalidRequirement:
            name = text
        waived = {canonicalize_name(w["name"]) for w in (source or {}).get("waive", [])}
        waived |= package_waive.get(canonicalize_name(problem["distribution"]), set())
        if canonicalize_name(name) in waived:
            continue
        who = f"{problem['distribution']} {problem['version']}"
        who = f"source {source['name']} ({who})" if source else who
        if problem["kind"] == "missing":
            problems.append(f"{who} requires {text}, which is not installed")
        elif problem["kind"] == "conflict":
            problems.append(f"{who} requires {text}, but {canonicalize_name(name)} {problem['installed']} is installed")
        else:
            problems.append(f"{who} declares {text!r}, which is not a PEP 508 requirement")
    for source in sources:
        found = seen.get(source["name"], {})
        if found.get("distribution") is None:
            problems.append(
                f"source {source['name']}: no installed distribution came from {source['path']} "
                f"(installed {source.get('mode')}, expected {source.get('distribution') or source['name']})"
            )
            continue
        if not found.get("imports") and not found.get("skipped"):
            problems.append(f"source {source['name']}: {found['distribution']} installs no top-level package to import")
        for attempt in found.get("imports", []):
            if not attempt.get("ok"):
                problems.append(f"source {source['name']}: import {attempt['module']} failed: {attempt['error']}")
    return problems
