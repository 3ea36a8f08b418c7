"""`lock update` as the bump, and the change report a reviewer acts on: for each moved source how many commits
it passed over (all, and first-parent), the first and last subjects of the branch's line, a warning when the
old commit is not an ancestor of the new (a force-push, a rewritten branch), and how submodule pairings
changed; on the terminal, in --json, and in Markdown (`--report FILE`, a pull request's body). Real
repositories on a real git daemon, whose branches move on, merge, and are force-pushed."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.escape import for_markdown
from envbuild.lock import read_lock
from tests.lib.gitrepos import Repo, Served, git

pytestmark = pytest.mark.gitdaemon

MEGATRON_PATH = "3rdparty/Megatron-LM"
ESC = "\x1b"
HOSTILE = f"evil | `tick` <script>alert(1)</script> {ESC}[31mred{ESC}[0m [link](http://x) *em* # h"


@dataclass
class Bump:
    """Upstreams named after the test, a lock of them (branch ``main`` each, copied only) and its cache."""

    served: Served
    tmp: Path
    repos: dict[str, Repo]
    lock: Path

    def url(self, name: str) -> str:
        return self.served.url(f"{self.tmp.name}-{name}", "daemon-filter")

    def run(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
        code = main([*args, "--cache-dir", str(self.tmp / "cache"), "-q"])
        out, err = capsys.readouterr()
        assert ESC not in out + err  # an upstream's escape sequence never reaches the terminal
        assert code != 2, err  # not a usage error
        return code, out

    def update(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
        return self.run(capsys, "lock", "update", str(self.lock), *args)

    def changes(self, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict]:
        """`lock update --json`'s changes, by name."""
        code, out = self.update(capsys, "--json", *args)
        assert code == 0
        return {c["name"]: c for c in json.loads(out)["changes"]}


def bump(served: Served, tmp: Path, names: tuple[str, ...]) -> Bump:
    """Upstreams ``names``, one commit each; shape them further, then :func:`write_lock`."""
    repos = {name: served.repo(f"{tmp.name}-{name}") for name in names}
    for name, repo in repos.items():
        repo.commit(f"{name}: start")
    return Bump(served, tmp, repos, tmp / "bump.lock.yaml")


def write_lock(b: Bump, submodules: dict[str, str] | None = None) -> None:
    """The lock of every upstream at the head of main; ``submodules``: {source: the submodule path it skips}."""
    entries = []
    for name, repo in b.repos.items():
        skip = (submodules or {}).get(name)
        entries.append(
            textwrap.dedent(f"""\
              - name: {name}
                repo: {b.url(name)}
                ref: main
                ref_type: branch
                commit: {repo.rev("main")}
                install: {{mode: none}}
            """)
            + (f"  submodules:\n    - {{path: {skip}, skip: the megatron source provides it}}\n" if skip else "")
        )
    b.lock.write_text("version: 2\nname: bump\nsources:\n" + "".join(entries))


@pytest.fixture()
def moved(served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Bump, dict[str, str]]:
    """alpha pinned at its start, cached; then main gains a commit, a merge of a two-commit branch and a
    commit: five commits, three of them first-parent."""
    b = bump(served, tmp_path, ("alpha",))
    write_lock(b)
    assert b.update(capsys)[0] == 0
    alpha = b.repos["alpha"]
    old = alpha.rev("main")
    alpha.checkout("feature", create_at=old)
    alpha.commit("feature one")
    alpha.commit("feature two")
    alpha.checkout("main")
    first = alpha.commit("first on main")
    git("merge", "-q", "--no-ff", "-m", "Merge branch feature", "feature", cwd=alpha.path)
    last = alpha.commit("last on main")
    return b, {"old": old, "first": first, "last": last}


def test_a_moved_source_says_its_commits_and_the_first_and_last_subjects(
    moved: tuple[Bump, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    b, commits = moved
    code, out = b.update(capsys, "--dry-run")
    assert code == 0
    assert f"    commit: {commits['old']} -> {commits['last']} (5 commits, first-parent 3)\n" in out
    day = r"\(\d{4}-\d\d-\d\d\)"
    assert re.search(rf"\n    first: first on main {day}\n    last: last on main {day}\n", out), out
    assert "warning" not in out

    alpha = b.changes(capsys)["alpha"]
    counts = {"commits": 5, "first_parent_commits": 3, "ancestor": True, "dropped_commits": 0}
    assert {key: alpha[key] for key in counts} == counts
    assert (alpha["first"]["commit"], alpha["first"]["subject"]) == (commits["first"], "first on main")
    assert (alpha["last"]["commit"], alpha["last"]["subject"]) == (commits["last"], "last on main")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", alpha["last"]["author_date"])
    assert [f["field"] for f in alpha["fields"]] == ["commit", "tree"]  # the keys it had, kept

    # lock diff of the two locks says the same, from the cache alone (a cache without them cannot tell).
    old_lock = b.tmp / "old.lock.yaml"
    old_lock.write_text(b.lock.read_text().replace(commits["last"], commits["old"]))
    code, out = b.run(capsys, "lock", "diff", str(old_lock), str(b.lock), "--json")
    [change] = json.loads(out)["changes"]
    assert code == 1 and (change["commits"], change["first_parent_commits"], change["ancestor"]) == (5, 3, True)
    assert main(["lock", "diff", str(old_lock), str(b.lock), "--json", "--cache-dir", str(b.tmp / "empty")]) == 1
    [change] = json.loads(capsys.readouterr().out)["changes"]
    assert change["ancestor"] is None and "commits" not in change and "first" not in change


def test_a_force_pushed_branch_is_a_warning(served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = bump(served, tmp_path, ("beta",))
    beta = b.repos["beta"]
    kept = beta.commit("kept")
    dropped = beta.commit("dropped by the force-push")
    write_lock(b)
    assert b.update(capsys)[0] == 0  # pinned at `dropped`, in the cache
    beta.force_branch("main", kept)
    new = beta.commit("rewritten")

    beta_change = b.changes(capsys, "--dry-run")["beta"]
    assert (beta_change["ancestor"], beta_change["dropped_commits"], beta_change["commits"]) == (False, 1, 1)
    assert beta_change["last"]["subject"] == beta_change["first"]["subject"] == "rewritten"
    # A fresh cache (the nightly's) holds the new commit's whole history, and the old commit is not in it:
    # no ancestor, though how much it lost is not known there.
    fresh = ["lock", "update", str(b.lock), "--dry-run", "--cache-dir", str(tmp_path / "fresh"), "-q"]
    assert main([*fresh, "--json"]) == 0
    [fresh_change] = json.loads(capsys.readouterr().out)["changes"]
    assert fresh_change["ancestor"] is False and fresh_change["first"] is None
    assert (fresh_change["last"]["commit"], fresh_change["last"]["subject"]) == (new, "rewritten")
    assert "commits" not in fresh_change and "dropped_commits" not in fresh_change
    assert main(fresh) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"commit: {dropped} -> {new} last: rewritten (" in out
    assert "the branch was force-pushed or rewritten; the old commit is not in the new one's history (nor in" in out

    code, out = b.update(capsys, "--report", str(tmp_path / "body.md"))
    assert code == 0
    assert (
        f"warning: {dropped} is not an ancestor of {new}: the branch was force-pushed or rewritten; the old "
        "commit's history is not in the new one (1 commit of it missing)"
    ) in " ".join(out.split())  # however the terminal's width wraps it
    body = (tmp_path / "body.md").read_text()
    assert "1 source moved (1 not from the old commit's history)" in body
    [row] = [line for line in body.splitlines() if line.startswith("| beta |")]
    assert "⚠️ the branch was force-pushed or rewritten" in row and f"`{dropped[:12]}` → `{new[:12]}`" in row


def test_a_submodule_pairing_that_changes_is_said(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bridge's gitlink pins megatron eight commits behind the megatron source's pin; then bridge moves its
    gitlink to that pin: the pairing goes from contained, 8 ahead, to the same commit."""
    b = bump(served, tmp_path, ("bridge", "megatron"))
    megatron = b.repos["megatron"]
    history = [megatron.commit(f"megatron {n}") for n in range(9)]
    bridge = b.repos["bridge"]
    gitmodules = {"Megatron-LM": (MEGATRON_PATH, b.url("megatron"))}
    bridge.commit_gitlinks("Megatron-LM as a submodule", {MEGATRON_PATH: history[0]}, gitmodules)
    write_lock(b, {"bridge": MEGATRON_PATH})
    assert b.update(capsys)[0] == 0
    (record,) = read_lock(b.lock).lock.source("bridge").submodules
    assert record.commit == history[0]
    bridge.commit_gitlinks("bump Megatron-LM", {MEGATRON_PATH: history[-1]})

    code, out = b.update(capsys, "--dry-run")
    assert code == 0
    said = (
        f"    pairing: bridge/{MEGATRON_PATH}: contained in source megatron's pin, 8 commits ahead -> the same "
        "commit as source megatron's pin"
    )
    assert said in out, out
    [pairing] = b.changes(capsys, "--report", str(tmp_path / "body.md"))["bridge"]["pairings"]
    assert pairing == {
        "submodule": f"bridge/{MEGATRON_PATH}",
        "before": {
            "source": "megatron",
            "commit": history[-1],
            "submodule_commit": history[0],
            "relation": "contained",
            "ahead": 8,
        },
        "after": {"source": "megatron", "commit": history[-1], "submodule_commit": history[-1], "relation": "same"},
    }
    body = (tmp_path / "body.md").read_text()
    assert (
        "### Submodule pairings\n\n"
        f"- `bridge/{MEGATRON_PATH}`: contained in source megatron's pin, 8 commits ahead → the same commit as "
        "source megatron's pin\n"
    ) in body
    # Moved together, the two pins relate as before: nothing to say.
    megatron.commit("megatron 9")
    bridge.commit_gitlinks("follow Megatron-LM", {MEGATRON_PATH: megatron.rev("main")})
    changes = b.changes(capsys)
    assert set(changes) == {"bridge", "megatron"} and "pairings" not in changes["bridge"]


def test_the_report_is_markdown_whose_table_names_each_moved_source_and_escapes_what_upstream_wrote(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = bump(served, tmp_path, ("gamma", "delta"))
    write_lock(b)
    assert b.update(capsys)[0] == 0
    b.repos["gamma"].commit(HOSTILE)
    b.repos["gamma"].commit("x" * 5000)
    b.repos["delta"].commit("delta moved")
    body, old = tmp_path / "body.md", tmp_path / "old.lock.yaml"
    old.write_bytes(b.lock.read_bytes())

    code, out = b.update(capsys, "--report", str(body))
    assert code == 0 and "\\x1b[31mred" in out  # the escape shown, not sent
    text = body.read_text()
    assert text.startswith(
        f"## envbuild lock update: {for_markdown(str(b.lock))}\n\n2 sources moved.\n\n### Sources moved\n"
    )
    header = "| source | ref | commit | commits | first | last | warning |"
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0] == header and [r.split(" | ")[0] for r in rows[1:]] == ["| ---", "| delta", "| gamma"]
    cells = len(re.findall(r"(?<!\\)\|", header))
    assert all(len(re.findall(r"(?<!\\)\|", row)) == cells for row in rows), rows  # no cell forged
    [gamma] = [row for row in rows if row.startswith("| gamma |")]
    assert "evil \\| \\`tick\\` &lt;script&gt;alert(1)&lt;/script&gt; \\\\x1b\\[31mred" in gamma
    assert "\\[link\\](http://x) \\*em\\* \\# h" in gamma
    assert ESC not in text and "<script>" not in text and "`tick`" not in text
    assert "| 2 (first-parent 2) |" in gamma and "x" * 199 + "…" in gamma and "x" * 200 not in gamma
    # `lock diff` of the same two locks writes the same report, from the cache alone.
    code, _ = b.run(capsys, "lock", "diff", str(old), str(b.lock), "--report", str(tmp_path / "diff.md"))
    title, rest = (tmp_path / "diff.md").read_text().split("\n", 1)
    assert (
        code == 1
        and title == "## " + for_markdown(f"envbuild lock diff: {old} → {b.lock}")
        and rest == text.split("\n", 1)[1]
    )


def test_a_report_that_could_not_be_written_is_refused_before_anything_is_asked(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = bump(served, tmp_path, ("epsilon",))
    write_lock(b)
    b.repos["epsilon"].commit("not asked for")
    before = b.lock.read_bytes()
    for report, said in ((tmp_path, "is a directory"), (tmp_path / "no" / "body.md", "is not a directory")):
        for command in (["update", str(b.lock)], ["diff", str(b.lock), str(b.lock)]):
            offline = ["--offline"] if command[0] == "diff" else []  # an update refuses --offline itself
            assert main(["lock", *command, "--report", str(report), *offline]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"envbuild: error: --report {report}: ") and said in err and err.count("\n") == 1
    assert b.lock.read_bytes() == before
