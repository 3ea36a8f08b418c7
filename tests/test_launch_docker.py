"""The docker backend, end to end: a real dockerd runs a test image holding the stand-in trainer, which
checks it received the plan's arguments and environment; the preflight checks the image's lock label."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import docker
import pytest

from envrun.bytecode import MOUNT, Bytecode
from envrun.cli.main import main
from envrun.execute import execute_run
from envrun.plan import RunParameters, Volume
from envrun.prepare import RunRequest, prepare_run
from envrun.rundir import read_status
from tests.lib.legacybuild import dockerfile_context
from tests.lib.tinyrun import FAKE_TRAINER, LOCK, Tiny, envrun_until_sleeping, tiny_setup

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def trainer_image(docker_client: docker.DockerClient, base_image) -> str:  # noqa: ANN001
    lock_sha = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    tag = f"envbuild-test/fake-trainer:{lock_sha[:12]}"
    dockerfile = (
        f"FROM {base_image.tag}\nCOPY fake_trainer.py /opt/fake_trainer.py\nLABEL io.envbuild.lock.sha256={lock_sha}\n"
        "ENV PYTHONDONTWRITEBYTECODE=1\n"  # as an image envbuild builds says: it ships no bytecode
    )
    docker_client.images.build(
        fileobj=dockerfile_context(dockerfile, {"fake_trainer.py": FAKE_TRAINER.read_bytes()}),
        custom_context=True,
        tag=tag,
        rm=True,
        network_mode="none",
    )
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
    tiny = tiny_setup(tmp_path).strict()
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
    # What the job imported was compiled into the image's bytecode volume, for the next container.
    volume = {Bytecode(image_id).volume: {"bind": MOUNT, "mode": "ro"}}
    listing = docker.from_env(version="auto").containers.run(
        trainer_image, ["find", MOUNT, "-name", "*.pyc"], volumes=volume, network_mode="none", remove=True
    )
    assert f"{MOUNT}/usr/lib/python3.11/json/__init__.cpython-311.pyc".encode() in listing


def test_a_symlinked_model_is_seen_where_the_trainer_is_told_it_is(trainer_image: str, tmp_path: Path) -> None:
    """--model through a symlink: the trainer is given the symlink's path, and the container has the model
    there (the engine mounts what the symlink points to), not only at the path it resolves to."""
    tiny = tiny_setup(tmp_path).strict()
    link = tmp_path / "model-link"
    link.symlink_to(tiny.model)
    request = tiny.request(
        backend="docker",
        image=trainer_image,
        model=link,
        entry_point=("python3", "/opt/fake_trainer.py"),
        extra_env={"FAKE_TRAINER_EXPECT": str(link / "expect.json")},  # read through the link, in the container
    )
    prepared = prepare_run(request)
    assert f"model.path={link}" in prepared.plan.argv
    tiny.expect(prepared.plan, tiny.model / "expect.json")
    outcome = execute_run(prepared)
    assert "fake trainer: ok" in (outcome.run_dir / "output.log").read_text()
    assert read_status(outcome.run_dir) == {"status": "succeeded", "exit_code": 0}


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


@pytest.mark.network
@pytest.mark.slow
def test_the_probe_runs_in_the_image_and_a_lost_export_fails_the_run(trainer_image: str, tmp_path: Path) -> None:
    """grpo-glm5 on the docker backend: the job probe runs in a container of the image (no network, no
    devices) with the real verl 0.9.1 — mounted from the cached environment, as this test image holds
    none — and the trainer writes its export where verl's own function says, into the run's output
    directory: a host directory, so the export outlives the container and is audited on the host."""
    from tests.lib.ckptgen import CheckpointSpec, write_checkpoint
    from tests.lib.pyenvs import interpreter_mounts
    from tests.lib.tinyrun import write_parquet_like
    from tests.lib.verlenv import path_env, probe_recipe, verl_env, verl_hf_export_dir

    verl = verl_env()
    python = interpreter_mounts(verl.python)  # the interpreter the environments link to, unless the image's
    mounts = [f"{p}:{p}:ro" for p in dict.fromkeys((verl.root, verl_env(transfer_queue=False).root, *python))]
    recipe = probe_recipe(tmp_path)
    write_checkpoint(tmp_path / "model", CheckpointSpec(include_mtp=False))
    saved = tmp_path / "saved"  # what the lenient save wrote: lm_head lost
    write_checkpoint(saved, CheckpointSpec(include_mtp=False), drop=("lm_head.weight",))
    data = write_parquet_like(tmp_path / "train.parquet")
    run_dir = tmp_path / "run"
    scratch = tmp_path / "scratch"
    where = run_dir / "outputs" / "ckpts" / verl_hf_export_dir(verl, scratch).relative_to(scratch)
    expect = tmp_path / "model" / "expect.json"  # the model directory is mounted: the trainer reads it there
    request = RunRequest(
        str(recipe),
        RunParameters(
            backend="docker",
            image=trainer_image,
            model=tmp_path / "model",
            train_files=(data,),
            overrides=("trainer.save_freq=1", "ray_kwargs.ray_init.num_cpus=16"),  # TransferQueue asks for 9
            extra_env={
                **path_env(verl),
                "FAKE_TRAINER_EXPECT": str(expect),
                "FAKE_TRAINER_EXPORT": f"{saved}={where}",
                # The mounted environment ships its bytecode: the job's own choice (read it, write none)
                # wins over the image's bytecode volume, whose prefix would hide it (envrun.bytecode).
                "PYTHONDONTWRITEBYTECODE": "1",
            },
            entry_point=("python3", "/opt/fake_trainer.py"),
            volumes=tuple(Volume.parse(m) for m in [*mounts, f"{saved}:{saved}:ro"]),
        ),
        lock=LOCK,
        cache_dir=tmp_path / "cache",
        skip_checks=("npus",),
        run_dir=run_dir,
    )
    prepared = prepare_run(request)
    (line,) = [c for c in prepared.plan.preflight if c.name == "job-probe"]
    assert line.status == "ok" and line.detail.startswith(f"image {trainer_image}: verl 0.9.1"), line.detail
    expect.write_text(json.dumps({"args": list(prepared.plan.argv[2:]), "env": {}}))

    outcome = execute_run(prepared)
    assert "fake trainer: ok" in (run_dir / "output.log").read_text()
    assert where.is_dir()  # on the host, after the container is gone
    status = read_status(run_dir)
    assert outcome.exit_status == 1 and status["status"] == "failed" and "lm_head.weight" in status["detail"]
    (audit,) = json.loads((run_dir / "exports.json").read_text())["exports"]
    assert audit["path"] == str(where) and audit["ok"] is False


def test_sigterm_stops_the_container_and_records_it(trainer_image: str, tmp_path: Path) -> None:
    """A scheduler's SIGTERM to envrun (the path Ctrl-C takes too): the job's container is stopped and
    removed, and the run is recorded as interrupted by SIGTERM. A real signal to a real envrun process."""
    import signal

    tiny = tiny_setup(tmp_path)
    sleep = {"FAKE_TRAINER_SLEEP": "300"}
    request = docker_request(tiny, trainer_image)
    request = replace(request, params=replace(request.params, extra_env={**request.params.extra_env, **sleep}))
    tiny.expect(prepare_run(request).plan, tiny.model / "expect.json")
    run_dir = tmp_path / "run"
    args = docker_args(tiny, trainer_image, "--env", "FAKE_TRAINER_SLEEP=300", "--run-dir", str(run_dir))
    client = docker.from_env(version="auto")
    with envrun_until_sleeping(args) as run:  # the job's own output: the container is really running
        running = client.containers.list(filters={"label": "io.envbuild.run.recipe=tiny"})
        assert running, "no running container of the job"
        assert run.stop(signal.SIGTERM, timeout=120) == 130
    status = read_status(run_dir)
    assert status["status"] == "interrupted" and status["detail"].startswith("stopped on SIGTERM"), status
    # docker-init is PID 1, so `docker stop`'s SIGTERM reached the trainer (128 + 15): without it the
    # trainer, PID 1 itself, ignores SIGTERM and is killed after the stop timeout (137).
    assert status["exit_code"] == 143, status
    ids = {c.id for c in running}
    # The engine's list as it is (no inspect of each: another lane's containers come and go meanwhile).
    assert not ids & {c["Id"] for c in client.api.containers(all=True)}  # stopped and removed
