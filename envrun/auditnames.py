"""Where a run's checkpoint audits take their expected names from, on each backend.

When the lock pins transformers, the names come from the model itself, built from config.json on the
meta device by the transformers the job will run (:mod:`envrun.checkpoint.modelnames`):

- local: the job's interpreter (the recipe's entry point, found on the job's ``PATH``) on this host;
- docker: a container of the locked image, no network and no devices, run through
  :mod:`envbuild.engine.client` (config.json is mounted read-only: an engine's container has no stdin);
- ray: each node's job interpreter, from the task pinned to that node (:mod:`envrun.cluster.onnode`).

Names made by another transformers than the lock's are refused, and a failure to get names from the
model fails the audit with its reason: there is no silent fallback to the static description. Without a
transformers pin in the lock there is no model to ask, and envrun's static description of the
transformers it describes is used; every result says which source it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import EngineError
from envbuild.lock.model import Lock
from envrun.checkpoint.expected import ExpectedNames, NameSource
from envrun.checkpoint.modelnames import (
    DEFAULT_TIMEOUT,
    ModelNames,
    ModelNamesError,
    interpret_answer,
    last_line,
    placed,
    script_argv,
)
from envrun.plan import RunPlan

TRANSFORMERS = "transformers"
_MOUNT = "/envrun-names"


def locked_transformers(lock: Lock) -> str | None:
    """The transformers version the lock pins, or None."""
    return next((p.version for p in lock.packages if p.name.lower() == TRANSFORMERS), None)


def job_python(python: str, env: Mapping[str, str]) -> str | None:
    """``python`` as the job's own command finds it: on the job's ``PATH`` over this environment's."""
    return shutil.which(python, path={**os.environ, **env}.get("PATH"))


@dataclass(frozen=True)
class ImageModelNames:
    """A :data:`NameSource`: the names from the model built by the transformers inside ``image``."""

    image: str
    python: str = "python3"
    env: Mapping[str, str] | None = None
    transformers: str | None = None

    def __call__(self, config: bytes, max_names: int) -> ExpectedNames:
        from envbuild.engine.client import Engine  # the engine's client costs an import: only when asked
        from envrun.bytecode import prepare_for, with_bytecode

        shown = f"{self.python} in image {self.image}"
        with tempfile.TemporaryDirectory(prefix="envrun-names-") as tmp:
            (Path(tmp) / "config.json").write_bytes(config)
            os.chmod(tmp, 0o755)  # noqa: PTH101 (the container's user reads it)
            command = script_argv([self.python], max_names, f"{_MOUNT}/config.json")
            try:
                with Engine.connect() as engine:
                    bytecode = prepare_for(engine, self.image)  # transformers and torch, compiled once
                    env, volumes = with_bytecode(bytecode, self.env or {}, {tmp: {"bind": _MOUNT, "mode": "ro"}})
                    done = engine.run(self.image, command, volumes=volumes, environment=env)
            except EngineError as exc:
                raise ModelNamesError(f"{shown}: cannot run a container: {exc}") from None
        names = interpret_answer(done.exit_code, done.stdout, last_line(done.stderr), config, shown, max_names)
        return placed(names, f"in image {self.image}", self.transformers, shown)


def name_source(plan: RunPlan) -> NameSource | None:
    """The source of names for an audit on this host (preflight, and the local and docker exports);
    None: envrun's static description (the lock pins no transformers). A Ray cluster's nodes choose
    their own (:func:`envrun.cluster.onnode.names_for`)."""
    if plan.transformers is None:
        return None
    if plan.backend == "docker" and plan.image:
        return ImageModelNames(plan.image, plan.python, plan.env, plan.transformers)
    found = job_python(plan.python, plan.env)
    if found is None:
        return _missing(f"{plan.python}: not found on the job's PATH (the job's interpreter)")
    where = f"with the job's {plan.python} ({found}) on this host"
    env = {**os.environ, **plan.env}
    return ModelNames((found,), DEFAULT_TIMEOUT, where, env, plan.transformers)


def _missing(reason: str) -> NameSource:
    def fail(config: bytes, max_names: int) -> ExpectedNames:
        raise ModelNamesError(reason)

    return fail
