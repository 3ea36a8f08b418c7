"""Virtual environments of real upstream packages for the tests, built once per machine and cached.

Tests that must meet the real thing (transformers' ``save_pretrained``, the real verl 0.9.1) run it in
a virtual environment of its own, never in the project's: the tool does not depend on torch, and the
real stack's pins (hydra, ray, numpy …) must not decide the tool's test environment.

``cached_venv(requirements)`` returns an environment holding exactly those requirements, built under
``CACHE_DIR/venvs/<key>``; the key is a hash of the sorted requirements, the interpreter (its real path
and full version) and :data:`REVISION`. ``cached_venv(more, base=venv)`` is an overlay: an environment that sees ``venv``'s
packages (a ``.pth`` file naming its site-packages) and adds ``more`` — a second stack differing by a few
packages costs seconds, not another torch. It is built in place under a file lock (a venv's scripts hold their absolute path, so
it cannot be built elsewhere and renamed), and a stamp written last marks it ready: a build killed
half-way is removed and made again by the next caller, and parallel sessions wait for one build.

CPU torch: this machine's pip finds a local CPU wheel of ``torch==2.13.0`` (``PIP_FIND_LINKS``); a
requirement that admits a newer torch would download a CUDA build of several GB, so callers pin it.

uv installs an environment of its own (not an overlay) where it can read the same sources pip would:
pip's configuration (``pip config list``: the indexes, find-links and constraints this machine sets) said
to uv in its flags (:func:`uv_sources`), every index weighed alike as pip weighs them. The verl stack then
takes ~26 s instead of pip's ~67 s (each from a cold cache), bytecode compiled as pip compiles it. Where
pip's configuration holds a setting not translated here, or uv is missing, pip installs. An overlay is
always pip's: uv reads only the environment's own site-packages, not the ``.pth``-named base, and would
install the base's packages (torch among them) again.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.lib.baseimage import CACHE_DIR

# Bump when the way an environment is made changes in a way its key does not show. 2: uv installs.
REVISION = 2
VENVS = CACHE_DIR / "venvs"
TORCH_CPU = "torch==2.13.0"  # the CPU wheel this machine's pip finds locally
HF_STACK = (TORCH_CPU, "transformers==5.10.4", "safetensors>=0.4")
_READY = ".envbuild-test-ready"
_BASE_PTH = "_envbuild_test_base.pth"


@dataclass(frozen=True)
class Venv:
    root: Path
    requirements: tuple[str, ...]

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return self.root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def run(
        self,
        *args: str,
        timeout: float = 600,
        cwd: Path | None = None,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run this environment's Python with ``args`` (and ``input`` on stdin, ``env`` added to this process's
        environment); output captured as text."""
        return subprocess.run(
            [str(self.python), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=cwd,
            input=input,
            env={**os.environ, **env} if env else None,
        )


def venv_key(requirements: Iterable[str], base: Venv | None = None) -> str:
    """The cache key: the requirements and the interpreter that makes the venv — its real path and full
    version, so a venv one interpreter made (Debian's /usr/bin/python3, a pyenv 3.11) is never another's."""
    interpreter = [os.path.realpath(sys.executable), sys.version]
    source = json.dumps([sorted(requirements), interpreter, REVISION, base.root.name if base else None]).encode()
    return hashlib.sha256(source).hexdigest()[:16]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# Where a system interpreter lives: the test images (Debian bookworm, as this machine) hold their own at the
# same paths, and mounting the host's /usr over an image's would hide its programs (its docker-init).
SYSTEM_PREFIXES = (Path("/usr"), Path("/"))


def interpreter_mounts(python: Path) -> tuple[Path, ...]:
    """The host directories a container of a test image mounts (at the same paths) to run ``python``, a
    venv's interpreter: the prefix of the interpreter the venv links to (a pyenv or uv Python), none for the
    system's own, which the image has."""
    prefix = Path(os.path.realpath(python)).parents[1]
    return () if prefix in SYSTEM_PREFIXES else (prefix,)


def cached_venv(requirements: Iterable[str], *, base: Venv | None = None, timeout: float = 1800) -> Venv:
    """The cached environment holding ``requirements`` (built on first use, on this machine); over ``base``
    when given (its packages seen, not copied)."""
    wanted = tuple(sorted(requirements))
    root = VENVS / venv_key(wanted, base)
    venv = Venv(root, wanted)
    if (root / _READY).exists():
        return venv
    VENVS.mkdir(parents=True, exist_ok=True)
    with _locked(VENVS / f"{root.name}.lock"):
        if (root / _READY).exists():
            return venv
        shutil.rmtree(root, ignore_errors=True)  # a build that was killed half-way
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
        if base is not None:  # a .pth is read only in a site directory: an overlay's overlay names the whole chain
            chain = [str(base.site_packages)]
            if (inherited := base.site_packages / _BASE_PTH).exists():
                chain += inherited.read_text().split()
            (venv.site_packages / _BASE_PTH).write_text("".join(f"{path}\n" for path in chain))
        sources = uv_sources(pip_config(venv)) if base is None and UV.exists() else None
        # uv leaves an empty lock file in the temporary directory for each sdist it builds: one of its own here.
        with tempfile.TemporaryDirectory(dir=VENVS) as scratch:
            if sources is None:
                command = [str(venv.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted]
                env = None
            else:
                command = [str(UV), "pip", "install", "-q", "--python", str(venv.python), "--compile-bytecode"]
                command += [*sources.flags, *wanted]
                env = {**os.environ, "TMPDIR": scratch, **sources.env}
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"{' '.join(command[:3])} {' '.join(wanted)} failed:\n{done.stderr[-3000:]}")
        (root / _READY).write_text(json.dumps(list(wanted)) + "\n")
    return venv


UV = Path(sys.executable).parent / "uv"  # the project's own (a dependency: lock update resolves with it)
_PRECEDENCE = (":env:", "install", "global")  # pip's: environment variables, then install's section, then global
# pip settings that change nothing uv would install (timeouts, output, the version check, its own cache;
# PIP_CONFIG_FILE, whose settings the listing already holds).
_INERT = {
    "config-file",
    "default-timeout",
    "timeout",
    "disable-pip-version-check",
    "no-cache-dir",
    "cache-dir",
    "progress-bar",
    "quiet",
    "verbose",
    "no-color",
    "root-user-action",
    "retries",
    "break-system-packages",
}
_LISTS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint"}


@dataclass(frozen=True)
class UvSources:
    flags: tuple[str, ...]
    env: dict[str, str]


def pip_config(venv: Venv) -> list[str]:
    """``pip config list`` as the environment's pip prints it: ``<section or :env:>.<key>=<repr of value>``."""
    done = subprocess.run(
        [str(venv.python), "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.splitlines()


def uv_sources(lines: Iterable[str]) -> UvSources | None:
    """uv's flags (and environment) for the packages pip's configuration ``lines`` would install, or None
    when that configuration holds a setting not translated here (then pip installs)."""
    settings: dict[str, dict[str, str]] = {}
    for line in lines:
        name, _, value = line.partition("=")
        scope, _, key = name.rpartition(".")
        if scope not in _PRECEDENCE:
            continue  # another command's section (download, wheel …)
        try:
            settings.setdefault(key, {})[scope] = str(ast.literal_eval(value))
        except (ValueError, SyntaxError):
            return None  # not the shape this reads: pip installs
    flags = ["--index-strategy", "unsafe-best-match"]
    env: dict[str, str] = {}
    for key, scopes in sorted(settings.items()):
        value = next(scopes[s] for s in _PRECEDENCE if s in scopes)
        if key in _LISTS:
            flags += [part for item in value.split() for part in (_LISTS[key], item)]
        elif key == "index-url":
            flags += ["--index-url", value]
        elif key == "cert":
            env["SSL_CERT_FILE"] = value
        elif key not in _INERT:
            return None
    return UvSources(tuple(flags), env)
