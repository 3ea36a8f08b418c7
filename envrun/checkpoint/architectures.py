"""What the modelling code of the locked transformers (5.10.4) builds, per ``model_type``: the static
description the host-side audit checks a checkpoint against (no torch on the host).

Read from ``transformers/models/<type>/{configuration,modeling}_<type>.py`` of 5.10.4; every fact below
is checked against the real code by tests/test_checkpoint_architectures.py, which builds each model on
the meta device and compares the names ``save_pretrained`` writes with :func:`layer_suffixes`:

- Which layers are MoE. ``glm_moe_dsa`` and ``glm4_moe_lite`` read ``mlp_layer_types`` only
  (``"sparse"`` is MoE, anything else dense); when it is absent their configs fill it in as the first
  3 (``glm_moe_dsa``) or 1 (``glm4_moe_lite``) layers dense, *whatever* ``first_k_dense_replace`` says:
  that key is not a field of either config and nothing reads it. ``deepseek_v3`` and ``glm4_moe`` read
  ``first_k_dense_replace`` only (MoE from that layer on; defaults 3 and 1); ``mlp_layer_types`` and
  ``moe_layer_freq`` mean nothing to them.
- Attention. MLA (``deepseek_v3``, ``glm4_moe_lite``, ``glm_moe_dsa``): ``q_proj`` when ``q_lora_rank``
  is null, else ``q_a_proj`` + ``q_a_layernorm`` + ``q_b_proj``; ``kv_a_proj_with_mqa``,
  ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``; ``attention_bias`` adds a bias to ``q_a_proj``,
  ``kv_a_proj_with_mqa`` and ``o_proj``. ``glm_moe_dsa`` requires ``q_lora_rank`` (its DSA indexer
  projects from it) and builds the indexer (``wq_b``, ``wk``, ``k_norm`` weight and bias,
  ``weights_proj``) in *every* layer: ``indexer_types`` only decides whether a layer reuses the previous
  layer's top-k, not whether it has weights. GQA (``glm4_moe``): ``q/k/v/o_proj``, a bias on q, k, v
  with ``attention_bias``, ``q_norm`` + ``k_norm`` with ``use_qk_norm``.
- MLP. Dense: ``gate/up/down_proj``. MoE: the router ``mlp.gate.weight`` and its persistent buffer
  ``mlp.gate.e_score_correction_bias``, the routed experts, which ``save_pretrained`` writes one tensor
  per expert and projection (``mlp.experts.E.{gate,up,down}_proj.weight``, the reverse of the fused
  ``gate_up_proj``), and ``mlp.shared_experts.*``, built even when ``n_shared_experts`` is 0 (as
  empty tensors). ``n_routed_experts`` must be at least 1: with none, ``save_pretrained`` fails.
- Top level: ``model.embed_tokens``, ``model.norm``, and ``lm_head`` unless ``tie_word_embeddings``.

MTP layers are not built by transformers at all (upstream-facts §4 and §8): their naming is the
checkpoints' convention, described in :mod:`envrun.checkpoint.expected`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TRANSFORMERS_VERSION = "5.10.4"

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
LAYER_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
PROJ = ("gate_proj", "up_proj", "down_proj")
DENSE_MLP = tuple(f"mlp.{p}.weight" for p in PROJ)
ROUTER = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")
SHARED_EXPERTS = tuple(f"mlp.shared_experts.{p}.weight" for p in PROJ)
INDEXER = tuple(
    f"self_attn.indexer.{t}"
    for t in ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight")
)


@dataclass(frozen=True)
class Architecture:
    """One ``model_type`` as the locked transformers builds it; see the module docstring."""

    model_type: str
    causal_lm: str  # the class AutoModelForCausalLM builds
    attention: Literal["mla", "gqa"]
    dsa_indexer: bool
    layer_types_from: Literal["mlp_layer_types", "first_k_dense_replace"]
    default_dense_layers: int  # leading dense layers when that field is absent
    q_lora_required: bool  # q_lora_rank may not be null
    # The config class's defaults for the fields read here, used when config.json leaves them out.
    num_hidden_layers: int
    n_routed_experts: int
    q_lora_rank: int | None

    def attention_suffixes(self, q_lora_rank: int | None, attention_bias: bool, use_qk_norm: bool) -> tuple[str, ...]:
        if self.attention == "gqa":
            names = [f"self_attn.{p}_proj.weight" for p in "qkvo"]
            if attention_bias:
                names += [f"self_attn.{p}_proj.bias" for p in "qkv"]
            if use_qk_norm:
                names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
            return tuple(names)
        if q_lora_rank is None:
            names = ["self_attn.q_proj.weight"]
        else:
            names = ["self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight"]
            if attention_bias:
                names.append("self_attn.q_a_proj.bias")
        names += [
            "self_attn.kv_a_proj_with_mqa.weight",
            "self_attn.kv_a_layernorm.weight",
            "self_attn.kv_b_proj.weight",
            "self_attn.o_proj.weight",
        ]
        if attention_bias:
            names += ["self_attn.kv_a_proj_with_mqa.bias", "self_attn.o_proj.bias"]
        if self.dsa_indexer:
            names += INDEXER
        return tuple(names)


ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in (
        Architecture(
            model_type="glm_moe_dsa",
            causal_lm="GlmMoeDsaForCausalLM",
            attention="mla",
            dsa_indexer=True,
            layer_types_from="mlp_layer_types",
            default_dense_layers=3,
            q_lora_required=True,
            num_hidden_layers=78,
            n_routed_experts=256,
            q_lora_rank=2048,
        ),
        Architecture(
            model_type="deepseek_v3",
            causal_lm="DeepseekV3ForCausalLM",
            attention="mla",
            dsa_indexer=False,
            layer_types_from="first_k_dense_replace",
            default_dense_layers=3,
            q_lora_required=False,
            num_hidden_layers=61,
            n_routed_experts=256,
            q_lora_rank=1536,
        ),
        Architecture(  # GLM-4.5, GLM-4.6, GLM-4.7
            model_type="glm4_moe",
            causal_lm="Glm4MoeForCausalLM",
            attention="gqa",
            dsa_indexer=False,
            layer_types_from="first_k_dense_replace",
            default_dense_layers=1,
            q_lora_required=False,
            num_hidden_layers=46,
            n_routed_experts=128,
            q_lora_rank=None,
        ),
        Architecture(  # GLM-4.7-Flash
            model_type="glm4_moe_lite",
            causal_lm="Glm4MoeLiteForCausalLM",
            attention="mla",
            dsa_indexer=False,
            layer_types_from="mlp_layer_types",
            default_dense_layers=1,
            q_lora_required=False,
            num_hidden_layers=47,
            n_routed_experts=64,
            q_lora_rank=768,
        ),
    )
}


def moe_suffixes(n_routed_experts: int) -> tuple[str, ...]:
    experts = (f"mlp.experts.{e}.{p}.weight" for e in range(n_routed_experts) for p in PROJ)
    return (*ROUTER, *experts, *SHARED_EXPERTS)


def moe_suffix_count(n_routed_experts: int) -> int:
    """``len(moe_suffixes(n))`` without building them: a config may declare a million experts."""
    return len(ROUTER) + len(PROJ) * n_routed_experts + len(SHARED_EXPERTS)
