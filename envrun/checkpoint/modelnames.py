"""Expected names from the model itself: run :mod:`envrun.checkpoint.saved_names` with a python that has
transformers (the locked image's own, where preflight and the post-run audit run) and read its answer.

``python`` is the command that starts that interpreter, as a list: ``["/usr/bin/python3"]``, or
``["docker", "run", "--rm", "-i", "--network", "none", IMAGE, "python3"]`` for the one in an image. The
script travels as ``-c`` text and config.json on stdin, so the interpreter needs neither envrun nor
access to the checkpoint's directory.

    names = expected_names_from_model(model_dir / "config.json", ["python3"])
    report = audit_checkpoint(model_dir, expected=names)
    # or, bounded by what the checkpoint holds before the model is built:
    report = audit_checkpoint(model_dir, expected=ModelNames(("python3",)))
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from envbuild.errors import EnvbuildError, InputError
from envrun.checkpoint.expected import ExpectedNames
from envrun.checkpoint.layout import MAX_EXPECTED_TENSORS, read_config
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


@dataclass(frozen=True)
class ModelNames:
    """A :data:`envrun.checkpoint.expected.NameSource`: the audit calls it with the config.json bytes it
    read and the most names it accepts for the checkpoint at hand.

    ``where`` says where ``python`` is ("the job's python3 on this host"), for the report;
    ``env`` is the environment it runs in (None: this one); ``transformers`` is the version the lock
    pins: names made by another transformers are refused, never taken."""

    python: tuple[str, ...]
    timeout: float = DEFAULT_TIMEOUT
    where: str = ""
    env: Mapping[str, str] | None = None
    transformers: str | None = None

    def __call__(self, config: bytes, max_names: int) -> ExpectedNames:
        names = names_for_config(config, self.python, max_names=max_names, timeout=self.timeout, env=self.env)
        return placed(names, self.where, self.transformers, " ".join(self.python))


def placed(names: ExpectedNames, where: str, transformers: str | None, shown: str) -> ExpectedNames:
    """``names`` with where they were made in their source; refused when made by another transformers
    than ``transformers`` (the lock's), since the audit would then check against code the job does not run."""
    if transformers is not None and names.transformers != transformers:
        raise ModelNamesError(f"{shown}: {names.source}, but the lock pins transformers {transformers}")
    source = f"{names.source} {where}" if where else names.source
    return replace(names, source=source)


def expected_names_from_model(
    config_path: Path, python: Sequence[str], *, max_names: int = MAX_EXPECTED_TENSORS, timeout: float = DEFAULT_TIMEOUT
) -> ExpectedNames:
    """The names ``save_pretrained`` writes for the model of ``config_path``, as ``python`` builds it."""
    raw, _ = read_config(Path(config_path))  # the bounded, hostile-input read, and a JSON object
    return names_for_config(raw, python, max_names=max_names, timeout=timeout)


def script_argv(python: Sequence[str], max_names: int, config_file: str | None = None) -> list[str]:
    """The command that runs the script with ``python``: config.json on stdin, or read from ``config_file``
    (a path the interpreter sees, for a container that has no stdin)."""
    return [*python, "-c", script_text(), str(max_names), *([config_file] if config_file else [])]


def names_for_config(
    config: bytes,
    python: Sequence[str],
    *,
    max_names: int = MAX_EXPECTED_TENSORS,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> ExpectedNames:
    if not python:
        raise InputError("no python command to build the model with")
    command = script_argv(python, max_names)
    shown = " ".join(python)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(
                command,
                input=config,
                stdout=out,
                stderr=err,
                timeout=timeout,
                check=False,
                env=None if env is None else dict(env),
            )
        except FileNotFoundError:
            raise ModelNamesError(f"{shown}: no such command") from None
        except subprocess.TimeoutExpired:
            raise ModelNamesError(f"{shown}: building the model on the meta device took over {timeout:g} s") from None
        stderr = _tail(err)
        size = out.seek(0, 2)
        if size > MAX_ANSWER_BYTES:
            raise ModelNamesError(f"{shown}: an answer of {size:,} bytes, more than {MAX_ANSWER_BYTES // MiB} MiB")
        out.seek(0)
        answer = out.read()
    return interpret_answer(done.returncode, answer, stderr, config, shown, max_names)


def interpret_answer(
    code: int, answer: bytes | str, stderr: str, config: bytes, shown: str, max_names: int
) -> ExpectedNames:
    """What the script's exit status, stdout and last stderr line mean: the names, or the error."""
    if code == 2 and stderr.startswith("saved_names: "):
        raise ModelRefusedConfigError(f"config.json: {stderr.removeprefix('saved_names: ')}")
    if code != 0:
        raise ModelNamesError(f"{shown} exited {code}: {stderr or 'no message'}")
    if len(answer) > MAX_ANSWER_BYTES:
        raise ModelNamesError(f"{shown}: an answer of {len(answer):,} bytes, more than {MAX_ANSWER_BYTES // MiB} MiB")
    return _parse_answer(answer, config, shown, max_names)


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
