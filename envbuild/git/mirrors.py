"""URL rewriting for mirrors, with git's ``url.<base>.insteadOf`` semantics: the longest matching
prefix wins, and a URL is rewritten at most once.

A rule comes from ``--mirror FROM=TO`` or the config file's ``mirrors:``. Both sides are URL prefixes,
checked like a lock's repository URL for credentials (none in an http(s), git or file URL; a plain user
name only in an ssh one) and for a host or user beginning with '-', and quoted redacted when refused.
The rewritten URL is checked again in full (:func:`envbuild.git.upstream.check_inputs`, and for a
submodule where it is read), so a rule cannot smuggle in an option, a remote helper or a user part
assembled across the prefix boundary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from envbuild.data.urls import GIT_CREDENTIALS, check_dashes, check_userinfo, redact_url
from envbuild.errors import InputError


def check_rule(source: str, target: str) -> str | None:
    """Why a FROM=TO rule is refused, or None."""
    if not source or not target:
        return f"expected FROM=TO with neither side empty, got {redact_url(source)!r}={redact_url(target)!r}"
    for side in (source, target):
        if any(c.isspace() or not c.isprintable() for c in side):
            return f"{redact_url(side)!r} contains whitespace or control characters"
        if (problem := check_userinfo(side, GIT_CREDENTIALS) or check_dashes(side)) is not None:
            return problem
    return None


class MirroredURL(str):
    """The URL git fetches from (a mirror's, once rewritten) that remembers the URL the lock names, ``pinned``.

    The caches key a repository by ``pinned`` (:func:`envbuild.git.cache.cache_key`): what was fetched
    through a mirror is what the lock pins, so ``--offline`` answers from it with or without the mirror
    rules, and two mirrors of one upstream share one entry."""

    pinned: str

    def __new__(cls, url: str, pinned: str) -> MirroredURL:
        made = super().__new__(cls, url)
        made.pinned = pinned
        return made


@dataclass(frozen=True)
class Mirrors:
    rules: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, specs: Iterable[str], origin: str = "--mirror") -> Mirrors:
        """Rules from FROM=TO strings; every bad one is reported, one line each, before any is used."""
        rules, problems = [], []
        for spec in specs:
            source, sep, target = spec.partition("=")
            problem = check_rule(source, target) if sep else f"expected FROM=TO, got {redact_url(spec)!r}"
            if problem is not None:
                problems.append(f"{origin}: {problem}")
            rules.append((source, target))
        if problems:
            raise InputError("\n".join(problems))
        return cls(tuple(rules))

    def merged(self, other: Mirrors) -> Mirrors:
        """``other`` (e.g. the command line) takes precedence over ``self`` (e.g. the config file)."""
        return Mirrors(other.rules + self.rules)

    def rewrite(self, url: str) -> MirroredURL:
        """Where to fetch ``url`` from; it remembers ``url`` (or, rewritten twice, the first one)."""
        best: tuple[str, str] | None = None
        for source, target in self.rules:
            if url.startswith(source) and (best is None or len(source) > len(best[0])):
                best = (source, target)
        pinned = getattr(url, "pinned", url)
        return MirroredURL(url if best is None else best[1] + url[len(best[0]) :], str(pinned))
