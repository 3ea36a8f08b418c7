"""A run directory: what was run, with what, what it printed and how it ended.

Layout::

    plan.json       the resolved command, environment, backend, image and lock digests
    command.txt     the command as one shell line (to rerun by hand)
    preflight.json  every preflight line
    output.log      the job's output, as streamed
    status.json     {"status": "succeeded" | "failed" | "interrupted" | "error" | "refused", "exit_code": N}
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal, TextIO

from envbuild.data.jsonout import to_jsonable
from envbuild.errors import CacheError
from envbuild.fileio import write_atomic
from envbuild.pipes import stdout_reader_gone
from envrun.plan import RunPlan
from envrun.planview import plan_to_json

# refused: where the job would run may not run it (a node on another lock); nothing was started.
Status = Literal["succeeded", "failed", "interrupted", "error", "refused"]
# Where the job's output is shown besides output.log: the stream itself, none, or sys.stdout / sys.stderr as they
# are when a line comes; stderr under `--json`, whose stdout holds the outcome's JSON alone.
Echo = TextIO | None | Literal["stdout", "stderr"]


def default_run_dir(recipe: str, base: Path = Path("runs")) -> Path:
    return base / f"{recipe}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


class RunDir:
    """Writes a run's record as it happens; ``log`` is safe to call from a log-streaming thread."""

    def __init__(self, path: Path, echo: Echo = "stdout") -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise CacheError(f"{self.path}: run directory exists; pick another --run-dir") from None
        except OSError as exc:
            raise CacheError(f"{self.path}: cannot create the run directory: {exc.strerror or exc}") from None
        self._log = (self.path / "output.log").open("a", encoding="utf-8")
        self._echo, self._lock = echo, threading.Lock()

    def record_plan(self, plan: RunPlan, image_digest: str | None = None) -> None:
        document = plan_to_json(plan)
        document["image_digest"] = image_digest
        _write_json(self.path / "plan.json", document)
        (self.path / "command.txt").write_text(plan.command_line + "\n", encoding="utf-8")
        _write_json(self.path / "preflight.json", to_jsonable(plan.preflight))

    def log(self, text: str) -> None:
        """One chunk of output (a line with its newline, usually)."""
        with self._lock:
            self._log.write(text)
            self._log.flush()
            echo = sys.stdout if self._echo == "stdout" else sys.stderr if self._echo == "stderr" else self._echo
            if echo is not None:
                try:
                    echo.write(text)
                    echo.flush()
                except BrokenPipeError:
                    if echo is not sys.stdout or not stdout_reader_gone():
                        raise
                    self._echo = None  # the terminal's reader went (a `| tee` stopped): the job goes on, logged here

    def record_json(self, name: str, document: Any) -> None:
        _write_json(self.path / name, document)

    def finish(self, status: Status, exit_code: int | None, detail: str = "") -> None:
        document: dict[str, Any] = {"status": status, "exit_code": exit_code}
        if detail:
            document["detail"] = detail
        _write_json(self.path / "status.json", document)
        with self._lock:
            self._log.close()


def read_status(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "status.json").read_text(encoding="utf-8"))


def _write_json(path: Path, document: Any) -> None:
    write_atomic(path, json.dumps(document, indent=2, sort_keys=True) + "\n")
