"""Every error message that tells the user what to do is true: each test meets the message, follows its
advice literally (the command in backquotes, run as written), and shows that it works.

Advice covered elsewhere, the same way: `envbuild image --offline` on an empty cache → `envbuild lock fetch`
(tests/test_fresh_start.py); an unreachable upstream → `--mirror` (tests/test_cli_lock.py); an unpinned
base image → `envbuild lock update` records its digest (tests/test_cli_lock.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.cli import main as envbuild
from envbuild.engine.client import Engine
from envbuild.errors import EngineError
from envbuild.lock import Lock, Package, PackageFile, Platform, Source, write_lock
from envbuild.lock.model import BaseImage, Install
from tests.lib.gitrepos import Served, free_port
from tests.lib.pyindex import PyIndex, make_wheel


def advised(message: str) -> list[str]:
    """The envbuild command a message advises, as argv for ``main`` (without the program name)."""
    found = re.search(r"`envbuild ([^`]+)`", message)
    assert found is not None, f"no advice in: {message}"
    return shlex.split(found.group(1))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = envbuild(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture()
def index(tmp_path: Path) -> Iterator[PyIndex]:
    root = tmp_path / "dists"
    root.mkdir()
    make_wheel(root, "tinyone", "1.0")
    with PyIndex(root) as served_index:
        yield served_index


def package_lock(path: Path, index: PyIndex, *, with_files: bool, sources: tuple[Source, ...] = ()) -> Path:
    wheel = next(index.root.glob("tinyone-*.whl")).name
    files = (PackageFile(wheel, index.sha256(wheel)),) if with_files else ()
    lock = Lock(
        version=1,
        name="advice",
        sources=sources,
        platform=Platform(os="linux", arch="x86_64", python="3.11"),  # type: ignore[arg-type]
        index=index.url,
        requirements=("tinyone==1.0",),
        packages=(Package(name="tinyone", version="1.0", files=files),),
    )
    write_lock(path, lock)
    return path


def test_an_unresolved_package_advises_lock_update_and_it_resolves_it(
    index: PyIndex, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = package_lock(tmp_path / "l.yaml", index, with_files=False)
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--json", "--cache-dir", str(tmp_path / "c"))
    (result,) = [r for r in json.loads(out)["results"] if r["kind"] == "package"]
    assert (code, result["status"]) == (1, "unresolved")
    code, out, _ = run(capsys, *advised(result["detail"]))  # `envbuild lock update <the lock>`, as written
    assert code == 0, out
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--json", "--cache-dir", str(tmp_path / "c"))
    assert (code, json.loads(out)["results"][0]["status"]) == (0, "ok")


def test_an_export_of_an_unresolved_package_advises_lock_update(
    index: PyIndex, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = package_lock(tmp_path / "l.yaml", index, with_files=False)
    code, out, _ = run(capsys, "lock", "export", str(lock), "--format", "requirements")
    assert code == 0 and "NOT INSTALLABLE FROM THIS FILE: tinyone==1.0" in out
    assert run(capsys, *advised(out), str(lock))[0] == 0  # the file has no path to name: the lock's is added
    code, out, _ = run(capsys, "lock", "export", str(lock), "--format", "requirements")
    assert code == 0 and "NOT INSTALLABLE" not in out and "tinyone==1.0 \\\n    --hash=sha256:" in out


def test_offline_verify_advises_lock_fetch_and_then_passes(
    index: PyIndex, served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = served.repo("advice-offline")
    commit = repo.commit("one")
    source = Source(name="one", repo=served.url("advice-offline", "daemon-filter"), ref="main", ref_type="branch",
                    commit=commit, install=Install(mode="none"))  # fmt: skip
    lock = package_lock(tmp_path / "l.yaml", index, with_files=True, sources=(source,))
    cache = str(tmp_path / "cache")
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--offline", "--json", "--cache-dir", cache)
    package = next(r for r in json.loads(out)["results"] if r["kind"] == "package")
    assert (code, package["status"]) == (1, "unreachable")
    assert run(capsys, *advised(package["detail"]))[0] == 0  # as written, with its --cache-dir
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--offline", "--json", "--cache-dir", cache)
    assert code == 0, out
    assert {r["kind"]: r["status"] for r in json.loads(out)["results"]} == {
        "source": "ok",
        "package": "cached",
        "requirement": "ok",  # the lock's root, checked from the metadata of the file the cache now holds
    }
    code, out, _ = run(capsys, "lock", "verify", str(lock), "--offline", "--strict", "--json", "--cache-dir", cache)
    assert code == 1  # `cached` says the index was not asked: --strict does not accept that


def test_a_refused_build_advises_lock_verify_which_names_the_failing_pin(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = served.repo("advice-refused")
    old = repo.commit("one")
    repo.tag("v1", old)
    source = Source(name="one", repo=served.url("advice-refused", "daemon-filter"), ref="v1", ref_type="tag",
                    commit=repo.commit("two"), install=Install(mode="none"))  # fmt: skip
    lock = tmp_path / "l.yaml"
    base = BaseImage(f"127.0.0.1:{free_port()}/refused/base:1", "sha256:" + "0" * 64)  # a build needs one to begin
    write_lock(lock, Lock(version=1, name="refused", sources=(source,), base_image=base))
    code, _, err = run(capsys, "image", str(lock), "--cache-dir", str(tmp_path / "c"))
    assert code == 1 and len(err.strip().splitlines()) == 1
    code, out, _ = run(capsys, *advised(err), "--cache-dir", str(tmp_path / "c"))
    assert code == 1 and re.search(r"source\s+one\s+tag-moved", out)


def test_a_lock_without_a_version_says_which_line_to_add(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / "l.yaml"
    lock.write_text("name: x\nsources: []\n")
    code, _, err = run(capsys, "lock", "verify", str(lock))
    line = re.search(r"\(add `(version: \d+)`\)", err)
    assert code == 2 and line is not None
    lock.write_text(f"{line.group(1)}\n" + lock.read_text())
    assert run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "c"))[0] == 0


@pytest.mark.docker
def test_no_engine_advises_setting_docker_host_and_that_reaches_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    live = os.environ["DOCKER_HOST"]
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(EngineError, match=r"start dockerd or set DOCKER_HOST"):
        Engine.connect()
    monkeypatch.setenv("DOCKER_HOST", live)
    with Engine.connect() as engine:
        assert engine.client.ping()


def test_every_advised_command_parses(tmp_path: Path) -> None:
    """The commands the code advises exist with the options it gives them (argparse would exit 2)."""
    from envbuild.cli import build_parser

    lock = str(tmp_path / "l.yaml")
    for argv in (
        ["lock", "fetch", lock, "--cache-dir", str(tmp_path), "--mirror", "a=b"],
        ["lock", "update", lock],
        ["lock", "verify", lock],
    ):
        assert build_parser().parse_args(argv).handler is not None


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["check", "{lock}", "--report", "{file}"], "--report {file}: exists and is not a directory"),
        (["check", "{lock}", "--history", "{file}/h.jsonl"], "cannot be created"),
        (["check", "{lock}", "--history", "/dev/null"], "exists and is not a regular file"),
        (["lock", "export", "{lock}", "--format", "repos", "-o", "{dir}"], "is a directory"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_refused_before_anything_runs(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "l.yaml"
    lock.write_text("version: 1\nname: x\nsources: []\n")
    (tmp_path / "afile").write_text("")
    names = {"lock": str(lock), "file": str(tmp_path / "afile"), "dir": str(tmp_path)}
    code, _, err = run(capsys, *[a.format(**names) for a in argv])
    assert code == 2 and err.count("\n") == 1 and words.format(**names) in err
    assert (tmp_path / "afile").read_text() == ""


def test_an_image_without_the_lock_label_advises_a_command_that_exists(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace
    from typing import cast

    from envrun.plan import RunPlan
    from envrun.preflight import check_image_label

    plan = cast(RunPlan, SimpleNamespace(image="someone/else:latest", backend="docker", lock_sha256="a" * 64))
    line = check_image_label(plan, lambda image: {"maintainer": "someone"})
    assert line.status == "fail"
    argv = advised(line.detail)
    assert argv == ["image"], line.detail  # the build command itself: no subcommand of it
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0 and "usage: envbuild image" in out


@pytest.mark.docker
@pytest.mark.parametrize("damage", [b"{not json", b'{"version": 99}', b'{"version": 1}'])
def test_a_damaged_cluster_state_advises_down_by_the_cluster_file_which_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: bytes
) -> None:
    from envrun.cli.main import main as envrun
    from envrun.cluster.state import state_path

    cache = tmp_path / "cache"
    state = state_path(cache, "damaged")
    state.parent.mkdir(parents=True)
    state.write_bytes(damage)
    assert envrun(["cluster", "status", "damaged", "--cache-dir", str(cache)]) == 1
    err = capsys.readouterr().err
    found = re.search(r"`envrun ([^`]+)`", err)
    assert found is not None, err
    argv = shlex.split(found.group(1))
    assert argv[:2] == ["cluster", "down"] and argv[2] == "CLUSTER.yaml", err
    # The cluster's file, naming its one host (this machine's engine, where nothing of it runs).
    cluster = tmp_path / "damaged.yaml"
    cluster.write_text(json.dumps({"name": "damaged", "nodes": [{"engine": os.environ["DOCKER_HOST"]}]}))
    assert envrun([*argv[:2], str(cluster), "--cache-dir", str(cache)]) == 0, capsys.readouterr().err
    assert not state.exists()
    assert envrun(["cluster", "down", "damaged", "--cache-dir", str(cache)]) == 0  # idempotent, by name too
