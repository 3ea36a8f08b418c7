"""How a build is judged and what a bisect of builds concludes, at the edges no other test reached: the
in-image check run for real (the probe as a separate stdlib-only process over real files and metadata)
finding an image its build did not leave as the lock pins it, a report the build's log cut short, and a
bisect whose endpoints leave nothing to bisect, whose ``--run`` stops it, whose culprit is the closure, a
source BAD adds or one BAD drops, and one of a source with submodules, bisected by commit.

The bisects build nothing: ``build_image`` is replaced by a judge of each candidate lock (the builds
themselves are tests/test_bisect.py's, on the engine); the locks, the search, ``--run``'s shell and the
reports are real."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import envbuild.bisect.run as bisect_run
from envbuild.bisect.report import render_markdown, render_text
from envbuild.bisect.result import BisectResult
from envbuild.bisect.run import BisectOptions, run_bisect
from envbuild.cli import main
from envbuild.config import SourceOptions
from envbuild.git import treehash
from envbuild.image import inimage_probe
from envbuild.image.build import BuildRefused
from envbuild.image.checked import InImageMismatch
from envbuild.image.inimage_verdict import compare_inimage, read_report
from envbuild.lock.io import LockFile, read_lock, write_lock
from envbuild.lock.model import Lock, Package, PackageFile, Source
from envbuild.verify.pins import VerifyOptions
from tests.lib.gitrepos import Served, make_repo

# --- the in-image check -------------------------------------------------------------------------------------


def test_a_report_the_build_log_cut_short_or_not_an_object_is_no_report() -> None:
    """BuildKit clips a step's output past a rate: the report's end line is then missing, and that is
    said, not read as a report; an answer that decodes to something other than an object is not one."""
    out = io.StringIO()
    inimage_probe.write_encoded(json.dumps({"report_version": inimage_probe.REPORT_VERSION}) + "\n", out)
    clipped = "\n".join(out.getvalue().splitlines()[:-1])
    assert read_report(0, clipped, "") == (None, ["the in-image check's report did not come whole: no end line"])
    listed = io.StringIO()
    inimage_probe.write_encoded("[1, 2]\n", listed)
    assert read_report(0, listed.getvalue(), "") == (None, ["the in-image check's report is not a JSON object"])


def test_the_in_image_check_names_an_image_its_build_did_not_leave_as_the_lock_pins(tmp_path: Path) -> None:
    """The probe, run as a separate stdlib-only process (its tree hashing shipped beside it) over a site of
    real metadata on disk, over five sources and a package: a distro's copy at a version that is not PEP 440, a requirement that is
    met by no version it can compare, one that is no requirement at all, a source whose distribution
    installs nothing to import, one nothing was installed from, one whose directory is gone and one whose
    commit marker a build step rewrote. Each is one line, in the order the host judges them."""
    meta, src, site = tmp_path / "meta", tmp_path / "src", tmp_path / "site"
    for directory in (meta, site):
        directory.mkdir()
    shutil.copy(inimage_probe.__file__, meta / "inimage_probe.py")
    shutil.copy(treehash.__file__, meta / "treehash.py")

    def source(name: str, files: dict[str, str], mode: str = "editable") -> dict[str, Any]:
        """A source as the build leaves it: its commit's files (no .git) and the commit marker."""
        repo = make_repo(src / name)
        commit = repo.commit(name, files=files)
        tree = repo.tree(commit)
        shutil.rmtree(src / name / ".git")
        (src / name / inimage_probe.COMMIT_MARKER).write_text(f"{commit}\n")
        return {"name": name, "commit": commit, "tree": tree, "files": sorted(files), "path": str(src / name)} | {
            "mode": mode,
            "distribution": None,
            "waive": [],
            "skip_imports": [],
        }

    def dist(name: str, version: str, *requires: str, origin: str | None = None, top_level: str = "") -> None:
        """A distribution's metadata as pip leaves it (an editable install records its origin)."""
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        lines = [
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
            *(f"Requires-Dist: {r}\n" for r in requires),
        ]
        (info / "METADATA").write_text("".join(lines))
        if origin is not None:
            (info / "direct_url.json").write_text(
                json.dumps({"url": Path(origin).as_uri(), "dir_info": {"editable": True}})
            )
            (info / "top_level.txt").write_text(top_level)

    alpha = source("alpha", {"alpha/__init__.py": "X = 1\n", "pyproject.toml": "[project]\nname = 'alpha'\n"})
    empty = source("empty", {"README.md": "data only\n"})
    orphan = source("orphan", {"orphan/__init__.py": ""})
    deleted = source("deleted", {"data.csv": "a\n1\n"}, mode="none")
    remarked = source("remarked", {"run.sh": "echo\n"}, mode="none")
    shutil.rmtree(deleted["path"])
    (src / "remarked" / inimage_probe.COMMIT_MARKER).write_text("0" * 40 + "\n")
    dist("debianish", "1.0ubuntu2")  # a distro's Python package: its version is no PEP 440 version
    dist("alpha", "0.1", "debianish>=1", "not a requirement ((", origin=alpha["path"], top_level="alpha\n")
    dist("empty", "0.1", origin=empty["path"])
    manifest = {
        "lock_sha256": "cd" * 32,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "packages": [{"name": "debianish", "version": "1.0"}],
        "sources": [alpha, empty, orphan, deleted, remarked],
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))

    done = subprocess.run(
        [
            sys.executable,
            "-S",
            str(meta / "inimage_probe.py"),
            inimage_probe.ENCODED_FLAG,
            str(tmp_path / "manifest.json"),
        ],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{site}:{src / 'alpha'}"},  # the site, and alpha importable as its editable .pth makes it
        timeout=120,
    )
    report, problems = read_report(done.returncode, done.stdout, done.stderr)

    assert report is not None and problems == [], done.stderr
    assert compare_inimage(report, manifest) == [
        "package debianish: 1.0ubuntu2 installed, the lock pins 1.0",
        f"source deleted: {deleted['path']} does not exist in the image",
        f"source remarked: marker says commit {'0' * 40}, the lock pins {remarked['commit']}",
        "source alpha (alpha 0.1) requires debianish>=1, but debianish 1.0ubuntu2 is installed",
        "source alpha (alpha 0.1) declares 'not a requirement ((', which is not a PEP 508 requirement",
        "source empty: empty installs no top-level package to import",
        f"source orphan: no installed distribution came from {orphan['path']} (installed editable, expected orphan)",
    ]


# --- bisect: the endpoints, --run, the culprit ------------------------------------------------------------------

LOCK_NAME = "buildgaps"
NO_ENGINE = "unix:///run/envbuild-test-build-gaps-no-engine.sock"


class NoEngine:
    """Stands in for the engine the judged builds never use; the bisect's claim on it is a real flock."""

    address = NO_ENGINE


class Built:
    """What a judged build returns for a lock that passes."""

    def __init__(self) -> None:
        self.image_id, self.tags, self.noop = "sha256:" + "0" * 64, (f"envbuild/{LOCK_NAME}:bisect",), False


Judge = Callable[[Lock], Built]


def source(name: str, commit: str) -> Source:
    return Source(name=name, repo=f"https://example.invalid/{name}.git", ref="main", ref_type="branch", commit=commit)


def package(version: str) -> Package:
    return Package(name="p", version=version, files=(PackageFile(f"p-{version}-py3-none-any.whl", "e" * 64),))


def lockfiles(tmp_path: Path, good: Lock, bad: Lock) -> tuple[LockFile, LockFile]:
    write_lock(tmp_path / "good.lock.yaml", good)
    write_lock(tmp_path / "bad.lock.yaml", bad)
    return read_lock(tmp_path / "good.lock.yaml"), read_lock(tmp_path / "bad.lock.yaml")


def bisect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, good: LockFile, bad: LockFile, judge: Judge, **options: Any
) -> tuple[BisectResult, list[str]]:
    """The bisect of ``good`` to ``bad`` with each candidate judged by ``judge``, offline (no history: a
    source is one state); its result and what it said."""
    monkeypatch.setattr(bisect_run, "build_image", lambda read, _options, **_: judge(read.lock))
    said: list[str] = []
    verify = VerifyOptions(SourceOptions(cache_dir=tmp_path / "cache", offline=True))
    result = run_bisect(good, bad, BisectOptions(verify, **options), progress=said.append, engine=NoEngine())  # type: ignore[arg-type]
    return result, said


def two_commits(tmp_path: Path) -> tuple[LockFile, LockFile]:
    return lockfiles(
        tmp_path,
        Lock(version=2, name=LOCK_NAME, sources=(source("a", "1a" * 20),)),
        Lock(version=2, name=LOCK_NAME, sources=(source("a", "2b" * 20),)),
    )


def test_a_bisect_of_a_lock_against_itself_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, _ = two_commits(tmp_path)
    report, forward = tmp_path / "bisect.md", tmp_path / "forward.lock.yaml"
    argv = ["bisect", str(good.path), str(good.path), "--cache-dir", str(tmp_path / "cache"), "--report", str(report)]

    code = main([*argv, "--write-lock", str(forward)])

    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"envbuild: error: {good.path} and {good.path} pin the same things: nothing to bisect"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.lock.yaml", "good.lock.yaml"]  # nothing written


def test_bad_that_cannot_be_built_or_good_that_fails_leaves_nothing_to_bisect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = two_commits(tmp_path)
    refused = f"{bad.path}: refusing to build, the lock fails verify: source a: missing-commit"

    def refuse(lock: Lock) -> Built:
        raise BuildRefused(refused)

    result, _ = bisect(tmp_path, monkeypatch, good, bad, refuse)
    assert (result.outcome, result.exit_code) == ("bad-unbuildable", 1)
    assert [(s.what, s.verdict, s.reason) for s in result.steps] == [("BAD", "skip", refused)]
    assert result.stopped == f"BAD cannot be built ({refused}): a bisect looks for a check that fails"
    assert render_text(result).startswith(f"NOTHING TO BISECT: {good.path} → {bad.path}: {result.stopped}\n")

    def both_fail(lock: Lock) -> Built:
        raise InImageMismatch("…", [f"source a: import a failed at {lock.sources[0].commit[:4]}"])

    result, _ = bisect(tmp_path, monkeypatch, good, bad, both_fail)
    assert (result.outcome, result.exit_code, [s.verdict for s in result.steps]) == ("good-fails", 1, ["bad", "bad"])
    assert result.stopped == "GOOD does not pass (source a: import a failed at 1a1a): nothing to bisect from"
    assert f"\n- {result.stopped}\n" in render_markdown(result)


def test_a_run_exiting_128_or_more_stops_the_bisect_with_its_last_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--run``'s output, both streams, is said line by line (blank ones too); the reason quotes its last
    line that is not blank. A shell killed by a signal exits 128 + the signal, as a shell says it."""
    good, bad = two_commits(tmp_path)
    run = "echo first; echo; echo '  last words  ' >&2; echo; exit 130"

    result, said = bisect(tmp_path, monkeypatch, good, bad, lambda lock: Built(), run=run)

    assert (result.outcome, result.exit_code) == ("stopped", 1)
    ((step,),) = [result.steps]  # the build it judged is counted
    assert (step.verdict, step.what) == ("stopped", "BAD")
    assert (
        result.stopped == "build 1 (BAD): --run exited 130: last words; an exit status of 128 or more stops the bisect"
    )
    assert said[said.index("build 1 (of at most 2): BAD") + 1 :] == [
        "  run: first",
        "  run: ",
        "  run:   last words  ",
        "  run: ",
        result.stopped,
    ]
    result, _ = bisect(tmp_path, monkeypatch, good, bad, lambda lock: Built(), run="echo bye; kill -TERM $$")
    assert result.stopped == "build 1 (BAD): --run exited 143: bye; an exit status of 128 or more stops the bisect"


def three_changes(tmp_path: Path) -> tuple[LockFile, LockFile]:
    """GOOD to BAD: p moves from 1.0 to 1.1 (one package either way), source new is added, source gone
    dropped; source kept is the same."""
    return lockfiles(
        tmp_path,
        Lock(
            version=2,
            name=LOCK_NAME,
            sources=(source("kept", "1a" * 20), source("gone", "2b" * 20)),
            packages=(package("1.0"),),
        ),
        Lock(
            version=2,
            name=LOCK_NAME,
            sources=(source("new", "3c" * 20), source("kept", "1a" * 20)),
            packages=(package("1.1"),),
        ),
    )


def breaks_when(broken: Callable[[Lock], bool]) -> Judge:
    def judge(lock: Lock) -> Built:
        if broken(lock):
            raise InImageMismatch("…", ["source kept: import kept failed: ImportError: cannot import name 'gone'"])
        return Built()

    return judge


def test_a_culprit_in_the_closure_says_which_fields_changed_and_goes_forward_at_goods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The closure's one-line description is the same on both sides (one package, no requirement): the
    change says which of its fields differ; the lock that goes forward is BAD with GOOD's packages."""
    good, bad = three_changes(tmp_path)

    result, _ = bisect(tmp_path, monkeypatch, good, bad, breaks_when(lambda lock: lock.packages[0].version == "1.1"))

    assert (result.outcome, result.culprit and result.culprit.unit.label) == ("found", "packages")
    assert result.forward is not None and result.forward.packages == good.lock.packages
    assert result.forward.sources == bad.lock.sources
    described = "1 packages, 0 requirements, index None"
    assert f"\n| packages | {described}; changed: packages |   |\n" in render_markdown(result)
    assert result.to_json()["forward_lock"] == {
        "differs_from_bad": [f"packages: {described} → {described}"],
        "built_in_step": None,  # source new and source gone come after it: built only with it broken
    }


def test_a_culprit_source_bad_adds_is_left_out_of_the_lock_that_goes_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = three_changes(tmp_path)

    result, _ = bisect(
        tmp_path, monkeypatch, good, bad, breaks_when(lambda lock: any(s.name == "new" for s in lock.sources))
    )

    assert (result.outcome, result.culprit and result.culprit.unit.label) == ("found", "source new")
    assert result.forward is not None and [s.name for s in result.forward.sources] == ["kept"]
    assert result.to_json()["forward_lock"]["differs_from_bad"] == ["source new: left out (GOOD has none)"]
    assert "\n  source new: left out (GOOD has none)\n" in render_text(result)


def test_a_culprit_source_bad_drops_is_kept_at_goods_in_the_lock_that_goes_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = three_changes(tmp_path)

    result, _ = bisect(
        tmp_path, monkeypatch, good, bad, breaks_when(lambda lock: all(s.name != "gone" for s in lock.sources))
    )

    assert (result.outcome, result.culprit and result.culprit.unit.label) == ("found", "source gone")
    assert result.forward is not None
    assert result.forward.sources == (*bad.lock.sources, good.lock.source("gone"))
    assert result.to_json()["forward_lock"]["differs_from_bad"] == [
        f"source gone: kept at GOOD's branch main {'2b' * 20}"
    ]


@pytest.mark.gitdaemon
def test_each_commit_of_a_source_with_submodules_is_built_with_its_own_submodules(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BAD records the submodule its own commit pins; a candidate at an earlier commit is built with the
    submodule that commit pins, read from its tree (not BAD's record) once a commit, and the lock that goes
    forward carries the last good commit's (read when it was built, not again)."""
    under = f"buildgaps-{tmp_path.name}"
    lib, parent = served.repo(f"{under}/lib"), served.repo(f"{under}/parent")
    libs = [lib.commit("lib 1"), lib.commit("lib 2")]
    lib_url, parent_url = served.url(f"{under}/lib", "daemon-filter"), served.url(f"{under}/parent", "daemon-filter")
    parent.commit("parent")
    gitmodules = {"lib": ("third_party/lib", lib_url)}
    start = parent.commit_gitlinks("lib 1 as a submodule", {"third_party/lib": libs[0]}, gitmodules)
    good_path, bad_path, cache = tmp_path / "good.lock.yaml", tmp_path / "bad.lock.yaml", tmp_path / "cache"
    text = (
        f"version: 2\nname: {LOCK_NAME}\nsources:\n  - name: parent\n    repo: {parent_url}\n    ref: main\n"
        f"    ref_type: branch\n    commit: {start}\n    install: {{mode: none}}\n"
    )
    good_path.write_text(text)
    assert main(["lock", "update", str(good_path), "--cache-dir", str(cache), "-q"]) == 0  # records lib 1
    commits = [
        parent.commit("docs", files={"README.md": "parent\n"}),
        parent.commit_gitlinks("lib 2 as the submodule", {"third_party/lib": libs[1]}),
        parent.commit("more docs", files={"README.md": "parent, more\n"}),
    ]
    bad_path.write_text(text)
    assert main(["lock", "update", str(bad_path), "--cache-dir", str(cache), "-q"]) == 0  # commit 3, lib 2
    good, bad = read_lock(good_path), read_lock(bad_path)
    assert [s.commit for s in bad.lock.source("parent").submodules] == [libs[1]]
    judged: dict[str, str | None] = {}

    def judge(lock: Lock) -> Built:
        [sub] = lock.source("parent").submodules
        judged[lock.source("parent").commit] = sub.commit
        if sub.commit == libs[1]:
            raise InImageMismatch("…", ["source parent: import parent failed: lib 2 breaks it"])
        return Built()

    reads: list[str] = []

    def read_source_submodules(source: Source, *args: Any, **kwargs: Any) -> Source:
        reads.append(source.commit)
        return read_submodules(source, *args, **kwargs)

    read_submodules = bisect_run.read_source_submodules
    monkeypatch.setattr(bisect_run, "read_source_submodules", read_source_submodules)  # counted, then read
    monkeypatch.setattr(bisect_run, "build_image", lambda read, _options, **_: judge(read.lock))
    verify = VerifyOptions(SourceOptions(cache_dir=cache))
    result = run_bisect(good, bad, BisectOptions(verify), engine=NoEngine())  # type: ignore[arg-type]

    assert judged == {commits[2]: libs[1], start: libs[0], commits[0]: libs[0], commits[1]: libs[1]}
    assert reads == [commits[0], commits[1]]
    assert result.outcome == "found" and result.culprit is not None
    assert (result.culprit.commit and result.culprit.commit.commit, result.culprit.last_good) == (
        commits[1],
        commits[0],
    )
    assert result.forward is not None
    forward = result.forward.source("parent")
    assert (forward.commit, [s.commit for s in forward.submodules]) == (commits[0], [libs[0]])
