"""Checkpoints written by the real transformers: ``AutoModelForCausalLM.from_config(...).save_pretrained()``.

The names on disk are then the modelling code's, not ours: a test that alters such a checkpoint checks
envrun against what transformers writes, never against a table the code under test shares. The model
is built from a tiny config of the given ``model_type`` (every other field is transformers' default)
inside a cached environment of :data:`tests.lib.pyenvs.HF_STACK`, and written in bf16.

``write_hf_checkpoint(directory, "glm_moe_dsa", num_hidden_layers=4, ...)`` returns ``directory``;
``max_shard_size`` (e.g. ``"20KB"``) makes it sharded, with ``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.lib.pyenvs import HF_STACK, Venv, cached_venv

# A GLM-5-shaped (glm_moe_dsa) config at tiny sizes: MLA attention, the DSA indexer, MoE with a shared
# expert, one MTP layer declared. transformers builds no MTP layer, so save_pretrained never writes one.
TINY_GLM5: dict[str, object] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "index_topk": 4,
    "num_nextn_predict_layers": 1,
}

_SCRIPT = """
import json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
spec = json.loads(sys.argv[1])
config = AutoConfig.for_model(spec["model_type"], **spec["config"])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
kwargs = {"max_shard_size": spec["max_shard_size"]} if spec["max_shard_size"] else {}
model.save_pretrained(spec["directory"], **kwargs)
"""


def hf_venv() -> Venv:
    """The cached environment with the real transformers and CPU torch (built on first use)."""
    return cached_venv(HF_STACK)


def write_hf_checkpoint(
    directory: Path, model_type: str = "glm_moe_dsa", *, max_shard_size: str | None = None, **config: object
) -> Path:
    """Write a checkpoint of ``model_type`` with ``config`` (tiny GLM-5 defaults for glm_moe_dsa)."""
    fields = {**TINY_GLM5, **config} if model_type == "glm_moe_dsa" else dict(config)
    spec = {"model_type": model_type, "config": fields, "directory": str(directory), "max_shard_size": max_shard_size}
    done = hf_venv().run("-c", _SCRIPT, json.dumps(spec), timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"save_pretrained of {model_type} failed:\n{done.stderr[-3000:]}")
    return directory


_TOKENIZER = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
directory = sys.argv[1]
vocab = json.load(open(directory + "/config.json"))["vocab_size"]
words = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"w{i}" for i in range(vocab - 4)]
tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(
    tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
)
fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
fast.save_pretrained(directory)
"""


def write_tiny_tokenizer(directory: Path, venv: Venv | None = None) -> Path:
    """A word-level tokenizer of the checkpoint's vocabulary size, with a chat template, saved beside it by
    the real transformers (a trainer loads one from the model directory); built offline."""
    done = (venv or hf_venv()).run("-c", _TOKENIZER, str(directory), timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"writing the tokenizer failed:\n{done.stderr[-3000:]}")
    return directory
