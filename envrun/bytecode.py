"""The jobs' bytecode: compiled once per image on each engine, kept outside the image.

An image envbuild builds holds no bytecode (compiled files are not reproducible bytes, and the build
compiles nothing), and sets ``PYTHONDONTWRITEBYTECODE``. Left so, every Python process of a job
compiles everything it imports from source: each Ray worker, each probe, each audit. Measured here:
``import ray`` takes 7.5-8 s that way and 1.3-2.4 s with bytecode, and verl's stack (torch, transformers,
vllm, Megatron) is several times ray.

So every container envrun starts from an image mounts that image's volume on its engine,
``envrun-bytecode-<image ID>``, at :data:`MOUNT`, with ``PYTHONPYCACHEPREFIX`` pointing there and
``PYTHONDONTWRITEBYTECODE`` emptied: the first process to import a module writes its bytecode there
(atomically: Python writes aside and renames, so the containers of one host share it safely), every
later one on that host reads it. The volume is keyed by the image ID, never by a tag: the image's files
all have the epoch's mtime, and a timestamp ``.pyc`` of another image's file of the same path and size
would be taken as valid. The image itself is untouched; its ID does not change.

Only an image that says it ships no bytecode (its config sets ``PYTHONDONTWRITEBYTECODE``, as every
image envbuild builds does) gets a volume: with ``PYTHONPYCACHEPREFIX`` set Python reads no
``__pycache__`` of the image's, so an image that ships its bytecode would lose it. A job that sets
``PYTHONPYCACHEPREFIX`` or ``PYTHONDONTWRITEBYTECODE`` itself (the recipe's ``runtime_env``, ``--env``)
keeps its own choice. Volumes of images the engine no longer has are
removed when envrun next prepares one (a volume a container still uses stays); ``docker volume rm``
removes one by hand, and costs one compile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envbuild.engine.client import Engine

VOLUME_PREFIX = "envrun-bytecode-"
MOUNT = "/var/cache/envrun/bytecode"
IMAGE_LABEL = "io.envrun.bytecode.image"  # the image ID the volume's bytecode was compiled from
PREFIX_ENV = "PYTHONPYCACHEPREFIX"
DONT_WRITE_ENV = "PYTHONDONTWRITEBYTECODE"


@dataclass(frozen=True)
class Bytecode:
    """One image's bytecode volume, as the containers of that image mount it."""

    image_id: str  # "sha256:<64 hex>"

    @property
    def volume(self) -> str:
        return VOLUME_PREFIX + self.image_id.removeprefix("sha256:")[:16]

    def env(self, job_env: Mapping[str, str]) -> dict[str, str]:
        """``job_env`` with the variables that send bytecode to the volume, unless the job set either."""
        if PREFIX_ENV in job_env or DONT_WRITE_ENV in job_env:
            return dict(job_env)
        return {**job_env, PREFIX_ENV: MOUNT, DONT_WRITE_ENV: ""}

    def volumes(self, job_volumes: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
        """``job_volumes`` with the bytecode volume (unless the job mounts something at :data:`MOUNT`)."""
        mounts = {host: dict(bind) for host, bind in job_volumes.items()}
        if all(bind.get("bind") != MOUNT for bind in mounts.values()):
            mounts[self.volume] = {"bind": MOUNT, "mode": "rw"}
        return mounts


def with_bytecode(
    bytecode: Bytecode | None, env: Mapping[str, str], volumes: Mapping[str, Mapping[str, str]]
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """A container's environment and volumes with ``bytecode``'s (unchanged copies when None)."""
    if bytecode is None:
        return dict(env), {host: dict(bind) for host, bind in volumes.items()}
    return bytecode.env(env), bytecode.volumes(volumes)


def prepare(engine: Engine, image_id: str) -> Bytecode:
    """The volume for ``image_id`` on ``engine``, created if new; the volumes of images the engine no
    longer has are removed first (unless a container still uses one)."""
    bytecode = Bytecode(image_id)
    for name, labels in engine.volumes(IMAGE_LABEL).items():
        if name.startswith(VOLUME_PREFIX) and name != bytecode.volume:
            owner = labels.get(IMAGE_LABEL, "")
            if owner and engine.inspect(owner) is None:
                engine.remove_volume(name)
    engine.ensure_volume(bytecode.volume, {IMAGE_LABEL: image_id})
    return bytecode


def ships_no_bytecode(attrs: Mapping[str, Any]) -> bool:
    """The image (its inspect data) sets ``PYTHONDONTWRITEBYTECODE`` to a non-empty value."""
    env = (attrs.get("Config") or {}).get("Env") or []
    return any(e.startswith(f"{DONT_WRITE_ENV}=") and e.partition("=")[2] != "" for e in env)


def bytecode_of(attrs: Mapping[str, Any]) -> Bytecode | None:
    """The volume the image (its inspect data) gets; None when it ships its own bytecode. Pure: the
    dry run names the volume without making it."""
    return Bytecode(str(attrs["Id"])) if ships_no_bytecode(attrs) else None


def prepare_image(engine: Engine, attrs: Mapping[str, Any]) -> Bytecode | None:
    """:func:`prepare` for the image of inspect data ``attrs``, when it ships no bytecode."""
    wanted = bytecode_of(attrs)
    return prepare(engine, wanted.image_id) if wanted is not None else None


def prepare_for(engine: Engine, reference: str) -> Bytecode | None:
    """:func:`prepare_image` for the image ``reference`` names; None also when the engine does not have it."""
    attrs = engine.inspect(reference)
    return prepare_image(engine, attrs) if attrs is not None else None
