"""What `lock update` writes passes the lock's own reader, or nothing is written: trees served by a real git
daemon give the three values that once made update write a lock envbuild then refused (#22 item 4), and
each is refused with the reason, exit 1, the old lock byte for byte as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import Lock, Source, read_lock, write_lock
from envbuild.lock.model import Install
from tests.lib.gitrepos import Served

pytestmark = pytest.mark.gitdaemon

# 992 kB, under the reader's 1 MiB; the lock listing them is over it. Few long names rather than many short
# ones: writing and checking the lock costs per name (120,000 names took a minute).
BIG_REQUIREMENTS = "".join(f"p{i:060d}\n" for i in range(16_000))

TREES = {
    "bad-name": (
        {"pyproject.toml": '[project]\nname = "Foo Bar"\nversion = "1.0"\n'},
        "sources[0].provides.name (source 'bad-name'): ",
    ),
    "big-reqs": (
        {
            "pyproject.toml": '[project]\nname = "big-reqs"\nversion = "1.0"\ndynamic = ["dependencies"]\n'
            '[tool.setuptools.dynamic]\ndependencies = {file = ["requirements.txt"]}\n',
            "requirements.txt": BIG_REQUIREMENTS,
        },
        "over the reader's limit of 1 MiB (1,048,576 bytes); the largest source is 'big-reqs'",
    ),
    "ctrl-path": (
        {
            "pyproject.toml": '[project]\nname = "ctrl-path"\nversion = "1.0"\ndynamic = ["dependencies"]\n'
            '[tool.setuptools.dynamic]\ndependencies = {file = ["req\\u0007s.txt"]}\n',
        },
        "sources[0].requires_unknown (source 'ctrl-path'): ",
    ),
}


@pytest.mark.parametrize("name", sorted(TREES))
def test_update_refuses_a_lock_its_reader_would_refuse_and_leaves_the_old_one(
    name: str, served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files, reason = TREES[name]
    repo = served.repo(f"write-check-{name}")
    first = repo.commit(files={"pyproject.toml": f'[project]\nname = "{name}"\nversion = "0.1"\n'})
    repo.commit(files=files)
    path = tmp_path / "w.lock.yaml"
    pinned = Source(
        name=name, repo=served.url(f"write-check-{name}", "daemon-filter"), ref="main", ref_type="branch",
        commit=first, install=Install(),
    )  # fmt: skip
    write_lock(path, Lock(version=2, name="w", sources=(pinned,)))
    path.write_text(path.read_text() + "# a person's note\n")
    before = path.read_bytes()
    capsys.readouterr()

    for dry in ([], ["--dry-run"]):
        assert main(["lock", "update", str(path), *dry, "--cache-dir", str(tmp_path / "cache"), "-q"]) == 1
        err = capsys.readouterr().err
        assert path.read_bytes() == before
        [line] = err.splitlines()
        assert line.startswith(f"envbuild: error: {path}: not written, the old lock is unchanged: ")
        assert reason in line
        assert "\x07" not in line  # the control character is shown escaped, never sent to the terminal
    assert read_lock(path).lock.sources[0].commit == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "w.lock.yaml"]  # no temporary file left


def test_json_says_written_when_the_file_was_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A version 1 lock with nothing to move is rewritten as version 2: `written` says so (it once said
    whether pins changed); a dry run writes nothing and says so; a second update has nothing to write."""
    lock = tmp_path / "old.lock.yaml"
    lock.write_text("version: 1\nname: old\nsources: []\n", encoding="utf-8")
    cache = ["--cache-dir", str(tmp_path / "cache"), "-q"]

    def update(*args: str) -> dict:  # type: ignore[type-arg]
        assert main(["lock", "update", str(lock), "--json", *args, *cache]) == 0
        return json.loads(capsys.readouterr().out)

    assert (update("--dry-run")["written"], read_lock(lock).lock.version) == (False, 1)
    first = update()
    assert (first["written"], first["changes"], read_lock(lock).lock.version) == (True, [], 2)
    assert update()["written"] is False
