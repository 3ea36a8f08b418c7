"""The local backend: the trainer as a child process of this one (already inside the image)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from envbuild.errors import InputError
from envbuild.interrupts import while_stopping
from envrun.launch.base import LaunchResult, LogSink, OnThisHost
from envrun.plan import RunPlan

STOP_GRACE_SECONDS = 20.0


class LocalLauncher(OnThisHost):
    def describe(self, plan: RunPlan) -> dict[str, Any]:
        """The process :meth:`launch` would start (for the dry run)."""
        return {
            "backend": "local",
            "argv": list(plan.argv),
            "env": dict(plan.env),  # over this process's environment
            "cwd": str(Path.cwd()),
            "process_group": (
                "a session of its own; Ctrl-C or SIGTERM sends SIGINT to the group, "
                f"SIGKILL after {STOP_GRACE_SECONDS:g} s"
            ),
        }

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        try:
            # A session of its own: a terminal's Ctrl-C reaches only us, and we stop the whole group.
            child = subprocess.Popen(
                list(plan.argv),
                env={**os.environ, **plan.env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except FileNotFoundError:
            raise InputError(f"{plan.argv[0]}: entry point not found on PATH") from None
        assert child.stdout is not None
        try:
            for line in child.stdout:
                log(line)
            return LaunchResult(child.wait())
        except KeyboardInterrupt:
            code = _stop(child, log)
            return LaunchResult(code, interrupted=True, detail="process group stopped")


def _signal_group(child: subprocess.Popen[str], sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


def _stop(child: subprocess.Popen[str], log: LogSink) -> int | None:
    """SIGINT to the job's process group (what a trainer expects from Ctrl-C), SIGKILL after a grace
    period or a second Ctrl-C (or SIGTERM); the job's last words still go to the log. The second signal is
    taken from before the first is passed on: it can never end envrun with the group left running."""
    graced = time.monotonic() + STOP_GRACE_SECONDS
    killer = threading.Timer(STOP_GRACE_SECONDS, _signal_group, (child, signal.SIGKILL))
    with while_stopping(lambda: _signal_group(child, signal.SIGKILL)):
        _signal_group(child, signal.SIGINT)
        killer.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:
                log(line)
            child.wait(timeout=max(0.0, graced - time.monotonic()))  # its output can end before it does
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)  # the grace is over (the killer may not have run yet)
        finally:
            killer.cancel()
        try:
            return child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None
