"""Audit the Hugging Face weights a run exported: the lenient save must have lost nothing but MTP.

The trainer writes HF exports under its checkpoint directory (verl: ``<trainer.default_local_dir>/
global_step_N/actor/huggingface``). The runner resolves that directory from the plan's overrides the way
the trainer would (``${oc.env:NAME,default}`` against the job's environment) and audits every export it
finds there with the same audit as the preflight. A directory it cannot see from here is reported as not
checked, never as fine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from envbuild.errors import EnvbuildError
from envrun.checkpoint.audit import audit_checkpoint

_ENV = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")


@dataclass(frozen=True)
class ExportSpec:
    dir_key: str  # the override naming the trainer's checkpoint directory
    pattern: str  # glob, relative to it, of the HF export directories


@dataclass(frozen=True)
class ExportAudit:
    path: str
    ok: bool
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "error": self.error,
        }


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value the last override of ``key`` gives (``+``/``++`` prefixes ignored)."""
    value = None
    for override in overrides:
        name, sep, rest = override.lstrip("+").partition("=")
        if sep and name == key:
            value = rest
    return value


def resolve_dir(value: str, env: Mapping[str, str]) -> Path | None:
    """Expand ``${oc.env:NAME,default}``; None when other interpolations remain (unknowable here)."""
    expanded = _ENV.sub(lambda m: env.get(m.group(1), m.group(2) or ""), value)
    if "${" in expanded or not expanded:
        return None
    return Path(expanded.strip("'\""))


def audit_exports(overrides: Sequence[str], env: Mapping[str, str], spec: ExportSpec) -> tuple[str, list[ExportAudit]]:
    """(where it looked, one audit per export found). No directory, or no export, is not a failure:
    a run may save no HF weights; it is said in the first element."""
    value = override_value(overrides, spec.dir_key)
    if value is None:
        return f"no {spec.dir_key} override: exports not checked", []
    root = resolve_dir(value, {**os.environ, **env})
    if root is None:
        return f"{spec.dir_key}={value} cannot be resolved here: exports not checked", []
    if not root.is_dir():
        return f"{root} is not visible from this host: exports not checked", []
    audits = []
    for export in sorted(root.glob(spec.pattern)):
        try:
            report = audit_checkpoint(export)
        except EnvbuildError as exc:
            audits.append(ExportAudit(str(export), False, error=str(exc).splitlines()[0]))
            continue
        audits.append(ExportAudit(str(export), report.ok, tuple(report.missing), tuple(report.unexpected)))
    return f"{len(audits)} export(s) under {root}", audits
