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
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.lib.baseimage import CACHE_DIR

REVISION = 1  # bump when the way an environment is made changes in a way its key does not show
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
        self, *args: str, timeout: float = 600, cwd: Path | None = None, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run this environment's Python with ``args`` (and ``input`` on stdin); output captured as text."""
        return subprocess.run(
            [str(self.python), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=cwd,
            input=input,
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
        done = subprocess.run(
            [str(venv.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"pip install {' '.join(wanted)} failed:\n{done.stderr[-3000:]}")
        (root / _READY).write_text(json.dumps(list(wanted)) + "\n")
    return venv
