"""The docker backend, end to end: a real dockerd runs a test image holding the stand-in trainer, which
checks it received the plan's arguments and environment; the preflight checks the image's lock label."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import docker
import pytest

from envrun.cli import main
from envrun.execute import execute_run
from envrun.prepare import RunRequest, prepare_run
from envrun.rundir import read_status
from tests.lib.tinyrun import FAKE_TRAINER, LOCK, Tiny, tiny_setup

pytestmark = pytest.mark.docker


def _context(dockerfile: str) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile.encode()), ("fake_trainer.py", FAKE_TRAINER.read_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


@pytest.fixture(scope="module")
def trainer_image(docker_client: docker.DockerClient, base_image) -> str:  # noqa: ANN001
    lock_sha = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    tag = f"envbuild-test/fake-trainer:{lock_sha[:12]}"
    dockerfile = (
        f"FROM {base_image.tag}\nCOPY fake_trainer.py /opt/fake_trainer.py\nLABEL io.envbuild.lock.sha256={lock_sha}\n"
    )
    docker_client.images.build(fileobj=_context(dockerfile), custom_context=True, tag=tag, rm=True, network_mode="none")
    yield tag
    docker_client.images.remove(tag, force=True)


def docker_args(tiny: Tiny, image: str, *extra: str) -> list[str]:
    return tiny.args(
        "--backend",
        "docker",
        "--image",
        image,
        "--entry-point",
        "python3 /opt/fake_trainer.py",
        "--env",
        f"FAKE_TRAINER_EXPECT={tiny.model / 'expect.json'}",
        *extra,
        entry=False,
    )


def docker_request(tiny: Tiny, image: str) -> RunRequest:
    # The model directory is mounted at the same path: the expectation lives there.
    return tiny.request(
        backend="docker",
        image=image,
        entry_point=("python3", "/opt/fake_trainer.py"),
        extra_env={"FAKE_TRAINER_EXPECT": str(tiny.model / "expect.json")},
    )


def test_docker_run_passes_argv_env_and_records_the_image(trainer_image: str, tmp_path: Path) -> None:
    tiny = tiny_setup(tmp_path)
    prepared = prepare_run(docker_request(tiny, trainer_image))
    assert prepared.plan.backend == "docker"
    label = next(c for c in prepared.plan.preflight if c.name == "image-lock-label")
    assert label.status == "ok", label
    tiny.expect(prepared.plan, tiny.model / "expect.json")

    outcome = execute_run(prepared)
    assert "fake trainer: ok" in (outcome.run_dir / "output.log").read_text()
    assert read_status(outcome.run_dir) == {"status": "succeeded", "exit_code": 0}
    recorded = json.loads((outcome.run_dir / "plan.json").read_text())
    image_id = docker.from_env(version="auto").images.get(trainer_image).id
    assert recorded["image_digest"].startswith(image_id)


def test_an_image_without_the_lock_label_is_refused(
    docker_client: docker.DockerClient,
    base_image,
    tmp_path: Path,  # noqa: ANN001
    capsys: pytest.CaptureFixture[str],
) -> None:
    tiny = tiny_setup(tmp_path)
    (tiny.model / "expect.json").write_text("{}")
    code = main(docker_args(tiny, base_image.tag, "--run-dir", str(tmp_path / "run")))
    err = capsys.readouterr().err
    assert code == 2 and "image-lock-label" in err and "nothing started" in err
    assert not (tmp_path / "run").exists()
