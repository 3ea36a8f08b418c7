"""The checkpoint audit as a library: real safetensors files written to tmp_path at tiny sizes."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors import safe_open

from envbuild.data.jsonout import to_jsonable
from envbuild.errors import InputError
from envrun.checkpoint import (
    CheckpointIndexError,
    ExpectedNames,
    ModelConfigError,
    SafetensorsHeaderError,
    audit_checkpoint,
    read_safetensors_header,
)
from envrun.checkpoint.audit import ModelAudit, audit_model
from envrun.checkpoint.modelnames import ModelNames, ModelNamesError, job_names
from envrun.checkpoint.names import abbreviate_names
from envrun.checkpoint.report import render_audit
from envrun.exports import export_verdict, search_here
from envrun.preflight import model_verdict
from envrun.probe.report import ExportLayout
from tests.lib.ckptgen import CheckpointSpec, layer_names, tensor_names, write_checkpoint

SPEC = CheckpointSpec(layers=4, mtp_layers=1, first_k_dense=1, experts=4, shards=3)


def test_complete_checkpoint_with_mtp_is_ok(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC)
    report = audit_checkpoint(tmp_path)
    assert report.ok
    assert (report.missing, report.unexpected, report.mtp_missing) == ((), (), ())
    assert report.mtp_layers == (4,) and report.mtp_present
    assert report.tensors == len(tensor_names(SPEC))
    assert len(report.shards) == 3


def test_lenient_export_without_mtp_is_ok_with_mtp_absent(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CheckpointSpec(include_mtp=False))
    report = audit_checkpoint(tmp_path)
    assert report.ok
    assert report.mtp_layers == (4,) and not report.mtp_present
    assert "model.layers.4.eh_proj.weight" in report.mtp_missing
    assert "model.layers.4.mlp.experts.3.down_proj.weight" in report.mtp_missing
    assert report.missing == ()


def test_partial_mtp_layer_is_tolerated_but_not_present(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC, drop=["model.layers.4.enorm.weight", "model.layers.4.self_attn.q_b_proj.weight"])
    report = audit_checkpoint(tmp_path)
    assert report.ok and not report.mtp_present
    assert report.mtp_missing == ("model.layers.4.enorm.weight", "model.layers.4.self_attn.q_b_proj.weight")


def test_dropped_lm_head_is_named(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC, drop=["lm_head.weight"])
    report = audit_checkpoint(tmp_path)
    assert not report.ok
    assert report.missing == ("lm_head.weight",)


def test_tied_embeddings_need_no_lm_head(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CheckpointSpec(tied=True))
    report = audit_checkpoint(tmp_path)
    assert report.ok and report.layout.tie_word_embeddings


@pytest.mark.parametrize("name", ["model.embed_tokens.weight", "model.norm.weight"])
def test_embedding_and_final_norm_are_required(tmp_path: Path, name: str) -> None:
    write_checkpoint(tmp_path, SPEC, drop=[name])
    assert audit_checkpoint(tmp_path).missing == (name,)


def test_one_expert_tensor_missing_is_not_ok(tmp_path: Path) -> None:
    lost = "model.layers.2.mlp.experts.3.up_proj.weight"
    write_checkpoint(tmp_path, SPEC, drop=[lost])
    report = audit_checkpoint(tmp_path)
    assert not report.ok and report.missing == (lost,)


def test_expert_lost_in_every_moe_layer_is_caught_without_a_majority(tmp_path: Path) -> None:
    # Learned from the layers, a lost expert would look like one that never existed.
    lost = [
        f"model.layers.{i}.mlp.experts.1.{p}.weight" for i in (1, 2, 3) for p in ("gate_proj", "up_proj", "down_proj")
    ]
    write_checkpoint(tmp_path, SPEC, drop=lost)
    report = audit_checkpoint(tmp_path)
    assert set(report.missing) == set(lost)


def test_shared_experts_and_dense_mlp_are_required(tmp_path: Path) -> None:
    lost = ["model.layers.0.mlp.down_proj.weight"] + [
        f"model.layers.{i}.mlp.shared_experts.gate_proj.weight" for i in (1, 2, 3)
    ]
    write_checkpoint(tmp_path, SPEC, drop=lost)
    assert set(audit_checkpoint(tmp_path).missing) == set(lost)


def test_an_indexer_tensor_missing_from_one_layer_is_missing(tmp_path: Path) -> None:
    lost = "model.layers.2.self_attn.indexer.wk.weight"
    write_checkpoint(tmp_path, SPEC, drop=[lost])
    assert audit_checkpoint(tmp_path).missing == (lost,)


@pytest.mark.parametrize(
    ("suffixes", "group"),
    [
        (
            [
                f"self_attn.indexer.{t}"
                for t in ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight")
            ],
            "self_attn.indexer.* in all 4 layers",
        ),
        (["mlp.gate.e_score_correction_bias"], "mlp.gate.e_score_correction_bias in all 3 MoE layers"),
        (["self_attn.kv_b_proj.weight"], "self_attn.kv_b_proj.weight in all 4 layers"),
    ],
)
def test_a_tensor_lost_from_every_layer_is_missing(tmp_path: Path, suffixes: list[str], group: str) -> None:
    # What a lenient save with one missing mapping writes; learned from the layers, it looked normal.
    lost = [n for i in range(4) for n in layer_names(SPEC, i) if n.split(".", 3)[3] in suffixes]
    write_checkpoint(tmp_path, SPEC, drop=lost)
    report = audit_checkpoint(tmp_path)
    assert not report.ok and set(report.missing) == set(lost) and report.missing_groups == (group,)
    assert report.check == "architecture" and report.to_json()["check"] == "architecture"


def test_names_from_a_model_that_builds_its_mtp_layers_keep_them_tolerated(tmp_path: Path) -> None:
    # A later transformers may build the MTP layer; its names are then the model's, and still optional.
    write_checkpoint(tmp_path, SPEC)
    config = (tmp_path / "config.json").read_bytes()
    names = frozenset(tensor_names(SPEC)) | {"model.layers.4.mtp_only.weight"}
    expected = ExpectedNames(names, "a model that builds MTP", hashlib.sha256(config).hexdigest())
    report = audit_checkpoint(tmp_path, expected=expected)
    assert report.ok and report.check == "model" and report.mtp_missing == ("model.layers.4.mtp_only.weight",)
    lenient = tmp_path / "lenient"
    write_checkpoint(lenient, CheckpointSpec(include_mtp=False))
    assert audit_checkpoint(lenient, expected=expected).ok


def test_an_unknown_architecture_is_refused_unless_the_weak_check_is_asked_for(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "kimi_k2"}))
    with pytest.raises(
        InputError, match="model_type 'kimi_k2' is none of the architectures the audit describes"
    ) as info:
        audit_checkpoint(tmp_path)
    assert info.value.exit_code == 2
    report = audit_checkpoint(tmp_path, trust_uniform_layers=True)
    assert report.ok and report.check == "uniform-layers"
    assert "uniform layers (--trust-uniform-layers; model_type 'kimi_k2'" in render_audit(report, tmp_path)


def test_a_whole_layer_missing_is_named(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC, drop=layer_names(SPEC, 1))
    report = audit_checkpoint(tmp_path)
    assert set(report.missing) == set(layer_names(SPEC, 1))


def test_stray_tensor_in_one_layer_is_unexpected(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC, extra=["model.layers.2.self_attn.rotary_emb.inv_freq"])
    report = audit_checkpoint(tmp_path)
    assert not report.ok and report.unexpected == ("model.layers.2.self_attn.rotary_emb.inv_freq",)


def test_layer_past_the_mtp_layers_is_unexpected(tmp_path: Path) -> None:
    extra = ["model.layers.5.input_layernorm.weight", "model.layers.12.mlp.gate.weight"]
    write_checkpoint(tmp_path, SPEC, extra=extra)
    report = audit_checkpoint(tmp_path)
    assert not report.ok and report.unexpected == tuple(extra)
    assert report.missing == ()


def test_unknown_top_level_tensor_is_unexpected(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC, extra=["model.layers.05.input_layernorm.weight", "model.rotary.inv_freq"])
    assert set(audit_checkpoint(tmp_path).unexpected) == {
        "model.layers.05.input_layernorm.weight",
        "model.rotary.inv_freq",
    }


def test_deleted_shard_names_the_shard_and_its_tensors(tmp_path: Path) -> None:
    shards = write_checkpoint(tmp_path, SPEC)
    gone = "model-00002-of-00003.safetensors"
    (tmp_path / gone).unlink()
    report = audit_checkpoint(tmp_path)
    assert not report.ok
    assert report.shards_missing == (gone,)
    assert set(report.missing) == set(shards[gone])


def test_tensor_in_a_shard_but_not_in_the_index_is_unexpected(tmp_path: Path) -> None:
    # One name nobody indexed, one duplicate of a tensor the index places in the last shard.
    stray = ["model.layers.1.mlp.gate.bias", "model.layers.3.mlp.experts.3.down_proj.weight"]
    write_checkpoint(tmp_path, SPEC, unindexed=stray)
    report = audit_checkpoint(tmp_path)
    assert not report.ok and report.unexpected == tuple(stray)
    assert report.missing == ()


def test_index_entry_the_shard_lacks_is_missing(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC, ghost=["model.layers.0.mlp.extra_proj.weight"])
    report = audit_checkpoint(tmp_path)
    assert not report.ok and report.missing == ("model.layers.0.mlp.extra_proj.weight",)


def test_tensor_in_the_wrong_shard_is_missing_and_unexpected(tmp_path: Path) -> None:
    shards = write_checkpoint(tmp_path, SPEC)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    moved = shards["model-00003-of-00003.safetensors"][0]
    index["weight_map"][moved] = "model-00001-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    report = audit_checkpoint(tmp_path)
    assert moved in report.missing and moved in report.unexpected


def test_single_file_checkpoint_without_index(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CheckpointSpec(single_file=True))
    report = audit_checkpoint(tmp_path)
    assert report.ok and report.shards == ("model.safetensors",)
    assert not (tmp_path / "model.safetensors.index.json").exists()


def test_single_file_checkpoint_missing_a_tensor(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CheckpointSpec(single_file=True), drop=["model.layers.3.mlp.gate.weight"])
    assert audit_checkpoint(tmp_path).missing == ("model.layers.3.mlp.gate.weight",)


def test_stale_shard_outside_the_index_is_reported_not_failed(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC)
    (tmp_path / "model-00009-of-00009.safetensors").write_bytes(b"stale")
    report = audit_checkpoint(tmp_path)
    assert report.ok and report.shards_unindexed == ("model-00009-of-00009.safetensors",)


def test_mtp_alias_and_no_mtp(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CheckpointSpec(mtp_layers=0))
    report = audit_checkpoint(tmp_path)
    assert report.ok and report.mtp_layers == () and not report.mtp_present

    other = tmp_path / "alias"
    write_checkpoint(other, SPEC)
    config = json.loads((other / "config.json").read_text())
    config["num_mtp_layers"] = config.pop("num_nextn_predict_layers")
    (other / "config.json").write_text(json.dumps(config))
    assert audit_checkpoint(other).mtp_layers == (4,)


def test_tensor_data_is_never_read(tmp_path: Path) -> None:
    shards = write_checkpoint(tmp_path, SPEC)
    total = sum((tmp_path / s).stat().st_size for s in shards)
    for shard in shards:  # scribble over the data sections: the audit must not notice
        path = tmp_path / shard
        header_end = 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]
        data = path.read_bytes()
        path.write_bytes(data[:header_end] + b"\xff" * (len(data) - header_end))
    report = audit_checkpoint(tmp_path)
    assert report.ok
    headers = sum(read_safetensors_header(tmp_path / s).bytes_read for s in shards)
    small_files = sum((tmp_path / n).stat().st_size for n in ("config.json", "model.safetensors.index.json"))
    assert report.bytes_read == headers + small_files and headers < total


# --- unreadable input: InputError, exit 2 -------------------------------------------------------


def test_truncated_shard_raises_naming_the_file(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC)
    shard = tmp_path / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(SafetensorsHeaderError, match="model-00002-of-00003.safetensors: truncated") as info:
        audit_checkpoint(tmp_path)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("cut", [4, 20])
def test_shard_cut_inside_the_header_is_truncated(tmp_path: Path, cut: int) -> None:
    write_checkpoint(tmp_path, SPEC)
    shard = tmp_path / "model-00001-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:cut])
    with pytest.raises(SafetensorsHeaderError, match="truncated"):
        audit_checkpoint(tmp_path)


def test_malformed_header_json_raises(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, SPEC)
    shard = tmp_path / "model-00003-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[8] = ord("[")  # same length, no longer a JSON object
    shard.write_bytes(bytes(data))
    with pytest.raises(SafetensorsHeaderError, match="model-00003-of-00003.safetensors: malformed header"):
        audit_checkpoint(tmp_path)


def _raw_file(path: Path, header: object, data: bytes, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "needs 8"),
        ({"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0", "unknown dtype"),
        ({"a": {"dtype": "F16", "shape": [1]}}, b"", "lacks data_offsets"),
        ({"a": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, b"\0", "shape"),
        ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0\0", "bytes after the last tensor"),
        (
            {
                "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
            },
            b"\0" * 3,
            "overlaps",
        ),
        ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"\0\0", "gap"),
        ({"__metadata__": {"format": 1}}, b"", "__metadata__"),
        (["not", "an", "object"], b"", "expected an object"),
        ({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}, b"\0", "whole number of bytes"),
    ],
)
def test_header_validation(tmp_path: Path, header: object, data: bytes, message: str | None) -> None:
    path = _raw_file(tmp_path / "x.safetensors", header, data)
    if message is None:
        parsed = read_safetensors_header(path)
        assert parsed.tensors["a"].shape == (2,)
        return
    with pytest.raises(SafetensorsHeaderError, match=message):
        read_safetensors_header(path)


@pytest.mark.parametrize("dtype", ["F8_E4M3FNUZ", "F8_E5M2FNUZ"])
def test_a_dtype_the_safetensors_reader_reads_is_known(tmp_path: Path, dtype: str) -> None:
    # The reference reader (safetensors 0.8) opens these; the audit once refused them as unknown (exit 2).
    path = _raw_file(tmp_path / "x.safetensors", {"a": {"dtype": dtype, "shape": [2], "data_offsets": [0, 2]}}, b"\0\0")
    with safe_open(str(path), "np") as reference:
        assert list(reference.keys()) == ["a"]
    assert read_safetensors_header(path).tensors["a"] == (dtype, (2,), (0, 2))


def test_header_length_beyond_the_file_or_absurd(tmp_path: Path) -> None:
    with pytest.raises(SafetensorsHeaderError, match="truncated"):
        read_safetensors_header(_raw_file(tmp_path / "a.safetensors", {}, b"", length=10_000))
    with pytest.raises(SafetensorsHeaderError, match="outside"):
        read_safetensors_header(_raw_file(tmp_path / "b.safetensors", {}, b"", length=2**63))


def test_duplicate_tensor_entry_is_malformed(tmp_path: Path) -> None:
    entry = '{"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}'
    raw = f'{{"a": {entry}, "a": {entry}}}'.encode()
    path = tmp_path / "d.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0")
    with pytest.raises(SafetensorsHeaderError, match="duplicate"):
        read_safetensors_header(path)


@pytest.mark.parametrize(
    "config",
    [
        "{not json",
        "[]",
        '{"num_hidden_layers": "78"}',
        '{"first_k_dense_replace": 3}',
        '{"num_hidden_layers": 4, "tie_word_embeddings": "no"}',
    ],
)
def test_bad_config_raises(tmp_path: Path, config: str) -> None:
    write_checkpoint(tmp_path, SPEC)
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(ModelConfigError, match="config.json"):
        audit_checkpoint(tmp_path)


def test_missing_config_and_missing_dir_raise(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a directory"):
        audit_checkpoint(tmp_path / "nowhere")
    write_checkpoint(tmp_path, SPEC)
    (tmp_path / "config.json").unlink()
    with pytest.raises(ModelConfigError, match="config.json: not found"):
        audit_checkpoint(tmp_path)


def test_no_weights_at_all_raises(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "glm_moe_dsa", "num_hidden_layers": 2}')
    with pytest.raises(InputError, match="neither model.safetensors"):
        audit_checkpoint(tmp_path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "sub/model.safetensors", "model.bin"])
def test_index_naming_files_outside_the_directory_raises(tmp_path: Path, shard: str) -> None:
    write_checkpoint(tmp_path, SPEC)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.norm.weight"] = shard
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointIndexError, match="not a .safetensors file name"):
        audit_checkpoint(tmp_path)


# --- rendering ---------------------------------------------------------------------------------


def test_abbreviate_names_folds_experts_then_layers() -> None:
    names = [f"model.layers.{i}.mlp.experts.{e}.down_proj.weight" for i in (3, 4, 5, 9) for e in range(256)]
    names += [
        "lm_head.weight",
        "model.layers.7.mlp.experts.0.up_proj.weight",
        "model.layers.7.mlp.experts.2.up_proj.weight",
    ]
    assert abbreviate_names(names) == [
        "lm_head.weight",
        "model.layers.{3..5,9}.mlp.experts.{0..255}.down_proj.weight",
        "model.layers.7.mlp.experts.{0,2}.up_proj.weight",
    ]


def test_render_summarises_and_groups(tmp_path: Path) -> None:
    lost = [f"model.layers.{i}.mlp.experts.{e}.down_proj.weight" for i in (2, 3) for e in range(4)]
    write_checkpoint(tmp_path, CheckpointSpec(include_mtp=False), drop=lost)
    text = render_audit(audit_checkpoint(tmp_path), tmp_path)
    assert "NOT OK" in text
    assert "layers: 4 (1 dense, 3 MoE), experts: 4 routed + 1 shared" in text
    assert "MTP layers 4: absent" in text
    assert "model.layers.{2..3}.mlp.experts.{0..3}.down_proj.weight" in text
    assert "model.layers.2.mlp.experts.0.down_proj.weight" not in text
    assert "expected names: the glm_moe_dsa modelling code of transformers 5.10.4" in text


def test_a_boolean_dimension_is_malformed_even_after_its_integer_twin(tmp_path: Path) -> None:
    """True == 1 in Python: the per-shape size cache must not let [2, true] pass because [2, 1] did."""
    import json
    import struct

    from envrun.checkpoint.safetensors_header import SafetensorsHeaderError, read_safetensors_header

    def write(name: str, shape: list) -> Path:
        header = json.dumps({"a": {"dtype": "BF16", "shape": shape, "data_offsets": [0, 4]}}).encode()
        path = tmp_path / name
        path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
        return path

    assert read_safetensors_header(write("good.safetensors", [2, 1])).tensors["a"].shape == (2, 1)
    with pytest.raises(SafetensorsHeaderError, match="not a list of non-negative integers"):
        read_safetensors_header(write("bad.safetensors", [2, True]))


def answering(names: list[str], asked: list[tuple[bytes, int]], transformers: str = "5.10.4") -> ModelNames:
    """ModelNames whose script "runs" here as a function: the answer a model of ``names`` gives."""

    def run(command: list[str], config: bytes, _: ModelNames) -> tuple[int, bytes, str]:
        asked.append((config, int(command[-1])))
        doc = {"names": names, "config_sha256": hashlib.sha256(config).hexdigest(), "class": "M",
               "transformers": transformers, "torch": "2.13.0"}  # fmt: skip
        return 0, json.dumps(doc).encode(), ""

    return ModelNames(("python3",), where="in a test", transformers="5.10.4", run=run)


def test_model_names_answer_each_config_once_within_the_limit() -> None:
    asked: list[tuple[bytes, int]] = []
    names = answering(["a", "b", "c"], asked)
    first = names(b"{}", 10)
    assert first.source == "M of transformers 5.10.4 on the meta device (torch 2.13.0) in a test"
    assert names(b"{}", 20) is first and names(b"{}", 3) is first  # the same config, within the limit
    assert names(b'{"x": 1}', 10) is not first  # another config: asked again
    with pytest.raises(ModelNamesError, match="no list of at most 2 tensor names"):
        names(b"{}", 2)  # a limit under the answer's 3 names: asked again, and the answer refused
    assert asked == [(b"{}", 10), (b'{"x": 1}', 10), (b"{}", 2)]


def test_a_run_audits_with_the_model_s_names_or_fails_in_one_wording(tmp_path: Path) -> None:
    """audit_model words each failure once, for this host and every node: no fallback to the description."""
    write_checkpoint(tmp_path, CheckpointSpec(include_mtp=False))
    names = sorted(n for n in tensor_names(SPEC) if not n.startswith("model.layers.4."))
    audit = audit_model(str(tmp_path), answering(names, []))
    assert audit == ModelAudit(str(tmp_path), True, check="model", expected_from=audit.expected_from)
    assert ModelAudit.of_answer(to_jsonable(audit)) == audit  # what a node sends is what the host judges
    other = audit_model(str(tmp_path), answering(names, [], transformers="5.9.0"))
    assert other.error == (
        f"{tmp_path}: the expected names could not be had from the model the lock's transformers 5.10.4 builds "
        "(no fallback to envrun's description): python3 in a test: M of transformers 5.9.0 on the meta device "
        "(torch 2.13.0), but the lock pins transformers 5.10.4"
    )
    absent = job_names("5.10.4", "python3", {"PATH": str(tmp_path / "nowhere")}, "on node n1")
    assert audit_model(str(tmp_path), absent).error == (
        f"{tmp_path}: the expected names could not be had from the model the lock's transformers 5.10.4 builds "
        "(no fallback to envrun's description): python3: not found on the job's PATH on node n1 (the job's interpreter)"
    )
    assert job_names(None, "python3", {}, "on this host") is None  # no pin: the static description
    assert audit_model(str(tmp_path), None).check == "architecture"
    assert audit_model(str(tmp_path / "none"), None).error == (
        f"{tmp_path / 'none'}: not a directory; pass the model directory holding config.json"
    )
    (tmp_path / "config.json").write_text("{")
    unreadable = audit_model(str(tmp_path), None).error or ""
    assert unreadable.startswith(f"{tmp_path}: checkpoint unreadable: {tmp_path / 'config.json'}: not readable JSON")


def test_a_run_names_a_missing_shard_file_when_nothing_else_is_lost(tmp_path: Path) -> None:
    """The MTP layer in a shard of its own, deleted while the index still names it (a loader then fails):
    no tensor outside the MTP layer is lost, so the missing file is the whole reason, and a run's export
    failure and preflight line once gave none ("/path:  (names: …)", "missing: -")."""
    export = tmp_path / "ckpts/global_step_1/actor/model/huggingface"
    write_checkpoint(export, CheckpointSpec(include_mtp=False))
    index = json.loads((export / "model.safetensors.index.json").read_text())
    gone = "model-00004-of-00004.safetensors"
    index["weight_map"].update(dict.fromkeys(layer_names(SPEC, 4), gone))
    (export / "model.safetensors.index.json").write_text(json.dumps(index))
    audit = audit_model(str(export), None)
    assert not audit.ok and audit.missing == audit.unexpected == () and audit.shards_missing == (gone,)
    assert audit.failure.startswith(f"{export}: missing shard file {gone} (names: ")
    assert ModelAudit.of_answer(to_jsonable(audit), "n1") == replace(audit, node="n1")  # as a node sends it
    assert f"missing: -; missing shard files: {gone}; names: " in model_verdict(audit).detail
    layout = ExportLayout(str(tmp_path / "ckpts"), "global_step_*/actor/model/huggingface", True, "save_freq=1", False)
    (failure,) = export_verdict(layout, search_here(layout)).failures
    assert failure == audit.failure
