"""The names a checkpoint must hold, from the architecture and never from the checkpoint itself, and the
one place that chooses where they come from (:func:`expectation`):

- the model's own names (:class:`ExpectedNames`, or a :data:`NameSource` such as
  :class:`envrun.checkpoint.modelnames.ModelNames`): what the modelling code gives, built on the meta
  device by a python that has transformers, so no table here can drift from the code it describes;
- else, where no interpreter is at hand, envrun's static description
  (:mod:`envrun.checkpoint.architectures`, :func:`from_architecture`);
- the weaker check of :func:`from_uniform_layers` only for an architecture neither covers, and only when
  asked for by name (:func:`weak_check`).

Neither source has MTP layers (transformers builds none). They follow the checkpoints' convention
(upstream-facts §4): layers ``N..N+M-1``, each a decoder block like the last decoder layer's (or of
the kind ``mlp_layer_types`` gives it, where the list reaches that far) plus ``enorm``, ``hnorm``,
``eh_proj`` and ``shared_head.norm``; ``shared_head.head`` and ``embed_tokens`` may be there too
(GLM-4.5 stores them). Their absence is tolerated, by name, and reported.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from envbuild.errors import InputError
from envrun.checkpoint.architectures import DENSE_MLP, LAYER_NORMS, PROJ, TRANSFORMERS_VERSION, moe_suffixes
from envrun.checkpoint.layout import MTP_OPTIONAL, MTP_REQUIRED, ModelConfigError, ModelLayout, split_layer_name

Check = Literal["architecture", "model", "uniform-layers"]


@dataclass(frozen=True)
class ExpectedNames:
    """Every tensor name ``save_pretrained`` writes for one config.json, as its modelling code says.

    ``config_sha256`` is the digest of the config.json bytes the names were made from: an audit
    refuses names made from another config than the one it reads."""

    names: frozenset[str]
    source: str  # e.g. "GlmMoeDsaForCausalLM of transformers 5.10.4 on the meta device (torch 2.13.0)"
    config_sha256: str
    transformers: str = ""  # the version that made them, when a model did


# A source of names the audit calls once it knows what the checkpoint holds: the config.json bytes it
# read, and the most names it will accept for them (see layout.plausible_limit).
NameSource = Callable[[bytes, int], ExpectedNames]


@dataclass(frozen=True)
class Expectation:
    """What must, may and may not be present, and where that knowledge came from."""

    required: frozenset[str]  # outside the MTP layers: absence is a loss
    mtp_required: frozenset[str]  # in the MTP layers: absence is tolerated, but reported
    allowed: frozenset[str]  # may be present, need not be
    check: Check
    source: str
    # Per decoder layer, the suffixes it requires, and which layers are MoE: to report a loss by
    # tensor and layers ("self_attn.indexer.* in all 78 layers") rather than name by name.
    layer_suffixes: Mapping[int, frozenset[str]] = field(default_factory=dict)
    moe_layers: frozenset[int] = frozenset()


class UnsupportedArchitectureError(ModelConfigError):
    """No description of the architecture: completeness cannot be checked (exit 2)."""


def weak_check(layout: ModelLayout, config_path: Path, have_names: bool, trust: bool) -> str:
    """Why only the uniform-layers check can run ("" when a stronger one can); refused unless trusted.
    Decided from config.json alone, before a shard is read."""
    if not layout.unsupported or (have_names and layout.quantization is None):
        return ""
    if trust:
        return layout.unsupported
    # The model's own names help only an architecture no description covers: transformers builds a
    # quantised model's weights unquantised, and no scale is among its names.
    helps = not have_names and layout.quantization is None
    fix = "give it the model's own names (--model-python PYTHON) or " if helps else ""
    raise UnsupportedArchitectureError(
        f"{config_path}: {layout.unsupported}: the audit cannot check that the checkpoint is complete; "
        f"{fix}ask for the weaker check by name (--trust-uniform-layers: layers alike, so a tensor lost "
        "from every layer passes)"
    )


def expectation(
    layout: ModelLayout,
    config: bytes,
    config_path: Path,
    names: ExpectedNames | NameSource | None,
    *,
    weak: str,
    present: frozenset[str],
    max_names: int,
) -> Expectation:
    """What an audit checks the checkpoint against: the model's own ``names`` when given (a source is asked
    for at most ``max_names``), else the static description; the uniform layers of ``present`` when
    :func:`weak_check` gave a reason."""
    if weak:
        return from_uniform_layers(layout, present, weak)
    if names is None:
        return from_architecture(layout)
    given = names if isinstance(names, ExpectedNames) else names(config, max_names)
    if given.config_sha256 != hashlib.sha256(config).hexdigest():
        raise InputError(f"{config_path}: the expected names were made from another config.json")
    return from_model_names(layout, given)


def from_architecture(layout: ModelLayout) -> Expectation:
    """The complete name set of ``layout``'s architecture (which must have one)."""
    arch = layout.architecture
    if arch is None or layout.unsupported:
        raise ValueError(f"no architecture describes {layout.model_type}: {layout.unsupported}")
    block = (*LAYER_NORMS, *layout.attention_suffixes())
    kinds = {False: frozenset((*block, *DENSE_MLP)), True: frozenset((*block, *moe_suffixes(layout.n_routed_experts)))}
    n = layout.num_hidden_layers
    per_layer = {i: kinds[layout.is_moe(i)] for i in range(n)}
    mtp = {i: kinds[layout.is_moe(i)] | frozenset(MTP_REQUIRED) for i in layout.mtp_layers}
    source = f"the {arch.model_type} modelling code of transformers {TRANSFORMERS_VERSION} (envrun's description)"
    return build_expectation(layout, per_layer, mtp, None, "architecture", source)


def from_model_names(layout: ModelLayout, expected: ExpectedNames) -> Expectation:
    """The names the model gave, with the MTP layers the model does not build added by convention.

    A transformers that does build MTP layers (none does for these types in 5.10.4) gives their names
    too: they are taken as they are, and stay tolerated like every MTP layer."""
    n, mtp_layers = layout.num_hidden_layers, set(layout.mtp_layers)
    per_layer: dict[int, set[str]] = {}
    built_mtp: dict[int, set[str]] = {}
    top: set[str] = set()
    for name in expected.names:
        split = split_layer_name(name)
        if split is not None and split[0] < n:
            per_layer.setdefault(split[0], set()).add(split[1])
        elif split is not None and split[0] in mtp_layers:
            built_mtp.setdefault(split[0], set()).add(split[1])
        else:
            top.add(name)
    frozen = {i: frozenset(s) for i, s in per_layer.items()}
    mtp: dict[int, frozenset[str]] = {i: frozenset(s) for i, s in built_mtp.items()}
    if n - 1 in frozen:
        last_moe = _is_moe(frozen[n - 1])
        for i in sorted(mtp_layers - mtp.keys()):
            typed = layout.mlp_layer_types is not None and i < len(layout.mlp_layer_types)
            want_moe = layout.is_moe(i) if typed else last_moe
            like = next((j for j in range(n - 1, -1, -1) if j in frozen and _is_moe(frozen[j]) == want_moe), n - 1)
            mtp[i] = frozen[like] | frozenset(MTP_REQUIRED)
    return build_expectation(layout, frozen, mtp, frozenset(top), "model", expected.source)


def build_expectation(
    layout: ModelLayout,
    per_layer: Mapping[int, frozenset[str]],
    mtp: Mapping[int, frozenset[str]],
    top: frozenset[str] | None,
    check: Check,
    source: str,
) -> Expectation:
    top_required, allowed_top = layout.top_level()
    required = set(top_required if top is None else top)
    allowed = set(allowed_top) - required
    required.update(f"model.layers.{i}.{s}" for i, suffixes in per_layer.items() for s in suffixes)
    allowed.update(f"model.layers.{i}.{s}" for i in mtp for s in MTP_OPTIONAL)
    return Expectation(
        required=frozenset(required),
        mtp_required=frozenset(f"model.layers.{i}.{s}" for i, suffixes in mtp.items() for s in suffixes),
        allowed=frozenset(allowed),
        check=check,
        source=source,
        layer_suffixes=per_layer,
        moe_layers=frozenset(i for i, s in per_layer.items() if _is_moe(s)),
    )


def _is_moe(suffixes: frozenset[str]) -> bool:
    return "mlp.gate.weight" in suffixes


# The weaker check, for an architecture no description covers, and only when asked for by name
# (--trust-uniform-layers): layers of a kind are alike. Only the essentials are hard-coded (embedding,
# final norm, lm_head, per-layer norms, o_proj, the dense MLP or the router, every routed expert and the
# shared experts, the MTP head); everything else a layer holds is learned from the checkpoint itself: a
# suffix that at least half the layers of a kind carry is expected in every layer of that kind. One
# layer that lost a tensor is then missing it, and one layer with a stray tensor has an unexpected one,
# but a tensor lost from *every* layer (the typical failure of a lenient save with one missing mapping)
# looks normal, and passes. That is why the report names this check, and why the audit never falls
# back to it on its own.

WEAKNESS = "learned from the checkpoint's own layers: a tensor lost from every layer of a kind is not caught"


def essential_suffixes(layout: ModelLayout, layer: int) -> frozenset[str]:
    """Tensors a decoder layer cannot do without, whatever the model family."""
    names = set(LAYER_NORMS) | {"self_attn.o_proj.weight"}
    if layout.is_moe(layer):
        names.add("mlp.gate.weight")
        names.update(f"mlp.experts.{e}.{p}.weight" for e in range(layout.n_routed_experts) for p in PROJ)
        if layout.n_shared_experts:
            names.update(f"mlp.shared_experts.{p}.weight" for p in PROJ)
    else:
        names.update(DENSE_MLP)
    return frozenset(names)


def from_uniform_layers(layout: ModelLayout, present: Iterable[str], reason: str) -> Expectation:
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
        return shared_ref | mlp_ref[layout.is_moe(layer)] | essential_suffixes(layout, layer)

    per_layer = {i: block(i) for i in range(n)}
    mtp = {i: block(i) | frozenset(MTP_REQUIRED) for i in layout.mtp_layers}
    source = f"uniform layers (--trust-uniform-layers; {reason}): {WEAKNESS}"
    return build_expectation(layout, per_layer, mtp, None, "uniform-layers", source)


def _majority(suffix_sets: list[set[str]]) -> frozenset[str]:
    # "At least half" rather than "more than half": on a tie (two layers, one lacking a tensor)
    # reporting the tensor missing is the safer mistake for a guard against lost weights.
    counts = Counter(s for suffixes in suffix_sets for s in suffixes)
    return frozenset(s for s, c in counts.items() if 2 * c >= len(suffix_sets))
