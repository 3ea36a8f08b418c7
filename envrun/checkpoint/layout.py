"""What a DeepSeek-V3 / GLM-MoE (glm_moe_dsa) checkpoint should hold, from config.json and the names present.

Only the essentials are hard-coded (embedding, final norm, lm_head, per-layer norms, the dense MLP or
the router, every routed expert and the shared experts, the MTP head tensors). Everything else a
layer holds (attention variants, indexers, quantisation scales) differs between model families and
releases, so it is learned from the checkpoint itself: a suffix that at least half the layers of a
kind carry is expected in every layer of that kind. One layer that lost a tensor is then missing it,
and one layer with a stray tensor has an unexpected one, without a table per model.

config.json is hostile input like the rest of a checkpoint: it is read through
:mod:`envrun.checkpoint.untrusted`, and what it declares is checked against what the checkpoint holds
(:func:`implausible_counts`) before a single expected name is generated, so that a 100-byte file
declaring a billion layers is refused instead of filling memory with names.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import InputError
from envrun.checkpoint.untrusted import JSONLimitError, MiB, brief, load_json, read_limited

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"

LAYER_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
PROJ = ("gate_proj", "up_proj", "down_proj")
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


class ModelConfigError(InputError):
    """config.json is missing, not JSON, or lacks what the audit needs."""


@dataclass(frozen=True)
class ModelLayout:
    """The layer plan of a checkpoint, as config.json declares it."""

    num_hidden_layers: int
    num_mtp_layers: int
    first_k_dense_replace: int
    n_routed_experts: int
    n_shared_experts: int
    moe_layer_freq: int
    tie_word_embeddings: bool
    model_type: str | None = None

    @property
    def mtp_layers(self) -> tuple[int, ...]:
        n = self.num_hidden_layers
        return tuple(range(n, n + self.num_mtp_layers))

    def is_moe(self, layer: int) -> bool:
        # DeepSeek's rule (modeling_deepseek): MoE from first_k_dense_replace on, every moe_layer_freq-th.
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    def moe_layers_between(self, start: int, stop: int) -> int:
        """How many of the layers ``start..stop-1`` are MoE layers, without counting them one by one."""
        first = max(start, self.first_k_dense_replace)
        if self.n_routed_experts == 0 or first >= stop:
            return 0
        freq = self.moe_layer_freq  # multiples of freq in [first, stop)
        return (stop - 1) // freq - (first - 1) // freq

    def min_tensor_count(self) -> int:
        """How many names :func:`derive_expectation` requires at the least: the essentials of every
        layer, MTP layers included. Arithmetic only, so any declared count costs nothing to check."""
        n, m = self.num_hidden_layers, self.num_mtp_layers
        dense = len(LAYER_NORMS) + 1 + len(PROJ)
        moe = len(LAYER_NORMS) + 1 + 1 + len(PROJ) * self.n_routed_experts + (len(PROJ) if self.n_shared_experts else 0)
        moe_layers = self.moe_layers_between(0, n + m)
        top = 2 + (0 if self.tie_word_embeddings else 1)  # embedding, final norm, lm_head
        return top + (n + m - moe_layers) * dense + moe_layers * moe + m * len(MTP_REQUIRED)

    def essential_suffixes(self, layer: int) -> frozenset[str]:
        """Tensors a decoder layer cannot do without, whatever the model family."""
        names = set(LAYER_NORMS) | {"self_attn.o_proj.weight"}
        if self.is_moe(layer):
            names.add("mlp.gate.weight")
            names.update(f"mlp.experts.{e}.{p}.weight" for e in range(self.n_routed_experts) for p in PROJ)
            if self.n_shared_experts:
                names.update(f"mlp.shared_experts.{p}.weight" for p in PROJ)
        else:
            names.update(f"mlp.{p}.weight" for p in PROJ)
        return frozenset(names)


def load_layout(config_path: Path) -> ModelLayout:
    """Read the layer plan from ``config_path``; every problem is reported at once, naming the file."""

    def fail(message: str) -> ModelConfigError:
        return ModelConfigError(f"{config_path}: {message}")

    if not os.path.lexists(config_path):
        raise fail("not found; a Hugging Face model directory needs config.json")
    raw = read_limited(config_path, MAX_CONFIG_BYTES, "a config.json", fail)
    try:
        doc = load_json(raw, max_containers=MAX_CONFIG_CONTAINERS)
    except JSONLimitError as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise fail(f"not readable JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ModelConfigError(f"{config_path}: a JSON {type(doc).__name__}, expected an object")

    problems: list[str] = []

    def count(key: str, default: int | None, *aliases: str, minimum: int = 0) -> int:
        for k in (key, *aliases):
            if k in doc and doc[k] is not None:
                value = doc[k]
                if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                    problems.append(f"{k}: {brief(value)} is not an integer >= {minimum}")
                    return minimum
                return value
        if default is None:
            problems.append(f"{key}: required")
            return minimum
        return default

    layout = ModelLayout(
        num_hidden_layers=count("num_hidden_layers", None, minimum=1),
        num_mtp_layers=count("num_nextn_predict_layers", 0, "num_mtp_layers"),
        first_k_dense_replace=count("first_k_dense_replace", 0),
        n_routed_experts=count("n_routed_experts", 0),
        # DeepSeek-V3 and GLM-MoE configs always carry it; absent means the usual one shared expert.
        n_shared_experts=count("n_shared_experts", 1),
        moe_layer_freq=count("moe_layer_freq", 1, minimum=1),
        tie_word_embeddings=_flag(doc, "tie_word_embeddings", problems),
        model_type=doc.get("model_type") if isinstance(doc.get("model_type"), str) else None,
    )
    if problems:
        raise ModelConfigError(f"{config_path}: " + "; ".join(problems))
    return layout


def _flag(doc: dict[str, object], key: str, problems: list[str]) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        problems.append(f"{key}: {brief(value)} is not true or false")
        return False
    return value


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
    if need <= min(PLAUSIBLE_FACTOR * held + PLAUSIBLE_SLACK, MAX_EXPECTED_TENSORS):
        return None
    n, m = layout.num_hidden_layers, layout.num_mtp_layers
    moe = layout.moe_layers_between(0, n + m)
    declared = f"declares {_number(n)} layers + {_number(m)} MTP layers"
    if moe:
        declared += f" ({_number(moe)} MoE with {_number(layout.n_routed_experts)} routed experts each)"
    if need > MAX_EXPECTED_TENSORS and PLAUSIBLE_FACTOR * held + PLAUSIBLE_SLACK >= need:
        return f"{declared}, at least {_number(need)} tensors, more than the {MAX_EXPECTED_TENSORS:,} an audit expects"
    return f"{declared}, at least {_number(need)} tensors"


def _number(n: int) -> str:
    # A JSON integer may have thousands of digits, and str() refuses past 4300: say its size instead.
    return f"{n:,}" if n < 10**18 else f"about 10^{int(n.bit_length() * 0.30103)}"


@dataclass(frozen=True)
class Expectation:
    """What must, may and may not be present, derived from the layout and the names found."""

    required: frozenset[str]  # outside the MTP layers: absence is a loss
    mtp_required: frozenset[str]  # in the MTP layers: absence is tolerated, but reported
    allowed: frozenset[str]  # may be present, need not be


def derive_expectation(layout: ModelLayout, present: Iterable[str]) -> Expectation:
    """Expected names for ``layout``, learning the non-essential suffixes from ``present``."""
    n = layout.num_hidden_layers
    by_layer: dict[int, set[str]] = defaultdict(set)
    for name in present:
        split = split_layer_name(name)
        if split is not None and split[0] < n:
            by_layer[split[0]].add(split[1])

    # Attention and norms are compared across all main layers, the MLP within its kind: a single
    # dense layer still has its attention checked against the other 77.
    shared_ref = _majority([{s for s in by_layer[i] if not s.startswith("mlp.")} for i in range(n)])
    mlp_ref = {
        moe: _majority([{s for s in by_layer[i] if s.startswith("mlp.")} for i in range(n) if layout.is_moe(i) == moe])
        for moe in (False, True)
    }

    def block(layer: int) -> frozenset[str]:
        return shared_ref | mlp_ref[layout.is_moe(layer)] | layout.essential_suffixes(layer)

    required = {EMBED, FINAL_NORM}
    allowed: set[str] = set()
    (allowed if layout.tie_word_embeddings else required).add(LM_HEAD)
    for i in range(n):
        required.update(f"model.layers.{i}.{s}" for s in block(i))
    mtp_required: set[str] = set()
    for i in layout.mtp_layers:
        mtp_required.update(f"model.layers.{i}.{s}" for s in block(i) | set(MTP_REQUIRED))
        allowed.update(f"model.layers.{i}.{s}" for s in MTP_OPTIONAL)
    return Expectation(frozenset(required), frozenset(mtp_required), frozenset(allowed))


def _majority(suffix_sets: list[set[str]]) -> frozenset[str]:
    # "At least half" rather than "more than half": on a tie (two layers, one lacking a tensor)
    # reporting the tensor missing is the safer mistake for a guard against lost weights.
    counts = Counter(s for suffixes in suffix_sets for s in suffixes)
    return frozenset(s for s, c in counts.items() if 2 * c >= len(suffix_sets))
