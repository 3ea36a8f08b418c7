"""What ``envbuild image`` begins as soon as its lock is read (envbuild/image/early.py): the upstreams'
listings, the fetches of tree-pinned commits, the docker CLI's version. Each is answered where the build
asks for it, once, with what the build would have got itself (its error too); nothing is begun for a lock
whose URLs a verify refuses, offline, for a dry run or a bad ``--tag``; a lock built before fetches nothing."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from envbuild.config import SourceOptions
from envbuild.engine.cli_build import CLI_ENV, choose_transport
from envbuild.git.cache import GitCache
from envbuild.git.mirrors import Mirrors
from envbuild.git.remote import GitRunner
from envbuild.git.treeexport import ExportError, TreeExporter, source_pin, whole_fetched
from envbuild.image.cache.ledger import BUILDER, BuiltImage, write_built
from envbuild.image.early import begin_build, upstream_urls
from envbuild.lock.io import read_lock
from envbuild.lock.model import Source, Submodule
from envbuild.verify.sources import verify_sources
from tests.lib.gitrepos import Served, free_port
from tests.lib.tinylock import DIGEST, branch_lock

PROJECT_ROOT = Path(__file__).resolve().parents[1]
ENVBUILD = "import sys; from envbuild.cli import main; sys.exit(main())"


class Seen:
    """Each network command git is asked for: (command, URL, the thread that asked)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, command: str, url: str) -> None:
        with self._lock:
            self.log.append((command, url, threading.current_thread().name))


@dataclasses.dataclass(frozen=True)
class Upstream:
    url: str
    commits: list[str]
    trees: list[str]


@pytest.fixture(scope="module")
def upstream(served: Served) -> Upstream:
    """A repository ``early`` with three commits on main."""
    repo = served.repo("early")
    commits = [repo.commit(f"c{n}", files={"data.txt": f"{n}\n"}) for n in range(3)]
    return Upstream(served.url("early", "daemon-filter"), commits, [repo.tree(c) for c in commits])


def source(url: str, commit: str, tree: str | None = None) -> Source:
    return Source(name="early", repo=url, ref="main", ref_type="branch", commit=commit, tree=tree)


@pytest.mark.gitdaemon
def test_a_begun_listing_answers_the_verify_once_then_the_next_ask_lists_again(
    upstream: Upstream, tmp_path: Path
) -> None:
    url, commits = upstream.url, upstream.commits
    seen = Seen()
    cache = GitCache(tmp_path / "git", git=GitRunner(observer=seen))
    cache.begin_listings([url, url], jobs=4)
    [result] = verify_sources([source(url, commits[-1])], cache)
    assert result.status == "ok"
    assert [(c, u) for c, u, _ in seen.log] == [("ls-remote", url)]  # one listing, the begun one
    assert seen.log[0][2].startswith("envbuild-refs")
    cache.list_refs(url)
    assert [(c, t) for c, _, t in seen.log[1:]] == [("ls-remote", threading.current_thread().name)]


def test_a_begun_listing_that_failed_answers_with_the_failure(tmp_path: Path) -> None:
    url = f"git://127.0.0.1:{free_port()}/nothing"
    begun = GitCache(tmp_path / "begun")
    begun.begin_listings([url], jobs=1)
    [early] = verify_sources([source(url, "ab" * 20)], begun)
    [plain] = verify_sources([source(url, "ab" * 20)], GitCache(tmp_path / "plain"))
    assert early.status == plain.status == "unreachable"
    assert early.detail == plain.detail


@pytest.mark.gitdaemon
def test_a_begun_whole_fetch_answers_once_and_says_so_once(upstream: Upstream, tmp_path: Path) -> None:
    url, commits, tree = upstream.url, upstream.commits, upstream.trees[1]
    pin = source_pin(source(url, commits[1], tree))
    exporter = TreeExporter(tmp_path / "cache")
    said: list[tuple[str, str]] = []

    def say(message: str) -> None:
        said.append((threading.current_thread().name, message))

    exporter.begin_whole([pin, pin], say, jobs=2)
    assert whole_fetched(exporter, pin, say) == (tree, True)
    assert whole_fetched(exporter, pin, say) == (tree, False)  # whole in the export cache now
    assert [message for _, message in said] == [f"fetching the files of source early ({commits[1][:12]})"]
    assert said[0][0].startswith("envbuild-whole")


@pytest.mark.gitdaemon
def test_a_begun_whole_fetch_of_a_commit_upstream_lacks_fails_as_one_not_begun(
    upstream: Upstream, tmp_path: Path
) -> None:
    url = upstream.url
    pin = source_pin(source(url, "ab" * 20, "cd" * 20))
    begun = TreeExporter(tmp_path / "begun")
    begun.begin_whole([pin], lambda _: None, jobs=1)
    with pytest.raises(ExportError) as early:
        whole_fetched(begun, pin, lambda _: None)
    with pytest.raises(ExportError) as plain:
        whole_fetched(TreeExporter(tmp_path / "plain"), pin, lambda _: None)
    assert str(early.value) == str(plain.value)


def test_two_threads_that_ask_for_the_docker_cli_at_once_run_it_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cli = tmp_path / "docker"
    cli.write_text(f"#!/bin/sh\necho run >> {runs}\nsleep 0.3\necho 20.10.24\n")
    cli.chmod(0o755)
    answers: list[object] = []
    threads = [threading.Thread(target=lambda: answers.append(choose_transport({CLI_ENV: str(cli)}))) for _ in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 2 and answers[0] == answers[1] is not None
    assert runs.read_text() == "run\n"


def test_the_upstreams_listed_are_each_source_and_each_submodule_not_skipped_after_mirrors(tmp_path: Path) -> None:
    lock_file = tmp_path / "l.lock.yaml"
    lock_file.write_text(branch_lock("app", "https://example.invalid/app.git", "ab" * 20))
    lock = read_lock(lock_file).lock
    sub = Submodule(path="third/a", repo="https://example.invalid/a.git", commit="cd" * 20)
    nested = dataclasses.replace(
        sub, path="third/b", repo="https://example.invalid/b.git", submodules=(dataclasses.replace(sub, path="x"),)
    )
    skipped = Submodule(path="third/c", skip="provided by app", repo="https://example.invalid/c.git")
    app = dataclasses.replace(lock.sources[0], submodules=(sub, nested, skipped))
    twin = dataclasses.replace(app, name="twin", submodules=())
    lock = dataclasses.replace(lock, sources=(app, twin))
    mirrors = Mirrors.parse(["https://example.invalid/b.git=https://mirror.invalid/b.git"])
    options = SourceOptions(cache_dir=tmp_path / "cache", mirrors=mirrors)
    assert upstream_urls(lock, options) == [
        "https://example.invalid/app.git",
        "https://example.invalid/a.git",
        "https://mirror.invalid/b.git",
    ]


@pytest.mark.gitdaemon
def test_a_lock_built_before_lists_but_fetches_nothing_and_one_not_built_begins_its_fetch(
    upstream: Upstream, tmp_path: Path
) -> None:
    url, commits, tree = upstream.url, upstream.commits, upstream.trees[-1]
    lock_file = tmp_path / "l.lock.yaml"
    lock_file.write_text(
        branch_lock("early", url, commits[-1]).replace("    install:", f"    tree: {tree}\n    install:")
    )
    read = read_lock(lock_file)
    assert read.lock.sources[0].tree == tree
    options = SourceOptions(cache_dir=tmp_path / "cache")
    said: list[str] = []
    record = BuiltImage(read.sha256, BUILDER, None, "sha256:" + "1" * 64, "sha256:" + "2" * 64, 0, "3" * 64, ())
    write_built(options.cache_dir, record)

    built = begin_build(read, options, said.append, no_cache=False)
    assert built is not None
    built.verify_cache.list_refs(url)  # the begun listing, waited for
    assert not built.cache.repo(url).exists() and said == []  # nothing fetched for the export

    again = begin_build(read, options, said.append, no_cache=True)  # --no-cache: built again, whole
    assert again is not None
    assert whole_fetched(again, source_pin(read.lock.sources[0]), lambda _: None) == (tree, True)
    assert said == [f"fetching the files of source early ({commits[-1][:12]})"]


@pytest.mark.parametrize(
    "options",
    [
        SourceOptions(cache_dir=Path("cache"), offline=True),
        SourceOptions(cache_dir=Path("cache"), mirrors=Mirrors.parse(["https://example.invalid/=-oProxyCommand=x/"])),
    ],
    ids=["offline", "hostile-mirror"],
)
def test_nothing_is_begun_offline_or_for_urls_a_verify_refuses(
    options: SourceOptions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lock_file = tmp_path / "l.lock.yaml"
    lock_file.write_text(branch_lock("app", "https://example.invalid/app.git", "ab" * 20))
    assert begin_build(read_lock(lock_file), options, lambda _: None, no_cache=True) is None
    assert not (tmp_path / "cache").exists()


def envbuild(*args: str, trace: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_TRACE": str(trace), "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", ENVBUILD, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def git_commands(trace: Path) -> list[str]:
    """The git subcommands run, in order, from git's own trace (``trace: built-in: git …``)."""
    if not trace.exists():
        return []
    found = []
    for line in trace.read_text().splitlines():
        if "trace: built-in: git " in line:
            words = line.split("trace: built-in: git ", 1)[1].split()
            while words and words[0] == "-C":
                words = words[2:]
            found.append(words[0] if words else "")
    return found


@pytest.mark.gitdaemon
def test_the_cli_lists_each_upstream_once_and_begins_nothing_for_a_bad_tag_or_a_dry_run(
    upstream: Upstream, tmp_path: Path
) -> None:
    """The branch moved on from the lock's pin: with --strict the build refuses it after its verify, before
    the engine (which is nowhere); the upstream was listed once."""
    url, commits = upstream.url, upstream.commits
    lock_file = tmp_path / "l.lock.yaml"
    base = f'base_image: {{name: "127.0.0.1:5000/envbuild-test/base:early", digest: "{DIGEST}"}}\n'
    lock_file.write_text(branch_lock("early", url, commits[0]) + base)
    cache = tmp_path / "cache"
    (tmp_path / "taken").write_text("")
    no_base = tmp_path / "nobase.lock.yaml"
    no_base.write_text(branch_lock("early", url, commits[0]))
    refusals = {  # each refused before anything starts: once, only after the build, the tag or the push
        "--tag": "--tag: ",
        "--push": "--push needs --tag REGISTRY/REPOSITORY:TAG: the default name, envbuild/<lock name>:…, is Docker Hub's",
        "--record-dir": "--record-dir taken: it exists and is not a directory",
        "nobase": f"{no_base}: base_image: the lock has none to build on; `envbuild lock update {no_base} --base-image",
    }
    cases = (["--tag", "Not:Valid"], ["--tag", "Foo/bar:1"], ["--push"], ["--record-dir", "taken"], ["nobase"])
    for args in (*cases, ["--dry-run"]):
        trace = tmp_path / f"trace{args[0]}"
        lock_args = [str(no_base)] if args == ["nobase"] else [str(lock_file), *args]
        done = envbuild("image", *lock_args, "--cache-dir", str(cache), trace=trace, cwd=tmp_path)
        assert done.returncode == (0 if args[0] == "--dry-run" else 2), done.stderr
        assert args[0] == "--dry-run" or done.stderr.startswith(f"envbuild: error: {refusals[args[0]]}"), done.stderr
        assert git_commands(trace) == [] and not (cache / "git").exists()
    trace = tmp_path / "trace"
    done = envbuild("image", str(lock_file), "--cache-dir", str(cache), "--strict", trace=trace, cwd=tmp_path)
    assert done.returncode == 1 and "refusing to build, the lock fails verify: source early: behind" in done.stderr
    # The advice runs the verify that fails as the build's did (without --strict, `behind` is OK, exit 0).
    assert f"run `envbuild lock verify {lock_file} --strict --cache-dir {cache}` for details" in done.stderr
    assert git_commands(trace).count("ls-remote") == 1
