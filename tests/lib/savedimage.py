"""Synthetic `docker save` archives (docker-save and OCI layouts) with build noise, for normalise tests."""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
from pathlib import Path

EPOCH = 1700000000
BUILD_TIME = 1750000000.25


def layer_tar(entries: list[dict], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A layer tar from entry specs: name, type (file/dir/link/symlink), data, mtime, owner, pax."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for spec in entries:
            info = tarfile.TarInfo(spec["name"])
            kind = spec.get("type", "file")
            info.type = {
                "file": tarfile.REGTYPE,
                "dir": tarfile.DIRTYPE,
                "link": tarfile.LNKTYPE,
                "symlink": tarfile.SYMTYPE,
            }[kind]
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


BASE_LAYER = layer_tar(
    [
        {"name": "usr", "type": "dir", "mtime": 1600000000},
        {"name": "usr/bin", "type": "dir", "mtime": 1600000000},
        {"name": "usr/bin/python3", "data": b"\x7fELF", "mode": 0o755, "mtime": 1600000000},
    ],
    fmt=tarfile.GNU_FORMAT,
)
BASE_DIFF = "sha256:" + hashlib.sha256(BASE_LAYER).hexdigest()


def added_layer(mtime: float, *, shuffle: int = 0, owner: tuple[int, int] = (0, 0), extra: bytes = b"") -> bytes:
    entries = [
        {"name": "opt", "type": "dir", "mtime": mtime},
        {"name": "opt/envbuild", "type": "dir", "mtime": mtime},
        {"name": "opt/envbuild/src", "type": "dir", "mtime": mtime},
        {
            "name": "opt/envbuild/src/a.py",
            "data": b"print('a')\n" + extra,
            "mtime": mtime,
            "owner": owner,
            "names": ("builder", "staff"),
            "pax": {"atime": str(mtime), "ctime": str(mtime), "SCHILY.xattr.user.note": "kept"},
        },
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
    history = [
        {"created": "2023-01-01T00:00:00Z", "created_by": "base layer"},
        {"created": "2023-01-01T00:00:01Z", "created_by": 'CMD ["sh"]', "empty_layer": True},
    ]
    history += [{"created": created, "created_by": f"/bin/sh -c #(nop) step {i}"} for i in range(len(diff_ids) - 1)]
    history.append({"created": created, "created_by": "LABEL x", "empty_layer": True})
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "docker_version": "20.10.24",
        "container": container,
        "container_config": {"Hostname": container[:12], "Image": "sha256:" + container},
        "config": {
            "Hostname": container[:12],
            "Image": "sha256:" + "9" * 64,
            "Env": ["PATH=/usr/bin"],
            "Labels": labels or {"io.envbuild.lock.sha256": "ab" * 32},
        },
        "history": history,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }


def save_archive(
    path: Path,
    layers: list[bytes],
    config: dict,
    *,
    oci: bool = False,
    tags: tuple[str, ...] = ("envbuild/test:1",),
    salt: str = "",
) -> Path:
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
    files["manifest.json"] = json.dumps(
        [
            {
                "Config": ("blobs/sha256/" if oci else "") + config_hex + ("" if oci else ".json"),
                "RepoTags": list(tags),
                "Layers": paths,
            }
        ]
    ).encode()
    if oci:
        files["index.json"] = b'{"schemaVersion":2,"manifests":[]}'
        files["oci-layout"] = b'{"imageLayoutVersion":"1.0.0"}'
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), int(BUILD_TIME)
            tar.addfile(info, io.BytesIO(data))
    return path


def build(
    tmp_path: Path,
    name: str,
    *,
    mtime: float,
    container: str,
    created: str,
    shuffle: int = 0,
    extra: bytes = b"",
    oci: bool = False,
    owner: tuple[int, int] = (0, 0),
) -> Path:
    layers = [
        BASE_LAYER,
        added_layer(mtime, shuffle=shuffle, owner=owner, extra=extra),
        layer_tar(
            [{"name": "etc", "type": "dir", "mtime": mtime}, {"name": "etc/envbuild", "data": b"x", "mtime": mtime}]
        ),
    ]
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    return save_archive(
        tmp_path / f"{name}.tar",
        layers,
        config_for(diff_ids, created=created, container=container),
        oci=oci,
        salt=container,
    )


def read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
