"""A cache whose objects are damaged (a pack cut short: the copy of a cache to an air-gapped cluster that was
interrupted) is fetched into anew, not answered forever with git's ``did not send all necessary objects``. Real repositories
served by ``git daemon`` on 127.0.0.1, real caches in tmp_path, the CLI as a user runs it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.git.damage import damaged_objects
from tests.lib.gitrepos import Served, git
from tests.lib.tinylock import branch_lock


def envbuild(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "-q"])
    out, err = capsys.readouterr()
    return code, out, err


def cut_short(repositories: Path, holding: str) -> Path:
    """Cut the pack that holds the object ``holding`` (of a repository below ``repositories``) to 20 bytes, its
    index left whole: what a copy cut short leaves, as git then sees it (it holds the object, it cannot read it)."""
    for index in sorted(repositories.glob("*.git/objects/pack/pack-*.idx")):
        if holding in git("show-index", stdin=index.read_bytes()):
            pack = index.with_suffix(".pack")
            pack.chmod(0o644)
            with open(pack, "r+b") as handle:
                handle.truncate(20)
            return pack
    raise AssertionError(f"no pack below {repositories} holds {holding}")


@pytest.mark.gitdaemon
def test_lock_fetch_fetches_anew_into_an_export_cache_whose_pack_was_cut_short(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two sources of one repository (one export repository); a pack cut short, ``lock fetch`` once failed
    with ``remote did not send all necessary objects`` on every run, and ``--offline`` could never build. Now it
    fetches both commits anew, the one it found whole before the damage was seen too."""
    upstream = served.repo("damaged-export")
    first = upstream.commit()
    git("tag", "v1", cwd=upstream.path)
    second = upstream.commit()
    url = served.url("damaged-export", "daemon-filter")
    lock = tmp_path / "e.lock.yaml"
    lock.write_text(
        branch_lock("e", url, second)
        + textwrap.indent(
            textwrap.dedent(f"""\
                - name: e1
                  repo: {url}
                  ref: v1
                  ref_type: tag
                  commit: "{first}"
                  install: {{mode: none}}
                """),
            "  ",
        )
    )
    cache = tmp_path / "cache"
    code, out, err = envbuild(capsys, "lock", "fetch", str(lock), "--cache-dir", str(cache))
    assert code == 0, out + err
    cut_short(cache / "git-export", second)

    code, out, err = envbuild(capsys, "lock", "fetch", str(lock), "--cache-dir", str(cache))
    assert code == 0, out + err
    code, out, err = envbuild(capsys, "lock", "fetch", str(lock), "--cache-dir", str(cache))
    assert (code, "0 fetched now, 2 cached before" in out) == (0, True), out + err


def test_damaged_objects_are_those_git_cannot_read_and_no_other(tmp_path: Path) -> None:
    """A whole repository (loose objects and a pack) has none; a loose object cut short and a pack whose trailer
    is not the one its index names are found; a pack without its index is git's to ignore."""
    repo = tmp_path / "r.git"
    git("init", "-q", "--bare", str(repo))
    blobs = [git("hash-object", "-w", "--stdin", cwd=repo, stdin=f"blob {n}\n".encode() * 500) for n in range(3)]
    git("repack", "-q", cwd=repo)  # nothing reachable: the pack is empty, the loose blobs stay
    pack_of = git("pack-objects", "-q", str(repo / "objects" / "pack" / "pack"), cwd=repo, stdin=blobs[0].encode())
    assert damaged_objects(repo) == []
    loose = repo / "objects" / blobs[1][:2] / blobs[1][2:]
    loose.chmod(0o644)
    loose.write_bytes(loose.read_bytes()[:10])
    pack = repo / "objects" / "pack" / f"pack-{pack_of}.pack"
    pack.chmod(0o644)
    with open(pack, "r+b") as handle:
        handle.truncate(pack.stat().st_size - 1)
    (repo / "objects" / "pack" / "pack-0.pack").write_bytes(b"PACK")  # no index: not git's either
    assert damaged_objects(repo) == [pack, loose]
