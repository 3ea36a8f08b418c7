"""The docker host a job's container runs on: the Ascend devices and driver files it has, the job's own
mounts, and what its engine says of an image (labels, platform, digest).

The devices and driver mounts are Ascend's own explicit list with what verl's guide mounts besides
(the firmware, ``/usr/local/sbin`` where some hosts keep ``npu-smi``), each passed only where it exists
on the host, instead of ``--privileged``: the docker backend's job (:mod:`envrun.launch.docker_backend`),
a cluster's nodes (:mod:`envrun.cluster.nodes`) and a Slurm job's (:mod:`envrun.schedule.sbatch`) all
mount this list. The preflight reads an image's labels and platform here, and probes the job with its
mounts. The engine itself is only ever reached through :mod:`envbuild.engine.client`.
"""

from __future__ import annotations

from pathlib import Path

from envbuild.engine.client import Engine
from envbuild.errors import EngineError, InputError
from envrun.plan import RunPlan

DEVICE_PATTERNS = ("/dev/davinci[0-9]*", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
DRIVER_MOUNTS = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
    "/usr/local/Ascend/firmware",  # verl's guide
    "/usr/local/sbin",  # verl's guide: npu-smi lives here on some hosts
)


def ascend_paths(root: str = "/") -> tuple[str, ...]:
    """The Ascend devices and driver files present under ``root``, as paths on that host."""
    found: list[Path] = []
    for pattern in (*DEVICE_PATTERNS, *DRIVER_MOUNTS):
        found += sorted(Path(root).glob(pattern.lstrip("/")))
    return tuple("/" + p.relative_to(root).as_posix() for p in found)


def devices_and_mounts(paths: tuple[str, ...]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """``host:container:rwm`` device specs and read-only driver mounts for the Ascend ``paths`` a host has
    (from :func:`ascend_paths` here, or from a probe on another host)."""
    devices = [f"{p}:{p}:rwm" for p in paths if p.startswith("/dev/")]
    mounts = {p: {"bind": p, "mode": "ro"} for p in paths if p in DRIVER_MOUNTS}
    return devices, mounts


def image_labels(ref: str) -> dict[str, str]:
    """The labels of a local image (for the preflight lock-label check)."""
    with Engine.connect() as engine:
        attrs = engine.inspect(ref)
    if attrs is None:
        raise InputError(f"image {ref} not found in the local engine; build or load it first")
    return dict((attrs.get("Config") or {}).get("Labels") or {})


def image_platform(ref: str) -> tuple[str, str]:
    """The architecture a local image is built for (OCI's name) and the engine host's machine (uname's)."""
    with Engine.connect() as engine:
        attrs = engine.inspect(ref)
        if attrs is None:
            raise InputError(f"image {ref} not found in the local engine; build or load it first")
        return str(attrs.get("Architecture") or ""), engine.machine()


def image_digest(ref: str) -> str | None:
    """The image ID (config digest) and, if pushed, its repository digest; for the run record."""
    try:
        with Engine.connect() as engine:
            attrs = engine.inspect(ref)
    except EngineError:
        return None
    if attrs is None:
        return None
    repo = (attrs.get("RepoDigests") or [None])[0]
    return f"{attrs['Id']} {repo}" if repo else attrs["Id"]


def job_volumes(plan: RunPlan, *, outputs: bool = False) -> dict[str, dict[str, str]]:
    """The job's own mounts: model and data read-only at the path the overrides name (absolute, as the
    plan holds them; the engine follows a symlink to its target), the output directory read-write when
    ``outputs``, then ``--volume``s."""
    volumes: dict[str, dict[str, str]] = {}
    for path in (plan.model, *plan.data_files):
        if path is not None:
            volumes.setdefault(str(path), {"bind": str(path), "mode": "ro"})
    if outputs and plan.output_dir is not None:
        volumes[str(plan.output_dir)] = {"bind": str(plan.output_dir), "mode": "rw"}
    for volume in plan.volumes:
        volumes[volume.host] = volume.bind()
    return volumes
