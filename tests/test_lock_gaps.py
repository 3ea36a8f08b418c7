"""What `envbuild lock …` does at the edges no other test reached: a lock whose entries are broken in
several ways at once, an index that lists a file name the lock cannot hold, `lock diff` of a package
removed, a platform moved, a pin moved to a branch off its line and a pairing moved by reordering the
sources, and `lock verify` of submodules that a cache, a mirror or an upstream cannot settle. Real files, a
real index on 127.0.0.1 and real repositories on a real git daemon; the CLI as a user calls it."""

from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from envbuild.cli import main
from tests.lib.gitrepos import Served, free_port, git
from tests.lib.pyindex import PyIndex, Route, make_wheel

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64
APP, LIB = "1a" * 20, "2b" * 20  # commits as a lock writes them (all digits would read as an integer)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- reading a lock: every problem at once ---------------------------------------------------------------


def test_a_lock_with_entries_broken_several_ways_names_every_problem_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry that is not a mapping (a package, a package's file, the installer's file, a submodule) is
    said once, where it is, and the checks across entries go on past it; a file name that is no wheel or
    sdist name is said as such; a version that is not PEP 440 is said on the version alone."""
    lock = tmp_path / "broken.lock.yaml"
    lock.write_text(
        textwrap.dedent(f"""\
        version: 2
        name: broken
        sources:
          - name: app
            repo: https://example.invalid/app.git
            ref: main
            ref_type: branch
            commit: {APP}
            submodules:
              - [not, a, submodule]
              - {{path: vendor/lib, skip: vendored}}
              - {{path: vendor/lib, skip: twice}}
        packages:
          - name: six
            version: '1.16.0'
            files:
              - [not, a, file]
              - {{filename: six-1.16.0-py2.py3-none.whl, sha256: {SHA_A}}}
              - {{filename: six.tar.gz, sha256: {SHA_B}}}
          - name: odd
            version: one point six
            files:
              - {{filename: odd-1.6.0-py3-none-any.whl, sha256: {SHA_C}}}
          - [not, a, package]
          - {{name: Six, version: '1.17.0'}}
        installer:
          name: uv
          version: 0.5.0
          files:
            - [not, a, wheel]
            - {{filename: uv-0.5.0.tar.gz, sha256: {SHA_A}}}
        """)
    )
    before = lock.read_bytes()

    code, out, err = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"))

    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"envbuild: error: {lock}:10: sources[0].submodules[0]: expected a mapping, got a list",
        f"envbuild: error: {lock}:12: sources[0].submodules[2].path: duplicate 'vendor/lib' (first at submodules[1])",
        f"envbuild: error: {lock}:17: packages[0].files[0]: expected a mapping, got a list",
        f"envbuild: error: {lock}:18: packages[0].files[1].filename: not a valid distribution filename: "
        "Invalid wheel filename (wrong number of parts): 'six-1.16.0-py2.py3-none'",
        f"envbuild: error: {lock}:19: packages[0].files[2].filename: not a valid distribution filename: "
        "Invalid sdist filename: 'six.tar.gz'",
        f"envbuild: error: {lock}:21: packages[1].version: 'one point six' is not a valid PEP 440 version",
        f"envbuild: error: {lock}:24: packages[2]: expected a mapping, got a list",
        f"envbuild: error: {lock}:25: packages[3].name: duplicate package 'Six' (first at packages[0])",
        f"envbuild: error: {lock}:30: installer.files[0]: expected a mapping, got a list",
        f"envbuild: error: {lock}:31: installer.files[1].filename: uv-0.5.0.tar.gz: the installer is run from its "
        "wheel; an sdist cannot be",
    ]
    assert lock.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.lock.yaml"]  # not even the cache


# --- writing a lock: what an index lists is held to the lock's reader ----------------------------------------


def test_an_index_listing_a_file_name_the_lock_cannot_hold_leaves_the_lock_unwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A package tied to its own index is listed again on `lock update --package`; that index lists a wheel
    whose name (a build tag of 251 digits) is valid for packaging but longer than a file name may be: the
    update is refused naming the field, exit 1, the lock as it was (the field is a package's: the message
    names no source)."""
    root = tmp_path / "index"
    root.mkdir()
    wheel = make_wheel(root, "tinyone", "1.0")
    long = f"tinyone-1.0-1{'0' * 250}-py3-none-any.whl"
    with PyIndex(root) as index:
        page = {
            "meta": {"api-version": "1.0"},
            "name": "tinyone",
            "files": [{"filename": long, "url": f"/files/{long}", "hashes": {"sha256": SHA_C}}],
        }
        index.answer("tinyone", json.dumps(page).encode())
        index.route(f"/files/{long}", Route(404, body=b"not found"))  # its METADATA cannot be pinned: a warning
        lock = tmp_path / "p.lock.yaml"
        lock.write_text(
            textwrap.dedent(f"""\
            version: 2
            name: p
            platform: {{os: linux, arch: x86_64, python: '3.11'}}
            sources: []
            packages:
              - name: tinyone
                version: '1.0'
                index: {index.url}
                files:
                  - {{filename: {wheel.name}, sha256: {index.sha256(wheel.name)}}}
            installer:
              name: uv
              version: 0.5.0
              files:
                - {{filename: uv-0.5.0-py3-none-manylinux_2_17_x86_64.whl, sha256: {SHA_A}}}
            """)
        )
        before = lock.read_bytes()

        code, out, err = run(
            capsys, "lock", "update", str(lock), "--package", "tinyone", "--cache-dir", str(tmp_path / "cache")
        )

        assert index.requests[0] == "/simple/tinyone/"
    assert (code, out) == (1, "")
    assert err.splitlines()[-1] == (
        f"envbuild: error: {lock}: not written, the old lock is unchanged: the new lock would fail the lock's "
        "reader: packages[0].files[0].filename (package 'tinyone'): 280 characters long, at most 255 allowed"
    )
    assert f"warning: {long}: its METADATA is not pinned" in err
    assert lock.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index", "p.lock.yaml"]  # no temporary file


# --- lock diff ---------------------------------------------------------------------------------------------


def test_lock_diff_says_a_removed_package_files_changed_and_a_platform_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In the terminal's words, in Markdown and in JSON: the platform as the lock writes it (not Python's
    repr of it), and a lock without one as "(none)"."""
    six = "{{name: six, version: 1.16.0, files: [{{filename: six-1.16.0-py2.py3-none-any.whl, sha256: {}}}]}}"
    old, new, bare = tmp_path / "old.lock.yaml", tmp_path / "new.lock.yaml", tmp_path / "bare.lock.yaml"
    old.write_text(
        "version: 2\nname: d\nplatform: {os: linux, arch: aarch64, python: '3.11'}\nsources: []\npackages:\n"
        f"  - {six.format(SHA_A)}\n  - {{name: tinyone, version: '1.0'}}\n"
    )
    new.write_text(
        "version: 2\nname: d\nplatform: {os: linux, arch: x86_64, python: '3.12', cann: 8.1.0}\nsources: []\n"
        f"packages:\n  - {six.format(SHA_B)}\n"
    )
    bare.write_text(f"version: 2\nname: d\nsources: []\npackages:\n  - {six.format(SHA_B)}\n")
    report, cache = tmp_path / "diff.md", str(tmp_path / "cache")

    code, out, _ = run(capsys, "lock", "diff", str(old), str(new), "--cache-dir", cache, "--report", str(report))

    assert code == 1
    assert out == (
        "~ package six:\n"
        "    files changed\n"
        "- package tinyone 1.0\n"
        "~ platform platform:\n"
        "    platform: linux/aarch64 python 3.11 -> linux/x86_64 python 3.12 cann 8.1.0\n"
    )
    assert report.read_text(encoding="utf-8").split("\n", 2)[2] == (
        "2 packages changed.\n\n"
        "### Packages\n\n"
        "| package | change |\n| --- | --- |\n| six | files changed |\n| tinyone | removed `1.0` |\n\n"
        "### Other changes\n\n"
        "- platform: `linux/aarch64 python 3.11` → `linux/x86_64 python 3.12 cann 8.1.0`\n"
    )
    code, out, _ = run(capsys, "lock", "diff", str(bare), str(new), "--cache-dir", cache, "--json")
    [platform] = [c for c in json.loads(out)["changes"] if c["kind"] == "platform"]
    assert code == 1 and platform["fields"] == [
        {"field": "platform", "old": "", "new": "linux/x86_64 python 3.12 cann 8.1.0"}
    ]
    code, out, _ = run(capsys, "lock", "diff", str(new), str(bare), "--cache-dir", cache)
    assert code == 1 and out == "~ platform platform:\n    platform: linux/x86_64 python 3.12 cann 8.1.0 -> (none)\n"


@pytest.mark.gitdaemon
def test_a_pin_moved_to_a_branch_off_its_line_is_said_as_another_line_in_both_reports(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """BAD's pin is on branch release, which left main before GOOD's commit: the old commit is not an
    ancestor of the new, and the report says the new ref is on another line of history (not that the
    branch was force-pushed), with the ref's move in the Markdown table."""
    name = f"lockgaps-moved-{tmp_path.name}"
    repo = served.repo(name)
    start = repo.commit("start")
    on_main = repo.commit("main moves on")
    repo.checkout("release", create_at=start)
    released = repo.commit("release fix")
    url, cache = served.url(name, "daemon-filter"), str(tmp_path / "cache")
    locks = {}
    for ref, commit in (("main", on_main), ("release", released)):
        locks[ref] = tmp_path / f"{ref}.lock.yaml"
        locks[ref].write_text(
            f"version: 2\nname: moved\nsources:\n  - name: lib\n    repo: {url}\n    ref: {ref}\n"
            f"    ref_type: branch\n    commit: {commit}\n    install: {{mode: none}}\n"
        )
        assert main(["lock", "update", str(locks[ref]), "--cache-dir", cache, "-q"]) == 0  # the cache holds it
    capsys.readouterr()
    report = tmp_path / "diff.md"

    code, out, _ = run(
        capsys, "lock", "diff", str(locks["main"]), str(locks["release"]), "--cache-dir", cache, "--report", str(report)
    )

    assert code == 1
    why = (
        "the new ref is on another line of history; the old commit's history is not in the new one "
        "(1 commit of it missing)"
    )
    assert f"    warning: {on_main} is not an ancestor of {released}: {why}\n" in out
    assert "    ref: main -> release\n" in out
    [row] = [line for line in report.read_text(encoding="utf-8").splitlines() if line.startswith("| lib |")]
    day = git("log", "-1", "--format=%ad", "--date=short", released, cwd=repo.path)
    assert row == (
        f"| lib | main (branch) → release (branch) | `{on_main[:12]}` → `{released[:12]}` | 1 (first-parent 1) | "
        f"release fix ({day}) | release fix ({day}) | ⚠️ {why} |"
    )


def test_reordering_two_sources_of_one_repository_moves_a_submodule_s_pairing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A submodule pairs with the lock's last source of its repository: two sources of megatron swapped,
    no pin moved, and the pairing of bridge's Megatron-LM is said as changed, under bridge (whose pin did
    not move either)."""

    def source(name: str, repo: str, commit: str, extra: str = "") -> str:
        return (
            f"  - name: {name}\n    repo: {repo}\n    ref: main\n    ref_type: branch\n    commit: {commit}\n"
            f"    install: {{mode: none}}\n{extra}"
        )

    megatron = "https://example.invalid/megatron.git"
    bridge = source(
        "bridge",
        "https://example.invalid/bridge.git",
        APP,
        f"    submodules:\n      - {{path: 3rdparty/Megatron-LM, repo: {megatron}, commit: {LIB}, skip: provided}}\n",
    )
    full, core = (
        source("megatron", megatron, "3c" * 20),
        source("megatron-core", megatron.removesuffix(".git"), "4d" * 20),
    )
    old, new = tmp_path / "old.lock.yaml", tmp_path / "new.lock.yaml"
    old.write_text(f"version: 2\nname: pair\nsources:\n{bridge}{full}{core}")
    new.write_text(f"version: 2\nname: pair\nsources:\n{bridge}{core}{full}")
    report = tmp_path / "diff.md"

    code, out, _ = run(
        capsys, "lock", "diff", str(old), str(new), "--cache-dir", str(tmp_path / "cache"), "--report", str(report)
    )

    was, now = (f"how it relates to source {name}'s pin is not in the cache" for name in ("megatron-core", "megatron"))
    assert (code, out) == (1, f"~ source bridge:\n    pairing: bridge/3rdparty/Megatron-LM: {was} -> {now}\n")
    assert report.read_text(encoding="utf-8").split("\n", 2)[2] == (
        f"1 submodule pairing changed.\n\n### Submodule pairings\n\n- `bridge/3rdparty/Megatron-LM`: {was} → {now}\n"
    )


# --- lock verify of submodules -----------------------------------------------------------------------------


def submodule_lock(path: Path, app: str, commit: str, submodules: str, *more: str) -> Path:
    """A lock of source app (copied only) recording ``submodules`` (YAML list items), and ``more`` sources."""
    path.write_text(
        f"version: 2\nname: subgaps\nsources:\n  - name: app\n    repo: {app}\n    ref: main\n    ref_type: branch\n"
        f"    commit: {commit}\n    install: {{mode: none}}\n    submodules:\n"
        + "".join(f"      - {item}\n" for item in submodules.split("\n"))
        + "".join(more)
    )
    return path


def results_of(out: str) -> dict[str, dict]:
    """`lock verify --json`'s results by kind and name: ``"submodule app/vendor/lib"``."""
    return {f"{r['kind']} {r['name']}": r for r in json.loads(out)["results"]}


def test_verify_offline_from_an_empty_cache_says_every_submodule_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing asked of any server: the parent's tree is not in the cache, so each submodule below it is
    unreachable, as the parent is, with the command that fills the cache."""
    lib = "https://example.invalid/lib.git"
    lock = submodule_lock(
        tmp_path / "offline.lock.yaml",
        "https://example.invalid/app.git",
        APP,
        f"{{path: third_party/lib, repo: {lib}, commit: {LIB}}}\n"
        f"{{path: vendor/lib, repo: {lib}, commit: {LIB}}}\n"
        "{path: docs/theme, skip: not needed}",
    )
    cache = tmp_path / "cache"

    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(cache), "--offline", "--json")

    assert code == 1
    fetch = f"offline and not in cache; run `envbuild lock fetch {lock} --cache-dir {cache}`"
    assert {name: (r["status"], r["detail"]) for name, r in results_of(out).items()} == {
        "source app": ("unreachable", fetch),
        "submodule app/third_party/lib": ("unreachable", fetch),
        "submodule app/vendor/lib": ("unreachable", fetch),
        "submodule app/docs/theme": ("unreachable", fetch),
    }


def test_verify_refuses_more_submodule_records_than_a_lock_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = submodule_lock(
        tmp_path / "many.lock.yaml",
        "https://example.invalid/app.git",
        APP,
        "\n".join(f"{{path: vendor/d{i:04d}, skip: vendored}}" for i in range(1001)),
    )
    before = lock.read_bytes()

    code, out, err = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "--offline")

    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "envbuild: error: lock 'subgaps': 1001 submodule records at every level; a lock holds at most 1000: skip a "
        "submodule the image does without by path in the lock ({path: PATH, skip: REASON})"
    ]
    assert lock.read_bytes() == before


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "online"])
def test_verify_refuses_a_mirror_that_turns_a_submodule_url_into_a_remote_helper(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], offline: bool
) -> None:
    """Each submodule the rule reaches is named, all at once, exit 2; a skipped one (no repository) is not.
    Online too, before any upstream is asked (app's is a port nobody listens on: nothing is cached)."""
    lib = "https://gitcode.example/x/lib.git"
    lock = submodule_lock(
        tmp_path / "mirror.lock.yaml",
        f"git://127.0.0.1:{free_port()}/app.git",
        APP,
        f"{{path: third_party/lib, repo: {lib}, commit: {LIB}}}\n"
        f"{{path: vendor/lib, repo: {lib}, commit: {LIB}}}\n"
        "{path: docs/theme, skip: not needed}",
    )
    cache = tmp_path / "cache"

    code, out, err = run(
        capsys,
        "lock",
        "verify",
        str(lock),
        "--cache-dir",
        str(cache),
        *(["--offline"] if offline else []),
        "--mirror",
        "https://gitcode.example/=ext::x%20",
    )

    assert (code, out) == (2, "")
    said = "repo 'ext::x%20x/lib.git' names a git remote helper; only https, ssh, git, file URLs are allowed"
    assert err.splitlines() == [
        f"envbuild: error: submodule app/{path}: {said} (after mirror rewriting of {lib!r})"
        for path in ("third_party/lib", "vendor/lib")
    ]
    assert not cache.exists()


@dataclass
class Paired:
    """app, whose tree pins lib's second commit at two paths, and lib (three commits), served."""

    served: Served
    commits: dict[str, str]
    under: str

    def url(self, name: str, transport: str = "daemon-filter") -> str:
        return self.served.url(f"{self.under}/{name}", transport)

    def lock(self, path: Path, *more: str, docs: str = "") -> Path:
        lib, pinned = self.url("lib"), self.commits["lib2"]
        items = [f"{{path: {p}, repo: {lib}, commit: {pinned}}}" for p in ("third_party/lib", "vendor/lib")]
        return submodule_lock(
            path, self.url("app"), self.commits["app"], "\n".join(items + ([docs] if docs else [])), *more
        )


def lib_source(url: str, commit: str, extra: str = "") -> str:
    return (
        f"  - name: lib\n    repo: {url}\n    ref: main\n    ref_type: branch\n    commit: {commit}\n"
        f"    install: {{mode: none}}\n{extra}"
    )


@pytest.fixture(scope="module")
def paired(served: Served) -> Paired:
    under = "lockgaps-paired"
    shutil.rmtree(served.base / under, ignore_errors=True)  # a module fixture xdist may set up twice
    lib, app = served.repo(f"{under}/lib"), served.repo(f"{under}/app")
    commits = {f"lib{n}": lib.commit(f"lib {n}") for n in (1, 2, 3)}
    app.commit("app")
    url = served.url(f"{under}/lib", "daemon-filter")
    commits["app"] = app.commit_gitlinks(
        "lib, twice",
        {"third_party/lib": commits["lib2"], "vendor/lib": commits["lib2"]},
        {"lib": ("third_party/lib", url), "vlib": ("vendor/lib", url)},
    )
    return Paired(served, commits, under)


@pytest.mark.gitdaemon
def test_a_skip_where_the_parent_has_no_gitlink_and_unknown_submodules_are_said(
    paired: Paired, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A skip by path written for a path the parent's tree has no gitlink at (a typo, or a submodule gone
    upstream) stands, and says so; a source whose submodules are unknown has that said as its own result."""
    unknown = "the tree of its commit could not be read when the lock was updated"
    lib = lib_source(paired.url("lib"), paired.commits["lib3"], f"    submodules_unknown: {unknown}\n")
    lock = paired.lock(tmp_path / "skip.lock.yaml", lib, docs="{path: docs/theme, skip: not needed}")

    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "--json")

    results = results_of(out)
    assert code == 0
    docs, said = results["submodule app/docs/theme"], results["submodule lib"]
    assert (docs["status"], docs["detail"]) == ("skipped", "skipped: not needed; the parent has no gitlink there")
    assert (said["status"], said["detail"]) == ("unknown", unknown)
    assert results["submodule app/third_party/lib"]["detail"] == (
        "contained in source lib's pin, 1 commit ahead; on an upstream ref; it is the parent's gitlink "
        "(the parent pins no tree)"
    )


@pytest.mark.gitdaemon
def test_a_pairing_with_a_source_pinned_at_a_commit_upstream_lacks_is_unknown_with_the_reason(
    paired: Paired, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = "e" * 40
    lock = paired.lock(tmp_path / "gone.lock.yaml", lib_source(paired.url("lib"), gone))

    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "--json")

    results = results_of(out)
    assert code == 1 and results["source lib"]["status"] == "missing-commit"
    for path in ("third_party/lib", "vendor/lib"):
        sub = results[f"submodule app/{path}"]
        assert (sub["status"], sub["pairs_with"]) == ("ok", {"source": "lib", "commit": gone, "relation": "unknown"})
        assert sub["detail"] == (
            f"how it relates to source lib's pin is unknown: remote error: upload-pack: not our ref {gone}; "
            "on an upstream ref; it is the parent's gitlink (the parent pins no tree)"
        )


@pytest.mark.gitdaemon
def test_a_pairing_offline_with_a_source_the_cache_lacks_is_unknown(
    paired: Paired, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The submodules' own checks are answered by a warm cache; the source of the same repository, by another
    transport (the other daemon: another URL, so another cache), was never fetched."""
    cache = str(tmp_path / "cache")
    assert main(["lock", "verify", str(paired.lock(tmp_path / "warm.lock.yaml")), "--cache-dir", cache, "-q"]) == 0
    capsys.readouterr()
    lib = lib_source(paired.url("lib", "daemon-nofilter"), paired.commits["lib3"])
    lock = paired.lock(tmp_path / "offline.lock.yaml", lib)

    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", cache, "--offline", "--json")

    results = results_of(out)
    assert code == 1 and results["source lib"]["status"] == "unreachable"
    sub = results["submodule app/third_party/lib"]
    assert (sub["status"], sub["pairs_with"]["relation"]) == ("ok", "unknown")
    assert sub["detail"] == (
        "how it relates to source lib's pin: offline and not in cache; on an upstream ref; it is the parent's "
        "gitlink (the parent pins no tree)"
    )


@pytest.mark.gitdaemon
def test_offline_a_submodule_whose_upstream_the_cache_never_listed_is_unreachable(
    paired: Paired, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cache was filled while the lock skipped lib at both paths (the parent's tree read, lib's upstream
    never asked); with the skips gone, offline: where the gitlinks are is known, whether lib's commit is on
    an upstream ref is not, and the command that fills the cache is named."""
    cache = str(tmp_path / "cache")
    skips = "\n".join(f"{{path: {p}, skip: vendored}}" for p in ("third_party/lib", "vendor/lib"))
    skipped = submodule_lock(tmp_path / "skipped.lock.yaml", paired.url("app"), paired.commits["app"], skips)
    assert main(["lock", "verify", str(skipped), "--cache-dir", cache, "-q"]) == 0
    capsys.readouterr()
    lock = paired.lock(tmp_path / "unskipped.lock.yaml")

    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", cache, "--offline", "--json")

    fetch = f"offline and not in cache; run `envbuild lock fetch {lock} --cache-dir {cache}`"
    assert code == 1 and {n: (r["status"], r["detail"]) for n, r in results_of(out).items()} == {
        "source app": ("ok", "the pinned commit is the head of branch main"),
        "submodule app/third_party/lib": ("unreachable", fetch),
        "submodule app/vendor/lib": ("unreachable", fetch),
    }
