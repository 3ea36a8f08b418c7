"""Normalising `docker save` archives: build noise removed, content kept, base layers untouched."""

from __future__ import annotations

import hashlib
import io
import json
import random
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

EPOCH = 1700000000
BUILD_TIME = 1750000000.25


def layer_tar(entries: list[dict], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A layer tar from entry specs: name, type (file/dir/link/symlink), data, mtime, owner, pax."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for spec in entries:
            info = tarfile.TarInfo(spec["name"])
            kind = spec.get("type", "file")
            info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "link": tarfile.LNKTYPE,
                         "symlink": tarfile.SYMTYPE}[kind]
            info.mode = spec.get("mode", 0o755 if kind == "dir" else 0o644)
            info.mtime = spec.get("mtime", BUILD_TIME)
            info.uid, info.gid = spec.get("owner", (0, 0))
            info.uname, info.gname = spec.get("names", ("root", "root"))
            info.linkname = spec.get("target", "")
            info.pax_headers = spec.get("pax", {})
            data = spec.get("data", b"")
            info.size = len(data) if kind == "file" else 0
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
    return buffer.getvalue()


BASE_LAYER = layer_tar([{"name": "usr", "type": "dir", "mtime": 1600000000},
                        {"name": "usr/bin", "type": "dir", "mtime": 1600000000},
                        {"name": "usr/bin/python3", "data": b"\x7fELF", "mode": 0o755, "mtime": 1600000000}],
                       fmt=tarfile.GNU_FORMAT)
BASE_DIFF = "sha256:" + hashlib.sha256(BASE_LAYER).hexdigest()


def added_layer(mtime: float, *, shuffle: int = 0, owner: tuple[int, int] = (0, 0), extra: bytes = b"") -> bytes:
    entries = [
        {"name": "opt", "type": "dir", "mtime": mtime},
        {"name": "opt/envbuild", "type": "dir", "mtime": mtime},
        {"name": "opt/envbuild/src", "type": "dir", "mtime": mtime},
        {"name": "opt/envbuild/src/a.py", "data": b"print('a')\n" + extra, "mtime": mtime, "owner": owner,
         "names": ("builder", "staff"), "pax": {"atime": str(mtime), "ctime": str(mtime),
                                                "SCHILY.xattr.user.note": "kept"}},
        {"name": "opt/envbuild/src/old.py", "data": b"old\n", "mtime": 1500000000},
        {"name": "opt/envbuild/src/__pycache__", "type": "dir", "mtime": mtime},
        {"name": "opt/envbuild/src/__pycache__/a.cpython-311.pyc", "data": str(mtime).encode(), "mtime": mtime},
        {"name": "opt/envbuild/src/zz-data", "data": b"shared bytes", "mtime": mtime},
        # a hard link whose name sorts before its target: the rewrite must move the data to it
        {"name": "opt/envbuild/src/b-link", "type": "link", "target": "opt/envbuild/src/zz-data", "mtime": mtime},
        {"name": "opt/envbuild/src/c-symlink", "type": "symlink", "target": "a.py", "mtime": mtime},
        {"name": "usr/.wh.old-file", "data": b"", "mtime": mtime},
    ]
    # the hard link must follow its target in the original archive, whatever else is shuffled
    head, links = entries[:-3], entries[-3:]
    random.Random(shuffle).shuffle(head)
    return layer_tar(head + links)


def config_for(diff_ids: list[str], *, created: str, container: str, labels: dict[str, str] | None = None) -> dict:
    history = [{"created": "2023-01-01T00:00:00Z", "created_by": "base layer"},
               {"created": "2023-01-01T00:00:01Z", "created_by": "CMD [\"sh\"]", "empty_layer": True}]
    history += [{"created": created, "created_by": f"/bin/sh -c #(nop) step {i}"} for i in range(len(diff_ids) - 1)]
    history.append({"created": created, "created_by": "LABEL x", "empty_layer": True})
    return {
        "architecture": "amd64", "os": "linux", "created": created, "docker_version": "20.10.24",
        "container": container,
        "container_config": {"Hostname": container[:12], "Image": "sha256:" + container},
        "config": {"Hostname": container[:12], "Image": "sha256:" + "9" * 64, "Env": ["PATH=/usr/bin"],
                   "Labels": labels or {"io.envbuild.lock.sha256": "ab" * 32}},
        "history": history,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }


def save_archive(path: Path, layers: list[bytes], config: dict, *, oci: bool = False,
                 tags: tuple[str, ...] = ("envbuild/test:1",), salt: str = "") -> Path:
    """A `docker save` archive in the legacy layout (docker 20.10) or the OCI one (docker 25+)."""
    config_bytes = json.dumps(config, indent=None).encode()  # docker's own, non-canonical key order
    config_hex = hashlib.sha256(config_bytes).hexdigest()
    files: dict[str, bytes] = {}
    paths = []
    for index, data in enumerate(layers):
        hex_id = hashlib.sha256(data).hexdigest()
        if oci:
            paths.append(f"blobs/sha256/{hex_id}")
            files[paths[-1]] = data
        else:
            v1 = hashlib.sha256(f"{salt}{index}{hex_id}".encode()).hexdigest()  # v1 ids vary between builds
            paths.append(f"{v1}/layer.tar")
            files[paths[-1]] = data
            files[f"{v1}/VERSION"] = b"1.0"
            files[f"{v1}/json"] = json.dumps({"id": v1, "created": salt}).encode()
    files["blobs/sha256/" + config_hex if oci else config_hex + ".json"] = config_bytes
    files["manifest.json"] = json.dumps([{"Config": ("blobs/sha256/" if oci else "") + config_hex + ("" if oci else ".json"),
                                          "RepoTags": list(tags), "Layers": paths}]).encode()
    if oci:
        files["index.json"] = b'{"schemaVersion":2,"manifests":[]}'
        files["oci-layout"] = b'{"imageLayoutVersion":"1.0.0"}'
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), int(BUILD_TIME)
            tar.addfile(info, io.BytesIO(data))
    return path


def build(tmp_path: Path, name: str, *, mtime: float, container: str, created: str, shuffle: int = 0,
          extra: bytes = b"", oci: bool = False, owner: tuple[int, int] = (0, 0)) -> Path:
    layers = [BASE_LAYER, added_layer(mtime, shuffle=shuffle, owner=owner, extra=extra),
              layer_tar([{"name": "etc", "type": "dir", "mtime": mtime},
                         {"name": "etc/envbuild", "data": b"x", "mtime": mtime}])]
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    return save_archive(tmp_path / f"{name}.tar", layers, config_for(diff_ids, created=created, container=container),
                        oci=oci, salt=container)


def read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


@pytest.mark.parametrize("oci", [False, True], ids=["docker-save", "oci"])
def test_two_noisy_builds_give_one_image_id(tmp_path: Path, oci: bool) -> None:
    one = build(tmp_path, "one", mtime=BUILD_TIME, container="a" * 64, created="2025-06-15T15:06:40.25Z", oci=oci)
    two = build(tmp_path, "two", mtime=BUILD_TIME + 3600.5, container="b" * 64, created="2025-06-15T16:06:41Z",
                shuffle=7, oci=oci, owner=(1000, 1000))
    assert one.read_bytes() != two.read_bytes()
    first = normalize_image(one, tmp_path / "one.norm.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH)
    second = normalize_image(two, tmp_path / "two.norm.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH)
    assert first.image_id == second.image_id
    assert first.layout == ("oci" if oci else "docker-save")
    assert (tmp_path / "one.norm.tar").read_bytes() == (tmp_path / "two.norm.tar").read_bytes()

    different = build(tmp_path, "three", mtime=BUILD_TIME, container="a" * 64, created="2025-06-15T15:06:40.25Z",
                      extra=b"# one more byte of content\n", oci=oci)
    third = normalize_image(different, tmp_path / "three.norm.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH)
    assert third.image_id != first.image_id
    assert third.diff_ids[0] == first.diff_ids[0] and third.diff_ids[2] == first.diff_ids[2]
    assert third.diff_ids[1] != first.diff_ids[1]


@pytest.mark.parametrize("oci", [False, True], ids=["docker-save", "oci"])
def test_output_is_consistent_and_loadable_shaped(tmp_path: Path, oci: bool) -> None:
    source = build(tmp_path, "one", mtime=BUILD_TIME, container="a" * 64, created="2025-06-15T15:06:40Z", oci=oci)
    result = normalize_image(source, tmp_path / "out.tar", base_diff_ids=[BASE_DIFF], epoch=EPOCH,
                             base_history=2, tags=["envbuild/final:1"])
    files = read_archive(tmp_path / "out.tar")
    (manifest,) = json.loads(files["manifest.json"])
    config_bytes = files[manifest["Config"]]
    assert "sha256:" + hashlib.sha256(config_bytes).hexdigest() == result.image_id
    config = json.loads(config_bytes)
    assert config_bytes == json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    assert manifest["RepoTags"] == ["envbuild/final:1"]
    layers = [files[p] for p in manifest["Layers"]]
    assert ["sha256:" + hashlib.sha256(l).hexdigest() for l in layers] == config["rootfs"]["diff_ids"] == list(result.diff_ids)
    assert layers[0] == BASE_LAYER  # byte for byte
    assert config["created"] == rfc3339(EPOCH) == "2023-11-14T22:13:20Z"
    for gone in ("container", "container_config", "docker_version"):
        assert gone not in config
    assert "Image" not in config["config"] and "Hostname" not in config["config"]
    assert config["config"]["Labels"] == {"io.envbuild.lock.sha256": "ab" * 32}
    assert [h["created"] for h in config["history"]] == ["2023-01-01T00:00:00Z", "2023-01-01T00:00:01Z"] + [rfc3339(EPOCH)] * 3
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
    source = build(tmp_path, "one", mtime=BUILD_TIME, container="a" * 64, created="2025-06-15T15:06:40Z",
                   shuffle=3, owner=(1000, 50))
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
    assert (tmp_path / "rootfs/opt/envbuild/src/zz-data").stat().st_ino == (tmp_path / "rootfs/opt/envbuild/src/b-link").stat().st_ino
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
    config = config_for(["sha256:" + "1" * 64, "sha256:" + "2" * 64], created="2025-01-01T00:00:00Z", container="c" * 64)
    new_ids = ["sha256:" + "1" * 64, "sha256:" + "3" * 64]
    out = normalize_config(config, new_ids, base_layers=1, epoch=EPOCH, base_history=2)
    assert config["container"] == "c" * 64  # input untouched
    assert out["rootfs"]["diff_ids"][1] == "sha256:" + "3" * 64
    assert [h["created"] for h in out["history"]] == ["2023-01-01T00:00:00Z", "2023-01-01T00:00:01Z"] + [rfc3339(EPOCH)] * 2
    # without the base's history length, everything after the base's last layer gets the epoch
    guessed = normalize_config(config, new_ids, base_layers=1, epoch=EPOCH)
    assert [h["created"] for h in guessed["history"]] == ["2023-01-01T00:00:00Z"] + [rfc3339(EPOCH)] * 3
    with pytest.raises(NormalizeError, match="history entries"):
        normalize_config(config, new_ids, base_layers=1, epoch=EPOCH, base_history=0)
