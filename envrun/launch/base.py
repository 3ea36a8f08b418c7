"""What every launcher is (:class:`Launcher`) and returns (:class:`LaunchResult`): the leaf the backends
import, so that choosing one (:func:`envrun.prepare.launcher_for`) and being one are apart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from envbuild.progress import Progress
from envrun.plan import RunPlan
from envrun.preflightline import PreflightLine

if TYPE_CHECKING:
    from envrun.exports import ExportSearch
    from envrun.probe.report import ExportLayout

LogSink = Callable[[str], None]


@dataclass(frozen=True)
class LaunchResult:
    exit_code: int | None  # None when the job never reported one (stopped, lost)
    interrupted: bool = False  # stopped on Ctrl-C or SIGTERM
    detail: str = ""
    # A scheduler's job records its own run where it ran (envrun.injob): its status there, when it gives one
    # (``refused``: its nodes refused the job), and the checks made on its nodes, joining this run's preflight.
    status: str | None = None
    checked: tuple[PreflightLine, ...] = ()


class Launcher(Protocol):
    def check_target(self, plan: RunPlan, skip: frozenset[str], progress: Progress) -> tuple[PreflightLine, ...]:
        """Ask where the job will run whether it may (a cluster's nodes: which lock each runs); the lines
        join the run's preflight record, and a failed one refuses the job before it starts."""

    def find_exports(self, plan: RunPlan, layout: ExportLayout, progress: Progress) -> ExportSearch:
        """The HF exports the job wrote, each audited on the machine that holds it."""

    def describe(self, plan: RunPlan) -> dict[str, Any]:
        """What :meth:`launch` would start, as JSON-able data with ``backend`` first: the process, the
        container (devices, mounts, environment) or the Ray submission. Nothing is started."""

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        """Run the job to its end; on KeyboardInterrupt (Ctrl-C, or SIGTERM while a run executes) stop it
        and return ``interrupted=True``."""


class OnThisHost:
    """What a launcher whose job runs on this host has to say: the preflight has checked this host (and the
    image), and the exports lie here (a container's output directory is a host directory)."""

    def check_target(self, plan: RunPlan, skip: frozenset[str], progress: Progress) -> tuple[PreflightLine, ...]:
        return ()

    def find_exports(self, plan: RunPlan, layout: ExportLayout, progress: Progress) -> ExportSearch:
        from envrun.auditnames import name_source
        from envrun.exports import search_here

        return search_here(layout, name_source(plan))
