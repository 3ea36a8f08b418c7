"""Text laid out to a terminal's width, a pure function of the text and the width (the CLI reads the
width): tables whose last column, a free-text reason, wraps onto lines of its own under that column, and
lines that wrap with a hanging indent.

Nothing is ever cut. Text breaks only at spaces, and never inside backquotes: a command the text
advises (`` `envbuild lock fetch …` ``) stays on one line, so that it runs as printed. A word (or such a
command) longer than the room it has takes a line of its own, starting further left where that lets it
fit, and runs past the width only when it is longer than the width itself (a URL, an image reference:
cut or broken, it could not be copied). ``width=None`` lays nothing out: a row per line, whole, for a
pipe or a file that grep and scripts read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["render_table", "words", "wrap"]

GAP = "  "
# The share of the width a table's last column keeps, at the least, when a name column would take it.
LAST_SHARE = 0.4
# A word: a run of non-spaces, or one that holds a backquoted span, spaces and all.
_WORD = re.compile(r"\S*`[^`]*`\S*|\S+")


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None) -> str:
    """A plain-text table, each column as wide as its widest cell and the last column unpadded. At a
    ``width``, the last column wraps under itself, and the widest other column (a name) is only as wide
    as leaves the last at least :data:`LAST_SHARE` of the width: a cell wider than its column takes its
    row's line to itself, and the rest of the row goes on the next line, under its columns. So one long
    name (a base image's reference) does not push every row's reason to the right."""
    table = [list(headers), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers) - 1)]
    if width is not None and widths:
        squeezed = max(range(len(widths)), key=lambda i: (widths[i], -i))
        others = sum(w + len(GAP) for i, w in enumerate(widths) if i != squeezed) + len(GAP)
        room = width - others - int(width * LAST_SHARE)
        fitting = [len(row[squeezed]) for row in table if len(row[squeezed]) <= room]
        widths[squeezed] = max([len(headers[squeezed]), *fitting])
    return "".join(line.rstrip() + "\n" for row in table for line in _row_lines(row, widths, width))


def wrap(line: str, width: int | None, indent: str = "  ") -> str:
    """``line`` wrapped to ``width``, its continuation lines indented by its own leading spaces and
    ``indent``; several lines (a log tail) each wrapped so. No trailing newline is added."""
    if width is None:
        return line
    out = []
    for one in line.split("\n"):
        lead = one[: len(one) - len(one.lstrip(" "))]
        pieces = _fill(words(one), width - len(lead), width - len(lead) - len(indent))
        out.append(lead + pieces[0] if pieces else one.rstrip())
        out += [_place(piece, len(lead + indent), width) for piece in pieces[1:]]
    return "\n".join(out)


def _row_lines(row: list[str], widths: list[int], width: int | None) -> list[str]:
    starts = [sum(w + len(GAP) for w in widths[:i]) for i in range(len(widths) + 1)]
    lines: list[str] = []

    def put(line: str, piece: str, start: int) -> str | None:
        """``line`` with ``piece`` at column ``start``; the line before goes out first when it ran into that
        column, and a piece that does not fit even from its column goes out on a line of its own (None)."""
        if len(line) > start - len(GAP) and line.strip():  # the cell before ran into this column
            lines.append(line)
            line = ""
        if width is not None and start + len(piece) > width:  # does not fit even from its column
            if line.strip():
                lines.append(line)
            lines.append(_place(piece, start, width, starts))
            return None
        return line.ljust(start) + piece

    line = ""
    for cell, start in zip(row[:-1], starts):
        if cell:
            line = put(line, cell, start) or ""
    last = starts[-1]
    room = None if width is None else width - last
    for piece in [row[-1]] if room is None else _fill(words(row[-1]), room, room):
        placed = put(line, piece, last)
        if placed is not None:
            lines.append(placed)
        line = ""
    if line.strip() or not lines:
        lines.append(line)
    return lines


def words(text: str) -> list[str]:
    """The units ``text`` breaks into: words, and backquoted spans whole."""
    return _WORD.findall(text)


def _fill(units: list[str], first: int, rest: int) -> list[str]:
    """Words joined into lines of at most ``first`` (the first line) and ``rest`` characters; a word
    longer than that is a line of its own."""
    lines: list[str] = []
    current = ""
    for word in units:
        room = first if not lines else rest
        if current and len(current) + 1 + len(word) <= room:
            current += " " + word
            continue
        if current:
            lines.append(current)
        current = word
    if current:
        lines.append(current)
    return lines


def _place(text: str, column: int, width: int, stops: Sequence[int] = ()) -> str:
    """``text`` on a line of its own at ``column``, or else at the rightmost of ``stops`` (a table's
    column starts) left of it where it fits in ``width``, or else as far right as it fits."""
    fits = [stop for stop in (column, *stops) if stop <= column and stop + len(text) <= width]
    return " " * (max(fits) if fits else max(0, min(column, width - len(text)))) + text
