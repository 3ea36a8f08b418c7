"""envrun.checkpoint.layout: config.json read as the modelling code reads it, and the arithmetic that
lets a declared layout be checked before names exist.

Whether these readings are what transformers 5.10.4 does is tests/test_checkpoint_architectures.py's
question (against the real code); here: the arithmetic equals the enumeration, and bad values are
refused in one line that names every problem.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from envrun.checkpoint.architectures import ARCHITECTURES
from envrun.checkpoint.expected import from_architecture, from_uniform_layers
from envrun.checkpoint.layout import (
    MAX_EXPECTED_TENSORS,
    PLAUSIBLE_FACTOR,
    PLAUSIBLE_SLACK,
    ModelConfigError,
    ModelLayout,
    implausible_counts,
    layout_from_config,
    load_layout,
    split_layer_name,
)

GLM5 = ARCHITECTURES["glm_moe_dsa"]


def layout(**kw: object) -> ModelLayout:
    values: dict[str, object] = dict(
        num_hidden_layers=4,
        num_mtp_layers=1,
        first_k_dense_replace=1,
        n_routed_experts=4,
        n_shared_experts=1,
        moe_layer_freq=1,
        tie_word_embeddings=False,
    )
    values.update(kw)
    return ModelLayout(**values)  # type: ignore[arg-type]


def read(tmp_path: Path, **config: object) -> ModelLayout:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return load_layout(path)


def built_names(lay: ModelLayout) -> int:
    """The names an audit builds for ``lay``, enumerated one by one."""
    # Without an architecture, nothing is learned from an empty checkpoint: the essentials alone.
    expect = from_architecture(lay) if lay.architecture is not None else from_uniform_layers(lay, (), "a test")
    return len(expect.required | expect.mtp_required)


def test_min_tensor_count_is_the_number_of_names_an_audit_builds() -> None:
    grid = itertools.product(
        [None, *ARCHITECTURES.values()],
        [1, 2, 5],  # layers
        [0, 1, 2],  # MTP layers
        [None, ("sparse", "dense"), ("dense", "sparse", "sparse")],  # mlp_layer_types prefixes
        [0, 1, 3, 12],  # first_k_dense_replace, past the last layer too
        [1, 3],  # routed experts
        [False, True],  # tied, attention bias and qk norm, q_lora_rank null
    )
    count = 0
    for arch, n, m, types, k, e, flag in grid:
        full = None if types is None else (types * n)[: n + min(m, 1)]
        if full is not None and len(full) < n:
            continue
        lay = layout(
            num_hidden_layers=n,
            num_mtp_layers=m,
            first_k_dense_replace=k,
            n_routed_experts=e,
            mlp_layer_types=full,
            tie_word_embeddings=flag,
            architecture=arch,
            attention_bias=flag,
            use_qk_norm=flag,
            q_lora_rank=None if flag and arch is not GLM5 else 8,
            moe_layer_freq=1 if arch is not None or not flag else 2,
        )
        assert lay.min_tensor_count() == built_names(lay), lay
        for start, stop in [(0, n), (n, n + m), (0, n + m), (2, 1), (1, n + m)]:
            assert lay.moe_layers_between(start, stop) == sum(lay.is_moe(i) for i in range(start, stop)), lay
        count += 1
    assert count > 2000


def test_mtp_layers_are_like_the_last_layer_unless_the_list_types_them() -> None:
    assert layout(mlp_layer_types=("dense", "dense", "dense", "sparse")).is_moe(4)
    assert not layout(mlp_layer_types=("sparse", "sparse", "sparse", "dense")).is_moe(4)
    assert not layout(mlp_layer_types=("sparse",) * 4 + ("dense",)).is_moe(4)
    assert layout(first_k_dense_replace=3).is_moe(4) and not layout(first_k_dense_replace=9).is_moe(4)


def test_counts_of_any_size_cost_nothing() -> None:
    for arch in (None, GLM5):
        lay = layout(num_hidden_layers=10**4000, n_routed_experts=10**4000, architecture=arch, q_lora_rank=8)
        assert lay.min_tensor_count() > 10**8000
        problem = implausible_counts(lay, 59_870)
        assert problem is not None and "about 10^4000 layers" in problem and len(problem) < 300


def test_implausible_counts_draws_the_line_at_a_factor_of_the_tensors_held() -> None:
    lay = layout(num_hidden_layers=1000, n_routed_experts=8)
    need = lay.min_tensor_count()
    held = (need - PLAUSIBLE_SLACK) // PLAUSIBLE_FACTOR + 1
    assert implausible_counts(lay, held) is None  # a checkpoint that lost three quarters: "not ok", exit 1
    assert implausible_counts(lay, held - 1) == (
        f"declares 1,000 layers + 1 MTP layers (1,000 MoE with 8 routed experts each), at least {need:,} tensors"
    )


def test_implausible_counts_has_an_absolute_cap() -> None:
    lay = layout(num_hidden_layers=10_000, n_routed_experts=100)
    assert lay.min_tensor_count() > MAX_EXPECTED_TENSORS
    problem = implausible_counts(lay, 10**7)
    assert problem is not None and problem.endswith(f"more than the {MAX_EXPECTED_TENSORS:,} an audit expects")


# --- reading config.json per architecture ---------------------------------------------------------


def test_glm_moe_dsa_is_planned_by_mlp_layer_types_never_by_first_k_dense_replace(tmp_path: Path) -> None:
    listed = read(tmp_path, model_type="glm_moe_dsa", num_hidden_layers=4, mlp_layer_types=["sparse", "dense"] * 2)
    assert [listed.is_moe(i) for i in range(5)] == [True, False, True, False, False]
    assert listed.notes == () and listed.architecture is GLM5 and not listed.unsupported

    # Without the list, the config class makes the first 3 layers dense, whatever first_k_dense_replace says.
    default = read(tmp_path, model_type="glm_moe_dsa", num_hidden_layers=5, first_k_dense_replace=1)
    assert [default.is_moe(i) for i in range(5)] == [False, False, False, True, True]
    assert default.notes == (
        "first_k_dense_replace 1 is not read by transformers 5.10.4's GlmMoeDsaForCausalLM: "
        "its default mlp_layer_types decides",
    )
    # Defaults of the config class where config.json is silent.
    bare = read(tmp_path, model_type="glm_moe_dsa")
    assert (bare.num_hidden_layers, bare.n_routed_experts, bare.q_lora_rank) == (78, 256, 2048)
    assert bare.moe_layers_between(0, 78) == 75 and bare.notes == ()


def test_deepseek_and_glm4_moe_are_planned_by_first_k_dense_replace(tmp_path: Path) -> None:
    for model_type, default in (("deepseek_v3", 3), ("glm4_moe", 1)):
        lay = read(
            tmp_path, model_type=model_type, num_hidden_layers=6, mlp_layer_types=["sparse"] * 6, moe_layer_freq=2
        )
        assert lay.moe_layers_between(0, 6) == 6 - default
        assert len(lay.notes) == 2 and "mlp_layer_types is not read" in lay.notes[0]
        assert "moe_layer_freq 2 is not read" in lay.notes[1]
        assert read(tmp_path, model_type=model_type, num_hidden_layers=6, first_k_dense_replace=0).is_moe(0)


def test_an_mlp_layer_types_may_type_the_mtp_layers_too(tmp_path: Path) -> None:
    lay = read(
        tmp_path,
        model_type="glm_moe_dsa",
        num_hidden_layers=2,
        num_nextn_predict_layers=1,
        mlp_layer_types=["sparse"] * 3,
    )
    assert lay.is_moe(2)
    # Entries past the MTP layers describe nothing transformers builds: read, and unused.
    longer = read(
        tmp_path,
        model_type="glm_moe_dsa",
        num_hidden_layers=2,
        num_nextn_predict_layers=1,
        mlp_layer_types=["sparse"] * 9,
    )
    assert longer.moe_layers_between(0, 3) == 3 and longer.min_tensor_count() == lay.min_tensor_count()


@pytest.mark.parametrize(
    ("config", "problems"),
    [
        (
            {"mlp_layer_types": ["dense", "moe"], "num_hidden_layers": 2, "q_lora_rank": None},
            ["mlp_layer_types: 'moe' is not 'dense' or 'sparse'", "q_lora_rank: null"],
        ),
        (
            {"mlp_layer_types": ["dense"], "num_hidden_layers": 2},
            ["mlp_layer_types: 1 entries, the layers need at least 2"],
        ),
        ({"indexer_types": ["full", "partial"]}, ["indexer_types: 'partial' is not 'full' or 'shared'"]),
        ({"indexer_types": ["full"], "num_hidden_layers": 2}, ["indexer_types: 1 entries, the layers need at least 2"]),
        (
            {"n_routed_experts": 0, "attention_bias": "yes"},
            ["n_routed_experts: 0 is not an integer >= 1", "attention_bias"],
        ),
        ({"num_hidden_layers": None, "n_shared_experts": -1}, ["num_hidden_layers: null", "n_shared_experts: -1"]),
        ({"first_k_dense_replace": "3"}, ["first_k_dense_replace: '3' is not an integer >= 0"]),
    ],
)
def test_values_the_config_class_refuses_are_refused_together(
    tmp_path: Path, config: dict[str, object], problems: list[str]
) -> None:
    with pytest.raises(ModelConfigError) as info:
        read(tmp_path, model_type="glm_moe_dsa", **config)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: ") and "\n" not in message
    for problem in problems:
        assert problem in message


def test_deepseek_v3_needs_a_first_k_dense_replace_and_may_drop_q_lora(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="first_k_dense_replace: null, but the modelling code needs an integer"):
        read(tmp_path, model_type="deepseek_v3", first_k_dense_replace=None)
    lay = read(tmp_path, model_type="deepseek_v3", num_hidden_layers=2, q_lora_rank=None, attention_bias=True)
    assert (
        lay.attention_suffixes()[0] == "self_attn.q_proj.weight" and "self_attn.o_proj.bias" in lay.attention_suffixes()
    )


def test_shared_indexers_are_noted_not_dropped(tmp_path: Path) -> None:
    lay = read(tmp_path, model_type="glm_moe_dsa", num_hidden_layers=2, indexer_types=["full", "shared"])
    assert "self_attn.indexer.wk.weight" in lay.attention_suffixes()
    assert lay.notes == (
        "transformers 5.10.4's GlmMoeDsaForCausalLM builds an indexer in every layer, 'shared' ones of indexer_types too",
    )


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"model_type": "llama", "num_hidden_layers": 2}, "model_type 'llama' is none of the architectures"),
        ({"num_hidden_layers": 2}, "model_type absent is none of the architectures"),
        ({"model_type": ["glm_moe_dsa"], "num_hidden_layers": 2}, "model_type ['glm_moe_dsa'] is none"),
        (
            {"model_type": "glm_moe_dsa", "quantization_config": {"quant_method": "fp8"}},
            "quantization_config ('fp8') adds tensors",
        ),
    ],
)
def test_what_no_description_covers_is_marked_unsupported(tmp_path: Path, config: dict[str, object], why: str) -> None:
    lay = layout_from_config(config, tmp_path / "config.json")
    assert why in lay.unsupported


def test_an_unknown_architecture_still_needs_its_layer_count(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="num_hidden_layers: required"):
        read(tmp_path, model_type="llama")


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("model.layers.5.mlp.gate.weight", (5, "mlp.gate.weight")),
        ("model.layers.123456789.x", (123456789, "x")),
        ("model.layers." + "9" * 5000 + ".x", None),  # int() refuses more than 4300 digits
        ("model.layers.05.x", None),
    ],
)
def test_split_layer_name(name: str, split: tuple[int, str] | None) -> None:
    assert split_layer_name(name) == split
