"""Submodules as pins, on real repositories served by ``git daemon`` and from empty caches: `lock update`
records every level (a relative URL resolved as git does, a nested one reached through a mirror, a skip
kept by path), `lock verify` checks each like a source and says how a submodule pairs with the lock's
source of the same repository; every refusal is one line naming the path, with nothing written."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.config import SourceOptions
from envbuild.data.jsonout import to_jsonable
from envbuild.git.mirrors import Mirrors
from envbuild.lock import Lock, read_lock, write_lock
from envbuild.lock.model import Submodule
from envbuild.verify.pins import VerifyOptions, verify_lock
from tests.lib.gitrepos import Served
from tests.lib.submodlock import (
    CATLASS_PATH,
    GTEST_PATH,
    GTEST_UPSTREAM,
    MEGATRON_PATH,
    SKIP_REASON,
    SubmoduleUpstreams,
    make_upstreams,
)

pytestmark = pytest.mark.gitdaemon
_counter = iter(range(10**6))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv]) if argv[0] != "lock" else main([*argv, "-q"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def up(served: Served) -> SubmoduleUpstreams:
    return make_upstreams(served, f"sm{next(_counter)}")


@pytest.fixture(scope="module")
def updated(up: SubmoduleUpstreams, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(lock, cache): the lock as `lock update` completed it, starting from an empty cache."""
    work = tmp_path_factory.mktemp("submodules")
    lock, cache = up.write_lock(work / "sub.lock.yaml"), work / "cache"
    assert main(["lock", "update", str(lock), "--cache-dir", str(cache), *up.mirror_args(), "-q"]) == 0
    yield lock, cache


def options(cache: Path, up: SubmoduleUpstreams, strict: bool = False) -> VerifyOptions:
    return VerifyOptions(SourceOptions(cache_dir=cache, mirrors=Mirrors.parse(up.mirrors())), strict=strict)


def by_name(lock: Lock, path: Path, opts: VerifyOptions) -> dict[str, dict]:
    return {r.name: to_jsonable(r) for r in verify_lock(lock, str(path), opts).results if r.kind == "submodule"}


def test_update_records_every_level_from_an_empty_cache(
    up: SubmoduleUpstreams, updated: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, cache = updated
    lock = read_lock(path).lock
    assert lock.version == 2
    (catlass,) = lock.source("parent").submodules
    assert catlass == Submodule(
        path=CATLASS_PATH,
        repo=up.url("catlass"),  # ../catlass, resolved against the parent's URL as git resolves it
        commit=up.commits["catlass"],
        tree=up.tree("catlass"),
        submodules=(
            Submodule(
                path=GTEST_PATH,
                repo=GTEST_UPSTREAM,  # the upstream URL, not the mirror's: mirrors apply when it is read
                commit=up.commits["googletest"],
                tree=up.tree("googletest"),
            ),
        ),
    )
    (megatron,) = lock.source("bridge").submodules
    assert megatron == Submodule(
        path=MEGATRON_PATH, skip=SKIP_REASON, repo=up.url("megatron"), commit=up.commits["megatron-gitlink"]
    )
    assert lock.source("megatron").submodules == () and lock.source("megatron").submodules_unknown is None
    before = path.read_bytes()
    code, out, _ = run(capsys, "lock", "update", str(path), "--cache-dir", str(cache), *up.mirror_args())
    assert (code, out, path.read_bytes()) == (0, "no changes\n", before)


def test_verify_checks_every_level_and_says_how_a_submodule_pairs_with_a_source(
    up: SubmoduleUpstreams, updated: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, cache = updated
    code, out, _ = run(capsys, "lock", "verify", str(path), "--cache-dir", str(cache), *up.mirror_args(), "--json")
    results = {r["name"]: r for r in json.loads(out)["results"] if r["kind"] == "submodule"}
    assert code == 0 and {n: r["status"] for n, r in results.items()} == {
        f"parent/{CATLASS_PATH}": "ok",
        f"parent/{CATLASS_PATH}/{GTEST_PATH}": "ok",
        f"bridge/{MEGATRON_PATH}": "skipped",
    }
    assert results[f"parent/{CATLASS_PATH}/{GTEST_PATH}"]["detail"].startswith("on an upstream ref; tree matches")
    bridge = results[f"bridge/{MEGATRON_PATH}"]
    assert bridge["pairs_with"] == {
        "source": "megatron",
        "commit": up.commits["megatron"],
        "relation": "contained",
        "ahead": 8,
    }
    assert bridge["detail"].startswith(f"contained in source megatron's pin, 8 commits ahead; skipped: {SKIP_REASON}; ")
    # Warm, and offline: the cache answers every level.
    code, out, _ = run(capsys, "lock", "verify", str(path), "--cache-dir", str(cache), *up.mirror_args(), "--offline")
    assert code == 0 and "submodules 2 ok, 1 skipped" in out


@pytest.mark.parametrize(
    ("pin", "status", "relation", "words"),
    [
        ("megatron-gitlink", "skipped", {"relation": "same"}, "the same commit as source megatron's pin"),
        ("first", "skipped", {"relation": "behind", "behind": 1}, "source megatron's pin is behind it, by 1 commit"),
        ("megatron-side", "diverged", {"relation": "diverged", "ahead": 1, "behind": 1}, "diverged from source"),
    ],
)
def test_every_pairing_is_reported_and_diverged_is_a_warning(
    up: SubmoduleUpstreams, updated: tuple[Path, Path], pin: str, status: str, relation: dict, words: str
) -> None:
    path, cache = updated
    commit = up.repos["megatron"].rev("core_v1~9") if pin == "first" else up.commits[pin]
    lock = read_lock(path).lock
    moved = dataclasses.replace(
        lock, sources=tuple(dataclasses.replace(s, commit=commit) if s.name == "megatron" else s for s in lock.sources)
    )
    result = by_name(moved, path, options(cache, up))[f"bridge/{MEGATRON_PATH}"]
    assert result["status"] == status and words in result["detail"]
    assert result["pairs_with"] == {"source": "megatron", "commit": commit, **relation}
    report = verify_lock(moved, str(path), options(cache, up, strict=True))
    failing = [r.name for r in report.results if not r.passes(strict=True)]  # the moved tag fails anyway
    assert failing == ["megatron", *([f"bridge/{MEGATRON_PATH}"] if status == "diverged" else [])]
    assert all(r.passes() for r in report.results if r.kind == "submodule")  # a warning, unless --strict


def test_a_submodule_commit_gone_upstream_fails_verify_naming_the_path(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = make_upstreams(served, f"sm{next(_counter)}")
    path, cache = gone.write_lock(tmp_path / "gone.lock.yaml"), tmp_path / "cache"
    assert main(["lock", "update", str(path), "--cache-dir", str(cache), *gone.mirror_args(), "-q"]) == 0
    catlass = gone.repos["catlass"]
    catlass.force_branch("main", catlass.rev("HEAD~1"))  # the commit the parent's gitlink pins, force-pushed away
    code, out, _ = run(capsys, "lock", "verify", str(path), "--cache-dir", str(cache), *gone.mirror_args())
    (line,) = [line for line in out.splitlines() if line.startswith("submodule") and "missing-commit" in line]
    assert code == 1 and f"parent/{CATLASS_PATH} " in line and "on no upstream branch or tag" in line
    assert "FAILED" in out


@pytest.mark.parametrize(
    ("field", "value", "status", "words"),
    [
        (
            "commit",
            "1" * 40,
            "gitlink-mismatch",
            f"the parent's tree pins {{catlass}} at {CATLASS_PATH}; the lock records",
        ),
        ("tree", "2" * 40, "tree-mismatch", f"the lock records {'2' * 40}"),
        (
            "path",
            "csrc/third_party/other",
            "gitlink-mismatch",
            "the parent's tree has no gitlink at csrc/third_party/other",
        ),
    ],
)
def test_a_record_the_trees_do_not_hold_fails_verify(
    up: SubmoduleUpstreams, updated: tuple[Path, Path], field: str, value: str, status: str, words: str
) -> None:
    path, cache = updated
    lock = read_lock(path).lock
    parent = lock.source("parent")
    (catlass,) = parent.submodules
    changed = dataclasses.replace(parent, submodules=(dataclasses.replace(catlass, **{field: value}),))
    lock = dataclasses.replace(lock, sources=tuple(changed if s.name == "parent" else s for s in lock.sources))
    result = by_name(lock, path, options(cache, up))[f"parent/{value if field == 'path' else CATLASS_PATH}"]
    assert result["status"] == status and words.format(catlass=up.commits["catlass"]) in result["detail"]


@pytest.mark.parametrize(
    ("tree", "words"),
    [
        ("recorded", "it is the parent's gitlink, held by the parent's tree pin too"),
        (None, "it is the parent's gitlink (the parent pins no tree)"),
        ("4" * 40, "it is the parent's gitlink (the parent's tree pin is not its commit's tree)"),
    ],
)
def test_a_submodule_says_whether_the_parents_tree_pin_holds_its_gitlink(
    up: SubmoduleUpstreams, updated: tuple[Path, Path], tree: str | None, words: str
) -> None:
    path, cache = updated
    lock = read_lock(path).lock
    parent = lock.source("parent")
    changed = parent if tree == "recorded" else dataclasses.replace(parent, tree=tree)
    lock = dataclasses.replace(lock, sources=tuple(changed if s.name == "parent" else s for s in lock.sources))
    result = by_name(lock, path, options(cache, up))[f"parent/{CATLASS_PATH}"]
    assert result["status"] == "ok" and words in result["detail"]


def refused_update(
    up: SubmoduleUpstreams, tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: str, lock_extra: str = ""
) -> tuple[int, str, bytes, bytes]:
    """A branch of the parent whose tree says ``shape`` of a submodule, and what `lock update` makes of it."""
    parent = up.repos["parent"]
    branch = f"bad{next(_counter)}"
    parent.checkout(branch, create_at="main")
    gitmodules = parent.path / ".gitmodules"
    if shape == "unnamed gitlink":
        parent.commit_gitlinks("vendored", {"vendor/lib": up.commits["catlass"]})
    elif shape == "entry without gitlink":
        gitmodules.write_text(gitmodules.read_text() + '[submodule "docs"]\n\tpath = docs/theme\n\turl = ../theme\n')
        parent.commit("a stale entry", files={})
    elif shape == "remote helper":
        gitmodules.write_text(
            f'[submodule "catlass"]\n\tpath = {CATLASS_PATH}\n\turl = ext::sh -c touch% /tmp/envbuild-pwned\n'
        )
        parent.commit("a remote helper", files={})
    parent.checkout("main")
    path = up.write_lock(tmp_path / "bad.lock.yaml", parent_ref=branch)
    if lock_extra:
        path.write_text(path.read_text().replace("    install: {mode: none}\n", lock_extra, 1))
    before = path.read_bytes()
    code, _, err = run(capsys, "lock", "update", str(path), "--cache-dir", str(tmp_path / "c"), *up.mirror_args())
    return code, err, before, path.read_bytes()


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ("unnamed gitlink", "parent/vendor/lib: a gitlink (commit {catlass}) that .gitmodules does not name"),
        (
            "entry without gitlink",
            "parent/docs/theme: .gitmodules names submodule 'docs' here, but the tree has no gitlink",
        ),
        (
            "remote helper",
            f"parent/{CATLASS_PATH}: .gitmodules url 'ext::sh -c touch% /tmp/envbuild-pwned' names a git remote helper",
        ),
    ],
)
def test_what_the_lock_cannot_record_refuses_the_update_naming_the_path(
    up: SubmoduleUpstreams, tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: str, words: str
) -> None:
    code, err, before, after = refused_update(up, tmp_path, capsys, shape)
    (line,) = err.strip().splitlines()
    assert code == 2 and line.startswith(f"envbuild: error: {words.format(catlass=up.commits['catlass'])}"), line
    assert after == before and not Path("/tmp/envbuild-pwned").exists()


def test_a_skip_by_path_records_what_would_be_refused(
    up: SubmoduleUpstreams, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    skip = "    install: {mode: none}\n    submodules: [{path: vendor/lib, skip: 'a vendored copy the build never reads'}]\n"
    code, err, _, _ = refused_update(up, tmp_path, capsys, "unnamed gitlink", skip)
    assert code == 0, err
    parent = read_lock(tmp_path / "bad.lock.yaml").lock.source("parent")
    assert [(s.path, s.skip, s.commit) for s in parent.submodules] == [
        (CATLASS_PATH, None, up.commits["catlass"]),
        ("vendor/lib", "a vendored copy the build never reads", up.commits["catlass"]),
    ]


def test_a_skip_without_a_reason_is_bad_input(
    up: SubmoduleUpstreams, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = up.write_lock(tmp_path / "noreason.lock.yaml")
    path.write_text(path.read_text().replace(f"skip: {SKIP_REASON}", "skip: ''"))
    code, out, err = run(capsys, "lock", "verify", str(path), "--cache-dir", str(tmp_path / "c"))
    assert (code, out) == (2, "")
    assert err.strip() == (
        f"envbuild: error: {path}:17: sources[1].submodules[0].skip: a reason is required: say why the lock accepts this"
    )


def test_a_skip_written_as_the_docs_show_verifies_before_an_update_completes_it(
    up: SubmoduleUpstreams, updated: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`{path, skip: REASON}` as docs/lockfile.md shows it, without the commit `lock update` fills in: verify
    passes it as `skipped` and names the parent's commit and the command that records it."""
    path, cache = updated
    lock = read_lock(path).lock
    bridge = lock.source("bridge")
    written = dataclasses.replace(bridge, submodules=(Submodule(path=MEGATRON_PATH, skip=SKIP_REASON),))
    hand = tmp_path / "hand.lock.yaml"
    write_lock(
        hand, dataclasses.replace(lock, sources=tuple(written if s.name == "bridge" else s for s in lock.sources))
    )
    code, out, _ = run(capsys, "lock", "verify", str(hand), "--cache-dir", str(cache), *up.mirror_args(), "--json")
    (result,) = [r for r in json.loads(out)["results"] if r["name"] == f"bridge/{MEGATRON_PATH}"]
    assert code == 0 and result["status"] == "skipped", result
    assert result["detail"] == (
        f"skipped: {SKIP_REASON}; the parent pins {up.commits['megatron-gitlink']} at {MEGATRON_PATH}, which the "
        "lock does not record yet (`envbuild lock update` records it)"
    )
    code, _, err = run(capsys, "lock", "update", str(hand), "--cache-dir", str(cache), *up.mirror_args())
    assert code == 0, err
    (completed,) = read_lock(hand).lock.source("bridge").submodules
    assert (completed.skip, completed.commit) == (SKIP_REASON, up.commits["megatron-gitlink"])
