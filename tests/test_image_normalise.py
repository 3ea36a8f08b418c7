"""Normalising without reading layers, against the real engine: the history the engine reports, a
config-only `docker load`, a layer of removals envbuild writes, and a save that leaves the base out."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from envbuild.engine.client import Engine
from envbuild.engine.transfer import directory_context
from envbuild.image.normalise import load_packages_image, normalise, save_added_layers, settled_history
from tests.lib.baseimage import BaseImage
from tests.lib.legacybuild import legacy_build

LABEL = "io.envbuild.lock.name=canonicaltest"
EPOCH = 1700000000
pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def engine(docker_client: docker.DockerClient) -> Iterator[Engine]:
    engine = Engine(docker_client)
    yield engine
    for image in docker_client.images.list(all=True, filters={"label": LABEL}):
        try:
            docker_client.images.remove(image.id, force=True)
        except docker.errors.APIError:
            pass


def build(engine: Engine, tmp_path: Path, base: BaseImage, *, nocache: bool = False) -> str:
    """A build with an empty RUN, a deterministic COPY (a context laid out from /) and config steps."""
    context = tmp_path / "context"
    (context / "files" / "opt" / "canonical").mkdir(parents=True, exist_ok=True)
    (context / "files" / "opt" / "canonical" / "data.txt").write_text("data\n")
    for path in [context, *context.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
        os.utime(path, (EPOCH, EPOCH))
    (context / "Dockerfile").write_text(
        f"FROM {base.tag}\nLABEL {LABEL}\nRUN true\nCOPY files/ /\nENV A=1\n", encoding="utf-8"
    )
    os.utime(context / "Dockerfile", (EPOCH, EPOCH))
    # the legacy builder: an image whose steps keep their parent chain (normalise reads it)
    return legacy_build(engine.client, directory_context(context).chunks(), nocache=nocache)[0]


def test_the_history_says_which_steps_made_a_layer(engine: Engine, base_image: BaseImage, tmp_path: Path) -> None:
    raw = build(engine, tmp_path, base_image)
    inspect, history = settled_history(engine, raw)
    assert len(inspect["RootFS"]["Layers"]) == 2
    steps = [
        (h.created_by.replace("/bin/sh -c #(nop) ", "").replace("/bin/sh -c ", "RUN ").split()[0], h.empty)
        for h in history
    ]
    assert steps == [("debootstrap", False), ("LABEL", True), ("RUN", True), ("COPY", False), ("ENV", True)]


def test_a_config_only_load_gives_the_computed_id_and_shares_every_layer(
    engine: Engine, base_image: BaseImage, tmp_path: Path
) -> None:
    first, second = build(engine, tmp_path, base_image, nocache=True), build(engine, tmp_path, base_image, nocache=True)
    assert first != second  # two builds: other configs (times, container IDs)
    assert engine.inspect(first)["RootFS"] == engine.inspect(second)["RootFS"]  # type: ignore[index]
    lines: list[str] = []
    one = normalise(engine, first, base_image.tag, EPOCH, lines.append)
    two = normalise(engine, second, base_image.tag, EPOCH, lines.append)
    assert one == two
    assert one.diff_ids == tuple(engine.inspect(first)["RootFS"]["Layers"])  # type: ignore[index]
    loaded = engine.inspect(one.image_id)
    assert loaded is not None and loaded["Created"].startswith("2023-11-14T22:13:20")
    assert loaded["Config"]["Env"][-1] == "A=1" and not loaded["Config"].get("Image")
    # what was sent to docker load: a config and a manifest, kilobytes for an image of any size
    (sent,) = [line for line in lines if line.startswith("sent to docker load: ")]
    assert sent.split(": ")[1].split()[1] in ("B", "kB"), sent
    history = [h["CreatedBy"] for h in engine.history(one.image_id)]
    assert history[0] == "ENV A=1" or history[0].endswith("ENV A=1")


def test_a_packages_image_is_the_base_a_committed_layer_and_a_layer_of_removals(
    engine: Engine, base_image: BaseImage
) -> None:
    etc = engine.run(base_image.tag, ["stat", "-c", "%a %u %g", "/etc"]).stdout.split()
    container = engine.client.containers.create(
        base_image.tag,
        [
            "sh",
            "-c",
            "mkdir -p /opt/pk && echo new >/opt/pk/new.txt && touch -h -d @315532800 /opt /opt/pk /opt/pk/new.txt",
        ],
        labels={"io.envbuild.lock.name": "canonicaltest"},
        network_mode="none",
    )
    try:
        container.start()
        assert container.wait()["StatusCode"] == 0, container.logs()
        committed = str(container.commit().id)  # one layer on the base, as a packages image has
    finally:
        container.remove(force=True)
    report = {
        "remove": ["/etc/issue.net", "/usr/share/doc"],
        "replaced": ["oldthing 0.1"],
        "directories": {
            "/etc": [int(etc[0], 8), int(etc[1]), int(etc[2])],
            "/usr": [0o755, 0, 0],
            "/usr/share": [0o755, 0, 0],
        },
    }
    tag = "envbuild-test/canonical:packages"
    made = [
        load_packages_image(engine, base_image.tag, committed, "canonicaltest", 1, report, tag, lambda m: None)
        for _ in range(2)
    ]
    try:
        assert made[0] == made[1]  # the same layer and removals give the same image
        image = engine.inspect(tag)
        assert (
            image is not None
            and len(image["RootFS"]["Layers"]) == len(engine.inspect(base_image.tag)["RootFS"]["Layers"]) + 2
        )  # type: ignore[index]
        out = engine.run(
            tag, ["sh", "-c", "cat /opt/pk/new.txt; ls /etc/issue.net /usr/share/doc 2>&1; stat -c '%a %u %g' /etc"]
        )
        assert out.stdout.startswith("new\n") and out.stdout.count("No such file") == 2
        assert out.stdout.rstrip().endswith(" ".join(etc))  # the directory above a removal is as it was
        assert [h["CreatedBy"] for h in engine.history(tag)[:2]] == [
            "envbuild: remove the base's own oldthing 0.1",
            "envbuild: install the lock's 1 package files (pip, no index)",
        ]
    finally:
        engine.remove(tag, force=True)
        engine.remove(committed, force=True)


def test_a_saved_archive_leaves_the_base_out(engine: Engine, base_image: BaseImage, tmp_path: Path) -> None:
    raw = build(engine, tmp_path, base_image)
    base_layers = set(engine.inspect(base_image.tag)["RootFS"]["Layers"])  # type: ignore[index]
    archive = save_added_layers(engine, raw, tmp_path / "out" / "saved.tar", base_layers, lambda message: None)
    with tarfile.open(archive) as tar:
        layers = {
            "sha256:" + hashlib.sha256(tar.extractfile(m).read()).hexdigest()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile() and m.name.endswith("layer.tar")
        }
        (manifest,) = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    added = set(engine.inspect(raw)["RootFS"]["Layers"]) - base_layers  # type: ignore[index]
    assert layers == added and len(manifest["Layers"]) == len(base_layers) + len(added)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["saved.tar"]  # no spool left
