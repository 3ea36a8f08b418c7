"""The normalised config and the small archives for `docker load`: pure functions, no engine."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from envbuild.image.normalised_config import (
    HistoryEntry,
    canonical_config,
    canonical_json,
    extend_config,
    files_layer,
    image_id,
    load_archive,
    removal_layer,
    settle_empty,
)

L1, L2, L3 = ("sha256:" + c * 64 for c in "123")


def entry(created_by: str, size: int = 0, empty: bool | None = None, created: int = 1_600_000_000) -> HistoryEntry:
    return HistoryEntry(created, created_by, "", size, empty)


def test_settle_empty_counts_exactly_the_layers() -> None:
    base = [
        entry("debootstrap", size=100),
        entry("/bin/sh -c mkdir /data"),  # a layer of directories only: size 0, yet a layer
        entry("/bin/sh -c #(nop)  ENV A=1"),
        entry('CMD ["bash"]'),  # BuildKit's form of a config-only step
    ]
    settled = settle_empty(base, layers=2)
    assert [e.empty for e in settled] == [False, False, True, True]
    assert [e.empty for e in settle_empty(base, layers=1)] == [False, True, True, True]
    # what the parent chain told stays as it is
    known = [*base, entry("/bin/sh -c #(nop) COPY dir:ab in / ", empty=False), entry("LABEL x", empty=True)]
    assert [e.empty for e in settle_empty(known, layers=3)] == [False, False, True, True, False, True]
    with pytest.raises(ValueError, match="cannot match"):
        settle_empty(base, layers=5)


def test_the_newest_undecided_entry_is_a_layer_first() -> None:
    """A base loaded with one more layer on top (the removal layer) settles the base's own entries
    the same way as the base alone: the added entry, newest, takes the added layer."""
    base = [entry("debootstrap", size=100), entry("/bin/sh -c mkdir /a"), entry("/bin/sh -c mkdir /b")]
    alone = settle_empty(base, layers=2)
    extended = settle_empty([*base, entry("envbuild: remove the base's own tinyone 0.9")], layers=3)
    assert [e.empty for e in extended] == [e.empty for e in alone] + [False]


def inspect(layers: list[str], **extra: object) -> dict:
    return {
        "Architecture": "amd64",
        "Os": "linux",
        "Config": {"Env": ["PATH=/usr/bin"], "Labels": {"a": "b"}, "Image": "sha256:" + "9" * 64, "Hostname": "x1"},
        "RootFS": {"Type": "layers", "Layers": layers},
        "Created": "2026-11-30T12:00:00.123456789Z",
        "DockerVersion": "20.10.24",
        "Container": "c" * 64,
        **extra,
    }


def test_canonical_config_fixes_every_build_time_field() -> None:
    history = [
        entry("debootstrap", size=10, created=1_500_000_000),
        entry("/bin/sh -c #(nop) COPY dir:ab in / ", empty=False, created=1_764_500_000),
        entry("/bin/sh -c #(nop)  LABEL a=b", empty=True, created=1_764_500_001),
    ]
    config = canonical_config(inspect([L1, L2]), history, base_entries=1, epoch=1_700_000_000)
    assert config == {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin"], "Labels": {"a": "b"}},
        "created": "2023-11-14T22:13:20Z",
        "history": [
            {"created": "2017-07-14T02:40:00Z", "created_by": "debootstrap"},  # the base's own time
            {"created": "2023-11-14T22:13:20Z", "created_by": "/bin/sh -c #(nop) COPY dir:ab in / "},
            {"created": "2023-11-14T22:13:20Z", "created_by": "/bin/sh -c #(nop)  LABEL a=b", "empty_layer": True},
        ],
        "rootfs": {"type": "layers", "diff_ids": [L1, L2]},
    }
    assert image_id(config) == "sha256:" + hashlib.sha256(canonical_json(config)).hexdigest()
    with_variant = canonical_config(inspect([L1, L2], Variant="v8"), history, base_entries=1, epoch=1_700_000_000)
    assert with_variant["variant"] == "v8"
    with pytest.raises(ValueError, match="non-empty history entries"):
        canonical_config(inspect([L1, L2, L3]), history, base_entries=1, epoch=1_700_000_000)


def _read(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_a_load_archive_names_every_layer_and_carries_only_the_new_ones() -> None:
    config = canonical_config(
        inspect([L1, L2]), [entry("a", size=1), entry("b", size=1)], base_entries=1, epoch=1_700_000_000
    )
    layer = removal_layer(["/etc/issue"], {"/etc": [0o755, 0, 0]}, 1_700_000_000)
    diff = "sha256:" + hashlib.sha256(layer).hexdigest()
    extended = extend_config(config, diff, "envbuild: remove", 1_700_000_000)
    files = _read(load_archive(extended, tags=["x/y:1"], layers={diff: layer}))
    (manifest,) = json.loads(files["manifest.json"])
    assert manifest["RepoTags"] == ["x/y:1"]
    assert manifest["Config"] == image_id(extended).split(":")[1] + ".json"
    assert files[manifest["Config"]] == canonical_json(extended)
    assert len(manifest["Layers"]) == 3
    carried = [path for path in manifest["Layers"] if path in files]
    assert carried == [f"{diff.split(':')[1]}/layer.tar"] and files[carried[0]] == layer
    assert extended["history"][-1] == {"created": "2023-11-14T22:13:20Z", "created_by": "envbuild: remove"}
    assert config["rootfs"]["diff_ids"] == [L1, L2]  # extend_config copies


def test_the_removal_layer_whites_out_under_directories_as_they_are() -> None:
    remove = ["/usr/local/lib/py/site/old-0.9.dist-info", "/usr/local/bin/old-tool", "/usr/local/lib/py/site/old"]
    directories = {
        "/usr": [0o755, 0, 0],
        "/usr/local": [0o2775, 0, 50],
        "/usr/local/bin": [0o2775, 0, 50],
        "/usr/local/lib": [0o2775, 0, 50],
        "/usr/local/lib/py": [0o755, 0, 0],
        "/usr/local/lib/py/site": [0o755, 0, 0],
    }
    layer = removal_layer(remove, directories, 315532800)
    assert layer == removal_layer(list(reversed(remove)), directories, 315532800)  # order does not matter
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names, key=str.encode)
    assert [n for n in names if "/.wh." in n] == [
        "usr/local/bin/.wh.old-tool",
        "usr/local/lib/py/site/.wh.old",
        "usr/local/lib/py/site/.wh.old-0.9.dist-info",
    ]
    by_name = {m.name: m for m in members}
    assert (by_name["usr/local"].mode, by_name["usr/local"].gid) == (0o2775, 50)
    assert all(m.mtime == 315532800 and m.uname == m.gname == "" for m in members)
    with pytest.raises(ValueError, match="not an absolute path"):
        removal_layer(["relative/path"], {}, 1)
    with pytest.raises(ValueError, match="not an absolute path"):
        removal_layer(["/usr/../etc"], directories, 1)


def _dir(mode: int, uid: int, gid: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo("x")
    info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, mode, uid, gid, mtime
    return info


def test_the_files_layer_keeps_its_parents_as_they_are_and_sets_its_own() -> None:
    parents = {"/opt": _dir(0o40775, 0, 50, 1_111_111_111), "/opt/envbuild": _dir(0o755, 0, 0, 1_700_000_000)}
    files = {"manifest.json": b"{}", "inimage_probe.py": b"print()\n"}
    layer = files_layer(parents, "/opt/envbuild/meta", files, 1_700_000_000)
    assert layer == files_layer(
        dict(reversed(parents.items())), "/opt/envbuild/meta", dict(reversed(files.items())), 1_700_000_000
    )
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        content = {name: tar.extractfile(m).read() for name, m in members.items() if m.isfile()}  # type: ignore[union-attr]
    assert list(members) == [
        "opt",
        "opt/envbuild",
        "opt/envbuild/meta",
        "opt/envbuild/meta/inimage_probe.py",
        "opt/envbuild/meta/manifest.json",
    ]
    opt = members["opt"]
    assert (opt.mode, opt.uid, opt.gid, opt.mtime) == (0o775, 0, 50, 1_111_111_111)  # as the image has it
    for name in ("opt/envbuild/meta", "opt/envbuild/meta/manifest.json"):
        info = members[name]
        assert (info.uid, info.gid, info.uname, info.gname, info.mtime) == (0, 0, "", "", 1_700_000_000)
    assert members["opt/envbuild/meta"].mode == 0o755 and members["opt/envbuild/meta/manifest.json"].mode == 0o644
    assert content == {"opt/envbuild/meta/inimage_probe.py": b"print()\n", "opt/envbuild/meta/manifest.json": b"{}"}


@pytest.mark.parametrize(
    ("parents", "files"),
    [
        ({"/opt": _dir(0o755, 0, 0, 1)}, {"a": b""}),  # /opt/envbuild missing
        ({"/opt": _dir(0o755, 0, 0, 1), "/opt/envbuild": _dir(0o755, 0, 0, 1)}, {"../a": b""}),
        ({"/opt": _dir(0o755, 0, 0, 1), "/opt/envbuild": _dir(0o755, 0, 0, 1)}, {"": b""}),
    ],
)
def test_the_files_layer_refuses_missing_parents_and_paths_for_names(parents, files) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        files_layer(parents, "/opt/envbuild/meta", files, 1)
