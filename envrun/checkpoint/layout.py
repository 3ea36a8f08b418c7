"""The layer plan of a checkpoint, read from config.json the way the locked transformers reads it.

For an architecture of :data:`envrun.checkpoint.architectures.ARCHITECTURES` only the fields its
modelling code reads decide the plan, with its config class's defaults when they are absent (so a
``glm_moe_dsa`` config is planned by ``mlp_layer_types``, never by ``first_k_dense_replace``); a field
the code does not read but that disagrees with the plan is kept as a note for the report. A value the
config class would refuse (a string where an integer belongs, an ``mlp_layer_types`` that does not
cover every layer) is refused here too, all problems at once, naming the file and the field.

Any other ``model_type`` (or a quantised checkpoint, whose scales no table here describes) gets the
generic DeepSeek-style plan, marked ``unsupported``: only the weaker check of
:func:`envrun.checkpoint.expected.from_uniform_layers` can use it, and only when asked for by name.

config.json is hostile input like the rest of a checkpoint: it is read through
:mod:`envrun.checkpoint.untrusted`, and what it declares is checked against what the checkpoint holds
(:func:`implausible_counts`) before a single expected name is generated, so that a 100-byte file
declaring a billion layers is refused instead of filling memory with names. Nothing here is sized by
a declared count: a plan of 10^4000 layers costs what a plan of 4 does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from envbuild.errors import InputError
from envrun.checkpoint.architectures import (
    ARCHITECTURES,
    DENSE_MLP,
    EMBED,
    FINAL_NORM,
    LAYER_NORMS,
    LM_HEAD,
    PROJ,
    TRANSFORMERS_VERSION,
    Architecture,
    moe_suffix_count,
)
from envrun.checkpoint.untrusted import MiB, brief, read_json

# The MTP head around the decoder block (upstream-facts §4). GLM-4.5 also stores its own
# shared_head.head and embed_tokens there, GLM-4.6 and GLM-5 do not: allowed, never required.
MTP_REQUIRED = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
MTP_OPTIONAL = ("shared_head.head.weight", "embed_tokens.weight")

# No leading zeros: "model.layers.05.x" is not layer 5 to any loader, so it must not count as one.
_LAYER_PREFIX = "model.layers."

# A GLM-style config.json is a few KB; configs with large label maps reach a few hundred.
MAX_CONFIG_BYTES = 4 * MiB
# Objects and arrays in it: a GLM-style config has a handful, one with per-layer block settings a few hundred.
MAX_CONFIG_CONTAINERS = 10_000
# What config.json declares must be plausible against the tensors the checkpoint holds: an audit
# builds every expected name, so it must not expect vastly more than it was given. A factor, not
# equality, so that a checkpoint that really lost tensors is still reported as "not ok" (exit 1);
# an absolute cap, because an index of 64 MiB holds about a million names.
PLAUSIBLE_FACTOR = 4
PLAUSIBLE_SLACK = 1024
MAX_EXPECTED_TENSORS = 2_000_000

MLP_LAYER_TYPES = ("dense", "sparse")
INDEXER_TYPES = ("full", "shared")


class ModelConfigError(InputError):
    """config.json is missing, not JSON, or lacks what the audit needs."""


@dataclass(frozen=True)
class ModelLayout:
    """The layer plan of a checkpoint, as config.json declares it to the modelling code."""

    num_hidden_layers: int
    num_mtp_layers: int
    first_k_dense_replace: int  # the leading dense layers, where no mlp_layer_types decides
    n_routed_experts: int
    n_shared_experts: int
    moe_layer_freq: int  # only in the generic plan (DeepSeek's remote code); 1 for known architectures
    tie_word_embeddings: bool
    model_type: str | None = None
    mlp_layer_types: tuple[str, ...] | None = None  # may cover the MTP layers too
    q_lora_rank: int | None = None
    attention_bias: bool = False
    use_qk_norm: bool = False
    architecture: Architecture | None = None
    unsupported: str = ""  # why no architecture describes this checkpoint; "" when one does
    quantization: str | None = None  # quantization_config's quant_method, when there is one
    notes: tuple[str, ...] = ()

    @property
    def mtp_layers(self) -> tuple[int, ...]:
        n = self.num_hidden_layers
        return tuple(range(n, n + self.num_mtp_layers))

    def is_moe(self, layer: int) -> bool:
        types = self.mlp_layer_types
        if types is not None and layer < len(types):
            return types[layer] == "sparse"
        n = self.num_hidden_layers
        if layer >= n:  # an MTP layer the config does not type: a block like the last decoder layer's
            return self.is_moe(n - 1)
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    def moe_layers_between(self, start: int, stop: int) -> int:
        """How many of the layers ``start..stop-1`` are MoE layers, without counting them one by one."""
        n = self.num_hidden_layers
        if start >= stop:
            return 0
        if start >= n:  # MTP layers: typed by the list where it reaches, else like layer n-1
            typed = self.mlp_layer_types[start:stop] if self.mlp_layer_types is not None else ()
            rest = stop - start - len(typed)
            return typed.count("sparse") + (rest if rest and self.is_moe(n - 1) else 0)
        if stop > n:
            return self.moe_layers_between(start, n) + self.moe_layers_between(n, stop)
        if self.mlp_layer_types is not None:
            return self.mlp_layer_types[start:stop].count("sparse")
        first = max(start, self.first_k_dense_replace)
        if self.n_routed_experts == 0 or first >= stop:
            return 0
        freq = self.moe_layer_freq  # multiples of freq in [first, stop)
        return (stop - 1) // freq - (first - 1) // freq

    def attention_suffixes(self) -> tuple[str, ...]:
        if self.architecture is None:
            raise ValueError(f"{self.model_type}: no architecture describes its attention")
        return self.architecture.attention_suffixes(self.q_lora_rank, self.attention_bias, self.use_qk_norm)

    def min_tensor_count(self) -> int:
        """How many names an audit builds at the least for this plan, MTP layers included: every name
        of the architecture, or the essentials of the generic plan. Arithmetic only, so any declared
        count costs nothing to check."""
        n, m = self.num_hidden_layers, self.num_mtp_layers
        moe_layers = self.moe_layers_between(0, n + m)
        top = 2 + (0 if self.tie_word_embeddings else 1)  # embedding, final norm, lm_head
        if self.architecture is not None:
            block = len(LAYER_NORMS) + len(self.attention_suffixes())
            dense, moe = block + len(DENSE_MLP), block + moe_suffix_count(self.n_routed_experts)
        else:  # expected.essential_suffixes
            dense = len(LAYER_NORMS) + 1 + len(PROJ)
            moe = len(LAYER_NORMS) + 2 + len(PROJ) * self.n_routed_experts + (len(PROJ) if self.n_shared_experts else 0)
        return top + (n + m - moe_layers) * dense + moe_layers * moe + m * len(MTP_REQUIRED)

    def top_level(self) -> tuple[frozenset[str], frozenset[str]]:
        """(required, allowed) names outside the layers."""
        if self.tie_word_embeddings:
            return frozenset({EMBED, FINAL_NORM}), frozenset({LM_HEAD})
        return frozenset({EMBED, FINAL_NORM, LM_HEAD}), frozenset()


def read_config(config_path: Path) -> tuple[bytes, dict[str, object]]:
    """The bytes of ``config_path`` and the JSON object they hold, read within the limits above."""

    def fail(message: str) -> ModelConfigError:
        return ModelConfigError(f"{config_path}: {message}")

    if not os.path.lexists(config_path):
        raise fail("not found; a Hugging Face model directory needs config.json")
    raw, doc = read_json(config_path, MAX_CONFIG_BYTES, "a config.json", fail, max_containers=MAX_CONFIG_CONTAINERS)
    if not isinstance(doc, dict):
        raise fail(f"a JSON {type(doc).__name__}, expected an object")
    return raw, doc


def load_layout(config_path: Path) -> ModelLayout:
    """Read the layer plan from ``config_path``; every problem is reported at once, naming the file."""
    return layout_from_config(read_config(config_path)[1], config_path)


def layout_from_config(doc: dict[str, object], config_path: Path) -> ModelLayout:
    reader = _Reader(doc)
    declared = doc.get("model_type")
    model_type = declared if isinstance(declared, str) else None
    arch = ARCHITECTURES.get(model_type or "")
    layout = _known_layout(reader, arch) if arch is not None else _generic_layout(reader)
    if reader.problems:
        raise ModelConfigError(f"{config_path}: " + "; ".join(reader.problems))
    unsupported, quantization = "", None
    if doc.get("quantization_config") is not None:
        config = doc["quantization_config"]
        quantization = brief(config.get("quant_method") if isinstance(config, dict) else config)
        unsupported = f"quantization_config ({quantization}) adds tensors (scales) no description names"
    elif arch is None:
        shown = brief(doc["model_type"]) if "model_type" in doc else "absent"
        known = ", ".join(sorted(ARCHITECTURES))
        unsupported = f"model_type {shown} is none of the architectures the audit describes ({known})"
    return replace(
        layout, model_type=model_type, unsupported=unsupported, quantization=quantization, notes=tuple(reader.notes)
    )


def _known_layout(r: _Reader, arch: Architecture) -> ModelLayout:
    n = r.count("num_hidden_layers", arch.num_hidden_layers, minimum=1, strict=True)
    m = r.count("num_nextn_predict_layers", 0, "num_mtp_layers")
    experts = r.count("n_routed_experts", arch.n_routed_experts, minimum=1, strict=True)  # 0: save_pretrained fails
    code = f"transformers {TRANSFORMERS_VERSION}'s {arch.causal_lm}"
    declared_k = r.optional_count("first_k_dense_replace")
    types: tuple[str, ...] | None = None
    if arch.layer_types_from == "mlp_layer_types":
        first_k = arch.default_dense_layers
        types = r.layer_types("mlp_layer_types", MLP_LAYER_TYPES, n)
        dense = _leading_dense(types, n) if types is not None else min(first_k, n)
        if declared_k is not None and declared_k != dense:
            decides = "mlp_layer_types" if types is not None else "its default mlp_layer_types"
            r.notes.append(f"first_k_dense_replace {declared_k} is not read by {code}: {decides} decides")
    else:
        first_k = r.count("first_k_dense_replace", arch.default_dense_layers, strict=True)
        if "mlp_layer_types" in r.doc:
            r.notes.append(f"mlp_layer_types is not read by {code}: first_k_dense_replace decides")
    if r.doc.get("moe_layer_freq", 1) != 1:
        r.notes.append(f"moe_layer_freq {brief(r.doc['moe_layer_freq'])} is not read by {code}")
    q_lora: int | None = None
    if arch.attention == "mla":
        q_lora = r.rank("q_lora_rank", arch.q_lora_rank, nullable=not arch.q_lora_required)
    if arch.dsa_indexer:
        indexers = r.layer_types("indexer_types", INDEXER_TYPES, n)
        if indexers is not None and "shared" in indexers[:n]:
            r.notes.append(f"{code} builds an indexer in every layer, 'shared' ones of indexer_types too")
    return ModelLayout(
        num_hidden_layers=n,
        num_mtp_layers=m,
        first_k_dense_replace=first_k,
        n_routed_experts=experts,
        n_shared_experts=r.count("n_shared_experts", 1, strict=True),
        moe_layer_freq=1,
        tie_word_embeddings=r.flag("tie_word_embeddings"),
        mlp_layer_types=types,
        q_lora_rank=q_lora,
        attention_bias=r.flag("attention_bias"),
        use_qk_norm=r.flag("use_qk_norm") if arch.attention == "gqa" else False,
        architecture=arch,
    )


def _generic_layout(r: _Reader) -> ModelLayout:
    n = r.count("num_hidden_layers", None, minimum=1)
    m = r.count("num_nextn_predict_layers", 0, "num_mtp_layers")
    types = r.layer_types("mlp_layer_types", MLP_LAYER_TYPES, n) if "mlp_layer_types" in r.doc else None
    return ModelLayout(
        num_hidden_layers=n,
        num_mtp_layers=m,
        first_k_dense_replace=r.count("first_k_dense_replace", 0),
        n_routed_experts=r.count("n_routed_experts", 0),
        # DeepSeek-V3 and GLM-MoE configs always carry it; absent means the usual one shared expert.
        n_shared_experts=r.count("n_shared_experts", 1),
        moe_layer_freq=r.count("moe_layer_freq", 1, minimum=1),
        tie_word_embeddings=r.flag("tie_word_embeddings"),
        mlp_layer_types=types,
    )


def _leading_dense(types: tuple[str, ...], n: int) -> int:
    return next((i for i, t in enumerate(types[:n]) if t == "sparse"), n)


class _Reader:
    """Typed reads of config.json fields, collecting every problem instead of stopping at the first."""

    def __init__(self, doc: dict[str, object]) -> None:
        self.doc = doc
        self.problems: list[str] = []
        self.notes: list[str] = []

    def count(self, key: str, default: int | None, *aliases: str, minimum: int = 0, strict: bool = False) -> int:
        """An integer >= ``minimum``; absent gives ``default`` (None: required). null gives ``default``
        too, unless ``strict``: the config classes of the known architectures refuse it."""
        for k in (key, *aliases):
            if k in self.doc and (self.doc[k] is not None or strict):
                return self._integer(k, minimum)
        if default is None:
            self.problems.append(f"{key}: required")
            return minimum
        return default

    def rank(self, key: str, default: int | None, *, nullable: bool) -> int | None:
        """An integer >= 0, or null where the modelling code reads null as "none" (q_lora_rank)."""
        if key not in self.doc:
            return default
        if self.doc[key] is None and nullable:
            return None
        return self._integer(key, 0)  # null where it is not nullable: a problem

    def optional_count(self, key: str) -> int | None:
        return None if self.doc.get(key) is None else self._integer(key, 0)

    def _integer(self, key: str, minimum: int) -> int:
        value = self.doc[key]
        if value is None:
            self.problems.append(f"{key}: null, but the modelling code needs an integer")
            return minimum
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.problems.append(f"{key}: {brief(value)} is not an integer >= {minimum}")
            return minimum
        return value

    def flag(self, key: str) -> bool:
        value = self.doc.get(key, False)
        if not isinstance(value, bool):
            self.problems.append(f"{key}: {brief(value)} is not true or false")
            return False
        return value

    def layer_types(self, key: str, allowed: tuple[str, ...], least: int) -> tuple[str, ...] | None:
        """A per-layer list of ``allowed`` words, at least ``least`` long (the modelling code indexes it
        by layer; entries past the layers it ignores, and the audit reads them for the MTP layers
        only); None when absent or null (the config class fills it in).

        Stricter than transformers 5.10.4 in one way: its check of such lists
        (``PreTrainedConfig.validate_layer_type``) returns before it reaches ``mlp_layer_types`` when a
        config has no ``layer_types``, so a word like "moe" passes and builds a dense layer. Here it
        is refused, naming the word."""
        value = self.doc.get(key)
        if value is None:
            return None
        words = " or ".join(map(repr, allowed))
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problems.append(f"{key}: {brief(value)} is not a list of {words}")
            return None
        wrong = next((v for v in value if v not in allowed), None)
        if wrong is not None:
            self.problems.append(f"{key}: {brief(wrong)} is not {words}")
            return None
        if len(value) < least:
            self.problems.append(f"{key}: {len(value):,} entries, the layers need at least {least:,}")
            return None
        return tuple(value)


def split_layer_name(name: str) -> tuple[int, str] | None:
    """``model.layers.5.mlp.gate.weight`` -> ``(5, "mlp.gate.weight")``; None for non-layer names."""
    # String operations, not the regex they implement (model\.layers\.(0|[1-9][0-9]*)\.(.+)): this
    # runs once per tensor, ~60k times for GLM-5.
    if not name.startswith(_LAYER_PREFIX):
        return None
    index, dot, suffix = name[len(_LAYER_PREFIX) :].partition(".")
    if not dot or not suffix or not index.isascii() or not index.isdigit() or (index[0] == "0" and len(index) > 1):
        return None
    try:
        return int(index), suffix
    except ValueError:  # int() refuses more than 4300 digits; no layer of any model has them
        return None


def implausible_counts(layout: ModelLayout, held: int) -> str | None:
    """What is implausible in ``layout`` for a checkpoint holding ``held`` tensors, or None."""
    need = layout.min_tensor_count()
    if need <= plausible_limit(held):
        return None
    n, m = layout.num_hidden_layers, layout.num_mtp_layers
    moe = layout.moe_layers_between(0, n + m)
    declared = f"declares {_number(n)} layers + {_number(m)} MTP layers"
    if moe:
        declared += f" ({_number(moe)} MoE with {_number(layout.n_routed_experts)} routed experts each)"
    if need > MAX_EXPECTED_TENSORS and PLAUSIBLE_FACTOR * held + PLAUSIBLE_SLACK >= need:
        return f"{declared}, at least {_number(need)} tensors, more than the {MAX_EXPECTED_TENSORS:,} an audit expects"
    return f"{declared}, at least {_number(need)} tensors"


def plausible_limit(held: int) -> int:
    """The most names an audit builds for a checkpoint holding ``held`` tensors."""
    return min(PLAUSIBLE_FACTOR * held + PLAUSIBLE_SLACK, MAX_EXPECTED_TENSORS)


def _number(n: int) -> str:
    # A JSON integer may have thousands of digits, and str() refuses past 4300: say its size instead.
    return f"{n:,}" if n < 10**18 else f"about 10^{int(n.bit_length() * 0.30103)}"
