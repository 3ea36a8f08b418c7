"""`envrun checkpoint audit` on hostile checkpoints: one line naming the file, exit status 2, no hang.

Every case here was first written against main, where it hung, ran out of memory, traced back or
passed as an ordinary "not ok". Cases whose risk is a hang or a runaway allocation run the CLI in a
child process under a timeout and an address-space limit (:func:`tests.lib.ckptgen.run_audit_guarded`),
so that a regression fails its test instead of the suite; all run with ``--json``, which must print
nothing when the input is refused.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import SafetensorError, safe_open

from envbuild.errors import InputError
from envrun.checkpoint import audit_checkpoint, read_safetensors_header, render_audit
from tests.lib.ckptgen import (
    AuditRun,
    CheckpointSpec,
    run_audit_guarded,
    tensor_names,
    write_checkpoint,
    write_raw_safetensors,
)

SPEC = CheckpointSpec(layers=4, mtp_layers=1, first_k_dense=1, experts=4, shards=3)
INDEX = "model.safetensors.index.json"
SHARD = "model-00002-of-00003.safetensors"
SINGLE = "model.safetensors"
TINY_ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    write_checkpoint(tmp_path / "model", SPEC)
    return tmp_path / "model"


@pytest.fixture
def single(tmp_path: Path) -> Path:
    write_checkpoint(tmp_path / "single", CheckpointSpec(single_file=True))
    return tmp_path / "single"


def assert_refused(run: AuditRun, path: Path, *fragments: str) -> str:
    """Exit 2, nothing on stdout, one line on stderr naming ``path``; returns that line."""
    assert run.returncode == 2, run
    assert run.stdout == "", run
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("envrun: error: "), run.stderr
    assert f"{path}:" in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def replace_with(path: Path) -> Path:
    path.unlink()
    return path


# --- files that are not regular files -----------------------------------------------------------


@pytest.mark.parametrize("name", ["config.json", INDEX, SHARD])
def test_a_fifo_is_refused_without_blocking(model: Path, name: str) -> None:
    os.mkfifo(replace_with(model / name))
    assert_refused(run_audit_guarded(model, "--json"), model / name, "FIFO, not a regular file")


def test_a_fifo_single_file_is_refused_not_skipped_for_the_index(model: Path) -> None:
    # transformers' isfile() would skip a FIFO named model.safetensors; an audit must not guess.
    os.mkfifo(model / SINGLE)
    assert_refused(run_audit_guarded(model, "--json"), model / SINGLE, "FIFO")


@pytest.mark.parametrize("name", ["config.json", INDEX, SHARD])
def test_a_link_to_dev_zero_is_refused(model: Path, name: str) -> None:
    replace_with(model / name).symlink_to("/dev/zero")
    assert_refused(run_audit_guarded(model, "--json"), model / name, "outside the model directory")


def test_a_link_to_a_regular_file_outside_is_refused(model: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere.json").write_text((model / "config.json").read_text())
    replace_with(model / "config.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(InputError, match="config.json: a symlink to .*elsewhere.json, outside the model directory"):
        audit_checkpoint(model)


def test_a_link_inside_the_directory_to_a_fifo_is_refused(model: Path) -> None:
    os.mkfifo(model / "pipe")
    replace_with(model / "config.json").symlink_to("pipe")
    assert_refused(run_audit_guarded(model, "--json"), model / "config.json", "FIFO")


def test_links_inside_the_directory_are_followed(model: Path) -> None:
    (model / "real").mkdir()
    for name in ("config.json", SHARD):
        (model / name).rename(model / "real" / name)
        (model / name).symlink_to(Path("real") / name)
    assert audit_checkpoint(model).ok


def test_a_dangling_shard_link_is_a_missing_shard(model: Path) -> None:
    replace_with(model / SHARD).symlink_to("gone.safetensors")
    report = audit_checkpoint(model)
    assert not report.ok and report.shards_missing == (SHARD,)


def test_a_link_loop_is_refused(model: Path) -> None:
    replace_with(model / "config.json").symlink_to("config.json")
    with pytest.raises(InputError, match="config.json: cannot open"):
        audit_checkpoint(model)


@pytest.mark.parametrize("name", ["config.json", INDEX, SHARD])
def test_a_directory_is_refused(model: Path, name: str) -> None:
    replace_with(model / name).mkdir()
    with pytest.raises(InputError, match=f"{name}: a directory, not a regular file"):
        audit_checkpoint(model)


# --- sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "limit"), [("config.json", "4 MiB"), (INDEX, "64 MiB")])
def test_a_sparse_multi_gb_json_file_is_refused_unread(model: Path, name: str, limit: str) -> None:
    os.truncate(model / name, 3 << 30)  # a hole: 3 GB that cost no disk, and no time unless read
    assert_refused(run_audit_guarded(model, "--json"), model / name, "3,221,225,472 bytes", limit)


def test_a_header_the_index_cannot_justify_is_refused_unread(model: Path) -> None:
    # Within the format's 100 MB, but the index places 49 small tensors in this shard.
    shard = write_raw_safetensors(replace_with(model / SHARD), b"", length=99_000_000)
    os.truncate(shard, 3 << 30)
    assert_refused(run_audit_guarded(model, "--json"), shard, "header of 99,000,000 bytes", "tensors the index")


def test_a_sparse_single_file_with_a_header_of_zeros_is_malformed(single: Path) -> None:
    path = write_raw_safetensors(replace_with(single / SINGLE), b"", length=99_000_000)
    os.truncate(path, 3 << 30)
    assert_refused(run_audit_guarded(single, "--json"), path, "malformed header")


# --- counts -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "args"),
    [
        ('{"model_type": "glm_moe_dsa", "num_hidden_layers": 1000000000, "n_routed_experts": 1000000}', ()),
        ('{"num_hidden_layers": 1000000000, "n_routed_experts": 1000000}', ("--trust-uniform-layers",)),
    ],
)
def test_a_100_byte_config_declaring_a_billion_layers_is_refused(model: Path, config: str, args: tuple[str]) -> None:
    path = model / "config.json"
    path.write_text(config)
    assert path.stat().st_size <= 100
    line = assert_refused(run_audit_guarded(model, "--json", *args), path, "1,000,000,000 layers")
    assert f"{model / INDEX} holds {len(tensor_names(SPEC))} tensors" in line


def test_a_billion_mtp_layers_are_refused(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    config["num_nextn_predict_layers"] = 10**9
    (model / "config.json").write_text(json.dumps(config))
    assert_refused(run_audit_guarded(model, "--json"), model / "config.json", "1,000,000,000 MTP layers")


def test_a_single_file_config_is_checked_against_its_header(single: Path) -> None:
    (single / "config.json").write_text(
        '{"model_type": "glm_moe_dsa", "num_hidden_layers": 100000, "n_routed_experts": 1000}'
    )
    run = run_audit_guarded(single, "--json")
    assert_refused(run, single / "config.json", "100,000 layers", f"{single / SINGLE} holds")


def test_a_config_naming_absurd_numbers_gets_a_short_line(model: Path) -> None:
    huge = "1" + "0" * 4000
    (model / "config.json").write_text(
        '{"model_type": "glm_moe_dsa", "num_hidden_layers": %s, "n_routed_experts": %s}' % (huge, huge)
    )
    line = assert_refused(run_audit_guarded(model, "--json"), model / "config.json", "layers")
    assert len(line) < 500


# --- shapes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dims", "message"), [(100_000, "100000 dimensions, more than 64"), (60, "more than the 8 bytes")]
)
def test_a_giant_shape_fails_fast(single: Path, dims: int, message: str) -> None:
    header = {"model.norm.weight": {"dtype": "F32", "shape": [2**63] * dims, "data_offsets": [0, 8]}}
    path = write_raw_safetensors(replace_with(single / SINGLE), header, b"\0" * 8)
    assert_refused(run_audit_guarded(single, "--json"), path, "model.norm.weight", message)


# --- nesting ------------------------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [65, 100_000])
@pytest.mark.parametrize("where", ["config", "index", "header"])
def test_deeply_nested_json_is_unreadable(model: Path, single: Path, where: str, depth: int) -> None:
    if where == "header":  # a single file: a shard's header is bounded by the index before it is read
        model, path = single, single / SINGLE
        raw = '{"model.norm.weight": {"dtype": "F32", "shape": %s, "data_offsets": [0, 8]}}' % _nested(depth - 2)
        write_raw_safetensors(path, raw.encode(), b"\0" * 8)
    else:
        path = model / ("config.json" if where == "config" else INDEX)
        path.write_text(path.read_text().replace("{", '{"deep": %s,' % _nested(depth - 1), 1))
    assert_refused(run_audit_guarded(model, "--json"), path, "JSON nested deeper than 64 levels")


def test_nesting_up_to_the_limit_is_read(model: Path) -> None:
    path = model / "config.json"
    path.write_text(path.read_text().replace("{", '{"deep": %s,' % _nested(63), 1))
    assert audit_checkpoint(model).ok


# --- amplification: a few bytes of JSON that would become a lot of Python objects -----------------


def test_an_index_full_of_empty_arrays_is_refused_unparsed(model: Path) -> None:
    path = model / INDEX
    path.write_text(path.read_text().replace("{", '{"pad": [%s[]],' % ("[]," * 20_000_000), 1))
    run = run_audit_guarded(model, "--json", address_space=512 << 20)
    assert_refused(run, path, "20,000,005 JSON objects and arrays, more than the 10,000 allowed")


def test_a_header_full_of_empty_arrays_is_refused_unparsed(single: Path) -> None:
    raw = b'{"model.norm.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "pad": [%s[]]}}'
    path = write_raw_safetensors(replace_with(single / SINGLE), raw % (b"[]," * 20_000_000), b"\0" * 8)
    assert_refused(run_audit_guarded(single, "--json", address_space=512 << 20), path, "JSON objects and arrays")


# --- names and values the attacker chose (found by probing every field) ---------------------------


@pytest.mark.parametrize(
    "shard",
    ["a\0.safetensors", "a\n\x1b[2J.safetensors", "\ud800.safetensors", "a" * 300 + ".safetensors"],
)
def test_shard_names_are_plain_printable_file_names(model: Path, shard: str) -> None:
    # NUL would reach open() as a ValueError, a newline or escape would forge lines of the report.
    index = json.loads((model / INDEX).read_text())
    index["weight_map"]["model.norm.weight"] = shard
    (model / INDEX).write_text(json.dumps(index))
    with pytest.raises(InputError, match="not a .safetensors file name") as info:
        audit_checkpoint(model)
    assert "\n" not in str(info.value) and len(str(info.value)) < 500


@pytest.mark.parametrize("value", [[[[[1]]]] * 1000, {"a": "b"}, None])
def test_a_weight_map_value_that_is_no_string_is_refused(model: Path, value: object) -> None:
    index = json.loads((model / INDEX).read_text())
    index["weight_map"]["model.norm.weight"] = value
    (model / INDEX).write_text(json.dumps(index))
    with pytest.raises(InputError, match=r"weight_map\['model.norm.weight'\] is .*, not a shard file name") as info:
        audit_checkpoint(model)
    assert len(str(info.value)) < 500


def test_an_index_naming_too_many_shard_files_is_refused(model: Path) -> None:
    # Each is looked up and, missing, listed: 300,000 of them took minutes.
    index = json.loads((model / INDEX).read_text())
    index["weight_map"].update({f"model.layers.9.x{k}": f"s{k}.safetensors" for k in range(10_000)})
    (model / INDEX).write_text(json.dumps(index))
    with pytest.raises(InputError, match="names 10,003 shard files, more than the 10,000"):
        audit_checkpoint(model)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_hidden_layers", "x" * 10**6),
        ("num_hidden_layers", list(range(10**5))),
        ("tie_word_embeddings", "y" * 10**6),
    ],
)
def test_absurd_config_values_get_a_short_line(model: Path, key: str, value: object) -> None:
    config = json.loads((model / "config.json").read_text())
    config[key] = value
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=f"config.json: {key}: ") as info:
        audit_checkpoint(model)
    assert len(str(info.value)) < 500


def test_a_config_of_many_objects_is_refused_unparsed(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    config["pad"] = [[]] * 10_000
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="config.json: 10,004 JSON objects and arrays, more than the 10,000"):
        audit_checkpoint(model)


def with_header_text(shard: Path, edit: Callable[[bytes], bytes]) -> Path:
    """Rewrite ``shard``'s header text through ``edit``, its data section unchanged."""
    raw = shard.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    return write_raw_safetensors(shard, edit(raw[8 : 8 + size]), raw[8 + size :])


def tensor_twice(raw: bytes) -> bytes:
    # The first tensor's entry again, offsets and all: the data section still tiles.
    name, entry = next((k, v) for k, v in json.loads(raw).items() if k != "__metadata__")
    again = json.dumps({name: entry}, separators=(",", ":")).encode()[1:-1]
    return raw.replace(b"{", b"{" + again + b",", 1)


def field_twice(raw: bytes) -> bytes:
    # A field twice in one entry: safetensors itself refuses to open the file.
    return raw.replace(b'{"dtype":', b'{"dtype":"U8","dtype":', 1)


@pytest.mark.parametrize(("edit", "loader_refuses"), [(tensor_twice, False), (field_twice, True)])
def test_a_duplicate_in_a_header_with_metadata_is_malformed(
    model: Path, edit: Callable[[bytes], bytes], loader_refuses: bool
) -> None:
    # Every shard transformers writes has __metadata__; its key once made up, in the count that decides
    # whether to look for duplicates, for the one a duplicate loses, and the audit passed such a shard.
    shard = with_header_text(model / SHARD, edit)
    assert b'"__metadata__":{"format":"pt"}' in shard.read_bytes()
    if loader_refuses:
        with pytest.raises(SafetensorError, match="duplicate field"):
            safe_open(str(shard), "np")
    assert_refused(run_audit_guarded(model, "--json"), shard, "malformed header", "duplicate key")


def test_a_header_with_spaces_before_its_colons_is_checked_for_duplicates(single: Path) -> None:
    entry = '{"dtype" : "F32", "shape" : [2], "data_offsets" : [0, 8]}'
    raw = f'{{"__metadata__" : {{"format" : "pt"}}, "a" : {entry}, "a" : {entry}}}'.encode()
    shard = write_raw_safetensors(replace_with(single / SINGLE), raw, b"\0" * 8)
    with pytest.raises(InputError, match="duplicate key 'a'"):
        read_safetensors_header(shard)


def test_a_dimension_beyond_64_bits_is_malformed(single: Path) -> None:
    # [0, 10**4000] is an empty tensor to Python's integers; the reference reads dimensions as u64.
    header = b'{"model.norm.weight": {"dtype": "F32", "shape": [0, 1%s], "data_offsets": [0, 0]}}' % (b"0" * 4000)
    write_raw_safetensors(replace_with(single / SINGLE), header)
    with pytest.raises(InputError, match="has a dimension of 2\\*\\*64 or more") as info:
        audit_checkpoint(single)
    assert len(str(info.value)) < 500


def test_an_unknown_dtype_of_a_megabyte_gets_a_short_line(single: Path) -> None:
    write_raw_safetensors(replace_with(single / SINGLE), {"a": {**TINY_ENTRY, "dtype": "F" * 10**6}}, b"\0" * 8)
    with pytest.raises(InputError, match="unknown dtype 'FFF") as info:
        audit_checkpoint(single)
    assert len(str(info.value)) < 500


HOSTILE_NAMES = [
    "model.layers." + "9" * 5000 + ".input_layernorm.weight",  # int() refuses more than 4300 digits
    "model.norm.weight\n\x1b[2Jcheckpoint /models/glm5: OK",  # a forged line and a cleared screen
    "1." * 10_000 + "x",  # folding and natural sorting once cost time per number in the name
    "w" * 50_000,  # (the four fit in the header size the index justifies for the shard they are in)
]


def test_hostile_tensor_names_are_reported_not_obeyed(model: Path) -> None:
    write_checkpoint(model, SPEC, extra=HOSTILE_NAMES)
    report = audit_checkpoint(model)
    assert not report.ok and set(report.unexpected) == set(HOSTILE_NAMES)
    text = render_audit(report, model)
    lines = text.splitlines()
    assert "\x1b" not in text and len(lines) == 10, text  # 5 summary lines, a title, 4 names
    assert all(line.startswith("  ") for line in lines[1:]) and max(map(len, lines)) < 400
    assert "checkpoint /models/glm5: OK" in text  # shown, escaped, on the line of its name


def test_hostile_tensor_names_survive_the_cli(model: Path) -> None:
    # Through `python -m envrun.cli` itself: the entry point, its stdout encoding, its exit status.
    write_checkpoint(model, SPEC, extra=HOSTILE_NAMES)
    run = run_audit_guarded(model, "--json", process=True)
    assert run.returncode == 1, run
    assert set(json.loads(run.stdout)["unexpected"]) == set(HOSTILE_NAMES)
    human = run_audit_guarded(model)
    assert human.returncode == 1 and "\x1b" not in human.stdout and human.stderr == ""


def test_the_guard_catches_a_runaway_allocation(model: Path) -> None:
    # The guard itself can fail a test: the same audit with no memory to spare is no exit 0, 1 or 2.
    assert run_audit_guarded(model, "--json").returncode == 0
    starved = run_audit_guarded(model, "--json", address_space=1 << 20)
    assert starved.returncode not in (0, 1, 2) and "MemoryError" in starved.stderr, starved


def hub_snapshot(tmp_path: Path) -> Path:
    """A checkpoint laid out as the Hugging Face hub cache keeps one: every file of the snapshot is a
    symlink ``../../blobs/<name>`` into the repository's ``blobs/``."""
    repo = tmp_path / "hub" / "models--org--glm"
    snapshot, blobs = repo / "snapshots" / ("a" * 40), repo / "blobs"
    write_checkpoint(snapshot, SPEC)
    blobs.mkdir()
    for file in sorted(snapshot.iterdir()):
        blob = blobs / f"blob-{file.name}"
        file.rename(blob)
        file.symlink_to(Path("../../blobs") / blob.name)
    return snapshot


def test_a_hugging_face_hub_snapshot_is_audited_through_its_blob_links(tmp_path: Path) -> None:
    snapshot = hub_snapshot(tmp_path)
    assert audit_checkpoint(snapshot).ok


def test_a_hub_snapshot_link_outside_its_own_blobs_is_still_refused(tmp_path: Path) -> None:
    snapshot = hub_snapshot(tmp_path)
    stranger = tmp_path / "hub" / "models--other--x" / "blobs"
    stranger.mkdir(parents=True)
    (stranger / "config.json").write_bytes((snapshot / "config.json").read_bytes())
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(stranger / "config.json")
    run = run_audit_guarded(snapshot)
    assert_refused(run, snapshot / "config.json", "outside the model directory")
