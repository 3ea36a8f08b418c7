"""What verification hands to reporting: one typed result per pin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["source", "package", "base_image"]

# Source statuses, exactly as documented; `behind` is a warning, the rest of the non-ok ones fail.
SOURCE_STATUSES = (
    "ok",
    "behind",
    "not-on-ref",
    "tag-moved",
    "missing-ref",
    "ref-type-changed",
    "missing-commit",
    "tree-mismatch",
    "unreachable",
)
PACKAGE_STATUSES = ("ok", "missing-file", "hash-mismatch", "yanked", "unresolved", "unreachable")
BASE_IMAGE_STATUSES = ("ok", "unpinned")
WARNING_STATUSES = frozenset({"behind"})


@dataclass(frozen=True)
class PinResult:
    """The verdict on one pin. ``facts`` holds machine-readable extras (e.g. ``ahead``, ``upstream``)."""

    kind: Kind
    name: str
    status: str
    detail: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def passes(self, strict: bool = False) -> bool:
        return self.status == "ok" or (not strict and self.status in WARNING_STATUSES)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            **dict(sorted(self.facts.items())),
        }


@dataclass(frozen=True)
class VerifyReport:
    lock_path: str
    results: tuple[PinResult, ...]
    strict: bool = False

    @property
    def ok(self) -> bool:
        return all(r.passes(self.strict) for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {"lock": self.lock_path, "ok": self.ok, "results": [r.to_json() for r in self.results]}
