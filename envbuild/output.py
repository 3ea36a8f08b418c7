"""Pure rendering of reports for people (tables) and scripts (JSON)."""

from __future__ import annotations

import json
from typing import Any, Sequence

from envbuild.results import VerifyReport


def render_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], max_width: int = 100) -> str:
    """A plain-text table; the last column is left unpadded and cut at ``max_width`` characters."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers[:-1])]
    lines = []
    for row in [list(headers), *[list(r) for r in rows]]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        last = row[-1] if len(row[-1]) <= max_width else row[-1][: max_width - 1] + "…"
        lines.append("  ".join([*cells, last]).rstrip())
    return "\n".join(lines) + "\n"


def render_verify(report: VerifyReport) -> str:
    rows = [(r.kind.replace("_", "-"), r.name, r.status, r.detail) for r in report.results]
    counts: dict[str, int] = {}
    for result in report.results:
        counts[result.status] = counts.get(result.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    verdict = "OK" if report.ok else "FAILED"
    strict = " (strict)" if report.strict else ""
    text = (
        render_table(("KIND", "NAME", "STATUS", "DETAIL"), rows)
        + f"\n{verdict}{strict}: {report.lock_path}: {summary}\n"
    )
    if any(r.kind == "source" and r.status == "unreachable" for r in report.results):
        text += (
            "hint: where the upstream git hosts are out of reach, verify against internal mirrors with "
            "--mirror FROM=TO (or `mirrors:` in the config file); --offline answers from the cache\n"
        )
    return text
