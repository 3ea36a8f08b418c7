"""`envbuild image` through the docker CLI's session transport, against the Engine API's tar: the real
engine, the real CLI (Debian's docker 20.10, as the services use), one lock. The same image ID through
both; an interrupted CLI build ends the CLI and leaves the caches usable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from envbuild.config import SourceOptions
from envbuild.engine.cli_build import Transport
from envbuild.engine.client import Engine
from envbuild.image.build import BuildResult, ImageOptions, build_image
from envbuild.image.syncdir import stable_context_dir
from envbuild.lock.io import read_lock
from envbuild.verify.pins import VerifyOptions
from tests.lib.gitrepos import Served
from tests.lib.imagelock import ImageLockEnv, served_env
from tests.lib.services import PushedImage, remove_lock_images
from tests.lib.signals import restore_sigint

pytestmark = [pytest.mark.gitdaemon, pytest.mark.slow, pytest.mark.docker, pytest.mark.registry]

LOCK_NAME = "clitransport"


@pytest.fixture(scope="module")
def env(
    served: Served, pushed_base_image: PushedImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ImageLockEnv]:
    name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    wheels = tmp_path_factory.mktemp("cli-wheels")
    with served_env(served, LOCK_NAME, name, pushed_base_image.digest, wheels) as made:
        yield made


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli-transport")


@pytest.fixture(scope="module")
def engine(docker_client: docker.DockerClient) -> Iterator[Engine]:
    engine = Engine(docker_client)
    # No silent skip: the services' docker CLI runs BuildKit builds, so this is the CLI path.
    assert engine.transport.cli is not None, engine.transport.reason
    yield engine
    remove_lock_images(docker_client, LOCK_NAME)


@pytest.fixture(scope="module")
def lock_path(env: ImageLockEnv, work: Path) -> Path:
    return env.write(work / "locks" / f"{LOCK_NAME}.lock.yaml", env.lock(name=LOCK_NAME))


def options(cache_dir: Path, **changes: object) -> ImageOptions:
    return ImageOptions(VerifyOptions(SourceOptions(cache_dir=cache_dir)), **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def through_cli(lock_path: Path, work: Path, engine: Engine) -> tuple[BuildResult, list[str]]:
    lines: list[str] = []
    result = build_image(
        read_lock(lock_path), options(work / "cache", no_cache=True), engine=engine, progress=lines.append
    )
    return result, lines


def test_the_cli_and_the_engine_api_build_one_image_id(
    through_cli: tuple[BuildResult, list[str]], lock_path: Path, work: Path, docker_client: docker.DockerClient
) -> None:
    cli, lines = through_cli
    assert any(line.startswith("builds go through /usr/bin/docker build (docker 20.10") for line in lines), lines
    assert any(line.startswith("sending the package files through /usr/bin/docker") for line in lines)
    assert any(line.startswith("sending the sources through /usr/bin/docker") for line in lines)
    synced = stable_context_dir(work / "cache", LOCK_NAME)
    assert (synced / "packages" / "Dockerfile").is_file() and (synced / "image" / "src" / "alpha").is_dir()
    runs = [step for step in cli.steps if "] RUN " in step.instruction]
    assert runs and not any(step.cached for step in runs)  # --no-cache, read off the CLI's progress

    api_engine = Engine(docker_client, transport=Transport(None, "the test asks for the Engine API"))
    api_lines: list[str] = []
    api = build_image(
        read_lock(lock_path), options(work / "api-cache", no_cache=True), engine=api_engine, progress=api_lines.append
    )
    assert "builds go through the Engine API: the test asks for the Engine API" in api_lines
    assert not (stable_context_dir(work / "api-cache", LOCK_NAME) / "packages").exists()
    assert (api.image_id, api.diff_ids) == (cli.image_id, cli.diff_ids)


def _envbuild(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from envbuild.cli import main; sys.exit(main())", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        preexec_fn=restore_sigint,  # the Ctrl-C case sends SIGINT: not one a shell had us ignore
    )


def _processes_naming(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(text.encode() in word for word in words):
            found.append(b" ".join(words).decode("utf-8", "replace"))
    return found


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_cli_build_ends_the_cli_and_leaves_the_caches_usable(
    through_cli: tuple[BuildResult, list[str]], lock_path: Path, work: Path, engine: Engine, signal_number: int
) -> None:
    cache = work / f"interrupted-{signal_number}"
    proc = _envbuild("image", str(lock_path), "--no-cache", "--cache-dir", str(cache))
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 180
    for line in proc.stderr:
        seen.append(line)
        if "RUN --mount=type=bind,source=packages," in line or time.monotonic() > deadline:  # the install runs
            break
    synced = str(stable_context_dir(cache, LOCK_NAME))
    assert _processes_naming(synced), "".join(seen)  # the docker CLI is building
    os.kill(proc.pid, signal_number)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + err
    assert "envbuild: interrupted" in err and "Traceback" not in err
    assert _processes_naming(synced) == []  # the CLI ended with envbuild
    again = build_image(read_lock(lock_path), options(cache), engine=engine)
    assert again.image_id == through_cli[0].image_id
