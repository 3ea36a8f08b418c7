"""Normalising `docker save` archives: build noise removed, content kept, base layers untouched."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from envbuild.image.normalize import (
    NormalizeError,
    chain_ids,
    normalize_config,
    normalize_image,
    rfc3339,
)
from tests.lib.savedimage import (
    BASE_DIFF,
    BASE_LAYER,
    BUILD_TIME,
    EPOCH,
    build,
    config_for,
    read_archive,
)


@pytest.mark.parametrize("oci", [False, True], ids=["docker-save", "oci"])
def test_two_noisy_builds_give_one_image_id(tmp_path: Path, oci: bool) -> None:
    one = build(tmp_path, "one", mtime=BUILD_TIME, container="a" * 64, created="2025-06-15T15:06:40.25Z", oci=oci)
    two = build(
        tmp_path,
        "two",
        mtime=BUILD_TIME + 3600.5,
        container="b" * 64,
        created="2025-06-15T16:06:41Z",
        shuffle=7,
        oci=oci,
        owner=(1000, 1000),
    )
    assert one.read_bytes() != two.read_bytes()
    first = normalize_image(one, tmp_path / "one.norm.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH)
    second = normalize_image(two, tmp_path / "two.norm.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH)
    assert first.image_id == second.image_id
    assert first.layout == ("oci" if oci else "docker-save")
    assert (tmp_path / "one.norm.tar").read_bytes() == (tmp_path / "two.norm.tar").read_bytes()

    different = build(
        tmp_path,
        "three",
        mtime=BUILD_TIME,
        container="a" * 64,
        created="2025-06-15T15:06:40.25Z",
        extra=b"# one more byte of content\n",
        oci=oci,
    )
    third = normalize_image(different, tmp_path / "three.norm.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH)
    assert third.image_id != first.image_id
    assert third.diff_ids[0] == first.diff_ids[0] and third.diff_ids[2] == first.diff_ids[2]
    assert third.diff_ids[1] != first.diff_ids[1]


@pytest.mark.parametrize("oci", [False, True], ids=["docker-save", "oci"])
def test_output_is_consistent_and_loadable_shaped(tmp_path: Path, oci: bool) -> None:
    source = build(tmp_path, "one", mtime=BUILD_TIME, container="a" * 64, created="2025-06-15T15:06:40Z", oci=oci)
    result = normalize_image(
        source, tmp_path / "out.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH, base_history=2, tags=["envbuild/final:1"]
    )
    files = read_archive(tmp_path / "out.tar")
    (manifest,) = json.loads(files["manifest.json"])
    config_bytes = files[manifest["Config"]]
    assert "sha256:" + hashlib.sha256(config_bytes).hexdigest() == result.image_id
    config = json.loads(config_bytes)
    assert config_bytes == json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    assert manifest["RepoTags"] == ["envbuild/final:1"]
    layers = [files[p] for p in manifest["Layers"]]
    assert (
        ["sha256:" + hashlib.sha256(l).hexdigest() for l in layers]
        == config["rootfs"]["diff_ids"]
        == list(result.diff_ids)
    )
    assert layers[0] == BASE_LAYER  # byte for byte
    assert config["created"] == rfc3339(EPOCH) == "2023-11-14T22:13:20Z"
    for gone in ("container", "container_config", "docker_version"):
        assert gone not in config
    assert "Image" not in config["config"] and "Hostname" not in config["config"]
    assert config["config"]["Labels"] == {"io.envbuild.lock.sha256": "ab" * 32}
    assert [h["created"] for h in config["history"]] == ["2023-01-01T00:00:00Z", "2023-01-01T00:00:01Z"] + [
        rfc3339(EPOCH)
    ] * 3
    if oci:
        index = json.loads(files["index.json"])
        oci_manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]])
        assert oci_manifest["config"]["digest"] == result.image_id
        assert [l["digest"] for l in oci_manifest["layers"]] == list(result.diff_ids)
        assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == "envbuild/final:1"
    else:
        repositories = json.loads(files["repositories"])
        top = chain_ids(list(result.diff_ids))[-1].split(":")[1]
        assert repositories == {"envbuild/final": {"1": top}}
        assert f"{top}/layer.tar" == manifest["Layers"][-1]


def test_added_layer_entries_are_canonical(tmp_path: Path) -> None:
    source = build(
        tmp_path,
        "one",
        mtime=BUILD_TIME,
        container="a" * 64,
        created="2025-06-15T15:06:40Z",
        shuffle=3,
        owner=(1000, 50),
    )
    normalize_image(source, tmp_path / "out.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH)
    files = read_archive(tmp_path / "out.tar")
    (manifest,) = json.loads(files["manifest.json"])
    with tarfile.open(fileobj=io.BytesIO(files[manifest["Layers"][1]])) as layer:
        members = layer.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names, key=lambda n: n.encode())
        assert not any("__pycache__" in n for n in names)
        assert "usr/.wh.old-file" in names  # whiteouts are content
        for member in members:
            assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "", "")
            assert member.mtime <= EPOCH and isinstance(member.mtime, int)
            assert not {"atime", "ctime", "mtime"} & set(member.pax_headers)
        by_name = {m.name: m for m in members}
        assert by_name["opt/envbuild/src/old.py"].mtime == 1500000000  # older than the epoch: kept
        assert by_name["opt/envbuild/src/a.py"].pax_headers == {"SCHILY.xattr.user.note": "kept"}
        link, target = by_name["opt/envbuild/src/b-link"], by_name["opt/envbuild/src/zz-data"]
        assert link.isfile() and target.islnk() and target.linkname == "opt/envbuild/src/b-link"
        layer.extractall(tmp_path / "rootfs")
    assert (tmp_path / "rootfs/opt/envbuild/src/zz-data").read_bytes() == b"shared bytes"
    assert (tmp_path / "rootfs/opt/envbuild/src/zz-data").stat().st_ino == (
        tmp_path / "rootfs/opt/envbuild/src/b-link"
    ).stat().st_ino
    assert (tmp_path / "rootfs/opt/envbuild/src/c-symlink").readlink() == Path("a.py")


def test_stream_input_and_refusal_of_a_foreign_base(tmp_path: Path) -> None:
    source = build(tmp_path, "one", mtime=BUILD_TIME, container="a" * 64, created="2025-06-15T15:06:40Z")
    with open(source, "rb") as stream:
        from_stream = normalize_image(stream, tmp_path / "s.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH)
    from_path = normalize_image(source, tmp_path / "p.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH)
    assert from_stream.image_id == from_path.image_id
    with pytest.raises(NormalizeError, match="not the base image's"):
        normalize_image(source, tmp_path / "x.tar", base_diff_ids=["sha256:" + "0" * 64], epoch=EPOCH)
    assert not (tmp_path / "x.tar").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no work dirs left


def test_normalize_config_is_pure_and_keeps_base_history() -> None:
    config = config_for(
        ["sha256:" + "1" * 64, "sha256:" + "2" * 64], created="2025-01-01T00:00:00Z", container="c" * 64
    )
    new_ids = ["sha256:" + "1" * 64, "sha256:" + "3" * 64]
    out = normalize_config(config, new_ids, base_layers=1, epoch=EPOCH, base_history=2)
    assert config["container"] == "c" * 64  # input untouched
    assert out["rootfs"]["diff_ids"][1] == "sha256:" + "3" * 64
    assert [h["created"] for h in out["history"]] == ["2023-01-01T00:00:00Z", "2023-01-01T00:00:01Z"] + [
        rfc3339(EPOCH)
    ] * 2
    # without the base's history length, everything after the base's last layer gets the epoch
    guessed = normalize_config(config, new_ids, base_layers=1, epoch=EPOCH)
    assert [h["created"] for h in guessed["history"]] == ["2023-01-01T00:00:00Z"] + [rfc3339(EPOCH)] * 3
    with pytest.raises(NormalizeError, match="history entries"):
        normalize_config(config, new_ids, base_layers=1, epoch=EPOCH, base_history=0)
