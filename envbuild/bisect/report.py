"""A bisect's result as a person reads it: text for a terminal, Markdown for ``--report`` (a CI job summary),
each listing every build. Pure. Subjects and reasons come from upstreams and builds: escaped."""

from __future__ import annotations

from envbuild.bisect.result import BisectResult, Step, differing, forward_difference
from envbuild.bisect.steps import Unit, describe
from envbuild.escape import for_markdown, for_terminal
from envbuild.terminal import render_table, wrap

HEADLINES = {
    "found": "FOUND",
    "ambiguous": "NOT PINNED DOWN",
    "bad-passes": "NOTHING TO BISECT",
    "bad-unbuildable": "NOTHING TO BISECT",
    "good-fails": "NOTHING TO BISECT",
    "deadline": "STOPPED AT THE DEADLINE",
    "stopped": "STOPPED",
}


def headline(result: BisectResult) -> str:
    culprit = result.culprit
    head = f"{HEADLINES[result.outcome]}: {result.good} → {result.bad}"
    if culprit is None:
        return f"{head}: {result.stopped}" if result.stopped else head
    what = culprit.unit.label
    if culprit.commit is not None:
        commit = culprit.commit
        dated = f" ({commit.author_date})" if commit.author_date else ""
        said = f" {commit.subject!r}" if commit.subject else ""
        what += f" commit {commit.commit}{said}{dated}, {culprit.position} of {len(culprit.unit.commits)}"
    return f"{head}: {what}"


def title(result: BisectResult) -> str:
    """One line naming what broke (an issue's title): ``source beta commit 684ed0665217 'subject'``."""
    culprit = result.culprit
    if culprit is None:
        return HEADLINES[result.outcome].lower()
    what = culprit.unit.label
    if culprit.commit is not None:
        said = f" {culprit.commit.subject!r}" if culprit.commit.subject else ""
        what += f" commit {culprit.commit.commit[:12]}{said}"
    return f"{what} breaks it"


def unit_row(unit: Unit) -> list[str]:
    counted = f" ({len(unit.commits)} commits)" if unit.commits else ""
    before, after = describe(unit.before), describe(unit.after)
    if before == after:  # the same pin, other recorded fields: say which
        return [unit.label, f"{before}; changed: {', '.join(differing(unit.before, unit.after)) or 'nothing shown'}"]
    return [unit.label, f"{before} → {after}{counted}"]


def _step_row(step: Step) -> list[str]:
    what = step.what
    if step.commit is not None and step.commit.subject:
        what += f" {step.commit.subject!r}"
    verdict = step.verdict + (" (answered from its record)" if step.answered else "")
    return [str(step.number), what, verdict, f"{step.seconds:.1f}", step.reason]


def _counts(result: BisectResult) -> str:
    parents = "first-parent" if result.first_parent else "every commit"
    return (
        f"{len(result.steps)} builds (at most {result.planned} planned) over {result.states} states "
        f"({parents}) in {result.seconds:.0f} s"
    )


def _forward_lines(result: BisectResult, written: str | None) -> list[str]:
    if result.forward is None or result.culprit is None:
        return []
    after = result.units[result.units.index(result.culprit.unit) + 1 :]
    built = (
        f"built and passed in build {result.forward_step}"
        if result.forward_step is not None
        else f"not built: {', '.join(u.label for u in after)} came after it in the order, built only with it broken"
        if after
        else "not built: it is GOOD's state, taken as good (--assume-good)"
    )
    where = f"written to {written}" if written else "not written (--write-lock FILE writes it)"
    said = f"the lock that goes forward: BAD with {result.culprit.unit.label} at its last good value; {where}; {built}"
    return [said, *(f"  {line}" for line in forward_difference(result))]


def render_text(result: BisectResult, width: int | None = None, written: str | None = None) -> str:
    """What a person reads at the end: the headline, the reason, the changes, every build, the forward
    lock (``written``: where it went)."""
    lines = [wrap(for_terminal(headline(result)), width)]
    culprit = result.culprit
    if culprit is not None:
        lines.append(wrap(for_terminal(f"  fails: {culprit.reason}"), width))
        if culprit.last_good:
            lines.append(wrap(f"  last good commit: {culprit.last_good}", width))
    if result.candidates:
        lines.append(wrap(for_terminal(f"  the first bad is one of: {'; '.join(result.candidates)}"), width))
    if result.stopped and culprit is not None:
        lines.append(wrap(for_terminal(f"  {result.stopped}"), width))
    lines.append(f"  {_counts(result)}")
    lines += ["", "changes, in the order tried:"]
    lines.append(render_table(["CHANGE", "GOOD → BAD"], [unit_row(u) for u in result.units], width).rstrip("\n"))
    lines += [wrap(for_terminal(f"note: {u.label}: {u.note}"), width) for u in result.units if u.note]
    lines += ["", "builds:"]
    rows = [[for_terminal(cell) for cell in _step_row(s)] for s in result.steps]
    lines.append(render_table(["#", "CANDIDATE", "VERDICT", "SECONDS", "REASON"], rows, width).rstrip("\n"))
    forward = _forward_lines(result, written)
    if forward:
        lines += ["", *(wrap(for_terminal(line), width) for line in forward)]
    return "\n".join(lines) + "\n"


def render_markdown(result: BisectResult, written: str | None = None) -> str:
    """The report ``--report FILE`` writes: the same, every build a row of a table."""

    def cell(text: str) -> str:
        return for_markdown(text) or " "

    lines = [f"# envbuild bisect: {cell(title(result))}", "", cell(headline(result)), ""]
    culprit = result.culprit
    if culprit is not None:
        lines.append(f"- fails: {cell(culprit.reason)}")
        if culprit.commit is not None:
            lines.append(f"- first bad commit: {for_markdown(culprit.commit.commit, code=True)}")
        if culprit.last_good:
            lines.append(f"- last good commit: {for_markdown(culprit.last_good, code=True)}")
    if result.candidates:
        lines.append(f"- the first bad is one of: {cell('; '.join(result.candidates))}")
    if result.stopped:
        lines.append(f"- {cell(result.stopped)}")
    lines += [f"- {cell(_counts(result))}", "", "## Changes, in the order tried", ""]
    lines += ["| change | GOOD → BAD | note |", "| --- | --- | --- |"]
    lines += [f"| {cell(u.label)} | {cell(unit_row(u)[1])} | {cell(u.note or '')} |" for u in result.units]
    lines += ["", "## Builds", "", "| # | candidate | verdict | seconds | reason |", "| --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(cell(text) for text in _step_row(s)) + " |" for s in result.steps]
    forward = _forward_lines(result, written)
    if forward:
        lines += ["", "## The lock that goes forward", "", cell(forward[0]), ""]
        lines += [f"- {cell(line.strip())}" for line in forward[1:]]
    return "\n".join(lines) + "\n"
