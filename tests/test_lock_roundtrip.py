"""`lock update` over a lock a person wrote keeps what they wrote (comments, order, flow or block style,
quoting) and changes only what it pins; over a lock envbuild wrote, it writes the canonical form. Real
repositories on a real git daemon; the result is read back by the lock's own reader."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import Lock, dump_lock, parse_lock, read_lock
from envbuild.lock.roundtrip import round_trip_text, updated_text
from tests.lib.gitrepos import Served

pytestmark = pytest.mark.gitdaemon

HAND_WRITTEN = """\
# my small lock: two repositories of mine
version: 2
name: small
sources:
# alpha first: beta builds on it
- name: alpha
  repo: {alpha}   # mirrored internally
  ref: main
  ref_type: branch
  commit: '{zeros}'  # any: update pins it
  install: {{mode: editable}}
- name: beta
  repo: {beta}
  ref: v1.0
  ref_type: tag
  commit: '{zeros}'
  install: {{mode: editable}}   # editable: I hack on it
"""


def test_update_keeps_a_hand_written_locks_comments_and_changes_only_the_pins(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commits = {}
    for name in ("rt-alpha", "rt-beta"):
        repo = served.repo(name)
        commits[name] = repo.commit(files={"pyproject.toml": f'[project]\nname = "{name}"\nversion = "1.0"\n'})
        repo.tag("v1.0", commits[name])
    lock = tmp_path / "small.lock.yaml"
    url = {n: served.url(n, "daemon-filter") for n in commits}
    lock.write_text(HAND_WRITTEN.format(alpha=url["rt-alpha"], beta=url["rt-beta"], zeros="0" * 40))

    assert main(["lock", "update", str(lock), "--cache-dir", str(tmp_path / "cache"), "-q"]) == 0
    assert "could not be kept" not in capsys.readouterr().err
    text = lock.read_text()
    for comment in (
        "# my small lock: two repositories of mine\n",
        "# alpha first: beta builds on it\n",
        "   # mirrored internally\n",
        "  # any: update pins it\n",
        "# editable: I hack on it\n",
    ):
        assert comment in text, text
    assert "install: {mode: editable" in text  # the flow style a person chose stays
    pinned = read_lock(lock).lock
    assert [s.commit for s in pinned.sources] == [commits["rt-alpha"], commits["rt-beta"]]
    assert all(s.tree is not None and s.provides is not None for s in pinned.sources)
    assert text.index("name: alpha") < text.index("name: beta")

    # Updated again with nothing to change: the file stays byte for byte.
    before = lock.read_bytes()
    assert main(["lock", "update", str(lock), "--cache-dir", str(tmp_path / "cache"), "-q"]) == 0
    assert lock.read_bytes() == before


def test_a_lock_envbuild_wrote_is_written_canonically() -> None:
    old = Lock(version=2, name="canon", sources=())
    new = Lock(version=2, name="canon", sources=(), source_date_epoch=1)
    assert updated_text(dump_lock(old), old, new) == (dump_lock(new), True)


def test_what_cannot_be_kept_faithfully_falls_back_to_the_canonical_form() -> None:
    old = Lock(version=2, name="canon", sources=())
    new = Lock(version=2, name="canon", sources=(), source_date_epoch=1)
    # A document that is not a mapping, and one ruamel.yaml cannot read: no round trip.
    assert round_trip_text("- not a lock\n", new) is None
    assert round_trip_text("version: 2\nname: [unclosed\n", new) is None
    written = "# hand\nversion: 2\nname: canon\nsources: []\n"
    kept = round_trip_text(written, new)
    assert kept is not None and kept.startswith("# hand\n") and "source_date_epoch: 1" in kept
    assert updated_text("- not a lock\n", old, new) == (dump_lock(new), False)


INDENTED = """\
# indented as many people write YAML: each list under its key
version: 2
name: small
platform:
    os: linux
    arch: aarch64
    python: '3.12'
sources:
  - name: alpha   # first
    repo: https://example.org/alpha.git
    ref: main
    ref_type: branch
    commit: '{alpha}'
    install: {{mode: editable}}
    requires:
      - numpy>=2
      - packaging
  - name: beta
    repo: https://example.org/beta.git
    ref: main
    ref_type: branch
    commit: '{beta}'
"""


DEEPER = """\
version: 2
name: small
sources:
    -   name: alpha
        repo: https://example.org/alpha.git
        ref: main
        ref_type: branch
        commit: '{alpha}'
        requires:
            -   numpy>=2
    -   name: beta   # last
        repo: https://example.org/beta.git
        ref: main
        ref_type: branch
        commit: '{beta}'
"""


@pytest.mark.parametrize("template", [INDENTED, DEEPER], ids=["dash-at-2", "dash-at-4"])
def test_an_update_keeps_the_indents_of_a_hand_written_lock(template: str) -> None:
    """Only the moved pin's line differs: once every line of `sources` was re-indented to ruamel's default."""
    written = template.format(alpha="a" * 40, beta="b" * 40)
    old = parse_lock(written)
    new = dataclasses.replace(old, sources=(old.sources[0], dataclasses.replace(old.sources[1], commit="c" * 40)))
    kept = round_trip_text(written, new)
    assert kept is not None
    assert [line for line in difflib.ndiff(written.splitlines(), kept.splitlines()) if line[:1] in "+-"] == [
        line.replace("b" * 40, "c" * 40) if sign == "+" else line
        for sign in "-+"
        for line in [f"{sign} " + next(x for x in written.splitlines() if "b" * 40 in x)]
    ]
