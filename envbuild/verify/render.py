"""Pure rendering of a verify report for people: a table, grouped where results are many."""

from __future__ import annotations

from collections.abc import Sequence

from envbuild.escape import for_terminal
from envbuild.verify.results import PinResult, VerifyReport


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], max_width: int = 100) -> str:
    """A plain-text table; the last column is left unpadded and cut at ``max_width`` characters, unless
    it names a command (in backquotes): advice cut short cannot be run as printed."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers[:-1])]
    lines = []
    for row in [list(headers), *[list(r) for r in rows]]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        last = row[-1] if len(row[-1]) <= max_width or "`" in row[-1] else row[-1][: max_width - 1] + "…"
        lines.append("  ".join([*cells, last]).rstrip())
    return "\n".join(lines) + "\n"


# What git says when a host cannot be reached at all (not when it answered and was refused: an fsck
# error or a missing repository is no reason to look for a mirror).
_OUT_OF_REACH = ("could not resolve host", "unable to connect", "connection refused", "connection timed out",
                 "network is unreachable", "no route to host", "timed out")  # fmt: skip


def _out_of_reach(detail: str) -> bool:
    lowered = detail.lower()
    return any(words in lowered for words in _OUT_OF_REACH)


# Kinds with hundreds of results (a real lock has 126 packages and several hundred requirements) are
# grouped in the table: what fails first, then warnings, then waivers (deliberate, so always shown), then
# one row counting the rest. Sources and the base image are few: every one is shown.
GROUPED = ("package", "requirement")
KIND_ORDER = ("source", "submodule", "package", "requirement", "base_image")


def render_verify(report: VerifyReport) -> str:
    rows = []
    for kind in KIND_ORDER:
        results = [r for r in report.results if r.kind == kind]
        if kind not in GROUPED:
            rows += [_row(r) for r in results]
            continue
        failing = [r for r in results if not r.passes()]
        warning = [r for r in results if r.passes() and not r.passes(strict=True)]
        waived = [r for r in results if r.status == "waived"]
        ok = [r for r in results if r.status == "ok"]
        rows += [_row(r) for r in failing + warning + waived]
        if ok:
            more = " more" if len(ok) < len(results) else ""
            rows.append((kind.replace("_", "-"), f"({len(ok)}{more})", "ok", ""))
    verdict = "OK" if report.ok else "FAILED"
    strict = " (strict)" if report.strict else ""
    text = (
        render_table(("KIND", "NAME", "STATUS", "DETAIL"), rows)
        + f"\n{verdict}{strict}: {for_terminal(report.lock_path)}: {_summary(report)}\n"
    )
    if any(r.kind == "source" and r.status == "unreachable" and _out_of_reach(r.detail) for r in report.results):
        text += (
            "hint: where the upstream git hosts are out of reach, verify against internal mirrors with "
            "--mirror FROM=TO (or `mirrors:` in the config file)"
        )
        # --offline only when the cache can answer: on an empty cache it would fail every source again
        text += f"; the cache answers offline: `{report.offline_command}`\n" if report.offline_command else "\n"
    return text


def _row(result: PinResult) -> tuple[str, str, str, str]:
    # Names and details carry what servers, indexes and trees said: escaped here, the one way out.
    return (result.kind.replace("_", "-"), for_terminal(result.name), result.status, for_terminal(result.detail))


def _summary(report: VerifyReport) -> str:
    """Counts per kind and status: `sources 2 ok, 7 unreachable; requirements 250 ok, 3 waived`."""
    parts = []
    for kind in KIND_ORDER:
        counts: dict[str, int] = {}
        for result in report.results:
            if result.kind == kind:
                counts[result.status] = counts.get(result.status, 0) + 1
        if counts:
            label = {"base_image": "base image"}.get(kind, f"{kind}s")
            parts.append(f"{label} " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    return "; ".join(parts) or "nothing to check"
