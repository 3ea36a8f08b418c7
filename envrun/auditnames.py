"""Where a run's checkpoint audits on this host take their expected names: the model the lock's
transformers builds with the job's interpreter (:func:`envrun.checkpoint.modelnames.job_names`, the one
choice, which a Ray node makes for itself in :mod:`envrun.cluster.onnode`), here where the job runs:

- local: the job's interpreter (the recipe's entry point, found on the job's ``PATH``) on this host;
- docker: a container of the locked image, no network and no devices, run through
  :mod:`envbuild.engine.client` (config.json is mounted read-only: an engine's container has no stdin).

Without a transformers pin in the lock there is no model to ask, and envrun's static description is
used; every result says which source it was.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import EngineError
from envbuild.lock.model import Lock
from envrun.checkpoint.modelnames import ModelNames, ModelNamesError, job_names, last_line
from envrun.plan import RunPlan

TRANSFORMERS = "transformers"
_MOUNT = "/envrun-names"


def locked_transformers(lock: Lock) -> str | None:
    """The transformers version the lock pins, or None."""
    return next((p.version for p in lock.packages if p.name.lower() == TRANSFORMERS), None)


@dataclass(frozen=True)
class InImage:
    """A :data:`envrun.checkpoint.modelnames.Runner`: the script in a container of ``image``."""

    image: str

    def __call__(self, command: list[str], config: bytes, names: ModelNames) -> tuple[int, bytes | str, str]:
        from envbuild.engine.client import Engine  # the engine's client costs an import: only when asked
        from envrun.bytecode import prepare_for, with_bytecode

        with tempfile.TemporaryDirectory(prefix="envrun-names-") as tmp:
            (Path(tmp) / "config.json").write_bytes(config)
            os.chmod(tmp, 0o755)  # noqa: PTH101 (the container's user reads it)
            try:
                with Engine.connect() as engine:
                    bytecode = prepare_for(engine, self.image)  # transformers and torch, compiled once
                    env, volumes = with_bytecode(bytecode, names.env or {}, {tmp: {"bind": _MOUNT, "mode": "ro"}})
                    done = engine.run(self.image, [*command, f"{_MOUNT}/config.json"], volumes=volumes, environment=env)
            except EngineError as exc:
                raise ModelNamesError(f"{names.shown}: cannot run a container: {exc}") from None
        return done.exit_code, done.stdout, last_line(done.stderr)


def name_source(plan: RunPlan) -> ModelNames | None:
    """The source of names for an audit on this host (preflight, and the local and docker exports);
    None: envrun's static description (the lock pins no transformers)."""
    if plan.backend == "docker" and plan.image:
        return job_names(plan.transformers, plan.python, plan.env, f"in image {plan.image}", InImage(plan.image))
    return job_names(plan.transformers, plan.python, plan.env, "on this host")
