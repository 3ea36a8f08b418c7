"""`lock diff` as a pure function of two locks, and its rendering."""

from __future__ import annotations

import dataclasses

from envbuild.lock import BaseImage, Lock, Package, PackageFile, Source
from envbuild.lock.diff import diff_locks, render_changes, render_markdown
from envbuild.lock.moves import Moved

OLD = "dc0ee41ada177d4c74ba46bb501bba5967264815"
NEW = "ba7b5ebce12af60627a80985792a1449ce45f46c"


def lock(**changes: object) -> Lock:
    base = Lock(
        version=1,
        name="t",
        sources=(
            Source(
                name="megatron-lm", repo="https://example.org/m.git", ref="core_r0.18.0", ref_type="branch", commit=OLD
            ),
            Source(name="vllm", repo="https://example.org/v.git", ref="main", ref_type="branch", commit=NEW),
        ),
        packages=(
            Package(name="six", version="1.16.0", files=(PackageFile("six-1.16.0-py2.py3-none-any.whl", "a" * 64),)),
        ),
    )
    return dataclasses.replace(base, **changes)


def test_identical_locks_have_no_changes() -> None:
    assert diff_locks(lock(), lock()) == []
    assert render_changes([]) == "no changes\n"


def test_moved_pin_reports_ref_type_commit_and_count() -> None:
    old = lock()
    new = lock(
        sources=(dataclasses.replace(old.sources[0], ref="core_v0.18.0", ref_type="tag", commit=NEW), old.sources[1])
    )
    calls = []
    changes = diff_locks(
        old, new, read_move=lambda a, b: calls.append((a.commit, b.commit)) or Moved(commits=12, ancestor=True)
    )
    assert calls == [(OLD, NEW)]
    (change,) = changes
    assert (change.kind, change.name, change.action, change.commits) == ("source", "megatron-lm", "changed", 12)
    assert {f for f, _, _ in change.fields} == {"ref", "ref_type", "commit"}
    text = render_changes(changes)
    assert "~ source megatron-lm:" in text
    assert "ref: core_r0.18.0 -> core_v0.18.0" in text and "ref_type: branch -> tag" in text
    assert f"commit: {OLD} -> {NEW} (12 commits)" in text


def test_added_removed_sources_and_packages() -> None:
    old = lock()
    new = lock(
        sources=old.sources[:1]
        + (Source(name="mindspeed", repo="https://example.org/ms.git", ref="master", ref_type="branch", commit=OLD),),
        packages=(Package(name="Six", version="1.17.0"), Package(name="packaging", version="24.0")),
    )
    changes = {(c.kind, c.name, c.action) for c in diff_locks(old, new)}
    assert changes == {
        ("source", "mindspeed", "added"),
        ("source", "vllm", "removed"),
        ("package", "Six", "changed"),
        ("package", "packaging", "added"),
    }
    text = render_changes(diff_locks(old, new))
    assert "+ package packaging 24.0" in text and "version: 1.16.0 -> 1.17.0" in text


def test_base_image_digest_change() -> None:
    old = lock(base_image=BaseImage("reg/cann:9.1.0"))
    new = lock(base_image=BaseImage("reg/cann:9.1.0", "sha256:" + "c" * 64))
    (change,) = diff_locks(old, new)
    assert change.kind == "base_image" and "(unpinned)" in change.fields[0][1] and "c" * 64 in change.fields[0][2]


def test_the_installer_added_and_moved_is_one_change_each() -> None:
    uv = Package(
        name="uv", version="0.13.8", files=(PackageFile("uv-0.13.8-py3-none-manylinux_2_28_aarch64.whl", "d" * 64),)
    )
    moved = Package(
        name="uv", version="0.13.9", files=(PackageFile("uv-0.13.9-py3-none-manylinux_2_28_aarch64.whl", "e" * 64),)
    )
    (added,) = diff_locks(lock(), lock(installer=uv))
    assert (added.kind, added.name, added.action) == ("installer", "uv", "added")
    assert ("version", "", "0.13.8") in added.fields
    (change,) = diff_locks(lock(installer=uv), lock(installer=moved))
    assert (change.action, dict((f, (o, n)) for f, o, n in change.fields)["version"]) == (
        "changed",
        ("0.13.8", "0.13.9"),
    )
    assert render_changes([change]).splitlines()[:2] == ["~ installer uv:", "    files changed"]
    (removed,) = diff_locks(lock(installer=uv), lock())
    assert removed.action == "removed" and ("version", "0.13.8", "") in removed.fields


def test_requirement_changes_show_what_was_added_and_removed() -> None:
    old = lock()
    source = dataclasses.replace(old.sources[1], requires=("msgspec", "blake3"), build_requires=("setuptools",))
    new = lock(sources=(old.sources[0], dataclasses.replace(source, requires=("msgspec", "gguf"))))
    before = lock(sources=(old.sources[0], source))
    [change] = diff_locks(before, new)
    assert [f[0] for f in change.fields] == ["requires"]
    assert render_changes([change]) == "~ source vllm:\n    requires: - blake3\n    requires: + gguf\n"
    [read] = diff_locks(old, before)
    assert ("requires", "(not read)", "msgspec\nblake3") in read.fields


def test_the_markdown_report_says_every_kind_of_change_once() -> None:
    old = lock(base_image=BaseImage("reg/cann:9.1.0", "sha256:" + "b" * 64))
    added = Source(name="mindspeed", repo="https://example.org/ms.git", ref="master", ref_type="branch", commit=OLD)
    new = lock(
        sources=(old.sources[0], added),
        packages=(Package(name="six", version="1.17.0"), Package(name="packaging", version="24.0")),
        base_image=BaseImage("reg/cann:9.1.0", "sha256:" + "c" * 64),
        requirements=("verl",),
    )
    text = render_markdown(diff_locks(old, new), "envbuild lock diff: a → b")
    assert text.startswith(
        "## envbuild lock diff: a → b\n\n"
        "1 source added, 1 source removed, 2 packages changed, 1 base image changed.\n\n"
        "### Sources added and removed\n\n"
        f"- added `mindspeed` (`master` at `{OLD[:12]}`)\n- removed `vllm` (`main`)\n\n"
        "### Packages\n\n| package | change |\n| --- | --- |\n| packaging | added `24.0` |\n| six | `1.16.0` → `1.17.0` |\n"
    )
    assert f"### Base image\n\n- `reg/cann:9.1.0@sha256:{'b' * 64}` → `reg/cann:9.1.0@sha256:{'c' * 64}`\n" in text
    assert text.endswith("### Other changes\n\n- requirements: (none) → `verl`\n")
    assert render_markdown([], "t") == "## t\n\nNo changes.\n"
