"""Differences between two locks, as typed changes, and the change report (for a terminal, and in
Markdown for a pull request's body); pure: what the commits of a moved source hold comes from a callback,
and how submodule pairings changed is given (both are read from the cache by ``update/report.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from packaging.utils import canonicalize_name

from envbuild.data.jsonout import fields_json, jfield, records
from envbuild.escape import for_markdown, for_terminal
from envbuild.lock.model import BaseImage, Lock, Package, Platform, Source, Submodule, walk_submodules
from envbuild.lock.moves import LoggedCommit, Moved, PairingChange, commits
from envbuild.terminal import wrap

MoveReader = Callable[[Source, Source], "Moved | None"]


@dataclass(frozen=True)
class Change:
    kind: str  # "source" | "package" | "base_image" | "installer" | "platform" | "requirements"
    name: str
    action: str  # "added" | "removed" | "changed"
    fields: tuple[tuple[str, str, str], ...] = jfield((), convert=records("field", "old", "new"))  # (field, old, new)
    # For a moved source: its commits from old to new, when the cache knows (shown as the move's keys).
    moved: Moved | None = jfield(None, inline=True)
    # Submodule pairings made differently, said under this change.
    pairings: tuple[PairingChange, ...] = jfield((), omit="empty")
    # For a source: its ref and ref_type in the new lock (the old one's, when removed).
    ref: str = jfield("", skip=True)
    ref_type: str = jfield("", skip=True)

    @property
    def commits(self) -> int | None:
        """For a moved source: how many commits the new pin brings, when the cache knows."""
        return None if self.moved is None else self.moved.commits

    @property
    def commit_moved(self) -> bool:
        return self.action == "changed" and any(field == "commit" for field, _, _ in self.fields)

    def to_json(self) -> dict[str, Any]:
        if self.moved is None and self.commit_moved:
            return fields_json(self, moved={"ancestor": None})  # the cache cannot tell
        return fields_json(self)


# Source fields that are lists: written one item per line, shown as the items added and removed.
LIST_FIELDS = ("requires_files", "build_requires", "requires", "waive", "skip_imports", "submodules")


def _lines(items: tuple[str, ...] | None) -> str:
    return "(not read)" if items is None else "\n".join(items)


def _submodule_lines(submodules: tuple[Submodule, ...]) -> list[str]:
    """One line per submodule at every level: its path from the source's root, commit, and what the
    image does with it."""
    lines = []
    for path, sub in walk_submodules(submodules):
        what = f"skipped: {sub.skip}" if sub.skipped else f"{sub.repo} tree {sub.tree or '(not recorded)'}"
        lines.append(f"{path} {sub.commit or '(no commit)'} {what}")
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


def _describe_platform(platform: Platform | None) -> str:
    if platform is None:
        return ""
    cann = f" cann {platform.cann}" if platform.cann else ""
    return f"{platform.os}/{platform.arch} python {platform.python}{cann}"


def diff_locks(
    old: Lock,
    new: Lock,
    *,
    read_move: MoveReader | None = None,
    pairings: Sequence[PairingChange] = (),
) -> list[Change]:
    """The changes from ``old`` to ``new``, sources first; ``read_move`` says
    what a moved source's commits are, and each of ``pairings`` is said under the change of the source its
    submodule belongs to (else of the source it pairs with)."""
    changes: list[Change] = []
    old_sources = {s.name: s for s in old.sources}
    new_sources = {s.name: s for s in new.sources}
    for name in sorted(old_sources.keys() | new_sources.keys()):
        before, after = old_sources.get(name), new_sources.get(name)
        if before is None:
            assert after is not None
            fields = _changed(dict.fromkeys(_source_fields(after), ""), _source_fields(after))
            changes.append(Change("source", name, "added", fields, ref=after.ref, ref_type=after.ref_type))
        elif after is None:
            changes.append(Change("source", name, "removed", ref=before.ref, ref_type=before.ref_type))
        elif fields := _changed(_source_fields(before), _source_fields(after)):
            moved = read_move(before, after) if read_move and before.commit != after.commit else None
            changes.append(Change("source", name, "changed", fields, moved, ref=after.ref, ref_type=after.ref_type))
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
        fields = (("image", _describe_image(old.base_image), _describe_image(new.base_image)),)
        changes.append(Change("base_image", image.name, "changed", fields))
    if old.installer != new.installer:
        installer = new.installer or old.installer
        assert installer is not None
        blank = dict.fromkeys(_package_fields(installer), "")  # the side without an installer
        before_fields, after_fields = (_package_fields(p) if p else blank for p in (old.installer, new.installer))
        action = "added" if old.installer is None else "removed" if new.installer is None else "changed"
        changes.append(
            Change("installer", installer.name, action, tuple(sorted(_changed(before_fields, after_fields))))
        )
    if old.platform != new.platform:
        fields = (("platform", _describe_platform(old.platform), _describe_platform(new.platform)),)
        changes.append(Change("platform", "platform", "changed", fields))
    if old.requirements != new.requirements:
        fields = (("requirements", " ".join(old.requirements), " ".join(new.requirements)),)
        changes.append(Change("requirements", "requirements", "changed", fields))
    return _with_pairings(changes, pairings)


def _with_pairings(changes: list[Change], pairings: Sequence[PairingChange]) -> list[Change]:
    sources = {c.name: i for i, c in enumerate(changes) if c.kind == "source"}
    attached: dict[int, list[PairingChange]] = {}
    for pairing in pairings:
        named = [pairing.parent, *(p.source for p in (pairing.after, pairing.before) if p is not None)]
        index = next((sources[name] for name in named if name in sources), None)
        if index is None:  # neither pin moved (a caller's own pairings): said under its parent all the same
            sources[pairing.parent] = index = len(changes)
            changes.append(Change("source", pairing.parent, "changed"))
        attached.setdefault(index, []).append(pairing)
    return [replace(c, pairings=tuple(attached[i])) if i in attached else c for i, c in enumerate(changes)]


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
            if field == "commit" and change.moved is not None:
                suffix = f" ({_counted(change.moved)})" if change.moved.commits is not None else ""
                lines.append(f"    {field}: {old} -> {new}{suffix}")
                lines += [f"    {line}" for line in _move_lines(change, change.moved, old, new)]
                continue
            if field == "files":
                lines.append("    files changed")
                continue
            if field in LIST_FIELDS:
                before, after = old.split("\n") if old else [], new.split("\n") if new else []
                lines += [f"    {field}: - {item}" for item in before if item not in after]
                lines += [f"    {field}: + {item}" for item in after if item not in before]
                continue
            lines.append(f"    {field}: {old or '(none)'} -> {new or '(none)'}")
        for pairing in change.pairings:
            was, now = pairing.words()
            lines.append(f"    pairing: {pairing.submodule}: {was} -> {now}")
    return "\n".join(wrap(line, width, indent="    ") for line in lines) + "\n"


def _logged(commit: LoggedCommit) -> str:
    return f"{for_terminal(commit.subject)} ({for_terminal(commit.day)})"


def _counted(moved: Moved, plain: bool = False) -> str:
    """``12 commits, first-parent 9`` (``plain``: ``12 (first-parent 9)``); the first-parent count only where
    it was read."""
    assert moved.commits is not None
    count = str(moved.commits) if plain else commits(moved.commits)
    if moved.first_parent is None:
        return count
    return f"{count} (first-parent {moved.first_parent})" if plain else f"{count}, first-parent {moved.first_parent}"


def _move_lines(change: Change, moved: Moved, old: str, new: str) -> list[str]:
    """Under a moved commit: the first and last commits of the branch's line (those the cache knows: only
    the last when it lacks the old commit, neither when the line is empty), and a warning when the old
    commit is not in the new one's history."""
    lines = [f"{what}: {_logged(c)}" for what, c in (("first", moved.first), ("last", moved.last)) if c is not None]
    if not moved.ancestor:
        lines.append(f"warning: {old} is not an ancestor of {new}: {_rewritten(change, moved)}")
    return lines


def _rewritten(change: Change, moved: Moved) -> str:
    """Why an old commit can be missing from the new one's history, for the pin ``change`` moved."""
    if any(field in ("ref", "ref_type") for field, _, _ in change.fields):
        why = "the new ref is on another line of history"
    elif change.ref_type == "tag":
        why = "the tag was moved to another line of history"
    else:
        why = "the branch was force-pushed or rewritten"
    if moved.dropped is None:
        return f"{why}; the old commit is not in the new one's history (nor in the cache: how much it lost is unknown)"
    return f"{why}; the old commit's history is not in the new one ({commits(moved.dropped)} of it missing)"


def render_markdown(changes: list[Change], title: str) -> str:
    """The change report in Markdown, for a pull request's body: a heading (``title``), a line that counts,
    then a section per kind of pin: a table of the moved sources (ref, old and new commits, how many commits,
    the first and last subjects of the branch's line, and the warning when the old commit is not an ancestor
    of the new), sources added and removed, the packages, the base image, the submodule pairings, and what
    else changed. Every name, value and commit subject is escaped (:func:`envbuild.escape.for_markdown`): a
    subject is an upstream's words, and neither a ``|`` nor markup in it may change the table or the page."""
    lines = [f"## {for_markdown(title)}", ""]
    if not changes:
        return "\n".join([*lines, "No changes.", ""])
    moved = [c for c in changes if c.kind == "source" and c.commit_moved]
    sources = [c for c in changes if c.kind == "source" and c.action != "changed"]
    packages = [c for c in changes if c.kind == "package"]
    images = [c for c in changes if c.kind == "base_image"]
    pairings = [p for c in changes for p in c.pairings]
    other = [(c, f) for c in changes for f in c.fields if not _in_a_section(c, f[0])]
    lines += [_summary(moved, sources, packages, images, pairings) + ".", ""]
    if moved:
        lines += ["### Sources moved", "", "| source | ref | commit | commits | first | last | warning |"]
        lines += ["| --- | --- | --- | --- | --- | --- | --- |", *(_moved_row(c) for c in moved), ""]
    if sources:
        lines += ["### Sources added and removed", ""]
        for change in sources:
            commit = dict((f, n) for f, _, n in change.fields).get("commit", "")
            at = f" at {_code(commit[:12])}" if commit else ""
            lines.append(f"- {change.action} {_code(change.name)} ({_code(change.ref)}{at})")
        lines.append("")
    if packages:
        lines += ["### Packages", "", "| package | change |", "| --- | --- |"]
        lines += [f"| {for_markdown(c.name)} | {_package_change(c)} |" for c in packages] + [""]
    if images:
        lines += ["### Base image", ""]
        lines += [f"- {_code(old)} → {_code(new)}" for c in images for _, old, new in c.fields] + [""]
    if pairings:
        lines += ["### Submodule pairings", ""]
        for pairing in pairings:
            was, now = pairing.words()
            lines.append(f"- {_code(pairing.submodule)}: {for_markdown(was)} → {for_markdown(now)}")
        lines.append("")
    if other:
        lines += ["### Other changes", ""]
        for change, (field, old, new) in other:
            what = for_markdown(field)  # the platform's and the requirements' field is named as they are
            if change.kind == "source":
                what = f"source {_code(change.name)}, {what}"
            if field in LIST_FIELDS:
                before, after = old.split("\n") if old else [], new.split("\n") if new else []
                lines += [f"- {what}: removed {_code(item)}" for item in before if item not in after]
                lines += [f"- {what}: added {_code(item)}" for item in after if item not in before]
            else:
                lines.append(f"- {what}: {_code(old)} → {_code(new)}")
        lines.append("")
    return "\n".join(lines)


def _code(text: str) -> str:
    """A value in a code span, so it reads as written (not in a table cell, unless it cannot hold a `|`)."""
    return for_markdown(text, code=True) if text else "(none)"


def _in_a_section(change: Change, field: str) -> bool:
    if change.kind in ("package", "base_image") or (change.kind == "source" and change.action != "changed"):
        return True
    return change.kind == "source" and change.commit_moved and field in ("commit", "tree", "ref", "ref_type")


def _summary(
    moved: list[Change],
    sources: list[Change],
    packages: list[Change],
    images: list[Change],
    pairings: list[PairingChange],
) -> str:
    warned = sum(1 for c in moved if c.moved is not None and not c.moved.ancestor)
    counted = [
        (len(moved), "source", "moved" + (f" ({warned} not from the old commit's history)" if warned else "")),
        (sum(c.action == "added" for c in sources), "source", "added"),
        (sum(c.action == "removed" for c in sources), "source", "removed"),
        (len(packages), "package", "changed"),
        (len(images), "base image", "changed"),
        (len(pairings), "submodule pairing", "changed"),
    ]
    parts = [f"{count} {what}{'s' * (count != 1)} {how}" for count, what, how in counted if count]
    return ", ".join(parts) if parts else "Other changes only"


def _moved_row(change: Change) -> str:
    fields = {f: (o, n) for f, o, n in change.fields}
    old, new = fields["commit"]
    ref = for_markdown(change.ref)
    if "ref" in fields or "ref_type" in fields:
        before = fields.get("ref", (change.ref, change.ref))[0]
        ref_type = fields.get("ref_type", (change.ref_type, change.ref_type))
        ref = f"{for_markdown(before)} ({ref_type[0]}) → {ref} ({ref_type[1]})"
    moved = change.moved
    count = "not in the cache" if moved is None or moved.commits is None else _counted(moved, plain=True)
    warning = "" if moved is None or moved.ancestor else f"⚠️ {for_markdown(_rewritten(change, moved))}"
    first, last = (_logged_markdown(c) for c in ((None, None) if moved is None else (moved.first, moved.last)))
    cells = [for_markdown(change.name), ref, f"{_code(old[:12])} → {_code(new[:12])}", count, first, last, warning]
    return "| " + " | ".join(cells) + " |"


def _logged_markdown(commit: LoggedCommit | None) -> str:
    # Not a code span: in a table cell a `|` would end the cell even there; escaped text cannot.
    return "—" if commit is None else f"{for_markdown(commit.subject)} ({for_markdown(commit.day)})"


def _package_change(change: Change) -> str:
    fields = {f: (o, n) for f, o, n in change.fields}
    if change.action != "changed":
        return f"{change.action} {_code(fields['version'][1] or fields['version'][0])}"
    if "version" in fields:
        old, new = fields["version"]
        return f"{_code(old)} → {_code(new)}"
    return ", ".join(f"{for_markdown(f)} changed" for f in fields)
