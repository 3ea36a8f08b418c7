"""`envbuild lock …` end to end: real repositories on a real git daemon, the CLI as a user calls it."""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import read_lock
from envbuild.lock.platform import OCI_ARCH
from tests.lib.gitrepos import Repo, Served
from tests.lib.registryapi import manifest_of, platform_variant, put_index
from tests.lib.services import PUSHED_REPOSITORY

pytestmark = pytest.mark.gitdaemon


@pytest.fixture(scope="module")
def upstream(served: Served) -> tuple[Served, Repo, list[str]]:
    # xdist may run this module's tests on one worker in two runs (service tests are grouped apart), so
    # this module fixture can be set up twice against the one session-wide `served`: start afresh.
    shutil.rmtree(served.base / "cli-upstream", ignore_errors=True)
    repo = served.repo("cli-upstream")
    commits = [repo.commit(files={"setup.py": f"# {i}\n"}) for i in range(4)]
    repo.tag("v1.0", commits[1], annotated=True)
    return served, repo, commits


def write_lock(
    path: Path, url: str, *, ref: str = "main", ref_type: str = "branch", commit: str, tree: str | None = None
) -> Path:
    tree_line = f"\n    tree: {tree}" if tree else ""
    path.write_text(
        textwrap.dedent(f"""\
        version: 1
        name: cli
        sources:
          - name: lib
            repo: {url}
            ref: {ref}
            ref_type: {ref_type}
            commit: {commit}""")
        + tree_line
        + "\n"
    )
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_ok_behind_and_strict(upstream, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    served, repo, commits = upstream
    cache = str(tmp_path / "cache")
    lock = write_lock(tmp_path / "ok.yaml", served.url("cli-upstream", "daemon-filter"), commit=commits[-1])
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", cache)
    assert code == 0 and re.search(r"^source +lib +ok", out, re.M) and "OK:" in out

    behind = write_lock(tmp_path / "behind.yaml", served.url("cli-upstream", "daemon-filter"), commit=commits[1])
    code, out, _ = run(capsys, "lock", "verify", str(behind), "--cache-dir", cache, "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] is True and data["lock"] == str(behind)
    (result,) = [r for r in data["results"] if r["kind"] == "source"]  # and its requirements: not recorded
    assert (result["kind"], result["name"], result["status"], result["ahead"]) == ("source", "lib", "behind", 2)
    assert set(result) >= {"kind", "name", "status", "detail"}

    code, out, _ = run(capsys, "lock", "verify", str(behind), "--cache-dir", cache, "--strict", "--json")
    assert code == 1 and json.loads(out)["ok"] is False


def test_a_dry_run_after_verify_takes_the_epoch_from_what_verify_fetched(upstream, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """`envbuild image --dry-run` right after `lock verify` of a lock that pins trees: verify fetched the
    pinned commit to check its tree, so the Dockerfile carries its date and no note that it shows 0."""
    served, repo, commits = upstream
    cache = str(tmp_path / "cache")
    tree = repo.tree(commits[-1])
    url = served.url("cli-upstream", "daemon-filter")
    lock = write_lock(tmp_path / "ok.yaml", url, commit=commits[-1], tree=tree)
    with lock.open("a") as f:  # a dry run needs a base to render FROM; nothing asks its registry
        f.write(f"base_image:\n  name: registry.example/base:1\n  digest: sha256:{'ab' * 32}\n")
    assert run(capsys, "lock", "verify", str(lock), "--cache-dir", cache)[0] == 0
    code, out, err = run(capsys, "image", str(lock), "--dry-run", "--offline", "--cache-dir", cache)
    date = subprocess.run(["git", "-C", str(repo.path), "show", "-s", "--format=%ct", commits[-1]],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert code == 0 and f"SOURCE_DATE_EPOCH={date}" in out, err
    assert "not in the cache yet" not in err


def test_verify_failures_exit_1_and_name_the_status(upstream, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    served, repo, commits = upstream
    lock = write_lock(
        tmp_path / "moved.yaml",
        served.url("cli-upstream", "daemon-filter"),
        ref="v1.0",
        ref_type="tag",
        commit=commits[2],
    )
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "c"))
    assert code == 1 and "tag-moved" in out and "FAILED" in out
    lock = write_lock(
        tmp_path / "type.yaml",
        served.url("cli-upstream", "daemon-filter"),
        ref="v1.0",
        ref_type="branch",
        commit=commits[1],
    )
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "c"), "--json")
    assert code == 1 and json.loads(out)["results"][0]["status"] == "ref-type-changed"


def test_mirror_from_command_line_and_config(upstream, tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    served, repo, commits = upstream
    lock = write_lock(tmp_path / "m.yaml", "https://git.example.invalid/org/cli-upstream", commit=commits[-1])
    cache = str(tmp_path / "cache")
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", cache, "--json", "--offline")
    assert code == 1 and json.loads(out)["results"][0]["status"] == "unreachable"

    mirror = f"https://git.example.invalid/org/={served.url('', 'daemon-filter')}"
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", cache, "--json", "--mirror", mirror)
    (result,) = [r for r in json.loads(out)["results"] if r["kind"] == "source"]
    assert code == 0 and result["status"] == "ok" and result["url"].startswith("git://127.0.0.1:")

    config = tmp_path / "config.yaml"
    config.write_text(
        f"mirrors:\n  'https://git.example.invalid/org/': '{served.url('', 'daemon-nofilter')}'\n"
        f"cache_dir: {tmp_path / 'cfg-cache'}\n"
    )
    monkeypatch.setenv("ENVBUILD_CONFIG", str(config))
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--json")
    assert code == 0 and json.loads(out)["results"][0]["status"] == "ok"
    assert (tmp_path / "cfg-cache" / "git").is_dir()
    # Offline now answers from the cache the config named.
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--json", "--offline")
    assert code == 0, out


def test_bad_input_exits_2_with_one_line_per_problem(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nname: x\nsources:\n  - name: a\n    repo: ext::sh\n    ref: main\n"
        "    ref_type: branch\n    commit: abc\n"
    )
    code, out, err = run(capsys, "lock", "verify", str(bad))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"envbuild: error: {bad}:") for line in lines)
    assert "Traceback" not in err
    code, _, err = run(capsys, "lock", "verify", str(tmp_path / "none.yaml"))
    assert code == 2 and "cannot read" in err
    good = write_lock(tmp_path / "good.yaml", "https://example.invalid/x.git", commit="a" * 40)
    code, _, err = run(capsys, "lock", "verify", str(good), "--mirror", "no-equals-sign")
    assert code == 2 and "--mirror" in err
    code, _, err = run(capsys, "lock", "frobnicate")
    assert code == 2 and "invalid choice" in err


def test_update_moves_the_branch_pin_and_diff_counts_commits(upstream, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    served, repo, commits = upstream
    cache = str(tmp_path / "cache")
    url = served.url("cli-upstream", "daemon-filter")
    old = write_lock(tmp_path / "old.yaml", url, commit=commits[0])
    new = tmp_path / "new.yaml"
    new.write_bytes(old.read_bytes())

    code, out, err = run(capsys, "lock", "update", str(new), "--cache-dir", cache, "--dry-run")
    assert code == 0 and commits[-1] in out and new.read_bytes() == old.read_bytes()
    assert f"envbuild: dry run: {new} not written" in err
    # The source named after the options, as the usage line allows (argparse once took it for an extra).
    assert run(capsys, "lock", "update", str(new), "--dry-run", "--cache-dir", cache, "lib")[:2] == (0, out)
    code, _, err = run(capsys, "lock", "update", str(new), "--dry-run", "lib", "--bogus")
    assert (code, err) == (2, "envbuild: error: unrecognized arguments: --bogus\n")

    code, out, _ = run(capsys, "lock", "update", str(new), "--cache-dir", cache)
    assert code == 0 and f"commit: {commits[0]} -> {commits[-1]} (3 commits, first-parent 3)" in out
    updated = read_lock(new).lock.sources[0]
    assert updated.commit == commits[-1] and updated.tree == repo.tree(commits[-1])
    first = new.read_bytes()
    code, out, _ = run(capsys, "lock", "update", str(new), "--cache-dir", cache)
    assert code == 0 and out == "no changes\n" and new.read_bytes() == first  # deterministic, idempotent

    code, out, _ = run(capsys, "lock", "diff", str(old), str(new), "--cache-dir", cache, "--json")
    (change,) = json.loads(out)["changes"]
    assert code == 1  # changes: exit 1, as diff(1) and `git diff --exit-code`
    code, out, _ = run(capsys, "lock", "diff", str(new), str(new), "--cache-dir", cache)
    assert (code, out) == (0, "no changes\n")
    # The pin moved, and the update read what the pinned tree declares (a setup.py only: build requirements).
    assert change["commits"] == 3
    assert {f["field"] for f in change["fields"]} == {"commit", "tree", "build_requires", "requires_unknown"}


def test_update_of_an_unknown_name_is_refused(upstream, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    served, _, commits = upstream
    lock = write_lock(tmp_path / "l.yaml", served.url("cli-upstream", "file"), commit=commits[0])
    before = lock.read_bytes()
    code, _, err = run(capsys, "lock", "update", str(lock), "nosuch", "--cache-dir", str(tmp_path / "c"))
    assert code == 2 and "nosuch: no such source" in err and lock.read_bytes() == before


def test_update_refuses_offline_before_asking_anyone(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """An update asks upstream where each ref is now: --offline was once taken and then ignored."""
    lock = write_lock(tmp_path / "l.yaml", "git://127.0.0.1:9/nowhere.git", commit="0" * 40)
    before = lock.read_bytes()
    code, out, err = run(capsys, "lock", "update", str(lock), "--offline", "--cache-dir", str(tmp_path / "c"))
    assert (code, out) == (2, "")
    assert err == (
        "envbuild: error: lock update: --offline makes no sense here; an update asks each upstream where its refs "
        "are now (`lock verify --offline` checks a lock against the cache)\n"
    )
    assert lock.read_bytes() == before and not (tmp_path / "c").exists()


def test_export_repos_and_schema(upstream, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    served, _, commits = upstream
    lock = write_lock(tmp_path / "l.yaml", served.url("cli-upstream", "file"), commit=commits[0])
    code, out, _ = run(capsys, "lock", "export", str(lock), "--format", "repos")
    assert code == 0 and f"version: {commits[0]}" in out
    code, out, _ = run(capsys, "lock", "schema")
    assert code == 0 and json.loads(out)["title"] == "envbuild lockfile, version 2"
    code, out, _ = run(capsys, "lock", "schema", "--version", "1")
    assert code == 0 and "Submodule" not in json.loads(out)["$defs"]


@pytest.mark.docker
@pytest.mark.registry
def test_update_pins_the_base_image_by_the_digest_its_registry_serves(
    upstream, pushed_base_image, tmp_path: Path, capsys
) -> None:  # noqa: ANN001
    served, _, commits = upstream
    lock = write_lock(tmp_path / "l.yaml", served.url("cli-upstream", "file"), commit=commits[-1])
    name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    lock.write_text(lock.read_text().replace("sources:", f"base_image: {{name: '{name}'}}\nsources:"))
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "c"), "--json")
    assert code == 1 and json.loads(out)["results"][-1]["status"] == "unpinned"

    code, out, _ = run(capsys, "lock", "update", str(lock), "--cache-dir", str(tmp_path / "c"))
    assert code == 0 and pushed_base_image.digest in out
    assert read_lock(lock).lock.base_image.digest == pushed_base_image.digest
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "c"), "--json")
    results = json.loads(out)["results"]
    assert results[-1]["status"] == "ok"
    # The update also read what the source's tree declares: a setup.py builds with setuptools, not in this lock.
    requirement = {(r["requirement"], r["status"]) for r in results if r["kind"] == "requirement"}
    assert code == 1 and requirement == {("setuptools>=40.8.0", "unmet"), (None, "unknown")}


@pytest.mark.docker
@pytest.mark.registry
def test_update_pins_a_base_only_where_its_registry_serves_the_locks_platform(
    upstream, pushed_base_image, registry: str, tmp_path: Path, capsys
) -> None:  # noqa: ANN001
    """A single-platform base of another platform is not pinned (a build would refuse it); a
    multi-platform index that has the lock's platform is pinned by the index's digest."""
    native = platform.machine()
    other = {"x86_64": "aarch64", "aarch64": "x86_64"}[native]
    variant = platform_variant(registry, PUSHED_REPOSITORY, pushed_base_image.digest, OCI_ARCH[other])
    index = put_index(
        registry,
        PUSHED_REPOSITORY,
        "update-multi",
        [manifest_of(registry, PUSHED_REPOSITORY, pushed_base_image.digest), variant],
    )
    served, _, commits = upstream
    cache = str(tmp_path / "c")
    single = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    for name, pinned in ((single, None), (f"{pushed_base_image.repository}:update-multi", index)):
        lock = write_lock(tmp_path / "l.yaml", served.url("cli-upstream", "file"), commit=commits[-1])
        header = f"platform: {{os: linux, arch: {other}, python: '3.11'}}\nbase_image: {{name: '{name}'}}\n"
        lock.write_text(lock.read_text().replace("sources:", header + "sources:"))
        code, _, err = run(capsys, "lock", "update", str(lock), "--no-packages", "--cache-dir", cache)
        assert code == 0, err
        assert read_lock(lock).lock.base_image.digest == pinned
        if pinned is None:
            assert f"none for the lock's platform linux/{other} (linux/{OCI_ARCH[other]})" in err, err
            assert f"linux/{OCI_ARCH[native]}" in err
        else:
            assert "none for the lock's platform" not in err


def test_help_names_fetch_and_says_what_json_does(capsys: pytest.CaptureFixture[str]) -> None:
    helps = {}
    for argv in (("--help",), ("lock", "update", "--help"), ("lock", "diff", "--help")):
        assert main(list(argv)) == 0
        helps[argv[-2] if len(argv) > 1 else "top"] = " ".join(capsys.readouterr().out.split())
    assert "start, verify, update, compare, fetch and export lockfiles" in helps["top"]
    assert "`lock init|add|verify|update|diff|fetch|export|schema`" in helps["top"]
    for command in ("update", "diff"):
        assert "--json one JSON object on stdout" in helps[command], helps[command]
