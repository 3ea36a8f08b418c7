"""Hydra overrides: merging the recipe's with the user's, and checking them against verl's config.

Validation composes the config the trainer will compose (same config tree, same name, same
overrides, Hydra's own compose API), but first checks each override on its own so that an error
names the override at fault and, for an unknown key, the closest key that exists.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.errors import InputError
from envrun import first_line
from envrun.recipe import override_key, override_prefix

_MISSING = object()
_SWEEP = object()  # the value of an override that is a sweep: no one value to check


class OverrideError(InputError):
    """One or more overrides do not fit the config schema; nothing was started (exit 2)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            f"{len(problems)} override(s) do not fit the verl config; nothing started:\n  " + "\n  ".join(problems)
        )


def merge_overrides(recipe: Iterable[str], later: Iterable[str]) -> tuple[str, ...]:
    """Apply ``later`` overrides over ``recipe``'s: the last one of a key wins, in the place of the first.

    A plain ``key=value`` replacing a recipe's ``+key=...`` keeps the ``+``: the user means "this
    value instead", and the key only exists because the recipe adds it. ``~key`` drops a key the
    recipe added, and deletes one the config has.
    """
    merged: dict[str, str] = {}
    added_by_recipe: set[str] = set()
    for override in recipe:
        key = override_key(override)
        merged[key] = override
        if override_prefix(override) in ("+", "++"):
            added_by_recipe.add(key)
    for override in later:
        key, prefix = override_key(override), override_prefix(override)
        if prefix == "~" and key in added_by_recipe:
            merged.pop(key, None)
            continue
        if prefix == "" and key in added_by_recipe:
            override = (override_prefix(merged[key]) if key in merged else "++") + override
        merged[key] = override
    return tuple(merged.values())


@dataclass(frozen=True)
class ConfigSchema:
    """A composed config's key set, for naming unknown keys and finding the closest one."""

    config: Any  # an omegaconf DictConfig, composed without overrides
    keys: frozenset[str]  # every dotted path, interior nodes included
    groups: frozenset[str]  # Hydra config groups (selectable with ``group=option``)

    def value(self, key: str) -> Any:
        """The value at ``key`` as plain Python (a section as a dict, a list as a list), interpolations
        resolved where they resolve; ``_MISSING`` where the config has none, a path through a list included."""
        from omegaconf import OmegaConf

        node = self._node(key)
        return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node

    def value_above(self, key: str) -> tuple[str, Any] | None:
        """The nearest key above ``key`` that holds a value (a scalar or a list), not a section, and that
        value: an override under it would replace it with a section (Hydra does so silently). A key above
        that holds null is left: a section may be given where the default is none. The sections above are
        told by their node, not copied out (the recipe's 123 overrides: 16 ms, not 240)."""
        from omegaconf import OmegaConf

        parts = key.split(".")
        for end in range(1, len(parts)):
            above = ".".join(parts[:end])
            if above in self.keys:
                node = self._node(above)
                if OmegaConf.is_list(node) and parts[end].isdecimal() and int(parts[end]) < len(node):
                    return None  # an item of a list (trainer.logger.0): Hydra sets it in place
                if node is not None and node is not _MISSING and not OmegaConf.is_dict(node):
                    return above, self.value(above)
        return None

    def in_list(self, key: str) -> bool:
        """Whether ``key`` names an item of a list, or a key under one (``trainer.logger.0``), that the config
        holds: :attr:`keys` names sections and values only."""
        return any(part.isdecimal() for part in key.split(".")) and self._node(key) is not _MISSING

    def _node(self, key: str) -> Any:
        """OmegaConf's node at ``key``, or ``_MISSING`` (a path through a list or a value included)."""
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        try:
            return OmegaConf.select(self.config, key, default=_MISSING, throw_on_missing=False)
        except OmegaConfBaseException:  # a path through a list or a value ("trainer.logger.x")
            return _MISSING

    def closest(self, key: str) -> str | None:
        """A sibling with a similar name first (a typo), else a similar full path (a misplaced key)."""
        parent, _, leaf = key.rpartition(".")
        siblings = sorted(k.rpartition(".")[2] for k in self.keys if k.rpartition(".")[0] == parent)
        matches = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
        if matches:
            return f"{parent}.{matches[0]}" if parent else matches[0]
        matches = difflib.get_close_matches(key, sorted(self.keys), n=1, cutoff=0.85)
        return matches[0] if matches else None


def load_schema(config_dir: Path, config_name: str) -> ConfigSchema:
    config = _compose(config_dir, config_name, [])
    from omegaconf import OmegaConf

    keys: set[str] = set()
    _flatten(OmegaConf.to_container(config, resolve=False), "", keys)
    groups = {str(p.relative_to(config_dir)) for p in config_dir.rglob("*") if p.is_dir() and any(p.glob("*.yaml"))}
    return ConfigSchema(config, frozenset(keys), frozenset(groups))


def validate_overrides(overrides: Iterable[str], config_dir: Path, config_name: str) -> None:
    """Raise :class:`OverrideError` naming every override the config will not take."""
    overrides = list(overrides)
    problems, values = _parse(overrides)
    bad = {o for o in overrides if o not in values or values[o] is _SWEEP}  # each said once, above
    schema = load_schema(config_dir, config_name)
    problems += key_problems([o for o in overrides if o not in bad], schema, values)
    if problems:
        raise OverrideError(problems)
    try:
        _compose(config_dir, config_name, overrides)
    except Exception as exc:  # Hydra's composition errors have no common base worth naming
        raise OverrideError([f"the verl config ({config_name}) rejects the overrides: {first_line(exc)}"]) from None


def key_problems(overrides: list[str], schema: ConfigSchema, parsed: dict[str, Any]) -> list[str]:
    """Keys that do not exist (``key=``, ``~key``) or already do (``+key=``), keys under a value (a scalar or
    a list, which Hydra would silently replace with a section), and values of the wrong kind: not a
    section for a section, a section for a value, not a boolean or a number for a boolean or numeric
    default (``parsed``: each override's value, from :func:`_parse`); each with a fix."""
    problems: list[str] = []
    added: set[str] = set()
    for override in overrides:
        key, prefix = override_key(override), override_prefix(override)
        if key.split("@", 1)[0].replace(".", "/") in schema.groups or key in schema.groups:
            continue
        if key.startswith("hydra/"):  # Hydra's own groups (hydra/job_logging=disabled): the composition judges
            continue
        if held := schema.value_above(key):
            above, value = held
            what = f"it has no key {key}" if prefix == "~" else f"{key} would replace it with a section, silently"
            if isinstance(value, list) and key.split(".")[above.count(".") + 1].isdecimal():
                what = f"it has {len(value)} item(s), numbered from 0"
                problems.append(f"{override}: {above} is a list in the verl config ({_shown(value)}); {what}")
                continue
            problems.append(
                f"{override}: {above} is a value in the verl config ({_shown(value)}), not a section; {what}"
            )
            continue
        if prefix == "~" and schema.in_list(key):
            above = key.rpartition(".")[0]
            problems.append(f"{override}: Hydra cannot delete an item of a list; give the whole list ({above}=[...])")
            continue
        known = (
            key in schema.keys
            or any(key == a or key.startswith(a + ".") for a in added)
            or _hydra_key(key)
            or schema.in_list(key)
        )
        if prefix in ("", "~") and not known:
            closest = schema.closest(key)
            hint = f"; did you mean {closest}?" if closest else ""
            add = " (or add it with +" + key + "=..., if verl reads it)" if prefix == "" else ""
            problems.append(f"{override}: unknown key {key} in the verl config{hint}{add}")
        elif prefix == "+" and schema.value(key) not in (_MISSING, None):
            problems.append(f"{override}: {key} already exists in the verl config; drop the '+' to change it")
        elif prefix in ("", "++") and (mismatch := _type_mismatch(schema.value(key), parsed.get(override))):
            problems.append(f"{override}: {key} {mismatch}")
        if prefix in ("+", "++"):
            added.add(key)
    return problems


def _hydra_key(key: str) -> bool:
    """Whether ``key`` is one of Hydra's own settings (``hydra.run.dir``), not the app's: Hydra's config, not
    verl's, holds it. Under a free-form map of it (``hydra.job_logging.root.level``: the logging config its
    ``hydra/job_logging`` group fills in) any key is taken here, and the composition judges it."""
    if not key.startswith("hydra."):
        return False
    from hydra.conf import HydraConf
    from omegaconf import OmegaConf

    node: Any = OmegaConf.structured(HydraConf)
    for part in key.split(".")[1:]:
        if OmegaConf.is_dict(node) and node._metadata.object_type in (None, dict):
            return True  # a free-form map (job_logging's dictConfig, job.env_set): the composition judges
        # not `part in node`: that is False for a key whose value is still missing (hydra.run.dir's ???)
        if not OmegaConf.is_dict(node) or part not in list(node.keys()):
            return False
        node = node._get_node(part)
    return True


def _type_mismatch(default: Any, value: Any) -> str | None:
    """verl's configs are untyped YAML, so Hydra takes ``total_epochs=abc``, and a value for a whole section
    (``actor_rollout_ref.actor.checkpoint=x``: every key of it gone); the trainer would fail later, or run
    with the section's defaults lost.

    A section must stay a section, a value a value (null may become either). Beyond that, only what verl's
    dataclasses would refuse too: a non-boolean for a boolean default (OmegaConf
    takes 0 and 1), a non-number for a numeric one (YAML authors write ``1`` for a float, so int and
    float are not told apart).
    """
    if default is _MISSING or value is _MISSING or isinstance(value, str) and "${" in value:
        return None
    if isinstance(default, dict):  # Hydra would put the value in the section's place, every key of it gone
        if isinstance(value, dict):
            return None
        keys = ", ".join(sorted(map(str, default))[:4]) + (", …" if len(default) > 4 else "")
        return (
            f"is a section of the verl config ({keys}), and {_shown(value)} would replace it whole; "
            "set one of its keys instead (or ~KEY to remove it)"
        )
    if value is None or default is None:
        return None
    if isinstance(value, dict):
        return f"is a value in the verl config (default {_shown(default)}), not a section; got {_shown(value)}"
    if isinstance(default, bool):
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
            return None
        return f"expects a boolean (True/False; default {default!r}), got {value!r}"
    if isinstance(default, (int, float)):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        return f"expects a number (default {default!r}), got {value!r}"
    return None


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parse(overrides: list[str]) -> tuple[list[str], dict[str, Any]]:
    """The overrides Hydra cannot parse or that are sweeps, each a problem; the value of each it parses
    (:data:`_SWEEP` for a sweep's)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, problems, values = OverridesParser.create(), [], dict[str, Any]()
    for override in overrides:
        try:
            parsed = parser.parse_overrides([override])[0]
        except OverrideParseException as exc:
            problems.append(f"{override}: not a valid Hydra override: {first_line(exc)}")
            continue
        if parsed.is_sweep_override():
            problems.append(f"{override}: a sweep (a,b or range) is not a single run; quote the value or pick one")
            values[override] = _SWEEP
            continue
        try:
            values[override] = parsed.value()
        except Exception:  # a value Hydra parses but cannot give: no type to compare
            values[override] = _MISSING
    return problems, values


def _compose(config_dir: Path, config_name: str, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if not (Path(config_dir) / f"{config_name}.yaml").is_file():
        raise InputError(f"{config_dir}: no {config_name}.yaml; is this verl's trainer/config?")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
            return compose(config_name=config_name, overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def _flatten(node: Any, prefix: str, out: set[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.add(path)
            _flatten(value, path, out)
