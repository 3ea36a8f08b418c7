"""Tensor names for people: sorted naturally, folded into ranges, escaped for the terminal.

Every name printed here came from a checkpoint, so it is hostile text: :func:`shown_name` escapes
control characters and cuts it short, and folding and sorting look at a bounded number of its parts.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from envbuild.escape import for_terminal
from envrun.checkpoint.expected import Expectation
from envrun.checkpoint.layout import split_layer_name

_DIGITS = re.compile(r"([0-9]+)")
# "05" folded into a range would print as "5", a different name; only canonical numbers fold, and
# only numbers of a sane length: a tensor name may carry a number of 5,000 digits, which int() refuses.
_CANONICAL_INT = re.compile(r"0|[1-9][0-9]{0,17}")
# Real names carry two numbers (layer, expert) in eight parts; sorting and folding look no further,
# so that a name of 20,000 numbers costs no more than one of eight.
_MAX_SORTED_NUMBERS = 8
_MAX_FOLDED_NUMBERS = 4
_MAX_FOLDED_PARTS = 32
_MAX_SHOWN_NAME = 300
_MAX_INT_DIGITS = 4000
_HUGE_NUMBER = 10**_MAX_INT_DIGITS


def _natural_key(name: str) -> tuple[Any, ...]:
    # split() with a group alternates text and number, so position i has the same type in every key.
    # int() refuses more than 4300 digits: longer numbers (no layer has them) sort after all others,
    # by length; the name itself breaks every tie, "05" against "5" included, so the order is total.
    parts: list[Any] = _DIGITS.split(name, maxsplit=_MAX_SORTED_NUMBERS)
    for i in range(1, len(parts), 2):
        digits = len(parts[i])
        parts[i] = int(parts[i]) if digits < _MAX_INT_DIGITS else _HUGE_NUMBER + digits
    return tuple(parts), name


def natural_sorted(names: Iterable[str]) -> tuple[str, ...]:
    """Sort so that layer 10 follows layer 9: deterministic and readable."""
    return tuple(sorted(names, key=_natural_key))


def abbreviate_names(names: list[str] | tuple[str, ...]) -> list[str]:
    """Fold names that differ in one number into ranges, innermost number first.

    ``model.layers.5.mlp.experts.{0..255}.down_proj.weight`` instead of 256 lines, and then
    ``model.layers.{3..77}.mlp.experts.{0..255}.down_proj.weight`` when every MoE layer lost it.
    """
    # Each name becomes tokens split on ".", numbers as sets so that folding is a set union.
    items: list[tuple[str | frozenset[int], ...]] = [
        tuple(frozenset([int(t)]) if _CANONICAL_INT.fullmatch(t) else t for t in name.split("."))
        if name.count(".") < _MAX_FOLDED_PARTS
        else (name,)
        for name in names
    ]
    depth = max((sum(isinstance(t, frozenset) for t in item) for item in items), default=0)
    for k in range(min(depth, _MAX_FOLDED_NUMBERS)):
        groups: dict[tuple[Any, ...], set[int]] = {}
        for item in items:
            positions = [i for i, t in enumerate(item) if isinstance(t, frozenset)]
            if len(positions) <= k:
                groups.setdefault(item, set())
                continue
            pos = positions[-1 - k]
            key = item[:pos] + (None,) + item[pos + 1 :]
            groups.setdefault(key, set()).update(item[pos])  # type: ignore[arg-type]
        items = [
            tuple(frozenset(nums) if t is None else t for t in key) if nums else key for key, nums in groups.items()
        ]
    # Order groups by their smallest numbers, so "layers.7" follows "layers.{3..5}".
    items.sort(key=lambda item: tuple((1, 0, t) if isinstance(t, str) else (0, min(t), "") for t in item))
    return [".".join(t if isinstance(t, str) else render_numbers(t) for t in item) for item in items]


def render_numbers(numbers: Iterable[int], braces: bool = True) -> str:
    """``{0..2,5}`` for 0, 1, 2, 5 (without braces: ``0..2,5``); one number alone, "" for none."""
    ordered = sorted(set(numbers))
    if len(ordered) <= 1:
        return "".join(map(str, ordered))
    runs: list[list[int]] = [[ordered[0], ordered[0]]]
    for n in ordered[1:]:
        if n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = ",".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)
    return "{" + text + "}" if braces else text


def group_missing(missing: Iterable[str], expect: Expectation, layers: int) -> list[str]:
    """``missing`` as a person reads it: by tensor and the layers that lost it, a whole module as ``*``.

    Every layer's DSA indexer lost is ``self_attn.indexer.* in all 78 layers``, not 390 names; a loss
    in some layers is ``model.layers.{2..3}.mlp.experts.{0..3}.down_proj.weight``, in one layer the
    name itself. A module folds into ``*`` only when every tensor the expectation has under it is
    lost, so ``*`` never hides a survivor.
    """
    top: list[str] = []
    lost: dict[int, list[str]] = {}
    for name in missing:
        split = split_layer_name(name)
        if split is None or split[0] not in expect.layer_suffixes:
            top.append(name)
        else:
            lost.setdefault(split[0], []).append(split[1])
    # Fold within each layer first (a whole layer is "*" even if one of its tensors is also lost
    # elsewhere), then gather the layers that lost the same thing.
    counted: dict[frozenset[str], Counter[str]] = {}
    layers_of: dict[str, set[int]] = {}
    for layer, suffixes in lost.items():
        expected = expect.layer_suffixes[layer]
        if expected not in counted:
            counted[expected] = Counter(p for s in expected for p in _prefixes(s))
        for pattern in _collapse(suffixes, counted[expected]):
            layers_of.setdefault(pattern, set()).add(layer)
    by_layers: dict[frozenset[int], list[str]] = {}
    for pattern, layer_set in layers_of.items():
        by_layers.setdefault(frozenset(layer_set), []).append(pattern)
    grouped: list[tuple[int, tuple[Any, ...], str]] = []
    for where, patterns in by_layers.items():
        named = _named_layers(where, expect, layers)
        numbers = render_numbers(where)
        for pattern in abbreviate_names(patterns):
            line = f"{pattern} in {named}" if named else f"model.layers.{numbers}.{pattern}"
            grouped.append((min(where), _natural_key(pattern), line))
    return list(natural_sorted(top)) + [line for _, _, line in sorted(grouped)]


def _prefixes(suffix: str) -> list[str]:
    """The modules a tensor is in, outermost first: "" (the layer), "self_attn.", "self_attn.indexer."."""
    parts = suffix.split(".")[:-1]
    return [""] + [".".join(parts[: k + 1]) + "." for k in range(len(parts))]


def _collapse(lost: list[str], expected_under: Counter[str]) -> list[str]:
    lost_under = Counter(p for s in lost for p in _prefixes(s))
    out = set()
    for suffix in lost:
        whole = next(
            (p for p in _prefixes(suffix) if expected_under[p] > 1 and lost_under[p] == expected_under[p]), None
        )
        out.add(suffix if whole is None else whole + "*")
    return sorted(out)


def _named_layers(where: frozenset[int], expect: Expectation, layers: int) -> str:
    """Words for a set of layers everyone knows: "all 78 layers", "all 75 MoE layers", or "" if none fit."""
    moe = expect.moe_layers
    dense = expect.layer_suffixes.keys() - moe
    if len(where) == layers and layers > 1:
        return f"all {layers} layers"
    if where == moe and len(moe) > 1 and dense:
        return f"all {len(moe)} MoE layers"
    if where == dense and len(dense) > 1 and moe:
        return f"all {len(dense)} dense layers"
    return ""


def shown_name(name: str) -> str:
    # Names come from the checkpoint: a newline or an escape sequence in one must not forge a line of
    # the report or rewrite the terminal, and a name of megabytes must not become one line of them.
    name = for_terminal(name)
    if len(name) > _MAX_SHOWN_NAME:
        half = _MAX_SHOWN_NAME // 2
        name = f"{name[:half]}...({len(name) - 2 * half} characters)...{name[-half:]}"
    return name
