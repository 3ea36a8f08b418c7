"""What verification hands to reporting: one typed result per pin."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from envbuild.data.jsonout import jfield, to_jsonable
from envbuild.data.urls import redact_urls

Kind = Literal["source", "submodule", "package", "requirement", "base_image"]

# The statuses of each kind, exactly as documented in the README. Every other non-ok status fails;
# a warning passes unless --strict: `behind` (the branch moved on, the pin is still on it), `cached`
# (offline: the package's files are in the cache by sha256, but the index was not asked), a
# requirement's or a submodule's `unknown`, and a submodule's `diverged`.
SourceStatus = Literal[
    "ok",
    "behind",
    "not-on-ref",
    "tag-moved",
    "missing-ref",
    "ref-type-changed",
    "missing-commit",
    "tree-mismatch",
    "unreachable",
]
# A submodule: like a source where that applies (no ref: its commit must be on some upstream ref); also
# `gitlink-mismatch` (the parent's tree pins another commit at its path, or none), `skipped` (by name,
# with the reason; passes), `diverged` (a warning: it and the lock's source of the same repository are on
# different lines of history) and `unknown` (a warning: `lock update` could not read the tree's submodules).
SubmoduleStatus = Literal[
    "ok", "skipped", "diverged", "missing-commit", "tree-mismatch", "gitlink-mismatch", "unreachable", "unknown"
]
PackageStatus = Literal["ok", "cached", "missing-file", "hash-mismatch", "yanked", "unresolved", "unreachable"]
BaseImageStatus = Literal["ok", "unpinned"]
# A requirement of a package or a source: met by the lock (`ok`), not (`unmet`: no such distribution;
# `conflict`: the locked version is outside the specifier), accepted by name (`waived`), or not known
# (`unknown`: the requirements were not recorded or the metadata could not be read; a warning), or
# `metadata-mismatch`: the package's wheel METADATA is not the one the lock pins (an index lying; fails).
RequirementStatus = Literal["ok", "unmet", "conflict", "waived", "unknown", "metadata-mismatch"]
Status = SourceStatus | SubmoduleStatus | PackageStatus | RequirementStatus | BaseImageStatus
PASSING_STATUSES: frozenset[Status] = frozenset({"ok", "waived", "skipped"})
WARNING_STATUSES: frozenset[Status] = frozenset({"behind", "cached", "unknown", "diverged"})


@dataclass(frozen=True)
class PinResult:
    """The verdict on one pin. ``facts`` holds machine-readable extras (e.g. ``ahead``, ``upstream``)."""

    kind: Kind
    name: str
    status: Status
    detail: str = ""
    # Shown beside the verdict's own keys, sorted.
    facts: dict[str, Any] = jfield(default_factory=dict, inline=True, convert=lambda facts: dict(sorted(facts.items())))

    def __post_init__(self) -> None:
        # A detail quotes what servers, indexes and trees said; it reaches the table, --json, check.json,
        # check.md and error messages. The user part of every URL in it is hidden here, once, so that no
        # rendering of it (nor a later one) can show a password a server handed out.
        object.__setattr__(self, "detail", redact_urls(self.detail))

    def passes(self, strict: bool = False) -> bool:
        return self.status in PASSING_STATUSES or (not strict and self.status in WARNING_STATUSES)


@dataclass(frozen=True)
class VerifyReport:
    lock_path: str
    results: tuple[PinResult, ...]
    strict: bool = False
    # The `lock verify --offline` command that answers from the cache, when some source was out of reach
    # and the cache holds what every such source's upstream last said (None: offline would not help).
    offline_command: str | None = None
    # The mirror rules in force (FROM=TO), from --mirror and the config file: hints read them.
    mirrors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(r.passes(self.strict) for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {"lock": self.lock_path, "ok": self.ok, "results": to_jsonable(self.results)}
