"""What a build needs before it starts: every recorded build requirement of every source it installs,
met by the lock or waived (pure; the lock alone decides).

The image installs each source without build isolation and without an index (by the lock's uv, or pip):
its build backend and everything ``[build-system].requires`` names must already be in the image, from the
lock. A missing or conflicting one would fail that ``RUN`` step after the packages layer was built — on
the real stack, after a long build; here it is refused before the engine starts, naming each. Build
requirements that were not recorded (``build_requires`` absent) cannot be checked and are not refused;
``lock verify`` reports them as ``unknown``.
"""

from __future__ import annotations

from envbuild.errors import EnvbuildError
from envbuild.lock.model import Lock
from envbuild.lock.platform import applies, marker_environment, try_parse
from envbuild.verify.closure import judge, providers


class UnmetBuildRequirements(EnvbuildError):
    """A source the lock installs cannot be built from the lock: nothing was built."""

    def __init__(self, lock_path: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            f"{lock_path}: refusing to build, the lock does not meet what its sources build with: "
            + "; ".join(problems)
            + " — add them to the lock (`envbuild lock update` resolves them in) or waive them by name in the "
            "source's `waive`, with the reason"
        )


def build_requirement_problems(lock: Lock) -> list[str]:
    """One line per unmet or conflicting build requirement of an installed source, in lock order."""
    environment = marker_environment(lock.platform)
    provided = providers(lock)
    problems = []
    for source in lock.sources:
        if not source.installed:
            continue
        for text in source.build_requires or ():
            requirement = try_parse(text)
            if requirement is None:
                problems.append(f"source {source.name}: build requirement {text!r} is not PEP 508")
                continue
            if not applies(requirement, environment):
                continue
            result = judge(source.name, requirement, text, True, provided, source)
            if result.status in ("unmet", "conflict"):
                problems.append(f"source {source.name} {result.detail} ({result.status})")
    return problems


def require_buildable(lock: Lock, lock_path: str) -> None:
    """Raise :class:`UnmetBuildRequirements` when :func:`build_requirement_problems` finds any."""
    problems = build_requirement_problems(lock)
    if problems:
        raise UnmetBuildRequirements(lock_path, problems)
