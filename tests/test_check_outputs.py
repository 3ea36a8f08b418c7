"""Where `envbuild check` writes (``--report DIR``, ``--history FILE``) on a disk that refuses writes: found
before anything runs when it already does (exit 2, one line naming the option), and, when a write fails
late, the answer is still printed and the rest written, with the file the user named in the error.

The disk is a real tmpfs remounted read-only (:mod:`tests.lib.tmpfs`); the check ends early and without an
engine (``DOCKER_HOST`` names no socket), which is one of the outcomes it answers for in full.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild.cli import main as envbuild
from tests.lib.historylines import line
from tests.lib.tmpfs import MiB, mounted_tmpfs

REPORTS = ["check.html", "check.json", "check.md"]
Check = Callable[..., tuple[int, str, str]]


@pytest.fixture
def check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Check:
    """``envbuild check`` of a lock without sources, no engine answering: (exit status, stdout, stderr)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    lock = tmp_path / "tiny.lock.yaml"
    lock.write_text("version: 1\nname: tiny\nsources: []\n")

    def run(*argv: str) -> tuple[int, str, str]:
        code = envbuild(
            ["check", str(lock), "--offline", "--json", "-q", "--cache-dir", str(tmp_path / "cache"), *argv]
        )
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.mark.parametrize("option", ["--report", "--history"])
def test_an_output_on_a_read_only_disk_is_refused_before_anything_runs(
    option: str, check: Check, tmp_path: Path
) -> None:
    with mounted_tmpfs(tmp_path / "disk", MiB) as disk:
        (disk.path / "h.jsonl").write_text(line())
        (disk.path / "report").mkdir()
        disk.remount("ro")
        named = disk.path / ("report" if option == "--report" else "h.jsonl")
        others = {"--report": tmp_path / "report", "--history": tmp_path / "h.jsonl"}
        others[option] = named
        code, out, err = check(*(word for pair in others.items() for word in map(str, pair)))
        assert (code, out, err) == (
            2,
            "",
            f"envbuild: error: {option} {named}: cannot be written (Read-only file system)\n",
        )
        assert (disk.path / "h.jsonl").read_text() == line() and list((disk.path / "report").iterdir()) == []
    assert not (tmp_path / "report").exists() and not (tmp_path / "h.jsonl").exists()  # nothing ran


def test_a_history_that_fails_late_still_gives_the_answer_and_names_the_history(
    check: Check, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk turned read-only during the hour of building (the up-front check passed; here it is left
    out): the JSON is printed, the three reports are written, and the error names the history."""
    monkeypatch.setattr("envbuild.cli.check.check_outputs", lambda report, history: None)
    with mounted_tmpfs(tmp_path / "disk", MiB) as disk:
        history = disk.path / "h.jsonl"
        history.write_text(line())
        disk.remount("ro")
        code, out, err = check("--report", str(tmp_path / "report"), "--history", str(history))
        assert history.read_text() == line()
    reason = f"{history}: cannot append: Read-only file system"
    assert (code, err) == (1, f"envbuild: error: --history {reason}\n")
    answer = json.loads(out)
    assert (answer["failed_stage"], answer["history_error"]) == ("engine", reason)
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == REPORTS
    assert json.loads((tmp_path / "report" / "check.json").read_text()) == answer


def test_reports_that_fail_late_still_give_the_answer_and_the_history_line(
    check: Check, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("envbuild.cli.check.check_outputs", lambda report, history: None)
    history = tmp_path / "h.jsonl"
    with mounted_tmpfs(tmp_path / "disk", MiB) as disk:
        report = disk.path / "report"
        report.mkdir()
        disk.remount("ro")
        code, out, err = check("--report", str(report), "--history", str(history))
        assert list(report.iterdir()) == []
    assert code == 1
    assert err == "".join(f"envbuild: error: --report {report / name}: cannot be written (Read-only file system)\n"
                          for name in ["check.json", "check.md", "check.html"])  # fmt: skip
    assert json.loads(out)["failed_stage"] == "engine"
    assert json.loads(history.read_text())["failed_stage"] == "engine"
