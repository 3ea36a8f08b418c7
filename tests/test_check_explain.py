"""Explaining an image mismatch: layers, files and first differing bytes, from two saved archives."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from envbuild.check.explain import explain, first_difference, step_label
from tests.lib.savedimage import BASE_LAYER, build, config_for, layer_tar, save_archive


@pytest.mark.parametrize("oci", [False, True], ids=["docker-save", "oci"])
def test_same_image_has_no_differences(tmp_path: Path, oci: bool) -> None:
    # The same image saved twice, apart: nothing differs.
    same = {"mtime": 1.75e9, "container": "c" * 64, "created": "2026-01-01T00:00:00Z", "oci": oci}
    a = build(tmp_path, "a", **same)
    b = build(tmp_path, "b", **same)
    assert explain(a, b) == ()


def test_a_build_time_stamp_is_named_with_its_first_differing_bytes(tmp_path: Path) -> None:
    old = build(
        tmp_path,
        "old",
        mtime=1.0e9,
        container="c" * 64,
        created="2026-01-01T00:00:00Z",
        extra=b"BUILT = '2026-11-01 02:00:00'\n",
    )
    new = build(
        tmp_path,
        "new",
        mtime=1.0e9,
        container="c" * 64,
        created="2026-01-01T00:00:00Z",
        extra=b"BUILT = '2026-11-02 02:00:07'\n",
    )
    (layer,) = explain(old, new)
    assert layer.where == "layer 1 (step 0)" and layer.old != layer.new  # named by its build step
    (changed,) = layer.files
    assert changed.path == "opt/envbuild/src/a.py" and changed.change == "changed"
    assert changed.aspects == ("content",)
    assert changed.first_difference is not None and "offset 29" in changed.first_difference
    assert "2026-11-01" in changed.first_difference and "2026-11-02" in changed.first_difference


def test_unnormalised_builds_show_mtimes_owners_and_config_noise(tmp_path: Path) -> None:
    old = build(tmp_path, "old", mtime=1.0e9, container="c" * 64, created="2026-01-01T00:00:00Z")
    new = build(tmp_path, "new", mtime=1.1e9, container="d" * 64, created="2026-01-02T00:00:00Z", owner=(1000, 1000))
    differences = {d.where.split(" (")[0]: d for d in explain(old, new)}
    assert set(differences) == {"config", "layer 1", "layer 2"}
    config_fields = {f.path for f in differences["config"].files}
    assert {"created", "container"} <= config_fields
    a_py = next(f for f in differences["layer 1"].files if f.path == "opt/envbuild/src/a.py")
    assert set(a_py.aspects) == {"owner", "mtime", "pax headers"}  # its atime and ctime records too


def test_limits_the_listing(tmp_path: Path) -> None:
    old = build(tmp_path, "old", mtime=1.0e9, container="c" * 64, created="2026-01-01T00:00:00Z")
    new = build(tmp_path, "new", mtime=1.1e9, container="c" * 64, created="2026-01-01T00:00:00Z")
    layer = next(d for d in explain(old, new, max_files=2) if d.where.startswith("layer 1 "))
    assert len(layer.files) == 2 and layer.omitted > 0


def test_first_difference() -> None:
    assert first_difference(b"abc", b"abd") == "offset 2: 'abc' vs 'abd'"
    assert first_difference(b"ab", b"abc").startswith("offset 2:")


@pytest.mark.parametrize(
    ("created_by", "label"),
    [
        ("/bin/sh -c #(nop)  LABEL a=b", "LABEL a=b"),
        ("/bin/sh -c pip install x", "RUN pip install x"),
        ("RUN /bin/sh -c since=$(($(date +%s) - 1)) && cp a b # buildkit", "RUN since=$(($(date +%s) - 1)) && cp a b"),
        ("COPY /out/ / # buildkit", "COPY /out/ /"),
        ("LABEL io.envbuild.lock.name=x", "LABEL io.envbuild.lock.name=x"),
        ("RUN /bin/sh -c " + "x" * 100 + " # buildkit", "RUN " + "x" * 75 + "…"),
    ],
    ids=["legacy-nop", "legacy-run", "buildkit-run", "buildkit-copy", "buildkit-label", "long"],
)
def test_a_step_is_labelled_as_its_dockerfile_line(created_by: str, label: str) -> None:
    assert step_label(created_by) == label


def test_layers_with_the_same_entries_in_another_order_are_told_apart(tmp_path: Path) -> None:
    same = {"mtime": 1.0e9, "container": "c" * 64, "created": "2026-01-01T00:00:00Z"}
    (layer,) = explain(build(tmp_path, "a", **same, shuffle=1), build(tmp_path, "b", **same, shuffle=2))
    (archive,) = layer.files
    assert archive.path == "(layer archive)" and archive.aspects == ("order",)
    assert archive.first_difference is not None and archive.first_difference.startswith("entry ")


def test_a_fraction_of_a_second_and_a_pax_record_are_named(tmp_path: Path) -> None:
    same = {"container": "c" * 64, "created": "2026-01-01T00:00:00Z"}
    differences = explain(build(tmp_path, "a", mtime=1.0e9, **same), build(tmp_path, "b", mtime=1.0e9 + 0.5, **same))
    a_py = next(f for d in differences for f in d.files if f.path == "opt/envbuild/src/a.py")
    assert set(a_py.aspects) == {"mtime", "pax headers"}  # atime/ctime records carry the time too


def test_the_same_entries_with_other_header_bytes_name_the_member(tmp_path: Path) -> None:
    entry = {"name": "etc/envbuild", "data": b"x", "mtime": 1.0e9}
    pax, gnu = layer_tar([entry]), layer_tar([entry], fmt=tarfile.GNU_FORMAT)  # one entry, two header formats
    old = save_archive(tmp_path / "old.tar", [BASE_LAYER, pax], _config(pax))
    new = save_archive(tmp_path / "new.tar", [BASE_LAYER, gnu], _config(gnu))
    (layer,) = explain(old, new)
    (archive,) = layer.files
    assert archive.aspects == ("bytes",) and "'etc/envbuild'" in (archive.first_difference or "")


def _config(layer: bytes) -> dict:
    diff_ids = ["sha256:" + hashlib.sha256(data).hexdigest() for data in (BASE_LAYER, layer)]
    return config_for(diff_ids, created="2026-01-01T00:00:00Z", container="c" * 64)
