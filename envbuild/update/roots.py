"""The resolver's roots that the sources add: what they declare, evaluated for the lock's platform (pure).

A source's requirement becomes a root unless the source waives it (a waived requirement is never
resolved) or another source provides it (then that source's requirements for the extras asked of it are
followed instead: ``megatron-core[dev,mlm]`` adds megatron-core's ``dev`` and ``mlm`` requirements, not
megatron-core from the index). Build requirements are roots too: the build installs with
``--no-build-isolation --no-index``, so what it needs must be in the lock. Markers, extras included, are
evaluated here, so the resolver gets plain ``name[extras]specifier`` roots.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.utils import canonicalize_name

from envbuild.lock.model import Lock, Source
from envbuild.lock.platform import applies, marker_environment, parsed, without_marker


@dataclass(frozen=True)
class Root:
    """One resolver root and the source (and extra) it comes from, to explain a resolver's refusal."""

    requirement: str
    source: str
    declared: str  # as the source declares it, marker and all
    build: bool


def source_roots(lock: Lock) -> list[Root]:
    """Every root the installed sources add, in lock order, each once."""
    environment = marker_environment(lock.platform)
    provided = {canonicalize_name(s.distribution): s for s in lock.sources if s.installed}
    todo: list[tuple[Source, str]] = [(s, "") for s in lock.sources if s.installed]
    seen: set[tuple[str, str]] = set()
    roots: dict[str, Root] = {}
    while todo:
        source, extra = todo.pop(0)
        if (source.name, extra) in seen:
            continue
        seen.add((source.name, extra))
        declared = [(r, True) for r in source.build_requires or () if not extra]
        declared += [(r, False) for r in source.requires or ()]
        for text, build in declared:
            requirement = parsed(text)
            if not applies(requirement, environment, (extra,)) or source.waiver(requirement.name) is not None:
                continue
            other = provided.get(canonicalize_name(requirement.name))
            if other is not None:
                todo += [(other, canonicalize_name(e)) for e in sorted(requirement.extras)]
                continue
            root = without_marker(requirement)
            roots.setdefault(root, Root(root, source.name, text, build))
    return list(roots.values())


def explain(roots: list[Root], names: set[str]) -> list[str]:
    """Which source asked for each root whose distribution is named in ``names`` (a resolver's message)."""
    wanted = {canonicalize_name(n) for n in names}
    return [
        f"{root.source} {'builds with' if root.build else 'requires'} {root.declared}"
        for root in roots
        if canonicalize_name(parsed(root.requirement).name) in wanted
    ]
