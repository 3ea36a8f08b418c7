"""What a lock and a pinned tree's ``.gitmodules`` say when they are not what envbuild can record, at the
edges no other test reached: a lock whose values are null or of another YAML kind than a choice takes, and a
``.gitmodules`` entry that names no path or whose relative URL climbs above its parent's host. Real files in
``tmp_path``, real repositories on a real git daemon, the CLI as a user calls it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from envbuild.cli import main
from tests.lib.gitrepos import Served

APP = "1a" * 20  # a commit as a lock writes it (all digits would read as an integer)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_null_value_and_a_list_or_mapping_where_a_choice_goes_are_named_where_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty value and ``~`` are null, said as null; a list or a mapping where the lock takes one of a few
    words (the platform's arch, a ref type, an install mode) is said as a list or a mapping, with the words it
    takes. Every problem at once, exit 2, the lock as it was and no cache made."""
    lock = tmp_path / "kinds.lock.yaml"
    lock.write_text(
        textwrap.dedent(f"""\
        version: 2
        name:
        platform: {{os: linux, arch: [x86_64], python: "3.11"}}
        sources:
          - name: app
            repo: https://example.invalid/app.git
            ref: ~
            ref_type: {{branch: main}}
            commit: {APP}
            install: {{mode: [editable]}}
        """)
    )
    before = lock.read_bytes()

    code, out, err = run(capsys, "lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"))

    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"envbuild: error: {lock}:2: name: expected a string, got null (quote it to make it a string)",
        f"envbuild: error: {lock}:3: platform.arch: expected one of aarch64 | x86_64, got a list",
        f"envbuild: error: {lock}:7: sources[0].ref: expected a string, got null (quote it to make it a string)",
        f"envbuild: error: {lock}:8: sources[0].ref_type: expected one of branch | tag, got a mapping",
        f"envbuild: error: {lock}:10: sources[0].install.mode: expected one of editable | wheel | none, got a list",
    ]
    assert lock.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kinds.lock.yaml"]


@pytest.mark.gitdaemon
def test_a_gitmodules_entry_without_a_path_and_a_url_above_the_host_refuse_the_update(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tree whose ``.gitmodules`` names a submodule with a URL but no path, and pairs a gitlink with a
    relative URL of more ``../`` than the parent's URL has components (git dies on it too, in the same
    words): `lock update` refuses both at once, one line each naming the source or the path, exit 2, the lock
    as it was."""
    repo = served.repo("gitmodules-gaps/app")
    repo.commit("app", files={"README.md": "app\n"})
    climbing = "../" * 7 + "lib.git"  # more than git://127.0.0.1:PORT/gitmodules-gaps/app has to drop
    repo.commit_gitlinks("lib as a submodule", {"lib": "2b" * 20}, {"lib": ("lib", climbing)})
    gitmodules = repo.path / ".gitmodules"
    gitmodules.write_text(gitmodules.read_text() + '[submodule "docs"]\n\turl = ../docs.git\n')
    head = repo.commit("docs named without a path", files={})
    url = served.url("gitmodules-gaps/app", "daemon-nofilter")
    lock = tmp_path / "gaps.lock.yaml"
    lock.write_text(
        "version: 2\nname: gaps\nsources:\n"
        f"  - {{name: app, repo: '{url}', ref: main, ref_type: branch, commit: {head}, install: {{mode: none}}}}\n"
    )
    before = lock.read_bytes()

    code, out, err = run(capsys, "lock", "update", str(lock), "--cache-dir", str(tmp_path / "cache"), "-q")

    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "envbuild: error: app/lib: .gitmodules url '../../../../../../../lib.git': cannot strip one component off url '.'",
        "envbuild: error: app: .gitmodules: submodule 'docs' names no path",
    ]
    assert lock.read_bytes() == before
