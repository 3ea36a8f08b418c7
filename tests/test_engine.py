"""envbuild.engine.client against the real dockerd of scripts/services: save/load, run without network, tags,
transfer progress, and the one-line error when no engine answers (builds: tests/test_engine_buildkit.py)."""

from __future__ import annotations

import io
import re
import tarfile
import threading
import uuid
from pathlib import Path

import docker
import pytest

from envbuild.engine.client import Engine
from envbuild.engine.jobs import JobSpec
from envbuild.engine.transfer import Meter, directory_context, human_bytes
from envbuild.errors import EngineError
from tests.lib.baseimage import BaseImage


@pytest.fixture(scope="module")
def engine(docker_client: docker.DockerClient) -> Engine:
    return Engine(docker_client)


def _context(tmp_path: Path, dockerfile: str) -> Path:
    (tmp_path / "Dockerfile").write_text(dockerfile)
    (tmp_path / "hello.txt").write_text("hello\n")
    return tmp_path


@pytest.mark.docker
def test_run_has_no_network_and_returns_the_output(engine: Engine, base_image: BaseImage) -> None:
    out = engine.run(base_image.tag, ["sh", "-c", "ls /sys/class/net; echo to-stderr >&2; exit 4"])
    assert out.exit_code == 4
    assert out.stdout.split() == ["lo"]
    assert out.stderr.strip() == "to-stderr"


@pytest.mark.docker
def test_disk_usage_asked_by_several_at_once_answers_each(engine: Engine) -> None:
    """The engine runs one ``docker system df`` at a time and refuses the others meanwhile (two builds
    tidying one engine: 9 of 18 such calls failed before the wait); each is answered."""
    errors: list[str] = []
    answers: list[dict] = []

    def ask() -> None:
        try:
            answers.append(engine.disk_usage())
        except EngineError as exc:
            errors.append(str(exc))

    for _ in range(3):
        threads = [threading.Thread(target=ask) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert errors == [] and len(answers) == 18 and all("LayersSize" in a for a in answers)


@pytest.mark.docker
def test_save_load_tag_and_remove(tmp_path: Path, engine: Engine, base_image: BaseImage) -> None:
    archive = tmp_path / "base.tar"
    engine.save(base_image.tag, archive)
    assert archive.stat().st_size > 1_000_000
    assert engine.load(archive) == [base_image.image_id] or engine.inspect(base_image.image_id) is not None
    name = f"envbuild-test/engine:{uuid.uuid4().hex[:8]}"
    engine.tag(base_image.image_id, name)
    assert engine.inspect(name)["Id"] == base_image.image_id  # type: ignore[index]
    assert engine.remove(name) is True
    assert engine.inspect(name) is None and engine.remove(name) is False
    assert engine.inspect(base_image.tag) is not None  # removing a tag left the image


@pytest.mark.docker
def test_a_missing_image_is_one_line(engine: Engine) -> None:
    with pytest.raises(EngineError, match=r"^run in envbuild-test/absent:none: no such image"):
        engine.run("envbuild-test/absent:none", ["true"])


def test_no_engine_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/dead.sock")
    with pytest.raises(EngineError) as caught:
        Engine.connect()
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"no container engine answers at unix://{tmp_path}/dead.sock: no such socket (start dockerd or set DOCKER_HOST)"
    )


# --- progress of long transfers (no engine) -----------------------------------------------


def test_a_meter_says_how_far_a_transfer_is_and_when_it_is_done() -> None:
    lines: list[str] = []
    meter = Meter(lines.append, "sent the package files", total=3_000_000_000, every=0.0)
    assert list(meter.wrap([b"x" * 1000, b"y" * 500])) == [b"x" * 1000, b"y" * 500]
    assert lines[0].startswith("sent the package files: 1.00 kB of 3.00 GB (")
    assert lines[-1].startswith("sent the package files: 1.50 kB in ") and len(lines) == 3
    assert [human_bytes(n) for n in (999, 1500, 2_340_000, 1_060_000_000, 123_400_000_000)] == [
        "999 B",
        "1.50 kB",
        "2.34 MB",
        "1.06 GB",
        "123 GB",
    ]


def test_a_directory_context_is_streamed_with_fixed_owners(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "file.txt").write_text("data\n")
    (tmp_path / "link").symlink_to("sub/file.txt")
    stream = directory_context(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream.chunks()))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["link", "sub", "sub/file.txt"]
    assert members["link"].issym() and members["sub/file.txt"].size == 5 == stream.payload
    assert all((m.uid, m.gid, m.uname, m.gname) == (0, 0, "", "") for m in members.values())


@pytest.mark.docker
def test_a_container_removed_takes_the_anonymous_volumes_its_image_made(
    tmp_path: Path, engine: Engine, docker_client: docker.DockerClient, base_image: BaseImage
) -> None:
    """An image's ``VOLUME`` gives each container an anonymous volume, made at creation even for one never
    started: a command run, a file read and a long job each leave none behind (a test image declaring one
    left two volumes a suite run), while a named volume a job mounts stays."""
    marker = uuid.uuid4().hex[:12]
    scratch = f"/scratch-{marker}"
    image = engine.buildkit_build(directory_context(_context(tmp_path, f"FROM {base_image.tag}\nVOLUME {scratch}\n")))

    def anonymous(container_id: str) -> str:
        mounts = docker_client.api.inspect_container(container_id)["Mounts"]
        (name,) = [m["Name"] for m in mounts if m["Destination"] == scratch]
        return str(name)

    def gone(name: str) -> bool:
        try:
            docker_client.volumes.get(name)
        except docker.errors.NotFound:
            return True
        return False

    kept = docker_client.volumes.create(f"envbuild-test-kept-{marker}")
    try:
        seen = engine.run(image.image_id, ["sh", "-c", f"grep ' {scratch} ' /proc/self/mountinfo"]).stdout
        (ran,) = re.findall(r"/volumes/([0-9a-f]{64})/_data", seen)
        with engine._unstarted(image.image_id) as created:
            read = anonymous(created)
        job = engine.start(
            JobSpec(image.image_id, ("sleep", "60"), volumes={kept.name: {"bind": "/kept", "mode": "rw"}})
        )
        in_job = anonymous(job)
        assert engine.remove_container(job, stop_timeout=0)
        assert [gone(ran), gone(read), gone(in_job)] == [True, True, True]
        assert not gone(kept.name)  # a named volume is the engine's to keep
    finally:
        kept.remove(force=True)
        engine.remove(image.image_id, force=True)
