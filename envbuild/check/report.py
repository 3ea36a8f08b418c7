"""The check's typed result and its renderings: JSON (scripts), Markdown (the full report: every pin's
row; the CI job summary), an HTML page with a per-pin x per-night status grid drawn from the history, and
the short summary a person reads in a terminal. All pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from envbuild.check.history import HistoryEntry
from envbuild.data.jsonout import fields_json, jfield, json_meta
from envbuild.data.urls import redact_urls
from envbuild.escape import for_html, for_markdown, for_terminal
from envbuild.terminal import render_table, wrap
from envbuild.verify.render import summarise, table_row
from envbuild.verify.results import VerifyReport


@dataclass(frozen=True)
class FileDifference:
    path: str
    change: Literal["added", "removed", "changed"]
    aspects: tuple[str, ...] = ()  # content, size, mode, owner, mtime, type, link
    first_difference: str | None = None  # for text files: where the bytes first differ, and both sides


@dataclass(frozen=True)
class Difference:
    """One part of the image that differs between two builds: a layer, or the image config."""

    where: str  # "layer 3" or "config"
    old: str = ""  # layer digest or config value
    new: str = ""
    files: tuple[FileDifference, ...] = ()
    omitted: int = 0  # further file differences not listed


Stage = Literal["history", "verify", "engine", "fetch", "build", "compare"]


@dataclass(frozen=True)
class CheckFailure:
    """The stage at which the check stopped, and why (one line a person can act on); in the report's JSON,
    its keys sit beside the report's own."""

    stage: Stage = field(metadata=json_meta(key="failed_stage"))
    reason: str = field(metadata=json_meta(key="error"))

    def __post_init__(self) -> None:
        # The reason is an error's text (a fetch, a build), written into check.json and check.md: the user
        # part of every URL in it is hidden, as in a verify result's detail.
        object.__setattr__(self, "reason", redact_urls(self.reason))


@dataclass(frozen=True)
class CheckReport:
    verify: VerifyReport
    reproducible: bool
    image_ids: tuple[str, ...] = ()
    differences: tuple[Difference, ...] = ()
    compared_with: str = jfield("", omit="empty")  # "history" or "second build"
    # The check stopped early: at which stage, and why.
    failure: CheckFailure | None = jfield(None, inline=True)
    # This run's line could not be appended to the history, and why (the answer stands; the CLI exits 1).
    history_error: str = jfield("", omit="empty")

    @property
    def ok(self) -> bool:
        return self.failure is None and self.verify.ok and self.reproducible

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **fields_json(self)}


def render_markdown(report: CheckReport) -> str:
    verdict = "✅ every pin holds and the image reproduced" if report.ok else "❌ check failed"
    lines = [f"## envbuild check: {for_markdown(report.verify.lock_path)}", "", f"**{verdict}**", ""]
    lines += ["| kind | name | status | detail |", "| --- | --- | --- | --- |"]
    for r in report.verify.results:
        lines.append(f"| {r.kind} | {for_markdown(r.name)} | `{r.status}` | {for_markdown(r.detail)} |")
    lines.append("")
    if report.failure is not None:
        lines.append(f"**Stopped at {report.failure.stage}:** {for_markdown(report.failure.reason)}")
        if report.image_ids:
            lines.append("")
    if report.image_ids or report.failure is None:
        ids = " vs ".join(for_markdown(i, code=True) for i in report.image_ids)
        state = "reproduced" if report.reproducible else "**did not reproduce**"
        lines.append(f"Image {state} (compared with {report.compared_with or 'a second build'}): {ids}")
    if report.history_error:
        lines += ["", f"**Not recorded in the history:** {for_markdown(report.history_error)}"]
    for diff in report.differences:
        lines += ["", f"### {diff.where} differs", ""]
        if diff.old or diff.new:
            lines.append(f"- before: {for_markdown(diff.old, code=True)}\n- after: {for_markdown(diff.new, code=True)}")
        for f in diff.files:
            aspects = f" ({', '.join(f.aspects)})" if f.aspects else ""
            lines.append(f"- {f.change}: {for_markdown(f.path, code=True)}{aspects}")
            if f.first_difference:
                lines.append(f"  - first difference: {for_markdown(f.first_difference)}")
        if diff.omitted:
            lines.append(f"- … and {diff.omitted} more")
    return "\n".join(lines) + "\n"


# Files named per differing part in the summary; check.md names up to explain's limit.
SUMMARY_FILES = 10


def render_summary(report: CheckReport, report_file: str, width: int | None = None) -> str:
    """What `envbuild check` prints for people, laid out to ``width``: the verdict, the counts per kind
    and status, the pins that fail, what stopped the check or how the image compared (the files of each
    difference, up to :data:`SUMMARY_FILES`), and where the full report is (``report_file``)."""
    verify = report.verify
    lock = for_terminal(verify.lock_path)
    failing = [r for r in verify.results if not r.passes(verify.strict)]
    lines = []
    if report.ok:
        lines.append(f"OK: {lock}: every pin holds and the image reproduced")
    elif report.failure is None:
        lines.append(f"FAILED: {lock}: the image did not reproduce")
    elif report.failure.stage == "verify" and failing:  # the reason lists the rows shown below
        lines.append(f"FAILED: {lock}: stopped at verify: the lock fails verify, so no image was built")
    else:
        first, *rest = [for_terminal(line) for line in report.failure.reason.split("\n")]
        lines += [f"FAILED: {lock}: stopped at {report.failure.stage}: {first}", *rest]
    if verify.results:
        lines.append(f"pins: {summarise(verify)}")
    sections = ["".join(wrap(line, width) + "\n" for line in lines)]
    if failing:
        sections.append(render_table(("KIND", "NAME", "STATUS", "DETAIL"), [table_row(r) for r in failing], width))
    lines = []
    if report.image_ids:
        state = "reproduced" if report.reproducible else "did not reproduce"
        compared = report.compared_with or "a second build"
        lines.append(f"image {state} (compared with {compared}): {' vs '.join(report.image_ids)}")
    for diff in report.differences:
        lines.append(f"  {for_terminal(diff.where)} differs")
        for f in diff.files[:SUMMARY_FILES]:
            aspects = f" ({', '.join(f.aspects)})" if f.aspects else ""
            lines.append(f"    {f.change}: {for_terminal(f.path)}{aspects}")
        if len(diff.files) + diff.omitted > SUMMARY_FILES:
            lines.append(f"    … and {len(diff.files) + diff.omitted - SUMMARY_FILES} more")
    lines.append(f"full report: {for_terminal(report_file)} (check.json and check.html beside it)")
    sections.append("".join(wrap(line, width) + "\n" for line in lines))
    return "\n".join(sections)  # a blank line between the sections


_COLOURS = {
    "ok": "#2e7d32",
    "behind": "#f9a825",
    "reproduced": "#2e7d32",
    "not reproduced": "#c62828",
    "not built": "#757575",
}
_FAILED_BUILD = ("engine", "fetch", "build", "compare")


def _cell(status: str | None) -> str:
    if status is None:
        return '<td class="none">–</td>'
    colour = _COLOURS.get(status, "#c62828")
    return f'<td style="background:{colour}" title="{for_html(status)}">{for_html(status)}</td>'


def _image_status(entry: HistoryEntry) -> str:
    if entry.failed_stage in _FAILED_BUILD:
        return f"failed: {entry.failed_stage}"
    if entry.reproducible is None:
        return "not built"
    return "reproduced" if entry.reproducible else "not reproduced"


def render_html(history: list[HistoryEntry], lock_path: str, nights: int = 30) -> str:
    """A self-contained page: one row per pin (and one for the image), one column per run."""
    runs = [e for e in history if e.lock == lock_path][-nights:]
    pins = sorted({pin for e in runs for pin in e.pins})
    head = "".join(f"<th>{for_html(e.time[:10])}<br><small>{for_html(e.time[11:16])}</small></th>" for e in runs)
    rows = []
    for pin in pins:
        cells = "".join(_cell(e.pins.get(pin)) for e in runs)
        rows.append(f"<tr><th class=pin>{for_html(pin)}</th>{cells}</tr>")
    image = "".join(_cell(_image_status(e)) for e in runs)
    rows.append(f"<tr><th class=pin>image</th>{image}</tr>")
    title = for_html(f"envbuild check: {lock_path}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 4px 6px; text-align: center; }}
td {{ color: #fff; font-size: 12px; }}
td.none {{ color: #999; }}
th.pin {{ text-align: left; font-family: monospace; }}
</style></head>
<body><h1>{title}</h1>
<p>{len(runs)} run(s); newest on the right.</p>
<table><tr><th>pin</th>{head}</tr>
{chr(10).join(rows)}
</table></body></html>
"""
