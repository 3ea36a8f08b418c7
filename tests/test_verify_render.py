"""Rendering verify's results for people: the table, the verdict line and the hint towards mirrors."""

from __future__ import annotations

from envbuild.verify.render import render_verify
from envbuild.verify.results import PinResult, VerifyReport


def report(detail: str) -> VerifyReport:
    return VerifyReport("l.yaml", (PinResult("source", "megatron-lm", "unreachable", detail),))


def test_an_upstream_out_of_reach_points_at_mirrors() -> None:
    text = render_verify(report("Could not resolve host: github.com"))
    assert "FAILED: l.yaml: sources 1 unreachable" in text
    assert "hint: where the upstream git hosts are out of reach" in text


def test_an_upstream_that_answered_and_refused_gets_no_mirror_hint() -> None:
    text = render_verify(report("object 0123: duplicateEntries: contains duplicate file entries"))
    assert "unreachable" in text and "hint:" not in text


def test_a_long_reason_is_wrapped_at_a_width_and_never_cut() -> None:
    detail = "fatal: " + " ".join(f"word{i}" for i in range(60))  # some 420 characters, once cut at 100
    assert detail in render_verify(report(detail))  # no width (a pipe): the row whole, on one line
    text = render_verify(report(detail), 60)
    assert all(len(line) <= 60 for line in text.splitlines())
    assert " ".join(detail.split()) in " ".join(text.split())
