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

from envrun.cli_run import main_for_tests
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
    expect = tiny.model / "expect.json"  # the model directory is mounted at the same path
    return tiny.args(
        "--backend",
        "docker",
        "--image",
        image,
        "--entry-point",
        "python3 /opt/fake_trainer.py",
        "--env",
        f"FAKE_TRAINER_EXPECT={expect}",
        *extra,
        entry=False,
    )


def test_docker_run_passes_argv_env_and_records_the_image(
    trainer_image: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = tiny_setup(tmp_path)
    assert main_for_tests(docker_args(tiny, trainer_image, "--dry-run", "--json")) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["backend"] == "docker"
    label = next(c for c in plan["preflight"] if c["name"] == "image-lock-label")
    assert label["status"] == "ok", label
    (tiny.model / "expect.json").write_text(json.dumps({"args": plan["argv"][2:], "env": plan["env"]}))

    run_dir = tmp_path / "run"
    assert main_for_tests(docker_args(tiny, trainer_image, "--run-dir", str(run_dir))) == 0
    assert "fake trainer: ok" in (run_dir / "output.log").read_text()
    assert read_status(run_dir) == {"status": "succeeded", "exit_code": 0}
    recorded = json.loads((run_dir / "plan.json").read_text())
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
    code = main_for_tests(docker_args(tiny, base_image.tag, "--run-dir", str(tmp_path / "run")))
    err = capsys.readouterr().err
    assert code == 2 and "image-lock-label" in err and "nothing started" in err
    assert not (tmp_path / "run").exists()
