"""Output fits a terminal: tables wrap their reasons to the width, never cut a word, and a long name takes a
line to itself rather than widening every row; `check` prints a summary and leaves the table to its
report; `--json` is the same at every width. Held against the shape of the real GLM-5.2 lock: its names
(the base image's 75-character reference), its recorded reasons and waivers, as verify reports them on a
machine without GitHub."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from envbuild.check.report import CheckFailure, CheckReport, Difference, FileDifference, render_markdown
from envbuild.cli import main
from envbuild.cli.common import render_json
from envbuild.cli.width import output_width
from envbuild.lock import read_lock
from envbuild.lock.diff import Change, render_changes
from envbuild.lock.model import Submodule
from envbuild.terminal import render_table, words, wrap
from envbuild.verify.render import render_verify
from envbuild.verify.results import PinResult, VerifyReport

GLM = Path(__file__).resolve().parents[1] / "lockfiles" / "glm5_2-ascend.lock.yaml"
WIDTHS = (40, 60, 80, 100, 120, 200)


def glm_report() -> VerifyReport:
    """Verify's rows for the real lock where GitHub is out of reach (as the README describes them): every
    source unreachable, the recorded reasons for unknown submodules and requirements, every waiver with
    its reason, one package on Ascend's own index unreachable, the base image unpinned."""
    lock = read_lock(GLM).lock
    rows = [PinResult("source", s.name, "unreachable", "Could not resolve host: github.com") for s in lock.sources]

    def submodules(prefix: str, subs: tuple[Submodule, ...]) -> list[PinResult]:
        found = []
        for sub in subs:
            name = f"{prefix}/{sub.path}"
            found += [PinResult("submodule", name, "unreachable", "Could not resolve host: github.com")]
            found += submodules(name, sub.submodules)
        return found

    for source in lock.sources:
        if source.submodules_unknown:
            rows.append(PinResult("submodule", source.name, "unknown", source.submodules_unknown))
        rows += submodules(source.name, source.submodules)
    for package in lock.packages:
        if package.name == "triton-ascend":
            detail = f"index {package.index or lock.index} out of reach: host name does not resolve"
            rows.append(PinResult("package", package.name, "unreachable", detail))
        else:
            rows.append(PinResult("package", package.name, "ok"))
    for source in lock.sources:
        if source.requires_unknown:
            rows.append(PinResult("requirement", source.name, "unknown", f"build requirements not known: {source.requires_unknown}"))  # fmt: skip
            rows.append(PinResult("requirement", source.name, "unknown", f"requirements not known: {source.requires_unknown}"))  # fmt: skip
        for waiver in source.waive:
            rows.append(PinResult("requirement", source.name, "waived", f"requires {waiver.name}: waived: {waiver.reason}"))  # fmt: skip
        rows += [PinResult("requirement", source.name, "ok", f"requires {r}") for r in source.requires or ()]
    assert lock.base_image is not None
    rows.append(
        PinResult(
            "base_image",
            lock.base_image.name,
            "unpinned",
            f"no digest recorded: the tag can move; `envbuild lock update {GLM.name}` pins the digest its registry serves",
        )
    )
    return VerifyReport("lockfiles/glm5_2-ascend.lock.yaml", tuple(rows))


def assert_fits(text: str, width: int) -> None:
    """No line wider than ``width``, but one that holds a single unbreakable word (or backquoted
    command) longer than the width, alone."""
    for line in text.splitlines():
        if len(line) > width:
            assert len(words(line)) == 1 and len(line.strip()) > width, (width, line)


def joined(text: str) -> str:
    return " ".join(text.split())


def assert_whole(text: str, reasons: list[str]) -> None:
    """Each reason's words appear in the output, in order and together: nothing cut, nothing torn apart."""
    out = joined(text)
    for reason in reasons:
        assert joined(reason) in out, reason


@pytest.mark.parametrize("width", WIDTHS)
def test_the_glm_verify_table_fits_the_width_and_keeps_every_word(width: int) -> None:
    report = glm_report()
    text = render_verify(report, width)
    assert_fits(text, width)
    shown = [r.detail for r in report.results if r.detail and (r.status != "ok" or r.kind not in ("package", "requirement"))]  # fmt: skip
    assert_whole(text, shown)
    assert_whole(text, [r.name for r in report.results if r.kind in ("source", "submodule", "base_image")])


def test_at_80_columns_a_long_name_stands_alone_and_does_not_widen_the_name_column() -> None:
    report = glm_report()
    lines = render_verify(report, 80).splitlines()
    base = report.results[-1].name
    assert len(base) > 70
    header = lines[0]
    assert header.index("STATUS") - header.index("NAME") < 30  # the column fits the names, not the reference
    assert base in [line.strip() for line in lines]  # its own line
    row = next(i for i, line in enumerate(lines) if line.startswith("source       vllm "))
    assert lines[row].split() == ["source", "vllm", "unreachable", "Could", "not", "resolve", "host:", "github.com"]


def test_without_a_width_every_row_is_one_line_and_no_reason_is_cut() -> None:
    report = glm_report()
    text = render_verify(report)
    for result in report.results:
        if result.kind in ("source", "submodule", "base_image"):
            assert any(result.name in line and line.endswith(result.detail) for line in text.splitlines()), result
    assert "…" not in text
    assert text.splitlines()[-1].startswith("hint: where the upstream git hosts are out of reach")


def test_a_command_in_backquotes_is_never_broken() -> None:
    command = "`envbuild lock fetch l.yaml --cache-dir /a/long/cache/directory --mirror git://a/=git://b/`"
    text = render_table(("KIND", "NAME", "DETAIL"), [("source", "alpha", f"not in the cache: run {command} first")], 50)
    assert command in [line.strip() for line in text.splitlines()]  # on a line of its own, whole
    assert_fits(text, 50)
    assert wrap(f"hint: {command}", 40).splitlines()[1] == command  # longer than the width: alone, unindented


def test_wrap_indents_continuations_under_the_line() -> None:
    text = wrap("    requires: + " + "word " * 30, 40, indent="    ")
    lines = text.splitlines()
    assert all(len(line) <= 40 for line in lines) and lines[0].startswith("    requires: + word")
    assert all(line.startswith("        word") for line in lines[1:])
    assert wrap("one line", None) == "one line" and wrap("a\nb", 10) == "a\nb"


def test_lock_diff_wraps_long_lines_and_keeps_them_whole_without_a_width() -> None:
    spec = 'nvidia-modelopt[torch]>=0.44; sys_platform != "darwin" and extra == "dev"'
    change = Change("source", "megatron-lm", "changed", (("requires", "", spec), ("commit", "a" * 40, "b" * 40)))
    assert render_changes([change]).splitlines()[1] == f"    requires: + {spec}"
    text = render_changes([change], 60)
    assert_fits(text, 60)
    assert_whole(text, [spec, f"commit: {'a' * 40} -> {'b' * 40}"])


# ---- the CLI: the width read from the terminal or COLUMNS, and --json the same at every width ----------


@pytest.fixture
def glm_verify(monkeypatch: pytest.MonkeyPatch) -> VerifyReport:
    report = glm_report()
    monkeypatch.setattr("envbuild.verify.pins.verify_lock", lambda *args, **kwargs: report)
    return report


class Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


def test_the_width_is_the_terminals_and_a_pipe_is_not_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert output_width(Stream(terminal=True)) == 80
    assert output_width(Stream(terminal=False)) is None  # COLUMNS alone: exported where no one chose it
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr("os.get_terminal_size", no_size)
    assert output_width(Stream(terminal=True)) == 100  # a terminal that does not say its size


def no_size(*args: object) -> os.terminal_size:
    raise OSError("Inappropriate ioctl for device")


def as_terminal(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    """stdout (pytest's capture) as a terminal of ``columns`` columns."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", str(columns))


def test_lock_verify_fits_the_terminal_and_its_json_is_the_same_at_every_width(
    glm_verify: VerifyReport, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["lock", "verify", str(GLM), "-q", "--cache-dir", str(tmp_path)]
    assert main(argv) == 1  # not a terminal: a row per line, for grep
    assert capsys.readouterr().out == render_verify(glm_verify)
    assert main([*argv, "--json"]) == 1
    outputs = [capsys.readouterr().out]
    for columns in (40, 80, 300):
        as_terminal(monkeypatch, columns)
        assert main(argv) == 1
        assert_fits(capsys.readouterr().out, columns)
        assert main([*argv, "--json"]) == 1
        outputs.append(capsys.readouterr().out)
    assert outputs == [render_json(glm_verify.to_json())] * 4


def check_report(verify: VerifyReport) -> CheckReport:
    failing = [f"{r.kind} {r.name}: {r.status}" for r in verify.results if not r.passes()]
    reason = "the lock fails verify (" + "; ".join(failing) + "), so no image was built"
    return CheckReport(verify, False, failure=CheckFailure("verify", reason))


def test_check_prints_a_summary_and_writes_the_table_to_its_report(
    glm_verify: VerifyReport, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    report = check_report(glm_verify)
    monkeypatch.setattr("envbuild.check.run.run_check", lambda *args, **kwargs: report)
    as_terminal(monkeypatch, 80)
    cache = tmp_path / "cache"
    assert main(["check", str(GLM), "-q", "--cache-dir", str(cache)]) == 1
    out = capsys.readouterr().out
    directory = cache / "check" / "glm5_2-grpo-ascend"  # no --report: beside the check's work, per lock
    assert (directory / "check.md").read_text() == render_markdown(report)
    assert len(render_markdown(report).splitlines()) > len(glm_verify.results)  # every pin's row is the report's
    assert_fits(out, 80)
    lines = out.splitlines()
    assert lines[0].startswith("FAILED: lockfiles/glm5_2-ascend.lock.yaml: stopped at verify")
    assert len(lines) < 40 and "| kind |" not in out
    failing = [r for r in glm_verify.results if not r.passes()]
    assert_whole(out, [r.detail for r in failing] + ["sources 9 unreachable;"])
    assert not any(r.detail in joined(out) for r in glm_verify.results if r.passes() and r.detail)  # warnings: counted
    assert joined(out).endswith(f"full report: {directory / 'check.md'} (check.json and check.html beside it)")

    report_dir = tmp_path / "report"
    outputs = []
    for columns in (40, 200):
        as_terminal(monkeypatch, columns)
        assert main(["check", str(GLM), "--json", "-q", "--report", str(report_dir), "--cache-dir", str(cache)]) == 1
        outputs.append(capsys.readouterr().out)
    assert outputs == [render_json(report.to_json())] * 2 == [(report_dir / "check.json").read_text()] * 2


def test_the_check_summary_names_what_did_not_reproduce() -> None:
    verify = VerifyReport("l.yaml", (PinResult("source", "a", "ok"),))
    files = tuple(FileDifference(f"/opt/site-packages/stamp/file{i}", "changed", ("content",)) for i in range(12))
    diff = Difference("layer 3 (RUN pip install)", "sha256:" + "1" * 64, "sha256:" + "2" * 64, files, omitted=5)
    from envbuild.check.report import render_summary

    report = CheckReport(verify, False, ("sha256:" + "a" * 64, "sha256:" + "b" * 64), (diff,), "second build")
    text = render_summary(report, "r/check.md", 80)
    assert_fits(text, 80)
    assert text.startswith("FAILED: l.yaml: the image did not reproduce\npins: sources 1 ok\n\nimage did not reproduce")
    assert "file9 (content)" in text and "file10" not in text and "… and 7 more" in text
    ok = CheckReport(verify, True, ("sha256:" + "a" * 64,) * 2, compared_with="history")
    assert render_summary(ok, "r/check.md").startswith("OK: l.yaml: every pin holds and the image reproduced\n")


def test_envrun_plan_wraps_a_preflight_reason_and_keeps_its_command_whole() -> None:
    from envrun.plan import RunPlan
    from envrun.planview import render_plan_text
    from envrun.preflightline import PreflightLine

    reason = "the model directory holds no config.json: " + " ".join(f"shard-{i:05d}.safetensors" for i in range(8))
    argv = ("python3", "-m", "verl.trainer.main_ppo", *(f"trainer.option_{i}=value_{i}" for i in range(12)))
    plan = RunPlan(
        recipe="grpo-glm5", argv=argv, env={}, backend="local", image=None, lock_file="l.yaml",
        lock_sha256="0" * 64, config_name="c", overrides=(), model=None, data_files=(), lenient_checkpoint=False,
        run_dir=Path("/runs/r1"), preflight=(PreflightLine("model", "fail", reason),),
    )  # fmt: skip
    assert f"  fail model: {reason}" in render_plan_text(plan).splitlines()
    text = render_plan_text(plan, 60)
    preflight = text.split("preflight:\n")[1]
    assert_fits(preflight, 60)
    assert len(preflight.splitlines()) > 1
    assert all(line.startswith("       ") for line in preflight.splitlines()[1:])  # under the check's name
    assert_whole(preflight, [reason])
    assert all(f"  {arg}" in text.splitlines() for arg in argv)  # the command: one argument a line, as before
