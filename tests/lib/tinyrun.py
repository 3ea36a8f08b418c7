"""A tiny recipe with a tiny Hydra config of its own, a tiny checkpoint and data: runs without network or NPUs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envbuild.fileio import write_atomic
from envbuild.lock.io import dump_lock, read_lock
from envrun.plan import RunParameters, RunPlan
from envrun.prepare import RunRequest
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint
from tests.lib.signals import restore_sigint

REPO = Path(__file__).resolve().parents[2]
REAL_LOCK = REPO / "lockfiles" / "glm5_2-ascend.lock.yaml"


def lock_without_transformers(source: Path = REAL_LOCK) -> Path:
    """The real lock without its transformers pin, written once per machine and content.

    The tiny runs' python has no transformers: with the real lock their checkpoint audits would ask
    the model of the lock's transformers for its names, and fail (as they must). Without the pin they
    use envrun's static description; the model's own names are tested with a real transformers in
    tests/test_auditnames.py."""
    lock = read_lock(source).lock
    text = dump_lock(replace(lock, packages=tuple(p for p in lock.packages if p.name != "transformers")))
    path = Path(tempfile.gettempdir()) / f"envbuild-tiny-{hashlib.sha256(text.encode()).hexdigest()[:16]}.lock.yaml"
    if not path.is_file():
        write_atomic(path, text)
    return path


LOCK = lock_without_transformers()
FAKE_TRAINER = REPO / "tests" / "lib" / "fake_trainer.py"

TINY_CONFIG = """\
trainer: {nnodes: 1, n_gpus_per_node: 1, total_epochs: 1, logger: [console], default_local_dir: null}
model: {path: null}
data: {train_files: null, val_files: null, batch: 8}
ckpt: {strict: true}
ray_kwargs: {ray_init: {runtime_env: {env_vars: {}}}}
"""

TINY_RECIPE = """\
recipe: 1
name: tiny
entry_point: [python3, -m, tiny.main]
config_name: tiny
runtime_env: {TINY_PATCH: '1'}
parameters: {model: model.path, train_files: data.train_files, val_files: data.val_files,
             nnodes: trainer.nnodes, npus_per_node: trainer.n_gpus_per_node}
lenient_checkpoint:
  override: ckpt.strict=False
  reason: MTP layers are not exported
  guard: checkpoint-audit
override_groups:
- group: data
  overrides: [data.batch=4, +data.extra.deep=x y]
- group: trainer
  overrides: ['trainer.logger=["console"]', trainer.total_epochs=2]
"""


@dataclass(frozen=True)
class Tiny:
    recipe: Path
    config: Path
    model: Path
    data: Path
    tmp: Path

    def args(self, *extra: str, entry: bool = True) -> list[str]:
        args = [
            "run",
            str(self.recipe),
            "--lock",
            str(LOCK),
            "--verl-config",
            str(self.config),
            "--model",
            str(self.model),
            "--data",
            str(self.data),
            "-q",
            "--skip-check",
            "npus",
        ]  # no NPU on a test host; the record says it was skipped
        if entry:
            args += ["--entry-point", f"{sys.executable} {FAKE_TRAINER}"]
        return args + list(extra)

    def request(self, *, dry_run: bool = False, **params: Any) -> RunRequest:
        """The library's request for what :meth:`args` says on the command line; ``params`` replace
        :class:`RunParameters` fields (``backend``, ``overrides``, ``extra_env``, ...)."""
        base = RunParameters(
            model=self.model, train_files=(self.data,), entry_point=(sys.executable, str(FAKE_TRAINER))
        )
        return RunRequest(
            str(self.recipe),
            replace(base, **params),
            lock=LOCK,
            verl_config=self.config,
            dry_run=dry_run,
            skip_checks=("npus",),  # no NPU on a test host; the record says it was skipped
            run_dir=self.tmp / "run",
        )

    def strict(self) -> Tiny:
        """The tiny recipe without its lenient save, for runs that must succeed: a lenient save is accepted
        only with its exports audited, and only the job probe (which the tiny recipe has not) says where
        they are (envrun.exports)."""
        text = self.recipe.read_text()
        if "lenient_checkpoint:" in text:
            self.recipe.write_text(text[: text.index("lenient_checkpoint:")] + text[text.index("override_groups:") :])
        return self

    @property
    def expect_file(self) -> Path:
        return self.tmp / "expect.json"

    def expect(self, plan: RunPlan, path: Path | None = None) -> None:
        """Tell the fake trainer to expect exactly ``plan``'s arguments (after its program) and env."""
        (path or self.expect_file).write_text(json.dumps({"args": list(plan.argv[2:]), "env": plan.env}))


def write_parquet_like(path: Path) -> Path:
    """Bytes with parquet's magic at both ends: all the preflight reads (pyarrow is not a dependency)."""
    path.write_bytes(b"PAR1" + b"\0" * 32 + b"PAR1")
    return path


def tiny_setup(tmp: Path) -> Tiny:
    config = tmp / "conf"
    config.mkdir()
    (config / "tiny.yaml").write_text(TINY_CONFIG)
    recipe = tmp / "tiny.yaml"
    recipe.write_text(TINY_RECIPE)
    model = tmp / "model"
    write_checkpoint(model, CheckpointSpec(include_mtp=False))
    return Tiny(recipe, config, model, write_parquet_like(tmp / "train.parquet"), tmp)


SLEEPING = "fake trainer: sleeping"  # the fake trainer's line once it runs (FAKE_TRAINER_SLEEP)


@dataclass
class EnvrunProcess:
    """A real ``envrun`` process whose job is running: the lines it printed until then, and how it ends."""

    process: subprocess.Popen[str]
    seen: list[str]
    rest: str = field(default="")  # what it printed after the signal

    def stop(self, signum: int, timeout: float) -> int:
        """Send ``signum`` (as Ctrl-C or a scheduler would) and wait for envrun to exit; its exit status."""
        self.process.send_signal(signum)
        self.rest = self.process.communicate(timeout=timeout)[0]
        return self.process.returncode


@contextmanager
def envrun_until_sleeping(args: Sequence[str], env: Mapping[str, str] | None = None) -> Iterator[EnvrunProcess]:
    """``python -m envrun.cli.main ARGS``, read until the fake trainer says it sleeps (the job is really
    running), then yielded; killed on the way out, whatever happened. SIGINT starts at its default in it,
    as under a terminal, whatever this process inherited."""
    cli = subprocess.Popen(
        [sys.executable, "-m", "envrun.cli.main", *args],
        cwd=REPO,
        env=dict(os.environ if env is None else env),
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=restore_sigint,
    )
    try:
        assert cli.stdout is not None
        seen = []
        for line in cli.stdout:
            seen.append(line)
            if SLEEPING in line:
                break
        yield EnvrunProcess(cli, seen)
    finally:
        cli.kill()
