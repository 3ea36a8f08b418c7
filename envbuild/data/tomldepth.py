"""How deeply a TOML document nests its arrays and inline tables, measured before it is parsed.

``tomllib`` parses nested arrays and inline tables by recursion: 100,000 nested arrays (200 KB, well
under any size limit) end in ``RecursionError``. As the YAML and JSON readers do, the nesting is
measured first, by one pass over the text that skips strings and comments, stopping at the limit.
"""

from __future__ import annotations

MAX_TOML_DEPTH = 64  # a pyproject.toml nests two or three levels; 64 is far beyond any real one


def toml_too_deep(text: str, limit: int = MAX_TOML_DEPTH) -> bool:
    """True when ``text`` opens more than ``limit`` arrays or inline tables inside one another."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        char = text[i]
        if char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth = max(0, depth - 1)
        elif char == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif char in "\"'":
            i = _string_end(text, i)
            continue
        i += 1
    return False


def _string_end(text: str, start: int) -> int:
    """The index just after the string starting at ``start`` (basic or literal, single or multi-line);
    an unterminated string runs to the end (the parser will refuse it)."""
    quote = text[start]
    if text.startswith(quote * 3, start):
        end = text.find(quote * 3, start + 3)
        while quote == '"' and end > 0 and _escaped(text, end):
            end = text.find(quote * 3, end + 1)
        return len(text) if end < 0 else end + 3
    i = start + 1
    while i < len(text) and text[i] != "\n":
        if text[i] == "\\" and quote == '"':
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return i


def _escaped(text: str, at: int) -> bool:
    backslashes = 0
    while at - backslashes - 1 >= 0 and text[at - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1
