"""What a tree says about its submodules, paired as git pairs them: relative URLs resolved exactly as git
resolves them (checked against git itself), every refusal one line naming the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.git.gitmodules import (
    GitmodulesEntry,
    RelativeURLError,
    pair_submodules,
    parse_gitmodules,
    repository_key,
    resolve_url,
)
from envbuild.lock.model import Submodule
from tests.lib.gitrepos import Served, git, make_repo
from tests.lib.tinylock import branch_lock

PARENTS = (
    "https://github.com/NVIDIA-NeMo/Megatron-Bridge.git",
    "https://github.com/a/b/",
    "git@github.com:org/repo.git",
    "git@github.com:repo.git",
    "ssh://git@host:2222/x/y.git",
    "git://127.0.0.1:9418/base/p",
    "file:///srv/git/p.git",
    "https://host/p",
)
RELATIVE = (
    "./x",
    "../x",
    "../../NVIDIA/Megatron-LM.git",
    "./../x",
    "../x/",
    "../../x",
    ".././y",
    "../",
    "../../../x",
    "../x/../y",
)


def git_resolves(tmp_path: Path, parent: str, urls: tuple[str, ...]) -> dict[str, str]:
    """What `git submodule init` records for each of ``urls`` in a superproject whose remote is ``parent``:
    git's own resolution (no network needed)."""
    repo = tmp_path / "super"
    git("init", "-q", str(repo))
    sections = "".join(f'[submodule "s{i}"]\n\tpath = s{i}\n\turl = {url}\n' for i, url in enumerate(urls))
    (repo / ".gitmodules").write_text(sections)
    for i in range(len(urls)):
        git("update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},s{i}", cwd=repo)
    git("add", ".gitmodules", cwd=repo)
    git("config", "remote.origin.url", parent, cwd=repo)
    git("submodule", "init", cwd=repo)
    return {url: git("config", f"submodule.s{i}.url", cwd=repo) for i, url in enumerate(urls)}


@pytest.mark.parametrize("parent", PARENTS)
def test_relative_urls_resolve_as_git_resolves_them(tmp_path: Path, parent: str) -> None:
    urls = RELATIVE if ":" not in parent.split("/", 1)[0] or "://" in parent else RELATIVE[:-2]
    assert {url: resolve_url(parent, url) for url in urls} == git_resolves(tmp_path, parent, urls)


def test_absolute_urls_are_kept_and_climbing_out_of_a_bare_name_fails() -> None:
    assert (
        resolve_url("https://h/a/b.git", "https://gitcode.com/cann/catlass.git")
        == "https://gitcode.com/cann/catlass.git"
    )
    with pytest.raises(RelativeURLError):
        resolve_url("./repo", "../../x")


def test_one_repository_whatever_the_transport() -> None:
    same = ("https://github.com/NVIDIA/Megatron-LM.git", "https://GitHub.com/NVIDIA/Megatron-LM/", "git@github.com:NVIDIA/Megatron-LM",
            "ssh://git@github.com/NVIDIA/Megatron-LM.git")  # fmt: skip
    assert len({repository_key(url) for url in same}) == 1
    assert repository_key("https://github.com/NVIDIA/Megatron-LM.git") != repository_key(
        "https://github.com/x/Megatron-LM.git"
    )


def test_gitmodules_records_read_like_git() -> None:
    entries = parse_gitmodules(
        [
            ("submodule.a.b.path", "lib/ab"),  # a name holding dots
            ("submodule.a.b.url", "../first.git"),
            ("submodule.a.b.url", "../second.git"),  # the last value wins
            ("submodule.c.path", None),  # a key without '='
            ("core.bare", "false"),
        ]
    )
    assert entries == {"a.b": GitmodulesEntry("a.b", "lib/ab", "../second.git"), "c": GitmodulesEntry("c", None, None)}


SHA = "d0b3b775498a8ae6870075f1a5fc32bc260aa1b3"
PARENT = "https://github.com/NVIDIA-NeMo/Megatron-Bridge.git"


def entry(name: str, path: str | None, url: str | None) -> GitmodulesEntry:
    return GitmodulesEntry(name, path, url)


def test_pairing_resolves_against_the_parent_and_keeps_skips_by_path() -> None:
    paired = pair_submodules(
        {"3rdparty/Megatron-LM": SHA, "docs/theme": "1" * 40},
        {
            "m": entry("m", "3rdparty/Megatron-LM", "../../NVIDIA/Megatron-LM.git"),
            "t": entry("t", "docs/theme", "./theme"),
        },
        PARENT,
        (Submodule(path="docs/theme", skip="docs are not built in the image"), Submodule(path="gone", skip="old")),
        "megatron-bridge",
    )
    assert paired.problems == ()
    assert paired.records == (
        Submodule(path="3rdparty/Megatron-LM", repo="https://github.com/NVIDIA/Megatron-LM.git", commit=SHA),
        Submodule(
            path="docs/theme",
            skip="docs are not built in the image",
            repo="https://github.com/NVIDIA-NeMo/Megatron-Bridge.git/theme",
            commit="1" * 40,
        ),
    )
    assert paired.notes == (
        "megatron-bridge/gone: the lock's skip no longer applies (the tree has no submodule there); dropped",
    )


@pytest.mark.parametrize(
    ("gitlinks", "entries", "words"),
    [
        ({"lib/x": SHA}, {}, "megatron-bridge/lib/x: a gitlink (commit d0b3b77"),
        (
            {},
            {"x": entry("x", "lib/x", "../x.git")},
            "megatron-bridge/lib/x: .gitmodules names submodule 'x' here, but the tree has no gitlink",
        ),
        (
            {"lib/x": SHA},
            {"x": entry("x", "lib/x", "ext::sh -c touch% /tmp/pwned")},
            "megatron-bridge/lib/x: .gitmodules url 'ext::sh",
        ),
        ({"lib/x": SHA}, {"x": entry("x", "lib/x", "-uhttps://h/x")}, "would be read as an option"),
        ({"lib/x": SHA}, {"x": entry("x", "lib/x", "https://ghp_token@github.com/x.git")}, "carries credentials"),
        (
            {"lib/x": SHA},
            {"x": entry("x", "lib/x", "../../../../../x")},
            "megatron-bridge/lib/x: .gitmodules url",
        ),
        ({"lib/x": SHA}, {"x": entry("x", "lib/x", None)}, "names no url for submodule 'x'"),
        (
            {"lib/x": SHA},
            {"x": entry("x", "lib/x", "file:///srv/mirrors/internal.git")},
            "megatron-bridge/lib/x: .gitmodules url 'file:///srv/mirrors/internal.git' names a repository on this "
            "machine, and its parent 'https://github.com/NVIDIA-NeMo/Megatron-Bridge.git' is not one",
        ),
        ({"lib/x": SHA}, {"../../modules/x": entry("../../modules/x", "lib/x", "../x.git")}, "has a '..' component"),
        ({"-x": SHA}, {"x": entry("x", "-x", "../x.git")}, "megatron-bridge/-x: '-x' starts with '-'"),
        (
            {"lib/x": SHA},
            {"a": entry("a", "lib/x", "../a.git"), "b": entry("b", "lib/x", "../b.git")},
            "names this path twice",
        ),
    ],
)
def test_what_the_lock_cannot_record_is_refused_naming_the_path(
    gitlinks: dict[str, str], entries: dict[str, GitmodulesEntry], words: str
) -> None:
    paired = pair_submodules(gitlinks, entries, PARENT, (), "megatron-bridge")
    assert paired.records == () and len(paired.problems) == 1, paired
    (problem,) = paired.problems
    assert words in problem and "\n" not in problem and "ghp_token" not in problem


def test_a_skip_by_path_covers_an_unnamed_gitlink_and_a_stale_entry() -> None:
    skips = (Submodule(path="lib/x", skip="vendored copy, unused"), Submodule(path="lib/y", skip="removed upstream"))
    paired = pair_submodules({"lib/x": SHA}, {"y": entry("y", "lib/y", "../y.git")}, PARENT, skips, "s")
    assert paired.problems == ()
    assert paired.records == (
        Submodule(path="lib/x", skip="vendored copy, unused", commit=SHA),
        Submodule(path="lib/y", skip="removed upstream", repo="https://github.com/NVIDIA-NeMo/y.git"),
    )


def test_a_local_url_is_a_submodule_only_of_a_local_parent_or_where_the_lock_skips_it() -> None:
    """git's protocol.file.allow=user: a file:// submodule of a file:// parent (a repository of this machine
    pointing at its neighbour) is recorded; of a remote parent only where the lock skips its path (never fetched)."""
    local = pair_submodules({"x": SHA}, {"x": entry("x", "x", "../x.git")}, "file:///srv/git/p.git", (), "p")
    assert (local.problems, local.records) == ((), (Submodule(path="x", repo="file:///srv/git/x.git", commit=SHA),))
    skip = (Submodule(path="x", skip="not in the image"),)
    skipped = pair_submodules({"x": SHA}, {"x": entry("x", "x", "file:///srv/x.git")}, PARENT, skip, "p")
    assert skipped.problems == () and skipped.records[0].repo == "file:///srv/x.git"


@pytest.mark.gitdaemon
def test_an_upstreams_gitmodules_cannot_read_a_repository_of_this_machine(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A served upstream whose .gitmodules names file:// a repository of the build machine (its commit known:
    a clone of a public repository with local work, an internal mirror's path): ``lock update`` once recorded
    it and ``lock fetch`` read it into the cache, for the image. Now: one line naming the path, exit 2, the
    lock and the cache's export untouched."""
    local = make_repo(tmp_path / "local" / "internal")
    secret = local.commit(files={"key.txt": "not for the image\n"})
    upstream = served.repo("h-localsub")
    commit = upstream.commit_gitlinks("vendor", {"vendor": secret}, {"v": ("vendor", local.path.as_uri())})
    lock = tmp_path / "l.lock.yaml"
    lock.write_text(branch_lock("l", served.url("h-localsub", "daemon-filter"), commit))
    before = lock.read_bytes()
    cache = tmp_path / "cache"
    code = main(["lock", "update", str(lock), "--cache-dir", str(cache), "-q"])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert err.startswith(f"envbuild: error: l/vendor: .gitmodules url '{local.path.as_uri()}' names a repository ")
    assert len(err.splitlines()) == 1 and lock.read_bytes() == before
    assert not list(cache.glob("git*/internal-*.git"))  # the local repository was never read
