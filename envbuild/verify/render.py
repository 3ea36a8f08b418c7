"""Pure rendering of a verify report for people: a table, grouped where results are many, laid out to
the terminal's width (:mod:`envbuild.terminal`: a reason wraps, never cut)."""

from __future__ import annotations

from envbuild.escape import for_terminal
from envbuild.httpreason import TLS_ADVICE, TLS_UNTRUSTED
from envbuild.terminal import render_table, wrap
from envbuild.verify.results import PinResult, VerifyReport

# What git says when a host cannot be reached at all (not when it answered and was refused: an fsck
# error or a missing repository is no reason to look for a mirror).
_OUT_OF_REACH = ("could not resolve host", "unable to connect", "connection refused", "connection timed out",
                 "network is unreachable", "no route to host", "timed out")  # fmt: skip


# Kinds with hundreds of results (a real lock has 126 packages and several hundred requirements) are
# grouped in the table: what fails first, then warnings, then waivers (deliberate, so always shown), then
# one row counting the rest. Sources and the base image are few: every one is shown.
GROUPED = ("package", "requirement")
KIND_ORDER = ("source", "submodule", "package", "requirement", "base_image")


def render_verify(report: VerifyReport, width: int | None = None) -> str:
    """The table, the verdict line and a hint, laid out to ``width`` columns (None: a row per line)."""
    rows = []
    for kind in KIND_ORDER:
        results = [r for r in report.results if r.kind == kind]
        if kind not in GROUPED:
            rows += [table_row(r) for r in results]
            continue
        failing = [r for r in results if not r.passes()]
        warning = [r for r in results if r.passes() and not r.passes(strict=True)]
        waived = [r for r in results if r.status == "waived"]
        ok = [r for r in results if r.status == "ok"]
        rows += [table_row(r) for r in failing + warning + waived]
        if ok:
            more = " more" if len(ok) < len(results) else ""
            rows.append((kind.replace("_", "-"), f"({len(ok)}{more})", "ok", ""))
    verdict = "OK" if report.ok else "FAILED"
    strict = " (strict)" if report.strict else ""
    text = (
        render_table(("KIND", "NAME", "STATUS", "DETAIL"), rows, width)
        + "\n"
        + wrap(f"{verdict}{strict}: {for_terminal(report.lock_path)}: {summarise(report)}", width)
        + "\n"
    )
    for hint in hints(report):
        text += wrap(f"hint: {hint}", width) + "\n"
    return text


# What git (libcurl), requests and uv say when a host's certificate is not one they trust.
_UNTRUSTED = (TLS_UNTRUSTED.lower(), "ssl certificate problem", "certificate verify failed")


def hints(report: VerifyReport) -> list[str]:
    """What to do next, read from the results and from what the user already did (the mirrors in force)."""
    said = []
    if any(
        r.kind == "source" and r.status == "unreachable" and any(words in r.detail.lower() for words in _OUT_OF_REACH)
        for r in report.results
    ):
        if report.mirrors:
            hint = (
                f"the git hosts are out of reach through the mirrors in force ({', '.join(report.mirrors)}): "
                "check that each mirror is reachable from here and serves these repositories"
            )
        else:
            hint = (
                "where the upstream git hosts are out of reach, verify against internal mirrors with "
                "--mirror FROM=TO (or `mirrors:` in the config file)"
            )
        # --offline only when the cache can answer: on an empty cache it would fail every source again
        hint += f"; the cache answers offline: `{report.offline_command}`" if report.offline_command else ""
        said.append(hint)
    if any(any(words in r.detail.lower() for words in _UNTRUSTED) for r in report.results):
        said.append(f"a TLS certificate was not trusted: {TLS_ADVICE} (docs/configuration.md)")
    return said


def table_row(result: PinResult) -> tuple[str, str, str, str]:
    """The table's row of ``result``: KIND, NAME, STATUS, DETAIL."""
    # Names and details carry what servers, indexes and trees said: escaped here, the one way out.
    return (result.kind.replace("_", "-"), for_terminal(result.name), result.status, for_terminal(result.detail))


def summarise(report: VerifyReport) -> str:
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
