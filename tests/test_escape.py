"""One escape function per medium (envbuild.escape), used by every printer: a server's, an index's or a
tree's text cannot rewrite the terminal, forge a line, or become markup in check.md or check.html."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from envbuild.check.history import HistoryEntry
from envbuild.check.report import CheckFailure, CheckReport, Difference, FileDifference, render_html, render_markdown
from envbuild.cli import main
from envbuild.cli.common import StderrProgress, run
from envbuild.errors import EnvbuildError
from envbuild.escape import for_html, for_markdown, for_terminal
from envbuild.lock import Lock, Package, PackageFile, write_lock
from envbuild.lock.model import Platform
from envbuild.verify.results import PinResult, VerifyReport
from tests.lib.pyindex import PyIndex, make_wheel, wheel_metadata

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202eevil\nforged line\r"
EVIL_NAME = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202eevil"
MARKUP = '<img src=x onerror="alert(1)"> <h1>big</h1> [click](https://evil.example) `code` *bold* | cell'


def test_for_terminal_shows_every_control_escaped_on_one_line() -> None:
    shown = for_terminal(ESCAPES)
    assert shown == "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202eevil\\nforged line\\r"
    assert shown.isprintable() and for_terminal("plain ünïcode text") == "plain ünïcode text"


def test_for_markdown_leaves_no_tag_link_or_cell_boundary() -> None:
    shown = for_markdown(MARKUP + ESCAPES)
    for markup in ("<img", "<h1>", "[click](", "`code`", "*bold*", " | ", "\x1b", "\n"):
        assert markup not in shown, markup
    assert "&lt;img" in shown and "\\[click\\]" in shown and "\\|" in shown


def test_for_html_escapes_markup_and_quotes() -> None:
    assert for_html('<a href="x">\x1b') == "&lt;a href=&quot;x&quot;&gt;\\x1b"


def test_the_verify_table_escapes_what_an_index_sent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: a METADATA `Name:` with escapes, printed raw by `lock verify`'s table."""
    root = tmp_path / "dists"
    root.mkdir()
    make_wheel(root, "alpha", "1.0")
    wheel = "alpha-1.0-py3-none-any.whl"
    with PyIndex(root, metadata=True) as index:
        index.forge_metadata(wheel, wheel_metadata(root / wheel).replace(b"Name: alpha", f"Name: {EVIL_NAME}".encode()))
        lock = tmp_path / "escapes.lock.yaml"
        write_lock(
            lock,
            Lock(
                version=2,
                name="escapes",
                platform=Platform(os="linux", arch="aarch64", python="3.12"),
                index=index.url,
                sources=(),
                packages=(Package("alpha", "1.0", (PackageFile(wheel, index.sha256(wheel)),)),),
            ),
        )
        main(["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache")])
    out, err = capsys.readouterr()
    assert "its metadata is for" in out
    assert "\x1b" not in out + err and "\x9b" not in out + err and "\u202e" not in out + err
    assert "\\x1b]0;owned\\x07" in out


def test_error_lines_and_progress_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="envbuild")

    def fail(args: argparse.Namespace) -> int:
        StderrProgress("envbuild")(f"fetching {ESCAPES}")
        raise EnvbuildError(f"git server said: {ESCAPES}")

    parser.set_defaults(handler=fail)
    assert run("envbuild", parser, []) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x9b" not in err and "\u202e" not in err and "\r" not in err
    # An error's lines are its problems, one each (a ProblemsError, uv's explanation): a newline in a
    # server's text starts another `envbuild: error:` line, never a bare one.
    assert err.splitlines() == [
        f"envbuild: fetching {for_terminal(ESCAPES)}",
        f"envbuild: error: git server said: {for_terminal(ESCAPES.splitlines()[0])}",
        f"envbuild: error: {for_terminal(ESCAPES.splitlines()[1])}",
    ]


def check_report() -> CheckReport:
    verify = VerifyReport(
        "lockfiles/x.lock.yaml",
        (
            PinResult("source", MARKUP, "unreachable", f"git server said: {MARKUP}"),
            PinResult("package", "alpha", "yanked", f"alpha-1.0.whl is yanked: {MARKUP}"),
        ),
    )
    diff = Difference("layer 3", MARKUP, "b", (FileDifference(MARKUP, "changed", ("content",), MARKUP),))
    return CheckReport(verify, False, ("sha256:a", "sha256:b"), (diff,), "history", CheckFailure("fetch", MARKUP))


def test_check_md_renders_no_untrusted_markup() -> None:
    rendered = render_markdown(check_report())
    text = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", rendered)  # code spans show their text as it is
    assert rendered.count("<img") == 2  # the two code spans: a path and a layer digest
    for markup in ("<img", "<h1>", "[click](", "*bold*"):
        assert markup not in text, (markup, text)
    assert all(line.count(" | ") <= 3 for line in text.splitlines() if line.startswith("| "))


def test_check_html_renders_no_untrusted_markup() -> None:
    entry = HistoryEntry(
        "2026-12-01T00:00:00Z", "lock <b>", "0" * 64, False, False, "sha256:" + "1" * 64, {f"source:{MARKUP}": "ok"}
    )
    text = render_html([entry], "lock <b>")
    assert "<img" not in text and "<h1>big" not in text
