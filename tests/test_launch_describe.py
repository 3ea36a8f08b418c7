"""The dry run shows the whole launch per backend (Launcher.describe): the local process, the container
with its devices, mounts and environment, the Ray submission with its runtime env — built by the same
code the launch uses (DockerLauncher.job_spec, ray_backend.runtime_env/metadata)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from envbuild.image.plan import LOCK_LABEL
from envrun.bytecode import MOUNT, Bytecode
from envrun.cli.main import main
from envrun.launch.docker_backend import DockerLauncher, docker_run_line
from envrun.plan import Volume
from envrun.prepare import prepare_run
from tests.lib.tinyrun import Tiny


def test_local_dry_run_shows_the_process(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(tiny.args("--dry-run", "--json")) == 0
    launch = json.loads(capsys.readouterr().out)["launch"]
    assert launch["backend"] == "local" and launch["argv"][1].endswith("fake_trainer.py")
    assert launch["env"] == {"TINY_PATCH": "1"} and "SIGINT to the group" in launch["process_group"]
    assert main(tiny.args("--dry-run")) == 0
    assert "launch:  a local process in " in capsys.readouterr().out


def test_docker_launch_is_the_container_the_launcher_starts(tiny: Tiny, tmp_path: Path) -> None:
    request = tiny.request(dry_run=True, backend="docker", image="train:1", volumes=(Volume.parse("/srv/x:/x"),))
    plan = prepare_run(request).plan  # the label check fails without an engine; the plan is complete
    paths = ("/dev/davinci0", "/dev/davinci_manager", "/usr/local/dcmi", "/usr/local/Ascend/driver/lib64")
    spec = DockerLauncher().job_spec(plan, paths)
    line = shlex.split(docker_run_line(spec))
    assert line[:5] == ["docker", "run", "--rm", "--network=host", "--ipc=host"]
    assert (
        "--device=/dev/davinci0:/dev/davinci0:rwm" in line
        and "--device=/dev/davinci_manager:/dev/davinci_manager:rwm" in line
    )
    assert "--volume=/usr/local/dcmi:/usr/local/dcmi:ro" in line
    assert f"--volume={tiny.model}:{tiny.model}:ro" in line and f"--volume={tiny.data}:{tiny.data}:ro" in line
    assert "--volume=/srv/x:/x:ro" in line and "--env=TINY_PATCH=1" in line
    assert f"--label={LOCK_LABEL}={plan.lock_sha256}" in line
    assert line[line.index("train:1") + 1 :] == list(plan.argv)  # the image, then exactly the job's command
    with_volume = shlex.split(docker_run_line(DockerLauncher().job_spec(plan, paths, Bytecode("sha256:" + "d" * 64))))
    assert f"--volume=envrun-bytecode-{'d' * 16}:{MOUNT}:rw" in with_volume
    assert f"--env=PYTHONPYCACHEPREFIX={MOUNT}" in with_volume and "--env=PYTHONDONTWRITEBYTECODE=" in with_volume

    described = plan.launch
    assert described is not None and described["backend"] == "docker" and described["image"] == "train:1"
    assert described["command"] == list(plan.argv) and described["env"] == {"TINY_PATCH": "1"}
    assert {"host": "/srv/x", "bind": "/x", "mode": "ro"} in described["volumes"]


def test_ray_dry_run_shows_the_submission(tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = tiny.args(
        "--dry-run",
        "--json",
        "--backend",
        "ray",
        "--ray-address",
        "http://127.0.0.1:9",
        "--output-dir",
        str(tmp_path / "out"),
        "--skip-check",
        "ray-node",  # nothing listens there: the submission is what is shown
    )
    assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    launch = plan["launch"]
    assert launch["backend"] == "ray" and launch["address"] == "http://127.0.0.1:9"
    assert launch["entrypoint"] == shlex.join(plan["argv"])
    assert launch["runtime_env"] == {"env_vars": {"TINY_PATCH": "1"}}
    assert launch["metadata"] == {"envrun.recipe": "tiny", "envrun.lock.sha256": plan["lock"]["sha256"]}
    args.remove("--json")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "launch:  a Ray job submitted to http://127.0.0.1:9" in out
    assert 'runtime_env:  {"env_vars": {"TINY_PATCH": "1"}}' in out
