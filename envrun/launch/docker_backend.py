"""The docker backend: run the locked image through the docker SDK with the host's Ascend devices.

The devices and driver mounts are Ascend's own explicit list (upstream-facts §5), passed only where
they exist on the host, instead of ``--privileged``.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

from envbuild.errors import EngineError, InputError
from envrun.launch import LaunchResult, LogSink
from envrun.plan import RunPlan

DEVICE_PATTERNS = ("/dev/davinci[0-9]*", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
DRIVER_MOUNTS = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
)
STOP_TIMEOUT_SECONDS = 20


def ascend_devices(root: str = "/") -> list[str]:
    """``host:container:rwm`` device specs for the Ascend devices present under ``root``."""
    found: list[str] = []
    for pattern in DEVICE_PATTERNS:
        found += sorted(glob.glob(os.path.join(root, pattern.lstrip("/"))))
    return [f"{p}:/{os.path.relpath(p, root)}:rwm" for p in found]


def ascend_mounts(root: str = "/") -> dict[str, dict[str, str]]:
    """Read-only driver mounts for those of :data:`DRIVER_MOUNTS` present under ``root``."""
    mounts = {}
    for path in DRIVER_MOUNTS:
        host = os.path.join(root, path.lstrip("/"))
        if os.path.exists(host):
            mounts[host] = {"bind": path, "mode": "ro"}
    return mounts


def _client() -> Any:
    import docker  # the only module of envrun that talks to dockerd

    try:
        return docker.from_env(version="auto")
    except docker.errors.DockerException as exc:
        raise EngineError(f"cannot reach dockerd: {exc}") from None


def image_labels(ref: str) -> dict[str, str]:
    """The labels of a local image (for the preflight lock-label check)."""
    import docker

    try:
        return dict(_client().images.get(ref).labels or {})
    except docker.errors.ImageNotFound:
        raise InputError(f"image {ref} not found in the local engine; build or load it first") from None
    except docker.errors.APIError as exc:
        raise EngineError(f"dockerd: {exc.explanation or exc}") from None


def image_digest(ref: str) -> str | None:
    """The image ID (config digest) and, if pushed, its repository digest; for the run record."""
    try:
        image = _client().images.get(ref)
    except Exception:
        return None
    repo = (image.attrs.get("RepoDigests") or [None])[0]
    return f"{image.id} {repo}" if repo else image.id


class DockerLauncher:
    def __init__(self, network_mode: str = "host", workdir: Path | None = None, remove: bool = True) -> None:
        self.network_mode, self.workdir, self.remove = network_mode, workdir, remove

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        import docker

        if not plan.image:
            raise InputError("--backend docker needs --image REF")
        client = _client()
        volumes = ascend_mounts()
        for path in {plan.model, *plan.data_files} - {None}:
            # Same path inside and out, so the trainer's overrides mean the same files.
            host = str(Path(path).resolve())  # type: ignore[arg-type]
            volumes.setdefault(host, {"bind": host, "mode": "ro"})
        try:
            container = client.containers.run(
                plan.image, command=list(plan.argv), environment=dict(plan.env),
                devices=ascend_devices(), volumes=volumes, ipc_mode="host",
                network_mode=self.network_mode, detach=True,
                labels={"io.envbuild.run.recipe": plan.recipe, "io.envbuild.lock.sha256": plan.lock_sha256},
                working_dir=str(self.workdir) if self.workdir else None,
            )
        except docker.errors.ImageNotFound:
            raise InputError(f"image {plan.image} not found in the local engine") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"dockerd refused to start the job: {exc.explanation or exc}") from None
        try:
            for chunk in container.logs(stream=True, follow=True):
                log(chunk.decode("utf-8", errors="replace"))
            return LaunchResult(container.wait()["StatusCode"])
        except KeyboardInterrupt:
            container.stop(timeout=STOP_TIMEOUT_SECONDS)
            code = container.wait(timeout=STOP_TIMEOUT_SECONDS + 10)["StatusCode"]
            return LaunchResult(code, interrupted=True, detail=f"container {container.short_id} stopped on Ctrl-C")
        finally:
            if self.remove:
                try:
                    container.remove(force=True)
                except docker.errors.APIError:
                    pass
