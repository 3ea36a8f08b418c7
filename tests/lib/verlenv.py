"""The real verl 0.9.1 for the tests, in cached environments of the lock's own pins (with CPU torch).

- :func:`verl_env`: verl and what its v1 trainer imports but declares only in its ``verl-core`` extra
  (cachetools, fastapi, uvicorn), at the versions the real lock pins; with ``transfer_queue=True`` (the
  default) an overlay adding TransferQueue and what it needs, at the lock's versions: the environment the
  fixed lock gives. Without it: the environment the lock gave before TransferQueue was locked.
- :func:`path_env`: the job environment that makes ``python3`` this environment's (the local backend and
  the job probe run the recipe's ``python3``).
- :func:`probe_recipe`: the shipped grpo-glm5 recipe, with one more ``skip_imports`` entry for what such an
  environment cannot hold: the lock's Megatron-LM source (megatron-core 0.18 needs Python 3.12; this
  machine's CPU torch is for 3.11).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml
from packaging.utils import canonicalize_name

from envbuild.lock.io import read_lock
from envrun.recipe import recipe_path
from tests.lib.pyenvs import TORCH_CPU, Venv, cached_venv
from tests.lib.tinyrun import REAL_LOCK as LOCK

VERL_NAMES = ("verl", "transformers", "tensordict", "ray", "cachetools", "fastapi", "uvicorn", "starlette")
TRANSFER_QUEUE_NAMES = ("transferqueue", "pyzmq", "msgspec")
NO_MEGATRON = {
    "name": "megatron",
    "reason": "the test environment holds verl, not the lock's Megatron-LM source (megatron-core 0.18 needs "
    "Python 3.12, and this machine's CPU torch is a 3.11 wheel)",
}


def lock_pins(names: tuple[str, ...], lock: Path = LOCK) -> list[str]:
    """``name==version`` for each of ``names`` as the real lock pins it."""
    packages = {canonicalize_name(p.name): p for p in read_lock(lock).lock.packages}
    return [f"{packages[canonicalize_name(n)].name}=={packages[canonicalize_name(n)].version}" for n in names]


def verl_env(*, transfer_queue: bool = True) -> Venv:
    base = cached_venv([TORCH_CPU, *lock_pins(VERL_NAMES)])
    if not transfer_queue:
        return base
    return cached_venv(lock_pins(TRANSFER_QUEUE_NAMES), base=base)


def path_env(venv: Venv) -> dict[str, str]:
    return {"PATH": f"{venv.bin}{os.pathsep}{os.environ.get('PATH', '')}"}


def probe_recipe(directory: Path, *skips: dict[str, str]) -> Path:
    """The shipped recipe with ``skips`` (default: :data:`NO_MEGATRON`) added to its probe's skip_imports."""
    document = yaml.safe_load(recipe_path("grpo-glm5").read_text(encoding="utf-8"))
    document["probe"]["skip_imports"] += list(skips or (NO_MEGATRON,))
    path = directory / "grpo-glm5.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


# verl's own get_hf_model_checkpoint_path, run for real: verl.utils.megatron_utils imported whole, with
# Megatron (absent here) answered by stub modules, so the path is the function's, not a copy of it.
_HF_EXPORT_DIR = """
import importlib.abc, importlib.machinery, sys, types

class Anything(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything(name, (), {})

    def __call__(cls, *args, **kwargs):
        return cls

class Stub(types.ModuleType):
    __path__ = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything(name, (), {})

class Megatron(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "megatron" or name.startswith("megatron."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return Stub(spec.name)

    def exec_module(self, module):
        pass

sys.meta_path.insert(0, Megatron())
from verl.utils.megatron_utils import get_hf_model_checkpoint_path
print(get_hf_model_checkpoint_path(sys.argv[1]))
"""


def verl_hf_export_dir(venv: Venv, checkpoint_root: Path, step: int = 1) -> Path:
    """Where verl writes the HF weights of the actor's checkpoint at ``step``: ``<root>/global_step_N/actor``
    (``_save_checkpoint`` in verl/trainer/ppo/v1/trainer_base.py) joined by verl's own
    function. It creates the directories, as verl does when it saves.

    verl's function joins names to the path it is given, so its answer below the root is the same for any
    root: it is run once per environment (importing verl's stack, ~10 s of CPU) and that part is kept beside
    the environment, which never changes once made (:func:`tests.lib.pyenvs.cached_venv`)."""
    kept = venv.root / f".verl-hf-export-dir-step-{step}"
    try:
        relative = Path(kept.read_text(encoding="utf-8"))
    except FileNotFoundError:
        with tempfile.TemporaryDirectory() as scratch:
            root = Path(scratch)
            # verl's function makes the directories under a lock file it leaves in the temporary directory
            # (verl.utils.fs.local_mkdir_safe: /tmp/ckpt_<hash>.lock, three a call): in this scratch one.
            where_to = str(root / f"global_step_{step}" / "actor")
            done = venv.run("-c", _HF_EXPORT_DIR, where_to, timeout=300, env={"TMPDIR": scratch})
            assert done.returncode == 0, done.stderr[-2000:]
            relative = Path(done.stdout.strip().splitlines()[-1]).relative_to(root)
        assert relative.parts[:2] == (f"global_step_{step}", "actor"), relative
        partial = kept.with_name(f"{kept.name}.{os.getpid()}")
        partial.write_text(str(relative), encoding="utf-8")
        partial.replace(kept)  # whole or not at all: parallel sessions may both write it
    where = checkpoint_root / relative
    where.mkdir(parents=True, exist_ok=True)
    return where
