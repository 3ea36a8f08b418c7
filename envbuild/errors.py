"""The one exception hierarchy of envbuild and envrun.

Every error a user can cause or meet derives from :class:`EnvbuildError`. The CLIs map
:class:`InputError` (bad lockfile, bad arguments, hostile input) to exit status 2 and every other
:class:`EnvbuildError` to exit status 1, printing the message as one line without a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


class EnvbuildError(Exception):
    """Base of every error envbuild raises on purpose."""

    exit_code = 1


class InputError(EnvbuildError):
    """The user's input is invalid: nothing was changed, exit status 2."""

    exit_code = 2


@dataclass(frozen=True, order=True)
class Problem:
    """One problem in an input file, located by file, line and field path."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


SHOWN_PROBLEMS = 100  # lines of a many-problem error that are printed; ``problems`` keeps every one


def problem_lines(lines: list[str]) -> str:
    """The first :data:`SHOWN_PROBLEMS` lines, and how many more there are: a lockfile with ten thousand
    bad entries gives a readable error, not ten thousand lines."""
    shown = lines[:SHOWN_PROBLEMS]
    if len(lines) > SHOWN_PROBLEMS:
        shown.append(f"… and {len(lines) - SHOWN_PROBLEMS} more problems (fix these first)")
    return "\n".join(shown)


class DataFileError(InputError):
    """A data file a user wrote (a lock, the config file, a recipe, a cluster file) failed strict reading
    (:mod:`envbuild.data`); carries every problem found, not just the first. Each kind of file has its
    own subclass, so a recipe's problem is never called a lockfile's."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems)
        super().__init__(problem_lines([str(p) for p in self.problems]))


class LockfileError(DataFileError):
    """A lockfile failed validation."""


class ProblemsError(EnvbuildError):
    """Several problems found at once (every package file, every source), reported together: one
    line each, sorted; ``problems`` keeps them for callers and tests."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = sorted(problems)
        super().__init__(problem_lines(self.problems))


class RemoteError(EnvbuildError):
    """A remote (git server, package index, registry) could not be reached or answered wrongly."""


class CacheError(EnvbuildError):
    """The local cache is unusable (permissions, disk full) in a way envbuild cannot repair."""


class EngineError(EnvbuildError):
    """The container engine is unreachable or a build failed."""
