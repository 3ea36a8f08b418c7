"""Expected names from the model itself: run :mod:`envrun.checkpoint.saved_names` with a python that has
transformers (the locked image's own, the job's) and read its answer. :class:`ModelNames` is the one
source of such names, wherever that python runs; :func:`job_names` is the one place a run chooses it.

``python`` is the command that starts that interpreter, as a list: ``["/usr/bin/python3"]``, or
``["docker", "run", "--rm", "-i", "--network", "none", IMAGE, "python3"]`` for the one in an image. The
script travels as ``-c`` text and config.json on stdin (a :data:`Runner` elsewhere may mount it
instead), so the interpreter needs neither envrun nor access to the checkpoint's directory.

    report = audit_checkpoint(model_dir, expected=ModelNames(("python3",)))
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from envbuild.errors import EnvbuildError, InputError
from envrun.checkpoint.expected import ExpectedNames
from envrun.checkpoint.untrusted import MiB, load_json

SCRIPT_PATH = Path(__file__).with_name("saved_names.py")
# 2,000,000 names of ~60 bytes in JSON; the answer for GLM-5 is 3.4 MB.
MAX_ANSWER_BYTES = 256 * MiB
_WORD = re.compile(r"[A-Za-z0-9_.+-]{1,128}")
DEFAULT_TIMEOUT = 600.0  # importing torch in a cold image is most of it; GLM-5 takes ~6 s warm


class ModelNamesError(EnvbuildError):
    """The interpreter could not produce the names (no transformers in it, a crash, a timeout)."""


class ModelRefusedConfigError(InputError):
    """The modelling code refuses the config.json, or cannot build or save its model: exit 2."""


def script_text() -> str:
    """The script, as text to run with any python (``python -c TEXT MAX_NAMES < config.json``)."""
    return SCRIPT_PATH.read_text(encoding="utf-8")


# How the script runs somewhere else than a process here (a container of an image): given its command
# line, config.json's bytes and the asking ModelNames, the exit status, stdout and stderr's last line.
Runner = Callable[[list[str], bytes, "ModelNames"], "tuple[int, bytes | str, str]"]


@dataclass(frozen=True)
class ModelNames:
    """A :data:`envrun.checkpoint.expected.NameSource`: the audit calls it with the config.json bytes it
    read and the most names it accepts for the checkpoint at hand.

    ``where`` says where ``python`` is ("with the job's python3 (PATH) on this host"), for the report;
    ``env`` is the environment it runs in (None: this one); ``transformers`` is the version the lock
    pins: names made by another transformers are refused, never taken; ``run`` runs it elsewhere (None:
    a process here). Each config.json is asked once (the exports of one run share their model's config,
    and each answer costs seconds), and an answer is reused only within the limit a later question sets,
    so the limit still refuses a model larger than that checkpoint makes plausible."""

    python: tuple[str, ...]
    timeout: float = DEFAULT_TIMEOUT
    where: str = ""
    env: Mapping[str, str] | None = None
    transformers: str | None = None
    run: Runner | None = None
    _answers: dict[bytes, ExpectedNames] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def shown(self) -> str:
        """The interpreter as errors name it: the command, and where it ran when not here."""
        command = " ".join(self.python)
        return f"{command} {self.where}" if self.run is not None and self.where else command

    def __call__(self, config: bytes, max_names: int) -> ExpectedNames:
        known = self._answers.get(config)
        if known is not None and len(known.names) <= max_names:
            return known
        if not self.python:
            raise InputError("no python command to build the model with")
        command = [*self.python, "-c", script_text(), str(max_names)]
        code, answer, stderr = (self.run or _run_here)(command, config, self)
        names = interpret_answer(code, answer, stderr, config, self.shown, max_names)
        if self.transformers is not None and names.transformers != self.transformers:
            raise ModelNamesError(f"{self.shown}: {names.source}, but the lock pins transformers {self.transformers}")
        if self.where:
            names = replace(names, source=f"{names.source} {self.where}")
        self._answers[config] = names
        return names


def job_names(
    transformers: str | None, python: str, env: Mapping[str, str], place: str, run: Runner | None = None
) -> ModelNames | None:
    """Where a run's checkpoint audits take their names, on this host and on every node alike: None —
    envrun's static description — when the lock pins no ``transformers`` (no model to ask); else the
    model that transformers builds with the job's interpreter ``python``, which ``run`` runs (in an
    image) or else is found as the job's own command finds it: on the job's PATH over this environment's.
    ``place`` says where ("on this host", "in image REF"). A failure to get the names fails the audit
    that asks: there is no fallback to the description."""
    if transformers is None:
        return None
    if run is not None:
        return ModelNames((python,), DEFAULT_TIMEOUT, place, env, transformers, run)
    job_env = {**os.environ, **env}
    found = shutil.which(python, path=job_env.get("PATH"))
    if found is None:
        return ModelNames((python,), where=place, transformers=transformers, run=_absent(python, place))
    return ModelNames((found,), DEFAULT_TIMEOUT, f"with the job's {python} ({found}) {place}", job_env, transformers)


def _absent(python: str, place: str) -> Runner:
    def fail(command: list[str], config: bytes, names: ModelNames) -> tuple[int, bytes | str, str]:
        raise ModelNamesError(f"{python}: not found on the job's PATH {place} (the job's interpreter)")

    return fail


def _run_here(command: list[str], config: bytes, names: ModelNames) -> tuple[int, bytes | str, str]:
    env = None if names.env is None else dict(names.env)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(
                command, input=config, stdout=out, stderr=err, timeout=names.timeout, check=False, env=env
            )
        except FileNotFoundError:
            raise ModelNamesError(f"{names.shown}: no such command") from None
        except subprocess.TimeoutExpired:
            took = f"building the model on the meta device took over {names.timeout:g} s"
            raise ModelNamesError(f"{names.shown}: {took}") from None
        size = out.seek(0, 2)
        if size > MAX_ANSWER_BYTES:
            raise ModelNamesError(f"{names.shown}: {_too_large(size)}")
        out.seek(0)
        return done.returncode, out.read(), _tail(err)


def interpret_answer(
    code: int, answer: bytes | str, stderr: str, config: bytes, shown: str, max_names: int
) -> ExpectedNames:
    """What the script's exit status, stdout and last stderr line mean: the names, or the error."""
    if code == 2 and stderr.startswith("saved_names: "):
        raise ModelRefusedConfigError(f"config.json: {stderr.removeprefix('saved_names: ')}")
    if code != 0:
        raise ModelNamesError(f"{shown} exited {code}: {stderr or 'no message'}")
    if len(answer) > MAX_ANSWER_BYTES:
        raise ModelNamesError(f"{shown}: {_too_large(len(answer))}")
    return _parse_answer(answer, config, shown, max_names)


def _too_large(size: int) -> str:
    return f"an answer of {size:,} bytes, more than {MAX_ANSWER_BYTES // MiB} MiB"


def _parse_answer(answer: bytes | str, config: bytes, shown: str, max_names: int) -> ExpectedNames:
    def fail(message: str) -> ModelNamesError:
        return ModelNamesError(f"{shown}: {message}")

    try:
        raw = answer.encode("utf-8", "surrogateescape") if isinstance(answer, str) else answer
        doc = load_json(raw)  # nesting bounded before parsing: the interpreter is the image's
    except ValueError as exc:
        raise fail(f"not a JSON answer ({exc})") from None
    if not isinstance(doc, dict):
        raise fail(f"the answer holds no list of at most {max_names:,} tensor names")
    names = doc.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(names) > max_names:
        raise fail(f"the answer holds no list of at most {max_names:,} tensor names")
    if doc.get("config_sha256") != hashlib.sha256(config).hexdigest():
        raise fail("the answer is for another config.json than the one sent")
    about = {k: doc.get(k) for k in ("class", "transformers", "torch")}
    if not all(isinstance(v, str) for v in about.values()):
        raise fail("the answer does not say which class and versions made it")
    # These words are printed in every result that names where the names came from, and the version is
    # compared with the lock's pin: a class name and two version strings, nothing a terminal would act on.
    if not all(_WORD.fullmatch(str(v)) for v in about.values()):
        raise fail("the class or a version in the answer is not a plain name (letters, digits, '._+-')")
    source = f"{about['class']} of transformers {about['transformers']} on the meta device (torch {about['torch']})"
    return ExpectedNames(frozenset(names), source, doc["config_sha256"], str(about["transformers"]))


def _tail(handle: IO[bytes], limit: int = 2000) -> str:
    """The last line of what the interpreter said on stderr (its error, after any warnings)."""
    size = handle.seek(0, 2)
    handle.seek(max(0, size - limit))
    return last_line(handle.read().decode("utf-8", "replace"))


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[-1:])[:500] if lines else ""
