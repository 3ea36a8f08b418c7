"""Reading envrun's YAML files (recipes, cluster files) into typed values, strictly, with the lock's
decoder: every problem as ``FILE:LINE: FIELD: message``, all of them raised at once (exit 2)."""

from __future__ import annotations

from typing import Callable, TypeVar

import yaml

from envbuild.errors import LockfileError, Problem
from envbuild.lock.typed import Decoder

T = TypeVar("T")


def decode_yaml(
    text: str,
    file: str,
    cls: type[T],
    error: type[LockfileError],
    *,
    empty: str,
    checks: Callable[[T, yaml.Node], list[Problem]] = lambda value, root: [],
) -> T:
    """``text`` as a ``cls``; ``empty`` says what an empty file lacks; ``checks`` adds cross-field problems."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error([Problem(file, mark.line + 1 if mark else 0, "", f"not valid YAML: {reason}")]) from None
    if root is None:
        raise error([Problem(file, 0, "", f"empty file; {empty}")])
    decoder = Decoder(file)
    value = decoder.decode(cls, root, "")
    if value is not None:
        decoder.problems.extend(checks(value, root))
    if decoder.problems or value is None:
        raise error(decoder.problems)
    return value
