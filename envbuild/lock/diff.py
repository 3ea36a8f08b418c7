"""Differences between two locks, as typed changes; pure (commit counts come from a callback)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from envbuild.lock.model import BaseImage, Lock, Package, Source, Submodule
from envbuild.terminal import wrap

CommitCounter = Callable[[Source, Source], "int | None"]


@dataclass(frozen=True)
class Change:
    kind: str  # "source" | "package" | "base_image" | "platform" | "requirements"
    name: str
    action: str  # "added" | "removed" | "changed"
    fields: tuple[tuple[str, str, str], ...] = ()  # (field, old, new)
    commits: int | None = None  # for a moved source: commits from old to new, when the cache knows

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "action": self.action,
            "fields": [{"field": f, "old": o, "new": n} for f, o, n in self.fields],
        }
        if self.commits is not None:
            data["commits"] = self.commits
        return data


# Source fields that are lists: written one item per line, shown as the items added and removed.
LIST_FIELDS = ("requires_files", "build_requires", "requires", "waive", "skip_imports", "submodules")


def _lines(items: tuple[str, ...] | None) -> str:
    return "(not read)" if items is None else "\n".join(items)


def _submodule_lines(submodules: tuple[Submodule, ...], prefix: str = "") -> list[str]:
    """One line per submodule at every level: its path from the source's root, commit, and what the
    image does with it."""
    lines = []
    for sub in submodules:
        path = f"{prefix}{sub.path}"
        what = f"skipped: {sub.skip}" if sub.skipped else f"{sub.repo} tree {sub.tree or '(not recorded)'}"
        lines.append(f"{path} {sub.commit or '(no commit)'} {what}")
        lines += _submodule_lines(sub.submodules, f"{path}/")
    return lines


def _source_fields(source: Source) -> dict[str, str]:
    install = source.install
    provides = source.provides
    return {
        "repo": source.repo,
        "ref": source.ref,
        "ref_type": source.ref_type,
        "commit": source.commit,
        "tree": source.tree or "",
        "install": ""
        if install is None
        else f"{install.mode} {' '.join(f'{k}={v}' for k, v in sorted(install.env.items()))}".strip(),
        "provides": "" if provides is None else f"{provides.name} {provides.version or ''}".strip(),
        "requires_files": _lines(source.requires_files),
        "build_requires": _lines(source.build_requires),
        "requires": _lines(source.requires),
        "requires_unknown": source.requires_unknown or "",
        "waive": _lines(tuple(f"{w.name}: {w.reason}" for w in source.waive)),
        "skip_imports": _lines(tuple(f"{i.name}: {i.reason}" for i in source.skip_imports)),
        "submodules": _lines(tuple(_submodule_lines(source.submodules))),
        "submodules_unknown": source.submodules_unknown or "",
    }


def _package_fields(package: Package) -> dict[str, str]:
    return {
        "version": package.version,
        "index": package.index or "",
        "files": ", ".join(f"{f.filename}:{f.sha256[:12]}" for f in sorted(package.files, key=lambda f: f.filename)),
        "waive": "\n".join(f"{w.name}: {w.reason}" for w in package.waive),
    }


def _changed(old: dict[str, str], new: dict[str, str]) -> tuple[tuple[str, str, str], ...]:
    return tuple((key, old[key], new[key]) for key in old if old[key] != new[key])


def _describe_image(image: BaseImage | None) -> str:
    return "" if image is None else f"{image.name}@{image.digest or '(unpinned)'}"


def diff_locks(old: Lock, new: Lock, count_commits: CommitCounter | None = None) -> list[Change]:
    changes: list[Change] = []
    old_sources = {s.name: s for s in old.sources}
    new_sources = {s.name: s for s in new.sources}
    for name in sorted(old_sources.keys() | new_sources.keys()):
        before, after = old_sources.get(name), new_sources.get(name)
        if before is None:
            assert after is not None
            changes.append(
                Change(
                    "source", name, "added", _changed(dict.fromkeys(_source_fields(after), ""), _source_fields(after))
                )
            )
        elif after is None:
            changes.append(Change("source", name, "removed"))
        elif fields := _changed(_source_fields(before), _source_fields(after)):
            commits = count_commits(before, after) if count_commits and before.commit != after.commit else None
            changes.append(Change("source", name, "changed", fields, commits))
    old_packages = {canonicalize_name(p.name): p for p in old.packages}
    new_packages = {canonicalize_name(p.name): p for p in new.packages}
    for key in sorted(old_packages.keys() | new_packages.keys()):
        old_package, new_package = old_packages.get(key), new_packages.get(key)
        if old_package is None:
            assert new_package is not None
            changes.append(Change("package", new_package.name, "added", (("version", "", new_package.version),)))
        elif new_package is None:
            changes.append(Change("package", old_package.name, "removed", (("version", old_package.version, ""),)))
        elif fields := _changed(_package_fields(old_package), _package_fields(new_package)):
            changes.append(Change("package", new_package.name, "changed", fields))
    if old.base_image != new.base_image:
        image = new.base_image or old.base_image
        assert image is not None
        changes.append(
            Change(
                "base_image",
                image.name,
                "changed",
                (("image", _describe_image(old.base_image), _describe_image(new.base_image)),),
            )
        )
    if old.platform != new.platform:
        changes.append(Change("platform", "platform", "changed", (("platform", str(old.platform), str(new.platform)),)))
    if old.requirements != new.requirements:
        changes.append(
            Change(
                "requirements",
                "requirements",
                "changed",
                (("requirements", " ".join(old.requirements), " ".join(new.requirements)),),
            )
        )
    return changes


def render_changes(changes: list[Change], width: int | None = None) -> str:
    """Readable, one block per pin: `~ source megatron-lm: commit dc0ee41ada17… → ba7b5ebce12a… (12 commits)`;
    a line longer than ``width`` wraps, indented under itself (None: no wrapping)."""
    if not changes:
        return "no changes\n"
    mark = {"added": "+", "removed": "-", "changed": "~"}
    lines = []
    for change in changes:
        head = f"{mark[change.action]} {change.kind.replace('_', '-')} {change.name}"
        if change.action == "removed" and change.kind == "source":
            lines.append(f"{head}: removed")
            continue
        if change.kind == "package" and change.action != "changed":
            lines.append(f"{head} {change.fields[0][2] or change.fields[0][1]}")
            continue
        lines.append(f"{head}:")
        for field, old, new in change.fields:
            suffix = ""
            if field == "commit" and change.commits is not None:
                suffix = f" ({change.commits} commit{'s' if change.commits != 1 else ''})"
            if field == "files":
                lines.append("    files changed")
                continue
            if field in LIST_FIELDS:
                before, after = old.split("\n") if old else [], new.split("\n") if new else []
                lines += [f"    {field}: - {item}" for item in before if item not in after]
                lines += [f"    {field}: + {item}" for item in after if item not in before]
                continue
            lines.append(f"    {field}: {old or '(none)'} -> {new or '(none)'}{suffix}")
    return "\n".join(wrap(line, width, indent="    ") for line in lines) + "\n"
