"""The one place untrusted text is made safe for where it is shown: a terminal, Markdown, HTML.

Text from a tree, an index, a git server, a registry or a checkpoint reaches every printer (the verify
table, error lines, progress, ``check.md`` and ``check.html``, envrun's reports). Each printer passes it
through one of these, so an escape sequence cannot rewrite the terminal (``ESC]0;…BEL`` retitles it,
``ESC[2J`` clears it), a newline cannot forge a line of output, and markup cannot become a tag, a
heading or a link in the job summary the nightly workflow publishes.
"""

from __future__ import annotations

import html
import re

__all__ = ["for_html", "for_markdown", "for_terminal"]

# What can start or end inline markup (CommonMark and GitHub's: code, emphasis, links and images,
# strikethrough, table cells, headings); `\` escapes each. The text is never at a line's start, where
# `-`, `+` or `1.` would also count; `<`, `>` and `&` are HTML-escaped first.
_MARKDOWN = re.compile(r"([\\`*_\[\]|~#])")


def for_terminal(text: str) -> str:
    """``text`` as one line of a terminal: every character that is not printable (C0 and C1 controls,
    ESC, BEL, newlines, bidirectional overrides, unassigned code points) shown as its Python escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def for_markdown(text: str, *, code: bool = False) -> str:
    """``text`` as inline Markdown that renders as exactly that text: one line, no HTML tag, no link,
    emphasis, heading or table cell boundary. With ``code``, as a code span (where nothing is markup),
    fenced by more backticks than any run of them in ``text``; not for a table cell, where `|` still
    ends the cell."""
    line = for_terminal(text)
    if code:
        fence = "`" * (max((len(run) for run in re.findall("`+", line)), default=0) + 1)
        pad = " " if line.startswith("`") or line.endswith("`") else ""
        return f"{fence}{pad}{line}{pad}{fence}"
    escaped = html.escape(line, quote=False)  # & < > first: GitHub renders inline HTML
    return _MARKDOWN.sub(r"\\\1", escaped)


def for_html(text: str) -> str:
    """``text`` as HTML text or an attribute value: markup and quotes escaped, controls shown escaped."""
    return html.escape(for_terminal(text), quote=True)
