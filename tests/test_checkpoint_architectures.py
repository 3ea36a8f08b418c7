"""The static description of the modelling code against the code itself (transformers 5.10.4).

For every supported model_type, and configs varied along every field that code reads (and some it does
not, which must change nothing), three name sets must be equal: envrun's static description
(:func:`envrun.checkpoint.expected.from_architecture`), the names envrun's own meta-device script
gives (:mod:`envrun.checkpoint.saved_names`, as the locked image would run it), and the names a real
``save_pretrained`` of the real (tiny) model writes to disk. Configs transformers refuses or cannot
build must be refused by the audit too (exit 2); the one place the audit is stricter is named.

All configs go through one interpreter of the cached HF_STACK environment (tests/lib/hfckpt.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envrun.checkpoint.expected import from_architecture
from envrun.checkpoint.layout import ModelConfigError, layout_from_config
from tests.lib.hfckpt import TINY, TransformersNames, transformers_names

pytestmark = [pytest.mark.network, pytest.mark.slow]  # the environment is built from PyPI on first use

N = 4  # layers of the tiny configs
REMOVE = "<remove>"  # as a value: leave the field out of config.json (None is JSON null)
ALTERNATE = ["sparse", "dense", "sparse", "dense"]


def variants() -> list[tuple[str, dict[str, object]]]:
    """(model_type, fields over its tiny config)."""
    mla = [
        {"q_lora_rank": None},
        {"q_lora_rank": REMOVE},  # the config class's default
        {"attention_bias": True},
        {"attention_bias": True, "q_lora_rank": None},
    ]
    common: list[dict[str, object]] = [
        {},
        {"tie_word_embeddings": True},
        {"n_shared_experts": 0},
        {"n_shared_experts": 2},
        {"n_routed_experts": 1},
        {"n_routed_experts": 7},
        {"num_hidden_layers": 1},
        {"num_hidden_layers": 2},
        {"num_hidden_layers": 6},
        {"num_nextn_predict_layers": 0},
        {"num_nextn_predict_layers": 3},
        {"moe_layer_freq": 2},  # read by no supported architecture
    ]
    by_list = [  # glm_moe_dsa, glm4_moe_lite: mlp_layer_types decides, first_k_dense_replace never
        {"mlp_layer_types": ALTERNATE},
        {"mlp_layer_types": ["sparse"] * N},
        {"mlp_layer_types": ["dense"] * N},
        {"mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "dense"]},  # one for the MTP layer
        {"mlp_layer_types": ["sparse"] * (N + 3)},  # longer than every layer: ignored past them
        {"mlp_layer_types": ALTERNATE, "first_k_dense_replace": 3},
        {"first_k_dense_replace": REMOVE},
        {"first_k_dense_replace": 0},
        {"first_k_dense_replace": 4},
        {"num_hidden_layers": 6, "first_k_dense_replace": 1},
    ]
    by_first_k = [  # deepseek_v3, glm4_moe: first_k_dense_replace decides, mlp_layer_types never
        {"first_k_dense_replace": 0},
        {"first_k_dense_replace": 2},
        {"first_k_dense_replace": N},
        {"first_k_dense_replace": 9},
        {"first_k_dense_replace": REMOVE},  # the config class's default
        {"mlp_layer_types": ALTERNATE},
    ]
    out: list[tuple[str, dict[str, object]]] = []
    for over in common + by_list + mla:
        out.append(("glm_moe_dsa", over))
    out += [("glm_moe_dsa", {"indexer_types": ["full", "shared", "shared", "full"]})]
    out += [("glm_moe_dsa", {"q_lora_rank": 24, "attention_bias": True, "tie_word_embeddings": True})]
    for over in common + by_list + mla:
        out.append(("glm4_moe_lite", over))
    for over in common + by_first_k + mla:
        out.append(("deepseek_v3", over))
    for over in common + by_first_k + [{"use_qk_norm": True}, {"attention_bias": True, "use_qk_norm": True}]:
        out.append(("glm4_moe", over))
    # glm_moe_dsa with q_lora_rank null is refused by transformers: REFUSED_BY_BOTH has it.
    return [(t, o) for t, o in out if not (t == "glm_moe_dsa" and "q_lora_rank" in o and o["q_lora_rank"] is None)]


# transformers refuses these, or cannot build or save their model: the audit must refuse them too.
REFUSED_BY_BOTH: list[tuple[str, dict[str, object]]] = [
    ("glm_moe_dsa", {"q_lora_rank": None}),  # the DSA indexer projects from it
    ("glm_moe_dsa", {"n_routed_experts": 0}),  # save_pretrained cannot split zero experts
    ("glm_moe_dsa", {"mlp_layer_types": ["sparse", "dense"]}),  # shorter than the layers
    ("glm_moe_dsa", {"indexer_types": ["full", "shared"]}),  # likewise
    ("glm_moe_dsa", {"num_hidden_layers": "4"}),
    ("glm_moe_dsa", {"attention_bias": "no"}),
    ("deepseek_v3", {"first_k_dense_replace": None}),
    ("deepseek_v3", {"n_routed_experts": 0}),
    ("glm4_moe", {"use_qk_norm": 1}),
    ("glm4_moe_lite", {"mlp_layer_types": ["dense"]}),
]
# The audit refuses these although transformers 5.10.4 builds them: its own check of mlp_layer_types
# (PreTrainedConfig.validate_layer_type) returns before reaching it, and any word but "sparse" is dense.
STRICTER: list[tuple[str, dict[str, object]]] = [
    ("glm_moe_dsa", {"mlp_layer_types": ["dense", "moe", "sparse", "sparse"]}),
    ("glm4_moe_lite", {"mlp_layer_types": ["dense", "full_attention", "sparse", "sparse"]}),
]


def config(model_type: str, over: dict[str, object]) -> dict[str, object]:
    doc: dict[str, object] = {"model_type": model_type, **TINY[model_type]}
    for key, value in over.items():
        if value == REMOVE:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


CASES = variants()
ALL = [config(t, o) for t, o in CASES + REFUSED_BY_BOTH + STRICTER]


@pytest.fixture(scope="module")
def answers() -> list[TransformersNames]:
    return transformers_names(ALL)


def ids(cases: list[tuple[str, dict[str, object]]]) -> list[str]:
    return [f"{t}-{o}" for t, o in cases]


@pytest.mark.parametrize("case", range(len(CASES)), ids=ids(CASES))
def test_static_description_meta_device_and_real_save_agree(answers: list[TransformersNames], case: int) -> None:
    doc = ALL[case]
    answer = answers[case]
    assert answer.meta_error is None and answer.real_error is None, answer
    assert answer.meta == answer.real  # envrun's meta-device names are those of the real save
    layout = layout_from_config(doc, Path("config.json"))
    static = from_architecture(layout)
    assert answer.real is not None
    assert static.required - answer.real == set(), "described but not written"
    assert answer.real - static.required == set(), "written but not described"
    # transformers builds no MTP layer: the MTP names are the checkpoints' convention, on top.
    assert not any(n.startswith(f"model.layers.{layout.num_hidden_layers}.") for n in answer.real)


@pytest.mark.parametrize("case", range(len(REFUSED_BY_BOTH)), ids=ids(REFUSED_BY_BOTH))
def test_what_transformers_refuses_the_audit_refuses(answers: list[TransformersNames], case: int) -> None:
    answer = answers[len(CASES) + case]
    assert answer.meta_error is not None and answer.real_error is not None, answer
    with pytest.raises(ModelConfigError):
        layout_from_config(ALL[len(CASES) + case], Path("config.json"))


@pytest.mark.parametrize("case", range(len(STRICTER)), ids=ids(STRICTER))
def test_where_the_audit_is_stricter_than_transformers(answers: list[TransformersNames], case: int) -> None:
    answer = answers[len(CASES) + len(REFUSED_BY_BOTH) + case]
    assert answer.real is not None and answer.meta == answer.real  # built, the odd word as a dense layer
    with pytest.raises(ModelConfigError, match="mlp_layer_types: '.*' is not 'dense' or 'sparse'"):
        layout_from_config(ALL[len(CASES) + len(REFUSED_BY_BOTH) + case], Path("config.json"))


def test_every_field_the_description_reads_is_varied() -> None:
    # The fields layout.py reads for the known architectures; each must appear in some variant.
    read = {
        "num_hidden_layers",
        "num_nextn_predict_layers",
        "n_routed_experts",
        "n_shared_experts",
        "first_k_dense_replace",
        "mlp_layer_types",
        "moe_layer_freq",
        "q_lora_rank",
        "indexer_types",
        "attention_bias",
        "use_qk_norm",
        "tie_word_embeddings",
    }
    varied = {key for _, over in CASES for key in over}
    assert read <= varied, read - varied
    assert {t for t, _ in CASES} == {"glm_moe_dsa", "deepseek_v3", "glm4_moe", "glm4_moe_lite"}
