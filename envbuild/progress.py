"""Progress reporting: every long stage says what it does through one callable, one line per event.

Library code takes a :data:`Progress`, :func:`silent` by default, and never prints; the command line
passes :class:`envbuild.cli.common.StderrProgress`, which prints ``envbuild: <line>`` on stderr.
"""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None]


def silent(message: str) -> None:
    """A :data:`Progress` that says nothing."""
