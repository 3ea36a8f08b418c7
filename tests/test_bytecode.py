"""The jobs' bytecode volume (envrun.bytecode): what a container of an image compiles, the next one on
that engine reads, and the image stays as it was built. Real dockerd, the test base's real python3.

The tests run on a dockerd of their own (``fresh_engine``, the test base loaded into it): they assert
which bytecode volumes the whole engine holds, and :func:`prepare` removes the volumes of every image the
engine no longer has. On the shared engine other lanes' jobs make such volumes and remove their images
meanwhile: a CI run saw another lane's volume pruned between two listings of this module's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

import docker
import pytest

from envbuild.engine.client import Engine
from envrun.bytecode import (
    DONT_WRITE_ENV,
    IMAGE_LABEL,
    MOUNT,
    PREFIX_ENV,
    Bytecode,
    bytecode_of,
    prepare,
    prepare_for,
    ships_no_bytecode,
    with_bytecode,
)
from tests.lib.baseimage import BaseImage, ensure_base_image
from tests.lib.engines import ExtraEngine

MISSING_IMAGE = "sha256:" + "0" * 64


def test_the_volume_is_named_for_the_image_id_and_the_job_keeps_its_own_choice() -> None:
    bytecode = Bytecode("sha256:" + "ab" * 32)
    assert bytecode.volume == "envrun-bytecode-abababababababab"
    assert bytecode.env({"A": "1"}) == {"A": "1", PREFIX_ENV: MOUNT, DONT_WRITE_ENV: ""}
    assert bytecode.env({DONT_WRITE_ENV: "1"}) == {DONT_WRITE_ENV: "1"}  # the job asked for none
    assert bytecode.env({PREFIX_ENV: "/mine"}) == {PREFIX_ENV: "/mine"}
    theirs = {"/host/cache": {"bind": MOUNT, "mode": "rw"}}
    assert bytecode.volumes(theirs) == theirs  # the job mounts its own there
    assert bytecode.volumes({}) == {bytecode.volume: {"bind": MOUNT, "mode": "rw"}}
    assert with_bytecode(None, {"A": "1"}, theirs) == ({"A": "1"}, theirs)
    assert ships_no_bytecode({"Config": {"Env": ["PATH=/bin", "PYTHONDONTWRITEBYTECODE=1"]}})
    assert not ships_no_bytecode({"Config": {"Env": ["PYTHONDONTWRITEBYTECODE="]}})  # emptied: Python writes
    assert not ships_no_bytecode({"Config": {"Env": None}}) and not ships_no_bytecode({})
    declared = {"Id": "sha256:" + "ab" * 32, "Config": {"Env": ["PYTHONDONTWRITEBYTECODE=1"]}}
    assert bytecode_of(declared) == bytecode and bytecode_of({**declared, "Config": {}}) is None


@pytest.fixture(scope="module")
def docker_client(fresh_engine: ExtraEngine) -> Iterator[docker.DockerClient]:
    with closing(fresh_engine.client()) as client:
        yield client


@pytest.fixture(scope="module")
def base_image(docker_client: docker.DockerClient) -> BaseImage:
    return ensure_base_image(docker_client)  # loaded from the suite's cached archive


@pytest.fixture()
def engine(docker_client: docker.DockerClient) -> Iterator[Engine]:
    """The module's own engine; the bytecode volumes each test made are removed after it."""
    engine = Engine(docker_client)
    before = set(engine.volumes(IMAGE_LABEL))
    yield engine
    for name in set(engine.volumes(IMAGE_LABEL)) - before:
        engine.remove_volume(name)


@pytest.mark.docker
def test_what_one_container_compiles_the_next_one_reads(engine: Engine, base_image: BaseImage) -> None:
    bytecode = Bytecode(base_image.image_id)
    engine.remove_volume(bytecode.volume)  # compiled afresh by this test
    bytecode = prepare(engine, base_image.image_id)
    assert engine.volumes(IMAGE_LABEL)[bytecode.volume] == {IMAGE_LABEL: base_image.image_id}
    env, volumes = with_bytecode(bytecode, {}, {})
    script = ["python3", "-v", "-c", "import email.parser"]
    first = engine.run(base_image.tag, script, volumes=volumes, environment=env)
    second = engine.run(base_image.tag, script, volumes=volumes, environment=env)
    cached = f"code object from '{MOUNT}/usr/lib/python3.11/email/parser.cpython-311.pyc'"
    assert first.exit_code == 0 and f"# created '{MOUNT}/usr/lib/python3.11/email/parser" in first.stderr
    assert second.exit_code == 0 and cached in second.stderr and "# created" not in second.stderr
    # The image is as it was: a container without the volume finds no bytecode of the prefix's.
    plain = engine.run(base_image.tag, ["sh", "-c", f"ls {MOUNT} 2>&1 || true"])
    assert "No such file" in plain.stdout


@pytest.mark.docker
def test_an_image_that_ships_its_bytecode_gets_no_volume(engine: Engine, base_image: BaseImage) -> None:
    """The test base, like any distro image, ships valid bytecode and says nothing against writing it:
    a prefix would make Python ignore that bytecode."""
    before = engine.volumes(IMAGE_LABEL)
    assert prepare_for(engine, base_image.tag) is None
    assert engine.volumes(IMAGE_LABEL) == before  # none made, none pruned


@pytest.mark.docker
def test_volumes_of_images_the_engine_lost_go_unless_in_use(
    engine: Engine, docker_client: docker.DockerClient, base_image: BaseImage
) -> None:
    lost, held = "envrun-bytecode-lost0000000000", "envrun-bytecode-held0000000000"
    for name in (lost, held):
        engine.ensure_volume(name, {IMAGE_LABEL: MISSING_IMAGE})
    user = docker_client.containers.create(base_image.tag, ["true"], volumes={held: {"bind": MOUNT, "mode": "rw"}})
    try:
        kept = prepare(engine, base_image.image_id)
        names = engine.volumes(IMAGE_LABEL)
        assert lost not in names  # its image is gone: nothing will read it again
        assert held in names  # a container still mounts it
        assert kept.volume in names
        prepare(engine, base_image.image_id)  # again: the same volume, nothing else touched
        assert engine.volumes(IMAGE_LABEL).keys() == names.keys()
    finally:
        user.remove(force=True)
        engine.remove_volume(held)
