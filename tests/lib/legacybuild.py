"""The engine's legacy builder, through the docker SDK: the hand peers of the benchmarks and the images the
normalise tests need with a parent chain (as a base built locally by `docker build` has). envbuild itself
builds with BuildKit only (envbuild/engine/client.py)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable, Mapping
from typing import IO

import docker


def dockerfile_context(dockerfile: str, files: Mapping[str, bytes] | None = None, mode: int = 0o644) -> io.BytesIO:
    """A build context in memory: a tar of ``dockerfile`` and ``files``, each with ``mode``, read from the start."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in {"Dockerfile": dockerfile.encode(), **(files or {})}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    return context


def legacy_build(
    client: docker.DockerClient,
    context: IO[bytes] | Iterable[bytes],
    *,
    nocache: bool = False,
    network: str = "none",
    tag: str | None = None,
) -> tuple[str, int]:
    """Build the context's Dockerfile (a tar, as a file or as chunks); (image ID, steps from the cache).
    A failed step raises AssertionError with the engine's message."""
    image, cached = None, 0
    for event in client.api.build(
        fileobj=context,
        custom_context=True,
        nocache=nocache,
        rm=True,
        forcerm=True,
        network_mode=network,
        decode=True,
        tag=tag,
    ):
        if "error" in event:
            raise AssertionError(f"legacy build failed: {event['error']}")
        cached += "Using cache" in str(event.get("stream", ""))
        image = (event.get("aux") or {}).get("ID", image)
    assert image is not None, "the engine named no built image"
    return str(image), cached
