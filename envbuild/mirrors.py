"""URL rewriting for mirrors, with git's ``url.<base>.insteadOf`` semantics: the longest matching
prefix wins, and a URL is rewritten at most once."""

from __future__ import annotations

from dataclasses import dataclass

from envbuild.errors import InputError


@dataclass(frozen=True)
class Mirrors:
    rules: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, specs: list[str], origin: str = "--mirror") -> "Mirrors":
        rules = []
        for spec in specs:
            source, sep, target = spec.partition("=")
            if not sep or not source or not target:
                raise InputError(f"{origin}: expected FROM=TO, got {spec!r}")
            rules.append((source, target))
        return cls(tuple(rules))

    def merged(self, other: "Mirrors") -> "Mirrors":
        """``other`` (e.g. the command line) takes precedence over ``self`` (e.g. the config file)."""
        return Mirrors(other.rules + self.rules)

    def rewrite(self, url: str) -> str:
        best: tuple[str, str] | None = None
        for source, target in self.rules:
            if url.startswith(source) and (best is None or len(source) > len(best[0])):
                best = (source, target)
        return url if best is None else best[1] + url[len(best[0]) :]
