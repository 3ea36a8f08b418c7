"""`envrun checkpoint audit` through envrun.cli.main: exit codes, output, JSON shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envrun.cli.main import main
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint

SPEC = CheckpointSpec(layers=4, mtp_layers=1, first_k_dense=1, experts=4, shards=3)


def test_complete_checkpoint_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path, SPEC)
    assert main(["checkpoint", "audit", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"checkpoint {tmp_path}: OK")
    assert "MTP layers 4: present" in out and err == ""


def test_lenient_export_exits_0_with_mtp_absent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path, CheckpointSpec(include_mtp=False))
    assert main(["checkpoint", "audit", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["mtp"] == {"layers": [4], "present": False}


def test_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path, SPEC, drop=["lm_head.weight"], extra=["model.layers.7.input_layernorm.weight"])
    assert main(["checkpoint", "audit", str(tmp_path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc)[:4] == ["ok", "missing", "unexpected", "mtp"]
    assert doc["ok"] is False
    assert doc["missing"] == ["lm_head.weight"]
    assert doc["unexpected"] == ["model.layers.7.input_layernorm.weight"]
    assert doc["mtp"] == {"layers": [4], "present": True}
    assert isinstance(doc["ok"], bool) and isinstance(doc["mtp"]["present"], bool)


def test_json_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path, CheckpointSpec(include_mtp=False), drop=["model.layers.2.mlp.gate.weight"])
    main(["checkpoint", "audit", str(tmp_path), "--json"])
    first = capsys.readouterr().out
    main(["checkpoint", "audit", str(tmp_path), "--json"])
    assert capsys.readouterr().out == first


def test_dropped_expert_exits_1_and_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path, SPEC, drop=["model.layers.3.mlp.experts.0.gate_proj.weight"])
    assert main(["checkpoint", "audit", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "NOT OK" in out and "model.layers.3.mlp.experts.0.gate_proj.weight" in out


def test_deleted_shard_exits_1_naming_shard_and_tensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = write_checkpoint(tmp_path, SPEC)
    gone = "model-00001-of-00003.safetensors"
    (tmp_path / gone).unlink()
    assert main(["checkpoint", "audit", str(tmp_path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["shards_missing"] == [gone]
    assert set(doc["missing"]) == set(shards[gone])
    assert main(["checkpoint", "audit", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"missing shard files (1):\n    {gone}" in out and "model.embed_tokens.weight" in out


def test_layer_past_mtp_is_unexpected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path, SPEC, extra=["model.layers.5.mlp.gate.weight"])
    assert main(["checkpoint", "audit", str(tmp_path)]) == 1
    assert "unexpected (1):\n    model.layers.5.mlp.gate.weight" in capsys.readouterr().out


def _assert_one_line_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("envrun: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def test_truncated_shard_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path, SPEC)
    shard = tmp_path / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1])
    assert main(["checkpoint", "audit", str(tmp_path)]) == 2
    _assert_one_line_error(capsys, str(shard), "truncated")


def test_malformed_header_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path, SPEC)
    shard = tmp_path / "model-00003-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[9:13] = b"\x00\xff{]"
    shard.write_bytes(bytes(data))
    assert main(["checkpoint", "audit", str(tmp_path), "--json"]) == 2
    _assert_one_line_error(capsys, str(shard), "malformed header")


@pytest.mark.parametrize("config", ["{", '{"num_hidden_layers": 0}', '"text"'])
def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str) -> None:
    write_checkpoint(tmp_path, SPEC)
    (tmp_path / "config.json").write_text(config)
    assert main(["checkpoint", "audit", str(tmp_path)]) == 2
    _assert_one_line_error(capsys, str(tmp_path / "config.json"))


def test_missing_model_dir_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "audit", str(tmp_path / "absent")]) == 2
    _assert_one_line_error(capsys, str(tmp_path / "absent"), "not a directory")


def test_debug_shows_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--debug", "checkpoint", "audit", str(tmp_path / "absent")]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["checkpoint"]) == 2
    assert main(["checkpoint", "audit"]) == 2
    assert "usage: envrun" in capsys.readouterr().err
