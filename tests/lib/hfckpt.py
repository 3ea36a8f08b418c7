"""Checkpoints written by the real transformers: ``AutoModelForCausalLM.from_config(...).save_pretrained()``.

The names on disk are then the modelling code's, not ours: a test that alters such a checkpoint checks
envrun against what transformers writes, never against a table the code under test shares. The model
is built from a tiny config of the given ``model_type`` (every other field is transformers' default)
inside a cached environment of :data:`tests.lib.pyenvs.HF_STACK`, and written in bf16.

- ``write_hf_checkpoint(directory, "glm_moe_dsa", num_hidden_layers=4, ...)`` returns ``directory``;
  ``max_shard_size`` (e.g. ``"20KB"``) makes it sharded, with ``model.safetensors.index.json``.
- :func:`write_hf_checkpoints` writes several in one interpreter (importing torch is most of the cost),
  each once per machine (kept under ``CACHE_DIR/hf-checkpoints``) and copied from there.
- :func:`transformers_names` asks the same environment, for each config.json, the names
  envrun's own :mod:`envrun.checkpoint.saved_names` gives (the model on the meta device) and the names a
  real ``save_pretrained`` of the real model writes, so tests compare both with the static description.
- :func:`alter_checkpoint` drops tensors from, or adds tensors to, a written checkpoint by rewriting its
  safetensors files byte for byte (bf16 data copied, never converted) and its index.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import struct
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from envrun.checkpoint.modelnames import SCRIPT_PATH
from tests.lib.baseimage import CACHE_DIR
from tests.lib.pyenvs import HF_STACK, Venv, cached_venv

# A GLM-5-shaped (glm_moe_dsa) config at tiny sizes: MLA attention, the DSA indexer, MoE with a shared
# expert, one MTP layer declared. transformers builds no MTP layer, so save_pretrained never writes one.
# (transformers 5.10.4 does not read first_k_dense_replace for glm_moe_dsa: its 4 layers are 3 dense
# and 1 MoE, the config class's default mlp_layer_types.)
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
_MLA = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
# The same sizes for the other supported architectures (no DSA indexer; glm4_moe is GQA, not MLA).
TINY: dict[str, dict[str, object]] = {
    "glm_moe_dsa": TINY_GLM5,
    "deepseek_v3": {k: v for k, v in TINY_GLM5.items() if not k.startswith("index")},
    "glm4_moe_lite": {k: v for k, v in TINY_GLM5.items() if not k.startswith("index") and k != "first_k_dense_replace"},
    "glm4_moe": {
        **{k: v for k, v in TINY_GLM5.items() if not k.startswith("index") and k not in _MLA},
        "num_key_value_heads": 1,
        "head_dim": 16,
    },
    # An architecture no description covers, for the refusal.
    "llama": {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3},
}

_WRITE = """
import json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
for spec in json.loads(sys.stdin.read()):
    config = AutoConfig.for_model(spec["model_type"], **spec["config"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    kwargs = {"max_shard_size": spec["max_shard_size"]} if spec["max_shard_size"] else {}
    model.save_pretrained(spec["directory"], **kwargs)
"""

# For each config.json: the names of envrun's script (the function its main() calls) and of a real save.
_NAMES = """
import glob, json, os, sys, tempfile
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM
script = {"__name__": "saved_names"}
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), script)

def real_names(raw):
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "config.json"), "wb").write(raw)
        config = AutoConfig.from_pretrained(tmp, local_files_only=True)
        model = AutoModelForCausalLM.from_config(config)
        model.save_pretrained(os.path.join(tmp, "out"))
        names = []
        for path in glob.glob(os.path.join(tmp, "out", "*.safetensors")):
            with safe_open(path, "pt") as f:
                names += list(f.keys())
        return sorted(names)

def attempt(function, *args):
    try:
        return function(*args), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]

answers = []
for config in json.loads(sys.stdin.read()):
    raw = json.dumps(config).encode()
    meta, meta_error = attempt(lambda: script["saved_names"](raw, 10**7)["names"])
    real, real_error = attempt(real_names, raw)
    answers.append({"meta": meta, "meta_error": meta_error, "real": real, "real_error": real_error})
print(json.dumps(answers))
"""


def hf_venv() -> Venv:
    """The cached environment with the real transformers and CPU torch (built on first use)."""
    return cached_venv(HF_STACK)


@dataclass(frozen=True)
class HFSpec:
    directory: Path
    model_type: str = "glm_moe_dsa"
    config: tuple[tuple[str, object], ...] = ()  # over the tiny defaults of TINY[model_type]
    max_shard_size: str | None = None
    tiny: bool = True  # False: ``config`` is every field (transformers' defaults for the rest)
    drop: tuple[str, ...] = ()  # fields of the tiny config to leave out

    def fields(self) -> dict[str, object]:
        fields = {**(TINY.get(self.model_type, {}) if self.tiny else {}), **dict(self.config)}
        return {k: v for k, v in fields.items() if k not in self.drop}


def write_hf_checkpoints(specs: Sequence[HFSpec]) -> None:
    """Write every checkpoint of ``specs`` with save_pretrained, in one interpreter.

    Each is written once per machine and copied from there: the model is seeded, so the environment, the
    spec and :data:`_WRITE` decide every byte, and the key holds all three (importing torch and saving
    costs ~10 s of CPU a module; the tests only read what was written, or alter their own copy)."""
    docs = [{"model_type": s.model_type, "config": s.fields(), "max_shard_size": s.max_shard_size} for s in specs]
    kept = [KEPT / _kept_key(doc) for doc in docs]
    if not all(path.is_dir() for path in kept):
        KEPT.mkdir(parents=True, exist_ok=True)
        with (KEPT / "write.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions wait rather than write twice
            _write_missing(docs, kept)
    for spec, path in zip(specs, kept):
        shutil.copytree(path, spec.directory, dirs_exist_ok=True)


KEPT = CACHE_DIR / "hf-checkpoints"


def _kept_key(doc: dict[str, object]) -> str:
    source = json.dumps([hf_venv().root.name, doc, _WRITE], sort_keys=True).encode()
    return hashlib.sha256(source).hexdigest()[:16]


def _write_missing(docs: list[dict[str, object]], kept: list[Path]) -> None:
    missing = {path.name: doc for doc, path in zip(docs, kept) if not path.is_dir()}
    if not missing:
        return
    scratch = Path(tempfile.mkdtemp(dir=KEPT, prefix="writing-"))
    try:  # written aside, then moved in whole: a kept checkpoint is complete or absent
        todo = [{**doc, "directory": str(scratch / name)} for name, doc in missing.items()]
        done = hf_venv().run("-c", _WRITE, input=json.dumps(todo), timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"save_pretrained failed:\n{done.stderr[-3000:]}")
        for name in missing:
            (scratch / name).rename(KEPT / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_hf_checkpoint(
    directory: Path, model_type: str = "glm_moe_dsa", *, max_shard_size: str | None = None, **config: object
) -> Path:
    """Write a checkpoint of ``model_type`` with ``config`` (tiny GLM-5 defaults for glm_moe_dsa)."""
    fields = {**TINY_GLM5, **config} if model_type == "glm_moe_dsa" else dict(config)
    write_hf_checkpoints([HFSpec(directory, model_type, tuple(fields.items()), max_shard_size, tiny=False)])
    return directory


@dataclass(frozen=True)
class TransformersNames:
    meta: frozenset[str] | None  # envrun's saved_names script: the model on the meta device
    meta_error: str | None
    real: frozenset[str] | None  # save_pretrained of the real (tiny) model, read back from its files
    real_error: str | None


def transformers_names(configs: Sequence[dict[str, object]]) -> list[TransformersNames]:
    """For each config.json document (with its model_type), the names transformers gives, two ways."""
    done = hf_venv().run("-c", _NAMES, str(SCRIPT_PATH), input=json.dumps(configs), timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"asking transformers for names failed:\n{done.stderr[-3000:]}")
    return [
        TransformersNames(
            frozenset(a["meta"]) if a["meta"] is not None else None,
            a["meta_error"],
            frozenset(a["real"]) if a["real"] is not None else None,
            a["real_error"],
        )
        for a in json.loads(done.stdout)
    ]


# --- altering a written checkpoint ------------------------------------------------------------------

INDEX = "model.safetensors.index.json"


def tensor_names(model_dir: Path) -> list[str]:
    """Every tensor name of the checkpoint, from its safetensors headers."""
    return sorted(n for path in sorted(model_dir.glob("*.safetensors")) for n in _read(path)[0] if n != "__metadata__")


def alter_checkpoint(model_dir: Path, *, drop: Iterable[str] = (), add: Iterable[str] = ()) -> None:
    """Remove the tensors ``drop`` from the checkpoint and add ``add`` (one-element F32 tensors, in the
    last shard), rewriting the safetensors files and the index as a saver would have written them."""
    dropped, added = set(drop), list(add)
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{model_dir}: no safetensors file")
    index_path = model_dir / INDEX
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    found: set[str] = set()
    for k, path in enumerate(shards):
        header, data = _read(path)
        found.update(set(header) & dropped)
        entries = {n: e for n, e in header.items() if n not in dropped}
        extra = added if k == len(shards) - 1 else []
        if len(entries) != len(header) or extra:
            _write(path, entries, data, extra)
            if index is not None:
                for name in extra:
                    index["weight_map"][name] = path.name
    if found != dropped:
        raise ValueError(f"not in the checkpoint: {sorted(dropped - found)[:5]}")
    if index is not None:
        index["weight_map"] = {n: f for n, f in sorted(index["weight_map"].items()) if n not in dropped}
        index_path.write_text(json.dumps(index, indent=2) + "\n")


def _read(path: Path) -> tuple[dict[str, dict[str, object]], bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def _write(path: Path, entries: dict[str, dict[str, object]], data: bytes, extra: list[str]) -> None:
    header: dict[str, object] = {}
    chunks: list[bytes] = []
    offset = 0
    for name, entry in entries.items():
        if name == "__metadata__":
            header[name] = entry
            continue
        begin, end = entry["data_offsets"]  # type: ignore[misc]
        chunk = data[begin:end]
        header[name] = {**entry, "data_offsets": [offset, offset + len(chunk)]}
        chunks.append(chunk)
        offset += len(chunk)
    for name in extra:
        header[name] = {"dtype": "F32", "shape": [1], "data_offsets": [offset, offset + 4]}
        chunks.append(b"\0" * 4)
        offset += 4
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(chunks))


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
