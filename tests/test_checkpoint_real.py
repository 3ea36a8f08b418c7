"""The audit on checkpoints written by the real transformers 5.10.4 ``save_pretrained``, then altered.

Every checkpoint here comes from the modelling code itself (tests/lib/hfckpt.py); a loss is made by
rewriting its safetensors files without the tensors, as a lenient save that lacks one mapping would
write them. The expected names are the audit's own (the static description) or the model's (built on
the meta device by the same environment's python, as the locked image would).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild.errors import InputError
from envrun.checkpoint import (
    ExpectedNames,
    ModelNames,
    ModelNamesError,
    ModelRefusedConfigError,
    UnsupportedArchitectureError,
    audit_checkpoint,
    render_audit,
)
from envrun.checkpoint.layout import MAX_EXPECTED_TENSORS, MTP_OPTIONAL, MTP_REQUIRED, read_config, split_layer_name
from envrun.cli.main import main
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint
from tests.lib.hfckpt import HFSpec, alter_checkpoint, hf_venv, tensor_names, write_hf_checkpoints

pytestmark = [pytest.mark.network, pytest.mark.slow]  # the environment is built from PyPI on first use

GLM5_TYPES = ("dense", "sparse", "sparse", "sparse")
SUPPORTED = ("glm5", "glm5_single", "glm5_tied", "glm5_listed", "deepseek_v3", "glm4_moe", "glm4_moe_lite")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    specs = {
        "glm5": HFSpec(root / "glm5", "glm_moe_dsa", (("mlp_layer_types", list(GLM5_TYPES)),), "20KB"),
        "glm5_single": HFSpec(root / "glm5_single", "glm_moe_dsa"),  # 3 dense + 1 MoE: the default list
        "glm5_tied": HFSpec(root / "glm5_tied", "glm_moe_dsa", (("tie_word_embeddings", True),), "20KB"),
        # mlp_layer_types and no first_k_dense_replace: planned by the list alone
        "glm5_listed": HFSpec(
            root / "glm5_listed",
            "glm_moe_dsa",
            (("mlp_layer_types", ["sparse", "dense", "sparse", "dense"]),),
            "20KB",
            drop=("first_k_dense_replace",),
        ),
        "deepseek_v3": HFSpec(root / "deepseek_v3", "deepseek_v3", (), "20KB"),
        "glm4_moe": HFSpec(root / "glm4_moe", "glm4_moe", (("use_qk_norm", True),), "20KB"),
        "glm4_moe_lite": HFSpec(root / "glm4_moe_lite", "glm4_moe_lite", (), "20KB"),
        "llama": HFSpec(root / "llama", "llama", (), "20KB"),
    }
    write_hf_checkpoints(list(specs.values()))
    return {name: spec.directory for name, spec in specs.items()}


Copy = Callable[[str], Path]


@pytest.fixture
def copy(written: dict[str, Path], tmp_path: Path) -> Copy:
    """copy(name) -> a fresh copy of a written checkpoint, to alter."""

    def make(name: str) -> Path:
        return Path(shutil.copytree(written[name], tmp_path / name))

    return make


def layers_of(model_dir: Path) -> dict[str, list[str]]:
    """suffix -> every name that carries it, over the decoder layers of a checkpoint."""
    out: dict[str, list[str]] = {}
    for name in tensor_names(model_dir):
        split = split_layer_name(name)
        if split is not None:
            out.setdefault(split[1], []).append(name)
    return out


# --- what transformers writes passes ---------------------------------------------------------------


@pytest.mark.parametrize("name", SUPPORTED)
def test_a_clean_export_without_mtp_passes(written: dict[str, Path], name: str) -> None:
    report = audit_checkpoint(written[name])
    assert report.ok, render_audit(report, written[name])
    assert report.check == "architecture" and "transformers 5.10.4" in report.expected_from
    assert (report.missing, report.unexpected) == ((), ())
    # num_nextn_predict_layers is 1 and transformers writes no MTP layer: tolerated, and said.
    assert report.mtp_layers == (4,) and not report.mtp_present and report.mtp_missing


def test_mlp_layer_types_without_first_k_dense_replace_is_planned_by_the_list(written: dict[str, Path]) -> None:
    config = json.loads((written["glm5_listed"] / "config.json").read_text())
    assert "first_k_dense_replace" not in config and config["mlp_layer_types"] == ["sparse", "dense"] * 2
    report = audit_checkpoint(written["glm5_listed"])
    assert report.ok and report.to_json()["layers"] == {"dense": "1,3", "moe": "0,2"}
    assert report.notes == ()


def test_the_default_list_is_followed_over_first_k_dense_replace(written: dict[str, Path]) -> None:
    # TINY_GLM5 says first_k_dense_replace 1; the config class made layers 0..2 dense, and so did the model.
    report = audit_checkpoint(written["glm5_single"])
    assert report.ok and report.to_json()["layers"] == {"dense": "0..2", "moe": "3"}
    assert report.notes and "first_k_dense_replace 1 is not read" in report.notes[0]


# --- a loss in every layer is caught, of every kind ------------------------------------------------


@pytest.mark.parametrize("name", ["glm5", "glm5_single", "deepseek_v3", "glm4_moe", "glm4_moe_lite"])
def test_no_uniform_loss_of_any_per_layer_tensor_passes(written: dict[str, Path], tmp_path: Path, name: str) -> None:
    kinds = layers_of(written[name])
    assert len(kinds) > 20
    for k, (suffix, names) in enumerate(sorted(kinds.items())):
        case = Path(shutil.copytree(written[name], tmp_path / str(k)))
        alter_checkpoint(case, drop=names)
        report = audit_checkpoint(case)
        assert not report.ok and set(report.missing) == set(names), (suffix, report.missing)
        assert report.unexpected == ()


def test_the_issue_s_uniform_losses_are_reported_by_tensor_and_layers(copy: Copy) -> None:
    model = copy("glm5")
    kinds = layers_of(model)
    lost = [n for s, names in kinds.items() if s.startswith("self_attn.indexer.") for n in names]
    lost += kinds["mlp.gate.e_score_correction_bias"] + kinds["self_attn.kv_b_proj.weight"]
    alter_checkpoint(model, drop=lost)
    report = audit_checkpoint(model)
    assert not report.ok and len(report.missing) == 4 * 5 + 3 + 4
    assert report.missing_groups == (
        "self_attn.indexer.* in all 4 layers",
        "self_attn.kv_b_proj.weight in all 4 layers",
        "mlp.gate.e_score_correction_bias in all 3 MoE layers",
    )
    text = render_audit(report, model)
    assert "  missing (27):\n    self_attn.indexer.* in all 4 layers\n" in text
    assert "model.layers.2.self_attn.indexer.wk.weight" not in text
    assert set(report.to_json()["missing"]) == set(lost)  # --json keeps every name


def test_a_loss_in_some_layers_names_them(copy: Copy) -> None:
    model = copy("glm5")
    lost = [f"model.layers.{i}.mlp.experts.{e}.down_proj.weight" for i in (2, 3) for e in range(4)]
    lost += ["model.layers.1.self_attn.q_a_layernorm.weight", "lm_head.weight"]
    lost += [n for n in tensor_names(model) if n.startswith("model.layers.0.")]  # a whole layer
    alter_checkpoint(model, drop=lost)
    assert audit_checkpoint(model).missing_groups == (
        "lm_head.weight",
        "model.layers.0.*",
        "model.layers.1.self_attn.q_a_layernorm.weight",
        "model.layers.{2..3}.mlp.experts.{0..3}.down_proj.weight",
    )


def test_a_tied_checkpoint_needs_no_lm_head_and_may_hold_one(written: dict[str, Path], copy: Copy) -> None:
    assert "lm_head.weight" not in tensor_names(written["glm5_tied"])
    model = copy("glm5_tied")
    alter_checkpoint(model, add=["lm_head.weight"])
    assert audit_checkpoint(model).ok


# --- MTP: only those layers may be missing, and they may be there ------------------------------------


def mtp_names(model: Path, layer: int = 4) -> list[str]:
    """The MTP layer as checkpoints store it: the last decoder layer's block, plus the MTP head."""
    block = [n.removeprefix("model.layers.3.") for n in tensor_names(model) if n.startswith("model.layers.3.")]
    return [f"model.layers.{layer}.{s}" for s in (*block, *MTP_REQUIRED)]


@pytest.mark.parametrize("name", ["glm5", "deepseek_v3", "glm4_moe"])
def test_a_checkpoint_holding_its_mtp_layer_passes(copy: Copy, name: str) -> None:
    model = copy(name)
    alter_checkpoint(model, add=mtp_names(model))
    report = audit_checkpoint(model)
    assert report.ok and report.mtp_present and report.mtp_missing == ()


def test_glm45_style_mtp_extras_are_allowed_and_a_partial_mtp_layer_tolerated(copy: Copy) -> None:
    model = copy("glm5")
    names = mtp_names(model)
    alter_checkpoint(model, add=[*names[:-3], *(f"model.layers.4.{s}" for s in MTP_OPTIONAL)])
    report = audit_checkpoint(model)
    assert report.ok and not report.mtp_present and len(report.mtp_missing) == 3


def test_a_layer_past_the_mtp_layers_is_unexpected(copy: Copy) -> None:
    model = copy("glm5")
    alter_checkpoint(model, add=mtp_names(model, layer=5)[:2])
    report = audit_checkpoint(model)
    assert not report.ok and len(report.unexpected) == 2 and report.missing == ()


# --- an architecture no description covers ---------------------------------------------------------


def test_an_unknown_architecture_is_refused_with_exit_2(
    written: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UnsupportedArchitectureError, match="model_type 'llama' is none of the architectures"):
        audit_checkpoint(written["llama"])
    assert main(["checkpoint", "audit", str(written["llama"]), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--trust-uniform-layers" in err and "--model-python" in err


def test_trust_uniform_layers_runs_the_weaker_check_by_name(
    written: dict[str, Path], copy: Copy, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoint", "audit", str(written["llama"]), "--json", "--trust-uniform-layers"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["check"] == "uniform-layers"
    assert "a tensor lost from every layer of a kind is not caught" in doc["expected_from"]
    # ... which is what it says: a loss in every layer passes it, a loss in one does not.
    model = copy("llama")
    alter_checkpoint(model, drop=layers_of(model)["self_attn.k_proj.weight"])
    assert audit_checkpoint(model, trust_uniform_layers=True).ok
    alter_checkpoint(model, drop=["model.layers.1.self_attn.q_proj.weight"])
    assert audit_checkpoint(model, trust_uniform_layers=True).missing == ("model.layers.1.self_attn.q_proj.weight",)


def test_a_supported_architecture_is_never_checked_the_weak_way(written: dict[str, Path]) -> None:
    assert audit_checkpoint(written["glm5"], trust_uniform_layers=True).check == "architecture"


def test_a_quantised_checkpoint_is_refused(copy: Copy) -> None:
    model = copy("glm5")
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match=r"quantization_config \('fp8'\)"):
        audit_checkpoint(model)
    assert audit_checkpoint(model, trust_uniform_layers=True).check == "uniform-layers"


# --- expected names from the model itself, on the meta device ---------------------------------------


@pytest.fixture(scope="module")
def python() -> tuple[str, ...]:
    return (str(hf_venv().python),)


def names_of(config_path: Path, python: tuple[str, ...]) -> ExpectedNames:
    """The model's names for the config.json at ``config_path``, read as the audit reads it."""
    return ModelNames(python)(read_config(config_path)[0], MAX_EXPECTED_TENSORS)


@pytest.fixture(scope="module")
def glm5_names(written: dict[str, Path], python: tuple[str, ...]) -> ExpectedNames:
    return names_of(written["glm5"] / "config.json", python)


def test_the_model_s_own_names_check_the_checkpoint(
    written: dict[str, Path], glm5_names: ExpectedNames, copy: Copy
) -> None:
    names = glm5_names
    assert "GlmMoeDsaForCausalLM of transformers 5.10.4 on the meta device (torch 2.13.0" in names.source
    assert names.names == set(tensor_names(written["glm5"]))
    report = audit_checkpoint(written["glm5"], expected=names)
    assert report.ok and report.check == "model" and report.expected_from == names.source
    assert set(report.mtp_missing) == set(mtp_names(written["glm5"]))  # the convention, on the model's names
    model = copy("glm5")
    alter_checkpoint(model, drop=layers_of(model)["self_attn.indexer.k_norm.bias"])
    lost = audit_checkpoint(model, expected=names)
    assert not lost.ok and lost.missing_groups == ("self_attn.indexer.k_norm.bias in all 4 layers",)
    alter_checkpoint(model, add=mtp_names(written["glm5"]))  # the MTP layer by convention, on top
    assert audit_checkpoint(model, expected=names).mtp_present


def test_names_from_another_config_are_refused(written: dict[str, Path], glm5_names: ExpectedNames) -> None:
    with pytest.raises(InputError, match="expected names were made from another config.json"):
        audit_checkpoint(written["glm5_tied"], expected=glm5_names)


def test_the_cli_builds_the_model_with_the_python_it_is_given(
    written: dict[str, Path], python: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    # An architecture the static description does not cover is checked in full with the model's names.
    assert main(["checkpoint", "audit", str(written["llama"]), "--json", "--model-python", python[0]]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["check"] == "model" and "LlamaForCausalLM" in doc["expected_from"]


def test_what_the_model_cannot_be_built_from_is_exit_2(tmp_path: Path, python: tuple[str, ...]) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "no_such_model", "num_hidden_layers": 2}')
    with pytest.raises(
        ModelRefusedConfigError, match="config.json: transformers 5.10.4 refuses this config.json"
    ) as info:
        names_of(tmp_path / "config.json", python)
    assert info.value.exit_code == 2
    (tmp_path / "config.json").write_text('{"model_type": "glm_moe_dsa", "num_hidden_layers": 1000000000}')
    with pytest.raises(ModelRefusedConfigError, match="num_hidden_layers 1,000,000,000: more than the 1,000"):
        ModelNames(python)((tmp_path / "config.json").read_bytes(), 1000)


def test_a_python_without_transformers_says_so(written: dict[str, Path]) -> None:
    import sys

    with pytest.raises(ModelNamesError, match="cannot import torch and transformers") as info:
        names_of(written["glm5"] / "config.json", (sys.executable,))
    assert info.value.exit_code == 1
    with pytest.raises(ModelNamesError, match="no-such-python: no such command"):
        names_of(written["glm5"] / "config.json", ("no-such-python",))


# --- the fast writer the other tests use, against the real one ---------------------------------------


def test_ckptgen_writes_the_names_save_pretrained_writes(written: dict[str, Path], tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CheckpointSpec(layers=4, first_k_dense=1, experts=4, include_mtp=False))
    assert tensor_names(tmp_path) == tensor_names(written["glm5"])
