"""The build context: refused on a bad package file or source tree, deterministic, checkable in the image."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import packaging
import pytest

from envbuild.errors import InputError
from envbuild.fileio import content_mtime_ns
from envbuild.git import treehash
from envbuild.image import inimage_probe
from envbuild.image.assemble import BuildContext, ContextError, ExportSource, FileFor, assemble_context
from envbuild.image.inimage_verdict import compare_inimage, inimage_command
from envbuild.image.plan import ContextPlan, plan_context
from envbuild.image.render import render_dockerfile
from envbuild.image.treestore import TreeStore
from envbuild.lock import Lock, Package, PackageFile, Source, parse_lock

LOCK_SHA = "cd" * 32
EPOCH = 1700000000
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


def assemble(plan: ContextPlan, dest: Path, export: ExportSource, file_for: FileFor) -> BuildContext:
    """Its kept trees in a cache beside ``dest`` (one per test: a test's commits name its own trees)."""
    store = TreeStore(dest.parent / f"{dest.name}-cache")
    return assemble_context(plan, render_dockerfile(plan), dest, export, file_for, store=store)


def git(*args: str, cwd: Path) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, env={**os.environ, **_GIT_ENV}, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode().strip()


def make_wheel(dest: Path, name: str = "tiny_pkg", version: str = "1.0") -> Path:
    """A small but real wheel: a module, METADATA, WHEEL and a RECORD with hashes."""
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = (
        "".join(
            f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
            for path, data in files.items()
        )
        + f"{name}-{version}.dist-info/RECORD,,\n"
    )
    files[f"{name}-{version}.dist-info/RECORD"] = record.encode()
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(zipfile.ZipInfo(member, (2020, 1, 1, 0, 0, 0)), data)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_lock(wheel: Path, sources: list[tuple[str, str, str | None]]) -> Lock:
    """A lock with one package (the wheel) and sources given as (name, commit, tree)."""
    lines = [
        f'  - {{name: {n}, repo: "https://example.org/{n}.git", ref: main, ref_type: branch, commit: "{c}"'
        + (f', tree: "{t}"' if t else "")
        + "}"
        for n, c, t in sources
    ]
    text = (
        textwrap.dedent(f"""\
        version: 1
        name: ctx
        platform: {{os: linux, arch: x86_64, python: "3.11"}}
        base_image: {{name: "example.org/base:1", digest: "sha256:{"ab" * 32}"}}
        source_date_epoch: {EPOCH}
        sources:
        """)
        + "\n".join(lines)
        + textwrap.dedent(f"""
        packages:
          - {{name: tiny_pkg, version: "1.0", files: [{{filename: {wheel.name}, sha256: "{sha256(wheel)}"}}]}}
        """)
    )
    return parse_lock(text, "ctx.lock.yaml")


def fake_export(trees: dict[str, dict[str, bytes]]):
    def export(source: Source, dest: Path) -> None:
        for rel, data in trees[source.name].items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)

    return export


FAKE = {"alpha": {"setup.py": b"# alpha\n", "alpha/__init__.py": b"A = 1\n"}, "beta": {"README": b"beta\n"}}


def snapshot(root: Path) -> list[tuple[str, int, int, bytes]]:
    out = []
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        out.append(
            (
                str(path.relative_to(root)),
                info.st_mode,
                int(info.st_mtime),
                path.read_bytes() if path.is_file() else b"",
            )
        )
    return out


def layout(context: BuildContext) -> list[tuple[str, int, int, bytes]]:
    """What a build reads: the context directory, and each source's kept tree as ``src/<name>``."""
    out = snapshot(context.path)
    for name, path in context.source_dirs:
        out += [(f"src/{name}/{rel}", *rest) for rel, *rest in snapshot(path)]
    return sorted(out)


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    (tmp_path / "cache").mkdir()
    return make_wheel(tmp_path / "cache")


def test_context_layout_and_determinism(tmp_path: Path, wheel: Path) -> None:
    lock = make_lock(wheel, [("alpha", "1" * 40, None), ("beta", "2" * 40, None)])
    plan = plan_context(lock, lock_sha256=LOCK_SHA)
    first = assemble(plan, tmp_path / "one", fake_export(FAKE), lambda p, f: wheel)
    second = assemble(plan, tmp_path / "two", fake_export(FAKE), lambda p, f: wheel)  # another cache
    assert layout(first) == layout(second)
    names = {p for p, *_ in layout(first)}
    assert {
        "Dockerfile",
        "wheels/" + wheel.name,
        "envbuild/requirements.txt",
        "envbuild/manifest.json",
        "envbuild/inimage_probe.py",
        "src/alpha/alpha/__init__.py",
        "src/alpha/.envbuild-commit",
        "src/beta/README",
    } <= names
    assert all(mtime == EPOCH for name, _, mtime, _ in snapshot(first.path) if not name.startswith("wheels/"))
    # a package file is the cache's inode, whose times the assembly leaves alone (stream.write_entries)
    assert (first.path / "wheels" / wheel.name).stat().st_mtime_ns == wheel.stat().st_mtime_ns
    alpha = first.source_dir("alpha")
    assert (alpha / ".envbuild-commit").read_text() == "1" * 40 + "\n"
    # a kept tree's file: its mtime made from its content (the CLI sends only what changed), modes fixed
    init = alpha / "alpha" / "__init__.py"
    assert init.stat().st_mtime_ns == content_mtime_ns(hashlib.sha256(b"A = 1\n").digest())
    assert stat.S_IMODE(init.stat().st_mode) == 0o644 and stat.S_IMODE((alpha / "alpha").stat().st_mode) == 0o755
    manifest = json.loads((first.path / "envbuild/manifest.json").read_text())
    assert manifest == first.manifest
    assert manifest["lock_sha256"] == LOCK_SHA
    assert manifest["packages"] == [{"name": "tiny-pkg", "version": "1.0"}]
    assert [(s["name"], s["commit"], s["mode"], s["path"]) for s in manifest["sources"]] == [
        ("alpha", "1" * 40, "editable", "/opt/envbuild/src/alpha"),
        ("beta", "2" * 40, "editable", "/opt/envbuild/src/beta"),
    ]
    assert manifest["sources"][0]["files"] == ["alpha/__init__.py", "setup.py"]
    assert (first.path / "Dockerfile").read_text() == first.dockerfile


def test_a_package_file_with_another_hash_is_refused_by_name(tmp_path: Path, wheel: Path) -> None:
    lock = make_lock(wheel, [("alpha", "1" * 40, None)])
    impostor = make_wheel(tmp_path, version="1.0")
    impostor.write_bytes(impostor.read_bytes() + b"\0")
    with pytest.raises(ContextError) as info:
        assemble(plan_context(lock, lock_sha256=LOCK_SHA), tmp_path / "ctx", fake_export(FAKE), lambda p, f: impostor)
    assert "package tiny_pkg 1.0: tiny_pkg-1.0-py3-none-any.whl" in str(info.value)
    assert sha256(wheel) in str(info.value)
    assert not (tmp_path / "ctx" / "wheels").exists() and not (tmp_path / "ctx" / "Dockerfile").exists()
    assert not info.value.fault  # what the lock pins: the candidate's, not the machine's


def test_a_cached_file_that_cannot_be_read_is_the_machines_fault(tmp_path: Path, wheel: Path) -> None:
    lock = make_lock(wheel, [("alpha", "1" * 40, None)])
    with pytest.raises(ContextError) as info:
        gone = tmp_path / "gone.whl"
        assemble(plan_context(lock, lock_sha256=LOCK_SHA), tmp_path / "ctx", fake_export(FAKE), lambda p, f: gone)
    assert "tiny_pkg-1.0-py3-none-any.whl: cannot read: " in str(info.value) and info.value.fault


def test_a_source_tree_that_differs_is_refused_with_every_problem(tmp_path: Path, wheel: Path) -> None:
    lock = make_lock(wheel, [("alpha", "1" * 40, "0" * 40), ("beta", "2" * 40, "f" * 40)])
    with pytest.raises(ContextError) as info:
        assemble(plan_context(lock, lock_sha256=LOCK_SHA), tmp_path / "ctx", fake_export(FAKE), lambda p, f: wheel)
    assert len(info.value.problems) == 2
    assert not (tmp_path / "ctx").exists()  # nothing written
    assert "source alpha" in info.value.problems[0] and "the lock pins tree " + "0" * 40 in info.value.problems[0]
    assert not info.value.fault
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "leftover").write_text("x")
    with pytest.raises(InputError, match="must be empty"):
        assemble(plan_context(lock, lock_sha256=LOCK_SHA), tmp_path / "ctx", fake_export(FAKE), lambda p, f: wheel)


@pytest.fixture
def real_repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    (repo / "pkg" / "sub").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("X = 1\n")
    (repo / "pkg" / "sub" / "data.txt").write_bytes(bytes(range(256)))
    (repo / "pkg-extra.txt").write_text("sorts before pkg/ in git's order\n")
    (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "link").symlink_to("pkg/__init__.py")
    (repo / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='realsrc', version='0.1', packages=['pkg'])\n"
    )
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "one", cwd=repo)
    return repo, git("rev-parse", "HEAD", cwd=repo), git("rev-parse", "HEAD^{tree}", cwd=repo)


def git_archive_export(repo: Path):
    def export(source: Source, dest: Path) -> None:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", source.commit], cwd=repo, capture_output=True, check=True
        ).stdout
        tar_path = dest.parent / f".{source.name}.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(dest)
        tar_path.unlink()

    return export


def fake_site(site: Path, source_dir: Path, requires: tuple[str, ...] = ("tiny-pkg",)) -> Path:
    """What an image's site-packages holds after the build, for the probe run as a host process: the wheel
    installed, the source installed editable (its origin and top-level package recorded as pip does), and
    the packaging library (pip's vendored copy stands in for it in an image)."""
    (site / "tiny_pkg-1.0.dist-info").mkdir(parents=True)
    (site / "tiny_pkg-1.0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: tiny_pkg\nVersion: 1.0\n")
    info = site / "realsrc-0.1.dist-info"
    info.mkdir()
    requires_dist = "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: realsrc\nVersion: 0.1\n{requires_dist}")
    (info / "direct_url.json").write_text(json.dumps({"url": source_dir.as_uri(), "dir_info": {"editable": True}}))
    (info / "top_level.txt").write_text("pkg\n")
    shutil.copytree(Path(packaging.__file__).parent, site / "packaging")
    return site


def probe(context: Path, tmp_path: Path, site: Path, source_dir: Path) -> Callable[[dict], list[str]]:
    """The in-image check run as a separate stdlib-only process against the context's own tree (standing
    in for /opt/envbuild/src), judged by the host side."""

    def check(manifest: dict) -> list[str]:
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        proc = subprocess.run(
            [sys.executable, "-S", str(context / "envbuild/inimage_probe.py"), str(tmp_path / "manifest.json")],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": f"{site}:{source_dir}"},  # the source importable, as its editable .pth makes it
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        report["python"] = "3.11.2"  # the host's python stands in for the image's
        return compare_inimage(report, manifest)

    return check


def test_real_git_tree_matches_and_in_image_check_agrees(
    tmp_path: Path, wheel: Path, real_repo: tuple[Path, str, str]
) -> None:
    repo, commit, tree = real_repo
    lock = make_lock(wheel, [("realsrc", commit, tree)])
    context = assemble(
        plan_context(lock, lock_sha256=LOCK_SHA), tmp_path / "ctx", git_archive_export(repo), lambda p, f: wheel
    )
    assert dict(context.trees) == {"realsrc": tree}

    # The in-image check, run as a separate stdlib-only process against the context's own tree
    # (standing in for /opt/envbuild/src), with a faked installed distribution.
    manifest = json.loads((context.path / "envbuild/manifest.json").read_text())
    source_dir = context.source_dir("realsrc")
    manifest["sources"][0]["path"] = str(source_dir)
    site = fake_site(tmp_path / "site", source_dir)
    check = probe(context.path, tmp_path, site, source_dir)

    assert check(manifest) == []
    (context.source_dir("realsrc") / "pkg/__init__.py").write_text("X = 2\n")
    (context.source_dir("realsrc") / "pkg-1.egg-info").mkdir()  # build by-products do not count
    (context.source_dir("realsrc") / "run.sh").unlink()
    problems = check(manifest)
    assert any("source realsrc: files of commit" in p and "run.sh" in p for p in problems)
    assert any("source realsrc: the installed files have tree" in p for p in problems)
    # In the check's step, the meta layer's files are mounted at the mount point every image has.
    command = inimage_command()
    assert (command[2], command[-1]) == ("/opt/envbuild/mnt/inimage_probe.py", "/opt/envbuild/mnt/manifest.json")
    assert " ".join(command[3:-1]) == "--encoded --stat /opt --stat /opt/envbuild"


def test_the_assembled_check_runs_as_the_image_runs_it(
    tmp_path: Path, wheel: Path, real_repo: tuple[Path, str, str]
) -> None:
    """``python3 -I``, as in the image: no PYTHONPATH, no script directory on sys.path, no envbuild. The
    check still finds the tree hashing shipped beside it, and recomputes the source's tree."""
    repo, commit, tree = real_repo
    lock = make_lock(wheel, [("realsrc", commit, tree)])
    context = assemble(
        plan_context(lock, lock_sha256=LOCK_SHA), tmp_path / "ctx", git_archive_export(repo), lambda p, f: wheel
    )
    manifest = json.loads((context.path / "envbuild/manifest.json").read_text())
    manifest["sources"][0]["path"] = str(context.source_dir("realsrc"))
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    proc = subprocess.run(
        [
            sys.executable,
            *inimage_command()[1:2],
            str(context.path / "envbuild/inimage_probe.py"),
            str(tmp_path / "manifest.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["sources"]["realsrc"]["tree"] == tree


def test_in_image_check_names_unmet_requirements_and_failed_imports_minus_the_locks_waivers(
    tmp_path: Path, wheel: Path, real_repo: tuple[Path, str, str]
) -> None:
    repo, commit, tree = real_repo
    lock = make_lock(wheel, [("realsrc", commit, tree)])
    context = assemble(
        plan_context(lock, lock_sha256=LOCK_SHA), tmp_path / "ctx", git_archive_export(repo), lambda p, f: wheel
    )
    manifest = json.loads((context.path / "envbuild/manifest.json").read_text())
    source_dir = context.source_dir("realsrc")
    manifest["sources"][0]["path"] = str(source_dir)
    # What `pip install --no-deps -e` leaves when the lock lacks a runtime requirement of the source.
    site = fake_site(
        tmp_path / "site", source_dir, requires=("tiny-pkg>=2", "msgspec", "winreg-only; sys_platform == 'win32'")
    )
    check = probe(context.path, tmp_path, site, source_dir)

    assert check(manifest) == [
        "source realsrc (realsrc 0.1) requires tiny-pkg>=2, but tiny-pkg 1.0 is installed",
        "source realsrc (realsrc 0.1) requires msgspec, which is not installed",
    ]
    manifest["sources"][0]["waive"] = [{"name": "msgspec", "reason": "not used here"}]
    assert check(manifest) == ["source realsrc (realsrc 0.1) requires tiny-pkg>=2, but tiny-pkg 1.0 is installed"]

    # A top-level package that does not import fails the image, naming the module and the error …
    (source_dir / "pkg/__init__.py").write_text("import libascend_hal_stand_in\n")
    manifest["sources"][0]["waive"] += [{"name": "tiny-pkg", "reason": "checked elsewhere"}]
    problems = check(manifest)
    assert problems[-1] == (
        "source realsrc: import pkg failed: ModuleNotFoundError: No module named 'libascend_hal_stand_in'"
    )
    # … unless the lock skips that import by name (it needs an NPU driver a build host does not have).
    manifest["sources"][0]["skip_imports"] = [{"name": "pkg", "reason": "needs the NPU driver"}]
    assert [p for p in check(manifest) if "import" in p] == []


def test_compare_inimage_names_each_mismatch() -> None:
    manifest = {
        "lock_sha256": LOCK_SHA,
        "python": "3.11",
        "packages": [
            {"name": "a", "version": "1.0"},
            {"name": "b", "version": "2.0"},
            {"name": "c", "version": "3.0"},
            {"name": "d", "version": "1.0"},
        ],
        "sources": [
            {"name": "s", "commit": "1" * 40, "tree": "2" * 40, "path": "/opt/envbuild/src/s", "mode": "none"},
            {"name": "t", "commit": "3" * 40, "tree": "4" * 40, "path": "/opt/envbuild/src/t", "mode": "none"},
        ],
    }
    report = {
        "report_version": inimage_probe.REPORT_VERSION,
        "requires": {"markers": {}, "distributions": {}},
        "lock_sha256": LOCK_SHA,
        "python": "3.12.1",
        "distributions": {"a": ["1.0.0"], "b": ["2.1"], "d": ["1.0", "0.9"]},
        "copies": {
            "d": [
                ["1.0", "/usr/local/lib/python3.11/dist-packages/d-1.0.dist-info"],
                ["0.9", "/usr/lib/python3/dist-packages/d-0.9.egg-info"],
            ]
        },
        "sources": {"s": {"exists": True, "commit_marker": "1" * 40, "tree": "2" * 40, "unreadable": []}},
    }
    problems = compare_inimage(json.dumps(report), manifest)
    assert problems == [
        "python3 in the image is 3.12.1, the lock's platform.python is 3.11",
        "package b: 2.1 installed, the lock pins 2.0",
        "package c: not installed (the lock pins 3.0)",
        # both paths, which one Python imports, and the fix
        "package d: several versions installed (1.0, 0.9); the lock pins 1.0: "
        "1.0 in /usr/local/lib/python3.11/dist-packages/d-1.0.dist-info; "
        "0.9 in /usr/lib/python3/dist-packages/d-0.9.egg-info; "
        "Python imports 1.0 from /usr/local/lib/python3.11/dist-packages/d-1.0.dist-info (first on sys.path) — "
        "remove /usr/lib/python3/dist-packages/d-0.9.egg-info from the base image (envbuild removes only what a "
        "RECORD, installed-files.txt or dpkg file list names; for a distro package, "
        "`dpkg -S /usr/lib/python3/dist-packages/d-0.9.egg-info` names the package to `apt-get remove` there)",
        "source t: not reported by the in-image check",
    ]
    assert compare_inimage("not json", manifest)[0].startswith("the in-image check printed no JSON")


def test_requirements_file_is_accepted_by_pip(tmp_path: Path, wheel: Path) -> None:
    """pip itself reads the requirements file and finds the wheel with hash checking and no index."""
    lock = make_lock(wheel, [("alpha", "1" * 40, None)])
    context = assemble(
        plan_context(lock, lock_sha256=LOCK_SHA), tmp_path / "ctx", fake_export(FAKE), lambda p, f: wheel
    )
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--no-index",
        "--require-hashes",
        "--no-deps",
        "--no-compile",
        "--find-links",
        str(context.path / "wheels"),
        "-r",
        str(context.path / "envbuild/requirements.txt"),
    ]
    ok = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "Would install tiny_pkg-1.0" in ok.stdout or "Would install tiny-pkg-1.0" in ok.stdout
    tampered = dataclasses.replace(lock, packages=(Package("tiny_pkg", "1.0", (PackageFile(wheel.name, "0" * 64),)),))
    bad = tmp_path / "bad.txt"
    bad.write_text(plan_context(tampered, lock_sha256=LOCK_SHA).requirements)
    refused = subprocess.run(command[:-1] + [str(bad)], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "HASH" in refused.stderr.upper()


def test_git_tree_sha_of_listed_files_only(tmp_path: Path, real_repo: tuple[Path, str, str]) -> None:
    repo, _, tree = real_repo
    files = [p for p in treehash.list_files(str(repo)) if not p.startswith(".git/") and p != ".git"]
    assert treehash.git_tree_sha(str(repo), files) == (tree, [])


def test_git_trees_count_each_gitlink_as_git_does(tmp_path: Path) -> None:
    """The tree of a directory holding submodules' files equals git's tree of the parent commit, with the
    submodules as gitlinks; each submodule's files give its own tree."""
    from tests.lib.gitrepos import make_repo

    inner = make_repo(tmp_path / "inner")
    inner_commit = inner.commit("inner", files={"include/a.h": "// a\n", "src/b.c": "int b;\n"})
    outer = make_repo(tmp_path / "outer")
    outer.commit("outer", files={"csrc/build.sh": "make\n"})
    outer_commit = outer.commit_gitlinks(
        "gitlink", {"csrc/third_party/inner": inner_commit}, {"i": ("csrc/third_party/inner", "../inner")}
    )
    written = tmp_path / "written"
    shutil.copytree(outer.path, written, ignore=shutil.ignore_patterns(".git"))
    shutil.copytree(
        inner.path, written / "csrc/third_party/inner", ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True
    )
    files = treehash.list_files(str(written))
    gitlinks = {"csrc/third_party/inner": inner_commit}
    trees, unreadable = treehash.git_trees(str(written), files, gitlinks, set(gitlinks))
    assert unreadable == []
    assert trees == {"": outer.tree(outer_commit), "csrc/third_party/inner": inner.tree(inner_commit)}
    skipped, _ = treehash.git_trees(str(written), files, gitlinks, set())  # skipped: counted, not walked
    assert skipped == {"": outer.tree(outer_commit)}


def test_compare_inimage_names_a_submodule_changed_at_build_time() -> None:
    manifest = {
        "lock_sha256": LOCK_SHA,
        "packages": [],
        "sources": [
            {
                "name": "s",
                "commit": "1" * 40,
                "tree": "2" * 40,
                "path": "/opt/envbuild/src/s",
                "mode": "none",
                "submodules": [
                    {"path": "lib/a", "commit": "3" * 40, "tree": "4" * 40, "skip": None},
                    {"path": "lib/b", "commit": "5" * 40, "tree": None, "skip": "not needed"},
                ],
            }
        ],
    }
    seen = {"exists": True, "commit_marker": "1" * 40, "tree": "2" * 40, "unreadable": []}
    report = {
        "report_version": inimage_probe.REPORT_VERSION,
        "requires": {"markers": {}, "distributions": {}},
        "lock_sha256": LOCK_SHA,
        "distributions": {},
        "sources": {"s": {**seen, "submodules": {"lib/a": "6" * 40}}},
    }
    assert compare_inimage(json.dumps(report), manifest) == [
        f"submodule s/lib/a: the installed files have tree {'6' * 40}, commit {'3' * 40} has tree {'4' * 40} "
        "(a file was changed at build time)"
    ]
    report["sources"]["s"]["submodules"] = {"lib/a": "4" * 40}  # type: ignore[index]
    assert compare_inimage(json.dumps(report), manifest) == []
