"""A data file (a recipe, a cluster file) into a typed value, strictly: read as every envbuild YAML file
is (:func:`envbuild.data.yamlfile.compose_yaml`: plain data only), decoded by :mod:`envbuild.data.typed`;
every problem as ``FILE:LINE: FIELD: message``, all of them raised at once as the file's own
:class:`~envbuild.errors.DataFileError` (exit 2)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import yaml

from envbuild.data.typed import Decoder
from envbuild.data.yamlfile import compose_yaml
from envbuild.errors import DataFileError, Problem

T = TypeVar("T")


def decode_yaml(
    text: bytes | str,
    file: str,
    cls: type[T],
    error: type[DataFileError],
    *,
    empty: str = "",
    default: T | None = None,
    checks: Callable[[T, yaml.Node], list[Problem]] = lambda value, root: [],
) -> T:
    """``text`` as a ``cls``; an empty file is ``default`` or, without one, refused: ``empty`` says what it
    lacks; ``checks`` adds cross-field problems."""
    root = compose_yaml(text, file, error)  # plain data only: size cap, UTF-8, no anchors or aliases
    if root is None and default is not None:
        return default
    if root is None:
        raise error([Problem(file, 0, "", f"empty file; {empty}")])
    decoder = Decoder(file)
    value = decoder.decode(cls, root, "")
    if value is not None:
        decoder.problems.extend(checks(value, root))
    if decoder.problems or value is None:
        raise error(decoder.problems)
    return value
