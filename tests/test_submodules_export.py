"""Every submodule the image gets, fetched into the cache and written at its path by the same link-safe
tree writer as sources, its tree checked; `--offline` names what is missing; a tree holding a gitlink the
lock does not record is refused naming the path; hostile submodule trees write nothing outside."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.config import SourceOptions
from envbuild.fetch import InputsMissing, fetch_inputs
from envbuild.git import treehash
from envbuild.git.mirrors import Mirrors
from envbuild.git.treeexport import ExportError, TreeExporter, export_tree, fetch_commit, source_pin
from envbuild.git.treewriter import TreeWriteError, write_tar_tree
from envbuild.lock import Lock, read_lock
from envbuild.lock.model import Source, Submodule, walk_submodules
from envbuild.verify.pins import VerifyOptions
from tests.lib.gitrepos import MALFORMED_TREES, Served, commit_malformed
from tests.lib.submodlock import (
    CATLASS_PATH,
    GTEST_PATH,
    MEGATRON_PATH,
    SKIP_REASON,
    SubmoduleUpstreams,
    make_upstreams,
)

pytestmark = pytest.mark.gitdaemon
_counter = iter(range(10**6))


@pytest.fixture(scope="module")
def up(served: Served) -> SubmoduleUpstreams:
    return make_upstreams(served, f"smx{next(_counter)}")


@pytest.fixture(scope="module")
def lock_path(up: SubmoduleUpstreams, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("submodule-export")
    path = up.write_lock(work / "sub.lock.yaml")
    assert main(["lock", "update", str(path), "--cache-dir", str(work / "update-cache"), *up.mirror_args(), "-q"]) == 0
    return path


def exporter(cache: Path, up: SubmoduleUpstreams, offline: bool = False) -> TreeExporter:
    return TreeExporter(cache, mirrors=Mirrors.parse(up.mirrors()), offline=offline)


def export(lock: Lock, name: str, dest: Path, exp: TreeExporter) -> str:
    dest.mkdir(parents=True)
    return export_tree(lock.source(name), dest, exp)


def test_fetch_then_offline_export_writes_every_level(
    up: SubmoduleUpstreams, lock_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"  # empty: lock fetch fills it
    assert main(["lock", "fetch", str(lock_path), "--cache-dir", str(cache), *up.mirror_args(), "--json", "-q"]) == 0
    inputs = {(i["kind"], i["name"]): i for i in json.loads(capsys.readouterr().out)["inputs"]}
    assert inputs[("submodule", f"parent/{CATLASS_PATH}")] == {
        "kind": "submodule",
        "name": f"parent/{CATLASS_PATH}",
        "what": up.commits["catlass"],
        "fetched": True,
    }
    assert ("submodule", f"parent/{CATLASS_PATH}/{GTEST_PATH}") in inputs
    assert ("submodule", f"bridge/{MEGATRON_PATH}") not in inputs  # skipped: nothing of it is fetched

    lock = read_lock(lock_path).lock
    out = tmp_path / "out"
    offline = exporter(cache, up, offline=True)
    assert export(lock, "parent", out / "parent", offline) == up.tree("parent")
    catlass = out / "parent" / CATLASS_PATH
    assert (catlass / "include/catlass/catlass.hpp").read_text() == "#pragma once\n"
    assert (catlass / GTEST_PATH / "googletest/include/gtest/gtest.h").is_file()
    assert os.readlink(catlass / GTEST_PATH / "include/gtest/latest") == "../../googletest"  # a link, as data
    assert export(lock, "bridge", out / "bridge", offline) == up.tree("bridge")
    assert os.listdir(out / "bridge" / MEGATRON_PATH) == []  # skipped: the empty directory git leaves

    files = treehash.list_files(str(out / "parent"))
    gitlinks = {CATLASS_PATH: up.commits["catlass"], f"{CATLASS_PATH}/{GTEST_PATH}": up.commits["googletest"]}
    trees, unreadable = treehash.git_trees(str(out / "parent"), files, gitlinks, set(gitlinks))
    assert unreadable == [] and trees == {
        "": up.tree("parent"),
        CATLASS_PATH: up.tree("catlass"),
        f"{CATLASS_PATH}/{GTEST_PATH}": up.tree("googletest"),
    }


def test_offline_names_a_missing_submodule_and_the_command_that_fetches_it(
    up: SubmoduleUpstreams, lock_path: Path, tmp_path: Path
) -> None:
    read = read_lock(lock_path)
    cache = tmp_path / "cache"
    online = exporter(cache, up)
    for name in ("parent", "bridge", "megatron"):
        fetch_commit(online, source_pin(read.lock.source(name)))  # the sources, not their submodules
    options = VerifyOptions(SourceOptions(cache_dir=cache, mirrors=Mirrors.parse(up.mirrors()), offline=True))
    with pytest.raises(InputsMissing) as missing:
        fetch_inputs(read, options.source)
    message = str(missing.value)
    assert "\n" not in message
    assert f"lacks submodule parent/{CATLASS_PATH} (commit {up.commits['catlass']}); " in message
    assert f"submodule parent/{CATLASS_PATH}/{GTEST_PATH} (commit {up.commits['googletest']})" in message
    assert "source " not in message.split("lacks", 1)[1]
    assert f"run `envbuild lock fetch {lock_path} --cache-dir {cache} --mirror {up.mirrors()[0]}`" in message


def test_a_gitlink_the_lock_does_not_record_is_refused_naming_the_path(
    up: SubmoduleUpstreams, lock_path: Path, tmp_path: Path
) -> None:
    lock = read_lock(lock_path).lock
    unrecorded = dataclasses.replace(lock.source("parent"), submodules=())  # what a version 1 lock says
    with pytest.raises(ExportError) as refused:
        export_tree(unrecorded, tmp_path, exporter(tmp_path / "cache", up))
    assert str(refused.value) == (
        f"source parent: gitlink {CATLASS_PATH} (commit {up.commits['catlass']}) is not recorded in the lock; "
        "`envbuild lock update` records it (a version 1 lock records no submodules), or skip it by path with a reason"
    )
    assert os.listdir(tmp_path) == ["cache"]


@pytest.mark.parametrize("kind", sorted(MALFORMED_TREES))
def test_a_malformed_submodule_tree_is_refused_at_the_fetch(
    served: Served, tmp_path: Path, kind: str, up: SubmoduleUpstreams
) -> None:
    """git's object checks refuse the submodule's tree before anything of it is written, naming it."""
    name = f"smx-evil-{kind}-{next(_counter)}"
    evil = served.repo(f"{name}/evil")
    evil.commit("good")
    bad = commit_malformed(evil.path, kind)
    holder = served.repo(f"{name}/holder")
    holder.commit("holder", files={"README": "holds an evil submodule\n"})
    commit = holder.commit_gitlinks("evil", {"lib/evil": bad}, {"evil": ("lib/evil", "../evil")})
    source = Source(
        name="holder",
        repo=served.url(f"{name}/holder", "daemon-filter"),
        ref="main",
        ref_type="branch",
        commit=commit,
        submodules=(Submodule(path="lib/evil", repo=served.url(f"{name}/evil", "daemon-filter"), commit=bad),),
    )
    (tmp_path / "dest").mkdir()
    with pytest.raises(ExportError) as refused:
        export_tree(source, tmp_path / "dest", exporter(tmp_path / "cache", up))
    message = str(refused.value)
    assert "\n" not in message and kind in message
    assert message.startswith(f"submodule holder/lib/evil: cannot fetch the files of {bad} from ")
    assert os.listdir(tmp_path / "dest" / "lib" / "evil") == []  # nothing of it written


def tar(members: list[tuple[str, str, str]]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, data
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data.encode()))
    buffer.seek(0)
    return buffer


HOSTILE_PLACES = {
    "a symlink on the way to the submodule's directory": ("lib", "symlink", "cannot open directory lib"),
    "a symlink as the submodule's directory": ("lib/sub", "symlink", "cannot open directory sub"),
    "files where the gitlink's empty directory should be": ("lib/sub/x", "file", "is not the empty directory"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PLACES))
def test_a_submodule_is_written_only_into_its_gitlinks_empty_directory(tmp_path: Path, case: str) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir(), outside.mkdir()
    where, kind, words = HOSTILE_PLACES[case]
    (dest / "lib").mkdir()
    if kind == "symlink":
        target = dest / where
        if target.exists():
            target.rmdir()
        target.symlink_to(outside, target_is_directory=True)
    else:
        (dest / where).parent.mkdir(parents=True, exist_ok=True)
        (dest / where).write_text("already here")
    with pytest.raises(TreeWriteError, match=words):
        write_tar_tree(tar([("evil", "file", "pwned"), ("up", "symlink", "../../../outside")]), dest, at="lib/sub")
    assert os.listdir(outside) == []


def test_hostile_members_of_a_submodule_tree_are_refused_like_a_sources(tmp_path: Path) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    (dest / "lib/sub").mkdir(parents=True), outside.mkdir()
    members = [("up", "symlink", str(outside)), ("up/evil", "file", "pwned")]  # write through a link out
    with pytest.raises(TreeWriteError, match="up/evil: up is a file or symlink in the tree and also a directory"):
        write_tar_tree(tar(members), dest, at="lib/sub")
    assert os.listdir(outside) == [] and os.readlink(dest / "lib/sub/up") == str(outside)  # data, not followed


def test_a_lock_that_records_another_commit_or_tree_than_the_trees_is_refused(
    up: SubmoduleUpstreams, lock_path: Path, tmp_path: Path
) -> None:
    parent = read_lock(lock_path).lock.source("parent")
    (catlass,) = parent.submodules
    for field, words, dest in (
        ("commit", f"source parent: the tree pins {up.commits['catlass']} at {CATLASS_PATH}, the lock records", "a"),
        (
            "tree",
            f"submodule parent/{CATLASS_PATH}: the commit's tree is {up.tree('catlass')}, the lock pins tree",
            "b",
        ),
    ):
        changed = dataclasses.replace(parent, submodules=(dataclasses.replace(catlass, **{field: "1" * 40}),))
        (tmp_path / dest).mkdir()
        with pytest.raises(ExportError) as refused:
            export_tree(changed, tmp_path / dest, exporter(tmp_path / "cache", up))
        assert str(refused.value) == f"{words} {'1' * 40}"


def test_the_repos_export_makes_vcstool_check_out_every_pinned_level(
    up: SubmoduleUpstreams, lock_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real vcstool imports the export: every source and every kept submodule at its pinned commit and
    tree, nested where the image has it; the skipped one is a comment with its reason, its directory left
    empty as git leaves it."""
    vcs = shutil.which("vcs", path=str(Path(sys.executable).parent))
    assert vcs is not None, "vcstool is a test dependency (pyproject [test])"
    repos = tmp_path / "sub.repos"
    assert main(["lock", "export", str(lock_path), "--format", "repos", "-o", str(repos), "-q"]) == 0
    assert f"# bridge/{MEGATRON_PATH} left out (skip: {SKIP_REASON})" in repos.read_text().splitlines()
    (mirror_rule,) = up.mirrors()
    upstream, mirror = mirror_rule.split("=", 1)
    env = {**os.environ, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"url.{mirror}.insteadOf",
           "GIT_CONFIG_VALUE_0": upstream, "GIT_TERMINAL_PROMPT": "0"}  # fmt: skip
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with repos.open() as stdin:
        done = subprocess.run([vcs, "import", "--workers", "4", str(workspace)], stdin=stdin, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lock = read_lock(lock_path).lock
    expected = {"parent": up.commits["parent"], f"parent/{CATLASS_PATH}": up.commits["catlass"],
                f"parent/{CATLASS_PATH}/{GTEST_PATH}": up.commits["googletest"],
                "bridge": up.commits["bridge"], "megatron": up.commits["megatron"]}  # fmt: skip
    for where, commit in expected.items():
        head = subprocess.run(["git", "-C", str(workspace / where), "rev-parse", "HEAD", "HEAD^{tree}"],
                              capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        assert head[0] == commit, where
    pinned_trees = {"parent": lock.source("parent").tree}
    pinned_trees |= {f"parent/{path}": sub.tree for path, sub in walk_submodules(lock.source("parent").submodules)}
    for where, tree in pinned_trees.items():
        got = subprocess.run(["git", "-C", str(workspace / where), "rev-parse", "HEAD^{tree}"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        assert got == tree, where
    assert (workspace / "parent" / CATLASS_PATH / "include/catlass/catlass.hpp").is_file()
    assert list((workspace / "bridge" / MEGATRON_PATH).iterdir()) == []
