"""Explaining a mismatch from `docker save` archives that are shaped oddly, or malformed: repeated layers
saved as symlinks (followed inside the archive only, eight deep at most), members missing or of the wrong
kind, a manifest of other than one image, and layers whose differences lie where the summary must not
guess (past the bytes it compares, in binary files, in the archive's order or its padding).

Every archive is a real tar written here, laid out as docker 20.10's ``docker save`` writes it
(:func:`saved`): ``manifest.json``, ``<config hex>.json``, and ``<v1 id>/layer.tar`` per layer, a layer
that repeats an earlier one being a symlink ``../<v1 id>/layer.tar`` to it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from envbuild.check.explain import ArchiveError, explain
from envbuild.check.report import FileDifference
from envbuild.errors import EnvbuildError
from tests.lib.savedimage import BASE_LAYER, config_for, layer_tar

# A member of an outer archive: bytes are a file, a str a symlink to that target, None a directory.
Member = tuple[str, "bytes | str | None"]


def write_tar(path: Path, members: list[Member]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1700000000
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return path


def diff_id_of(layer: bytes) -> str:
    return "sha256:" + hashlib.sha256(layer).hexdigest()


def v1_id(index: int, layer: bytes) -> str:
    """A legacy layer directory's name; docker's vary between builds, and explain never relies on them."""
    return hashlib.sha256(f"{index}{diff_id_of(layer)}".encode()).hexdigest()


def saved_members(layers: list[bytes], config: dict | None = None) -> list[Member]:
    """The members `docker save` (legacy layout) writes for an image of ``layers``: a layer seen before is
    a symlink to the first one's ``layer.tar``, as docker's ``saveLayer`` makes it."""
    diff_ids = [diff_id_of(layer) for layer in layers]
    config_bytes = json.dumps(config or config_for(diff_ids, created="2026-01-01T00:00:00Z", container="c" * 64))
    config_name = hashlib.sha256(config_bytes.encode()).hexdigest() + ".json"
    members: list[Member] = []
    first: dict[str, str] = {}  # diff ID -> the v1 id whose directory holds its layer.tar
    paths = []
    for index, (layer, diff_id) in enumerate(zip(layers, diff_ids)):
        v1 = v1_id(index, layer)
        members += [(v1, None), (f"{v1}/VERSION", b"1.0"), (f"{v1}/json", json.dumps({"id": v1}).encode())]
        members.append((f"{v1}/layer.tar", f"../{first[diff_id]}/layer.tar" if diff_id in first else layer))
        first.setdefault(diff_id, v1)
        paths.append(f"{v1}/layer.tar")
    manifest = [{"Config": config_name, "RepoTags": ["envbuild/test:1"], "Layers": paths}]
    return [*members, (config_name, config_bytes.encode()), ("manifest.json", json.dumps(manifest).encode())]


def saved(path: Path, layers: list[bytes], config: dict | None = None) -> Path:
    return write_tar(path, saved_members(layers, config))


def one_file(name: str, data: bytes) -> bytes:
    return layer_tar([{"name": "etc", "type": "dir", "mtime": 1.0e9}, {"name": name, "data": data, "mtime": 1.0e9}])


def relinked(members: list[Member], name: str, target: bytes | str | None) -> list[Member]:
    """``members`` with the member ``name`` made ``target`` (a symlink when a str)."""
    assert any(member == name for member, _ in members)
    return [(member, target if member == name else content) for member, content in members]


def manifest_of(members: list[Member]) -> list[dict]:
    manifest = dict(members)["manifest.json"]
    assert isinstance(manifest, bytes)
    return list(json.loads(manifest))


def layer_path(members: list[Member], index: int) -> str:
    return str(manifest_of(members)[0]["Layers"][index])


# --- repeated layers: the symlinks docker save writes -----------------------------------------------


def test_a_repeated_layer_saved_as_a_symlink_is_read_through_it(tmp_path: Path) -> None:
    one, two, between = one_file("etc/x", b"one\n"), one_file("etc/x", b"two\n"), one_file("etc/y", b"y\n")
    old = saved(tmp_path / "old.tar", [BASE_LAYER, one, between, one])
    new = saved(tmp_path / "new.tar", [BASE_LAYER, two, between, two])
    with tarfile.open(old) as tar:  # the shape under test: layer 3 is docker's symlink to layer 1
        link = tar.getmember(f"{v1_id(3, one)}/layer.tar")
        assert link.issym() and link.linkname == f"../{v1_id(1, one)}/layer.tar"
    changed = FileDifference("etc/x", "changed", ("content",), "offset 0: 'one\\n' vs 'two\\n'")
    assert [(d.where, d.files) for d in explain(old, new)] == [
        ("layer 1 (step 0)", (changed,)),
        ("layer 3 (step 2)", (changed,)),
    ]


def test_a_symlink_climbing_above_the_archive_stays_inside_it(tmp_path: Path) -> None:
    """``..`` at the archive's root stays at the root, as it does at ``/``: however far a link climbs, it
    names a member of the archive (and only ever a member: nothing is looked up on disk)."""
    inside = one_file("etc/x", b"inside\n")
    members = saved_members([BASE_LAYER, inside])
    climbing = relinked(members, layer_path(members, 1), "./../../../outside/layer.tar")
    new = saved(tmp_path / "new.tar", [BASE_LAYER, one_file("etc/x", b"INSIDE\n")])
    old = write_tar(tmp_path / "old.tar", climbing)
    with pytest.raises(ArchiveError) as raised:
        explain(old, new)
    assert str(raised.value) == f"{old}: the saved image has no outside/layer.tar"

    held = write_tar(tmp_path / "held.tar", [*climbing, ("outside/layer.tar", inside)])
    (layer_1,) = explain(held, new)
    assert layer_1.files == (FileDifference("etc/x", "changed", ("content",), "offset 0: 'inside\\n' vs 'INSIDE\\n'"),)


@pytest.mark.parametrize(("links", "readable"), [(8, True), (9, False)], ids=["8-links", "9-links"])
def test_a_chain_of_symlinks_is_followed_eight_deep(tmp_path: Path, links: int, readable: bool) -> None:
    layer = one_file("etc/x", b"x\n")
    members = saved_members([BASE_LAYER, layer])
    start = layer_path(members, 1)
    # the manifest's member links to chain/1, chain/1 to chain/2 …, the last to the layer itself
    chain: list[Member] = [
        (f"chain/{i}", f"{i + 1}" if i + 1 < links else "../real/layer.tar") for i in range(1, links)
    ]
    chained = write_tar(
        tmp_path / "old.tar", [*relinked(members, start, "../chain/1"), *chain, ("real/layer.tar", layer)]
    )
    new = saved(tmp_path / "new.tar", [BASE_LAYER, one_file("etc/x", b"y\n")])
    if readable:
        (layer_1,) = explain(chained, new)
        assert layer_1.files == (FileDifference("etc/x", "changed", ("content",), "offset 0: 'x\\n' vs 'y\\n'"),)
    else:  # the manifest's member, then chain/1 … chain/8: the eighth link is not followed
        with pytest.raises(ArchiveError) as raised:
            explain(chained, new)
        assert str(raised.value) == f"{chained}: chain/8 in the saved image is not a file"


def test_a_symlink_loop_ends_in_one_line(tmp_path: Path) -> None:
    members = saved_members([BASE_LAYER, one_file("etc/x", b"x\n")])
    start = layer_path(members, 1)
    looping = write_tar(
        tmp_path / "old.tar", [*relinked(members, start, "../loop/layer.tar"), ("loop/layer.tar", f"../{start}")]
    )
    with pytest.raises(ArchiveError) as raised:
        explain(looping, saved(tmp_path / "new.tar", [BASE_LAYER, one_file("etc/x", b"y\n")]))
    assert str(raised.value) == f"{looping}: {start} in the saved image is not a file"


# --- members missing or of the wrong kind ------------------------------------------------------------


def test_a_layer_symlink_to_a_member_the_archive_lacks_names_both(tmp_path: Path) -> None:
    members = saved_members([BASE_LAYER, one_file("etc/x", b"x\n")])
    dangling = write_tar(tmp_path / "old.tar", relinked(members, layer_path(members, 1), "../gone/layer.tar"))
    with pytest.raises(ArchiveError) as raised:
        explain(dangling, saved(tmp_path / "new.tar", [BASE_LAYER, one_file("etc/x", b"y\n")]))
    assert str(raised.value) == f"{dangling}: the saved image has no gone/layer.tar"


@pytest.mark.parametrize("missing", ["manifest.json", "config", "layer"])
def test_a_member_the_archive_lacks_is_named_with_the_archive(tmp_path: Path, missing: str) -> None:
    members = saved_members([BASE_LAYER, one_file("etc/x", b"x\n")])
    name = {
        "manifest.json": "manifest.json",
        "config": manifest_of(members)[0]["Config"],
        "layer": layer_path(members, 1),
    }[missing]
    old = write_tar(tmp_path / "old.tar", [m for m in members if m[0] != name])
    with pytest.raises(ArchiveError) as raised:
        explain(old, saved(tmp_path / "new.tar", [BASE_LAYER, one_file("etc/x", b"y\n")]))
    assert str(raised.value) == f"{old}: the saved image has no {name}"


def test_a_directory_where_the_manifest_names_a_layer_is_not_a_file(tmp_path: Path) -> None:
    members = saved_members([BASE_LAYER, one_file("etc/x", b"x\n")])
    name = layer_path(members, 1)
    old = write_tar(tmp_path / "old.tar", relinked(members, name, None))
    with pytest.raises(ArchiveError) as raised:
        explain(old, saved(tmp_path / "new.tar", [BASE_LAYER, one_file("etc/x", b"y\n")]))
    assert str(raised.value) == f"{old}: {name} in the saved image is not a file"


@pytest.mark.parametrize("images", [0, 2, None], ids=["no-image", "two-images", "an-object"])
def test_a_manifest_of_other_than_one_image_is_an_archive_error(tmp_path: Path, images: int | None) -> None:
    """An :class:`EnvbuildError`, so `envbuild check` reports it as the comparison's failure (it catches
    no other kind) instead of ending in a traceback with no report and no history line."""
    members = saved_members([BASE_LAYER, one_file("etc/x", b"x\n")])
    (image,) = manifest_of(members)
    manifest = {"Config": image["Config"]} if images is None else [image] * images
    old = write_tar(tmp_path / "old.tar", relinked(members, "manifest.json", json.dumps(manifest).encode()))
    with pytest.raises(EnvbuildError) as raised:
        explain(old, saved(tmp_path / "new.tar", [BASE_LAYER, one_file("etc/x", b"y\n")]))
    assert isinstance(raised.value, ArchiveError)
    assert str(raised.value) == f"{old}: manifest.json must describe one image"


def manifest_replaced(members: list[Member], change: dict) -> list[Member]:
    (image,) = manifest_of(members)
    return relinked(members, "manifest.json", json.dumps([{**image, **change}]).encode())


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ("not a tar", "ReadError"),
        ("manifest not JSON", "JSONDecodeError"),
        ("no Config", "KeyError('Config')"),
        ("fewer layers than diff IDs", "IndexError"),
        ("a layer that is no tar", "ReadError"),
    ],
)
def test_an_archive_not_as_docker_save_writes_one_is_an_archive_error_naming_it(
    tmp_path: Path, shape: str, words: str
) -> None:
    """Whatever is malformed, the check's explanation fails in one line naming the archive (an EnvbuildError,
    which `envbuild check` reports and records), not with a traceback."""
    members = saved_members([BASE_LAYER, one_file("etc/x", b"x\n")])
    old = tmp_path / "old.tar"
    if shape == "not a tar":
        old.write_bytes(b"this is not an archive\n" * 40)
    elif shape == "manifest not JSON":
        write_tar(old, relinked(members, "manifest.json", b"[{"))
    elif shape == "no Config":
        (image,) = manifest_of(members)
        write_tar(old, relinked(members, "manifest.json", json.dumps([{"Layers": image["Layers"]}]).encode()))
    elif shape == "fewer layers than diff IDs":
        write_tar(old, manifest_replaced(members, {"Layers": [layer_path(members, 0)]}))
    else:
        write_tar(old, relinked(members, layer_path(members, 1), b"not a tar" * 100))
    with pytest.raises(ArchiveError) as raised:
        explain(old, saved(tmp_path / "new.tar", [BASE_LAYER, one_file("etc/x", b"y\n")]))
    message = str(raised.value)
    assert message.startswith(f"{old}: not an image archive as `docker save` writes one: ") and words in message
    assert "\n" not in message


def test_layers_saved_compressed_are_compared_as_the_same_layers_uncompressed(tmp_path: Path) -> None:
    """An OCI layout's layer blobs may be gzip-compressed (the containerd image store's `docker save`):
    the files and the bytes are compared in the tar inside, as for the same layers saved plain."""
    plain = [BASE_LAYER, one_file("etc/x", b"one\n")], [BASE_LAYER, one_file("etc/x", b"two\n")]

    def compressed(path: Path, layers: list[bytes]) -> Path:
        members = saved_members(layers)
        for index, layer in enumerate(layers):
            members = relinked(members, layer_path(members, index), gzip.compress(layer, mtime=0))
        return write_tar(path, members)

    expected = explain(saved(tmp_path / "a.tar", plain[0]), saved(tmp_path / "b.tar", plain[1]))
    assert [d.files for d in expected] == [
        (FileDifference("etc/x", "changed", ("content",), "offset 0: 'one\\n' vs 'two\\n'"),)
    ]
    assert explain(compressed(tmp_path / "c.tar", plain[0]), compressed(tmp_path / "d.tar", plain[1])) == expected

    # the same entries in another order: where the two tars part is an offset in the tar, not in the gzip
    entries = [{"name": "etc/a", "data": b"a\n", "mtime": 1.0e9}, {"name": "etc/b", "data": b"b\n", "mtime": 1.0e9}]
    old_layers, new_layers = [BASE_LAYER, layer_tar(entries)], [BASE_LAYER, layer_tar(entries[::-1])]
    ordered = explain(compressed(tmp_path / "e.tar", old_layers), compressed(tmp_path / "f.tar", new_layers))
    assert ordered == explain(saved(tmp_path / "g.tar", old_layers), saved(tmp_path / "h.tar", new_layers))


# --- what a difference says about the files and bytes of a layer ------------------------------------


def explain_file(tmp_path: Path, old: bytes, new: bytes) -> tuple[FileDifference, ...]:
    (layer,) = explain(
        saved(tmp_path / "old.tar", [BASE_LAYER, one_file("etc/x", old)]),
        saved(tmp_path / "new.tar", [BASE_LAYER, one_file("etc/x", new)]),
    )
    return layer.files


def test_a_large_text_file_differing_past_the_compared_head_claims_no_offset(tmp_path: Path) -> None:
    """The first 64 KiB of a file are kept to show where it differs; past them only the digest says so.
    When those 64 KiB agree, no offset is known, and none may be shown (it was 65536, where both agree)."""
    text = b"".join(b"line %06d\n" % i for i in range(10_000))  # 120,000 bytes of text
    at = 90_000
    later = text[:at] + b"X" + text[at + 1 :]
    assert explain_file(tmp_path, text, later) == (FileDifference("etc/x", "changed", ("content",), None),)
    earlier = text[:10] + b"X" + text[11:]
    (changed,) = explain_file(tmp_path, text, earlier)
    assert (
        changed.first_difference
        == "offset 10: 'line 000000\\nline 000001\\nline 00000' vs 'line 00000X\\nline 000001\\nline 00000'"
    )


@pytest.mark.parametrize(
    ("old", "new", "detail"),
    [
        (b"\x7fELF\x00\x01", b"\x7fELF\x00\x02", None),  # binary: a NUL
        (b"caf\xe9 1\n", b"caf\xe9 2\n", None),  # not UTF-8 (Latin-1)
        (  # UTF-8 whose 8 KiB sample ends inside a character: still text
            b"x" * 8191 + "é".encode() + b"tail-1",
            b"x" * 8191 + "é".encode() + b"tail-2",
            "offset 8198: 'xxxxxxxxxxxxxxxxxétail-1' vs 'xxxxxxxxxxxxxxxxxétail-2'",
        ),
    ],
    ids=["nul", "latin-1", "utf-8-cut-at-8k"],
)
def test_bytes_are_shown_only_for_text(tmp_path: Path, old: bytes, new: bytes, detail: str | None) -> None:
    assert explain_file(tmp_path, old, new) == (FileDifference("etc/x", "changed", ("content",), detail),)


def test_files_added_and_removed_in_a_layer_are_named(tmp_path: Path) -> None:
    def layer(name: str) -> bytes:
        return layer_tar([{"name": "etc/x", "data": b"x", "mtime": 1.0e9}, {"name": name, "data": b"", "mtime": 1.0e9}])

    (differs,) = explain(
        saved(tmp_path / "old.tar", [BASE_LAYER, layer("etc/old")]),
        saved(tmp_path / "new.tar", [BASE_LAYER, layer("etc/new")]),
    )
    assert differs.files == (FileDifference("etc/new", "added"), FileDifference("etc/old", "removed"))


def test_a_layer_without_a_history_entry_is_named_by_its_index(tmp_path: Path) -> None:
    """Images from ``docker import`` or other builders may carry no history: no step is named."""
    layers = [[BASE_LAYER, one_file("etc/x", data)] for data in (b"x", b"y")]
    configs = [config_for([diff_id_of(x) for x in ls], created="", container="") for ls in layers]
    for config in configs:
        del config["history"]
    (differs,) = explain(
        saved(tmp_path / "old.tar", layers[0], configs[0]), saved(tmp_path / "new.tar", layers[1], configs[1])
    )
    assert differs.where == "layer 1"


def test_an_entry_listed_twice_is_named_with_the_order(tmp_path: Path) -> None:
    x, y = {"name": "etc/x", "data": b"x", "mtime": 1.0e9}, {"name": "etc/y", "data": b"y", "mtime": 1.0e9}
    (differs,) = explain(
        saved(tmp_path / "old.tar", [BASE_LAYER, layer_tar([x, y, x])]),
        saved(tmp_path / "new.tar", [BASE_LAYER, layer_tar([y, x])]),
    )
    assert differs.files == (
        FileDifference(
            "(layer archive)",
            "changed",
            ("order",),
            "entry 0: 'etc/x' vs 'etc/y'; listed more than once in one of them: etc/x",
        ),
    )


def test_bytes_differing_past_the_first_mebibyte_after_the_last_member(tmp_path: Path) -> None:
    """The same entries, one archive padded further (as another tar writer pads): the offset is counted
    across the chunks read, and it lies past every member."""
    layer = layer_tar([{"name": "etc/big", "data": bytes(range(256)) * 6144, "mtime": 1.0e9}])  # 1.5 MiB
    padded = layer + bytes(512)
    (differs,) = explain(
        saved(tmp_path / "old.tar", [BASE_LAYER, layer]), saved(tmp_path / "new.tar", [BASE_LAYER, padded])
    )
    assert len(layer) > 1 << 20
    assert differs.files == (
        FileDifference("(layer archive)", "changed", ("bytes",), f"offset {len(layer)}, after the last member"),
    )


def test_the_same_layer_bytes_under_two_diff_ids_are_not_called_different(tmp_path: Path) -> None:
    """A config whose diff ID is not its layer's digest (no engine writes one; a hand-made or damaged
    archive does): the layers are the same bytes, and the summary must not place a difference in them."""
    layer = one_file("etc/x", b"x\n")
    base = diff_id_of(BASE_LAYER)
    configs = [
        config_for([base, diff_id], created="", container="") for diff_id in ("sha256:" + "0" * 64, diff_id_of(layer))
    ]
    (differs,) = explain(
        saved(tmp_path / "old.tar", [BASE_LAYER, layer], configs[0]),
        saved(tmp_path / "new.tar", [BASE_LAYER, layer], configs[1]),
    )
    assert differs.files == (
        FileDifference(
            "(layer archive)", "changed", ("diff id",), "the same bytes: a config's diff ID is not this layer's digest"
        ),
    )
