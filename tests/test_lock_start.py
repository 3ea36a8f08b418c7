"""A lock started from nothing, as a newcomer starts one: `lock init`, then `lock add LOCK NAME REPO REF` for a
branch and a tag of real repositories on a real git daemon, then the advice it prints (`lock update`, against a
real local index), and `lock verify` passes whole."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import read_lock
from tests.lib.gitrepos import Served, make_repo
from tests.lib.pyindex import PyIndex, make_wheel

pytestmark = pytest.mark.gitdaemon


def test_init_then_add_a_branch_and_a_tag_then_the_advice_then_verify_passes(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    alpha, beta = served.repo("start-alpha"), served.repo("start-beta")
    head = alpha.commit(files={"pyproject.toml": '[project]\nname = "alpha"\nversion = "1.0"\n'})
    tagged = beta.commit(files={"pyproject.toml": '[project]\nname = "beta"\nversion = "2.0"\n'})
    beta.tag("v2.0", tagged, annotated=True)
    beta.commit("after the tag")
    dists = tmp_path / "dists"
    dists.mkdir()
    make_wheel(dists, "setuptools", "80.0")
    lock = tmp_path / "mine.lock.yaml"
    cache = ["--cache-dir", str(tmp_path / "cache"), "-q"]
    with PyIndex(dists) as index:
        assert main(["lock", "init", str(lock), "--name", "mine", "--arch", "x86_64", "--python", "3.11",
                     "--index", index.url]) == 0  # fmt: skip
        assert main(["lock", "init", str(lock), "--name", "mine"]) == 2  # never over an existing lock
        lock.write_text(lock.read_text() + "# kept: a note of mine\n")
        assert (
            main(["lock", "add", str(lock), "alpha", served.url("start-alpha", "daemon-filter"), "main", *cache]) == 0
        )
        assert main(["lock", "add", str(lock), "beta", served.url("start-beta", "daemon-filter"), "v2.0", *cache]) == 0
        err = capsys.readouterr().err
        assert main(["lock", "add", str(lock), "beta", served.url("start-beta", "daemon-filter"), "v2.0", *cache]) == 2
        assert main(["lock", "add", str(lock), "Bad Name", served.url("start-beta", "daemon-filter"), "v2.0"]) == 2
        assert "sources[2].name: expected" in capsys.readouterr().err

        added = {s.name: s for s in read_lock(lock).lock.sources}
        assert (added["alpha"].ref_type, added["alpha"].commit, added["alpha"].tree) == (
            "branch",
            head,
            alpha.tree(head),
        )
        assert (added["beta"].ref_type, added["beta"].commit) == ("tag", tagged)  # the tag's commit, not the head
        assert added["beta"].provides is not None and added["beta"].provides.name == "beta"
        assert added["alpha"].build_requires == ("setuptools>=40.8.0",)  # read from the pinned tree
        assert "# kept: a note of mine" in lock.read_text()

        advice = re.search(r"`envbuild (lock update [^`]+)`", err)
        assert advice is not None, err
        assert main([*shlex.split(advice.group(1)), *cache]) == 0  # `envbuild lock update LOCK`, as printed
        capsys.readouterr()
        assert main(["lock", "verify", str(lock), "--json", *cache]) == 0
        report = json.loads(capsys.readouterr().out)
    assert {(r["kind"], r["name"]): r["status"] for r in report["results"] if r["kind"] == "source"} == {
        ("source", "alpha"): "ok",
        ("source", "beta"): "ok",
    }
    assert [p.name for p in read_lock(lock).lock.packages] == ["setuptools"]


def test_add_takes_a_local_repository_as_git_does_and_calls_a_tag_a_ref(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "work" / "gamma")
    tagged = repo.commit(files={"pyproject.toml": '[project]\nname = "gamma"\nversion = "1.0"\n'})
    repo.tag("v1.0", tagged, annotated=True)
    lock = tmp_path / "local.lock.yaml"
    assert main(["lock", "init", str(lock), "--name", "local"]) == 0
    capsys.readouterr()
    relative = Path("..") / tmp_path.name / "work" / "gamma"  # as a user types it, relative to where they are
    monkeypatch.chdir(tmp_path)
    code = main(["lock", "add", str(lock), "gamma", str(relative), "v1.0", "--cache-dir", str(tmp_path / "c")])
    out, err = capsys.readouterr()
    assert code == 0, err
    (source,) = read_lock(lock).lock.sources
    assert (source.repo, source.ref_type, source.commit) == (repo.path.resolve().as_uri(), "tag", tagged)
    assert f"{relative} is recorded as {repo.path.resolve().as_uri()}" in err
    assert "resolving gamma v1.0" in err and "branch" not in err  # a tag is not called a branch
    assert f"added gamma: tag v1.0 at {tagged}" in out


def test_init_in_a_directory_that_does_not_exist_names_the_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lock init nodir/mine.lock.yaml` named our temporary (`nodir/.mine.lock.yaml.ejdu64rf.tmp`); now the lock."""
    lock = tmp_path / "nodir" / "mine.lock.yaml"
    assert main(["lock", "init", str(lock), "--name", "mine"]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"envbuild: error: {lock}: No such file or directory\n")
    assert list(tmp_path.iterdir()) == []
