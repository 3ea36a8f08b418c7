"""The advice of `lock verify`'s table, followed as a person reads it: each command is taken from the printed
table (not from --json), run as printed, and shown to work. Real git daemons on loopback; the lock names an
upstream that refuses connections (a closed port), reached only through `--mirror`, as on a cluster without
GitHub; the cache path is long, so every row's advice runs past the table's 100-character DETAIL."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from envbuild.cli import main as envbuild
from envbuild.lock import Lock, Source, write_lock
from envbuild.lock.model import BaseImage, Install
from tests.lib.gitrepos import GitDaemon, Served, free_port, make_repo

pytestmark = pytest.mark.gitdaemon


def table_advice(out: str) -> list[list[str]]:
    """Every `envbuild …` command the table prints, once each, as argv for ``main``."""
    commands = dict.fromkeys(re.findall(r"`envbuild ([^`]+)`", out))
    assert commands, f"no advice in:\n{out}"
    return [shlex.split(c) for c in commands]


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = envbuild(argv)
    return code, capsys.readouterr().out


def two_source_lock(path: Path, upstream: str, repos: dict[str, str]) -> Path:
    sources = tuple(
        Source(
            name=name,
            repo=f"{upstream}/{name}",
            ref="main",
            ref_type="branch",
            commit=commit,
            install=Install(mode="none"),
        )  # fmt: skip
        for name, commit in repos.items()
    )
    write_lock(path, Lock(version=2, name="advice-table", sources=sources))
    return path


def test_offline_rows_advise_a_fetch_that_runs_as_printed_through_the_mirror(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repos = {name: served.repo(f"table-{name}").commit("one") for name in ("alpha", "beta")}
    closed = f"git://127.0.0.1:{free_port()}"  # nothing listens there
    lock = two_source_lock(tmp_path / "small.lock.yaml", closed, {f"table-{n}": c for n, c in repos.items()})
    cache = tmp_path / ("a-cache-directory-with-a-long-name-" * 2) / "cache"
    mirror = ["--mirror", f"{closed}/={served.url('', 'daemon-filter')}"]
    offline = ["lock", "verify", str(lock), "--offline", "--cache-dir", str(cache), *mirror]

    code, out = run(capsys, offline)
    assert code == 1 and out.count("offline and not in cache; run `envbuild lock fetch") == 2, out
    assert "…" not in out  # the advice is printed whole, however long
    [fetch] = table_advice(out)
    assert fetch[:2] == ["lock", "fetch"] and mirror[1] in fetch
    assert run(capsys, fetch)[0] == 0
    code, out = run(capsys, offline)
    assert code == 0, out
    # The cache is keyed by the URL the lock names, not the mirror's: offline needs no mirror rules.
    code, out = run(capsys, offline[: offline.index("--mirror")])
    assert code == 0, out


def test_an_unreachable_upstream_advises_offline_only_when_the_cache_can_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "upstream"
    repos = {name: make_repo(base / name).commit("one") for name in ("gamma", "delta")}
    daemon = GitDaemon(base, allow_filter=True).start()
    upstream = f"git://127.0.0.1:{daemon.port}"
    lock = two_source_lock(tmp_path / "small.lock.yaml", upstream, repos)
    online = ["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache")]
    try:
        empty = ["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "empty")]
        assert run(capsys, online)[0] == 0  # the cache now holds what the upstream said
    finally:
        daemon.stop()

    code, out = run(capsys, empty)  # an empty cache: offline cannot help, so it is not suggested
    assert code == 1 and "hint: where the upstream git hosts are out of reach" in out and "--offline" not in out

    code, out = run(capsys, online)  # the upstream went away; the cache has its answer
    assert code == 1 and "the cache answers offline: `envbuild lock verify" in out, out
    [verify] = table_advice(out)
    assert "--offline" in verify
    code, out = run(capsys, verify)
    assert code == 0, out
    assert re.search(r"source\s+gamma\s+ok", out) and re.search(r"source\s+delta\s+ok", out)


def test_fetch_fetches_everything_else_while_the_base_is_unpinned_and_says_so(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit = served.repo("table-fetch").commit("one")
    lock = tmp_path / "small.lock.yaml"
    source = Source(name="one", repo=served.url("table-fetch", "daemon-filter"), ref="main", ref_type="branch",
                    commit=commit, install=Install(mode="none"))  # fmt: skip
    write_lock(lock, Lock(version=2, name="fetch", sources=(source,), base_image=BaseImage(name="127.0.0.1:1/base:1")))
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert envbuild(["lock", "fetch", str(lock), *cache]) == 0
    err = capsys.readouterr().err
    assert f"{lock}: base image 127.0.0.1:1/base:1 left unfetched (unpinned): no digest recorded" in err
    assert f"`envbuild lock update {lock} --base --cache-dir {tmp_path / 'cache'}` pins the digest" in err
    code, out = run(capsys, ["lock", "verify", str(lock), "--offline", *cache])
    assert code == 1 and re.search(r"source\s+one\s+ok", out) and re.search(r"base-image\s+\S+\s+unpinned", out), out


def test_the_offline_advice_ends_where_some_upstreams_are_out_of_reach(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lock verify --offline` advises `lock fetch`; run as printed where one upstream is out of reach, it
    fetches the pins that verify, names the one it leaves (exit 1), and `--offline` then answers for the
    rest: the chain of advice ends instead of looping."""
    commit = served.repo("partial-near").commit("one")
    closed = f"git://127.0.0.1:{free_port()}"
    sources = (
        Source(name="near", repo=served.url("partial-near", "daemon-filter"), ref="main", ref_type="branch",
               commit=commit, install=Install(mode="none")),
        Source(name="far", repo=f"{closed}/far", ref="main", ref_type="branch", commit="b" * 40,
               install=Install(mode="none")),
    )  # fmt: skip
    lock = tmp_path / "partial.lock.yaml"
    write_lock(lock, Lock(version=2, name="partial", sources=sources))
    offline = ["lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "cache")]
    code, out = run(capsys, offline)
    assert code == 1 and out.count("offline and not in cache; run `envbuild lock fetch") == 2, out
    [fetch] = table_advice(out)

    code = envbuild(fetch)
    out, err = capsys.readouterr()
    assert code == 1 and "1 inputs in" in out and "1 pins fail verify, 1 of them left unfetched" in out, out
    assert re.search(rf"{re.escape(str(lock))}: source far left unfetched \(unreachable\): ", err), err
    code, out = run(capsys, offline)
    assert code == 1 and re.search(r"source\s+near\s+ok", out), out
    assert "run `envbuild lock fetch" in out  # only for the one still out of reach
    assert re.search(r"source\s+far\s+unreachable", out), out


def test_what_was_verified_through_a_mirror_answers_offline_without_it(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repos = {f"mirrored-{n}": served.repo(f"mirrored-{n}").commit("one") for n in ("a", "b")}
    closed = f"git://127.0.0.1:{free_port()}"
    lock = two_source_lock(tmp_path / "small.lock.yaml", closed, repos)
    cache = ["--cache-dir", str(tmp_path / "cache")]
    mirror = ["--mirror", f"{closed}/={served.url('', 'daemon-filter')}"]
    assert run(capsys, ["lock", "verify", str(lock), *cache, *mirror])[0] == 0
    code, out = run(capsys, ["lock", "verify", str(lock), "--offline", *cache])
    assert code == 0, out
    assert re.search(r"source\s+mirrored-a\s+ok", out) and re.search(r"source\s+mirrored-b\s+ok", out)
    # ... and online without the mirror, the upstream out of reach, the hint offers exactly that
    code, out = run(capsys, ["lock", "verify", str(lock), *cache])
    assert code == 1 and "the cache answers offline: `envbuild lock verify" in out, out
    [verify] = table_advice(out)
    assert run(capsys, verify)[0] == 0
