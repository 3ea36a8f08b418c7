"""The names a checkpoint must hold, from the architecture and never from the checkpoint itself.

Two sources, one result (:class:`Expectation`):

- :func:`from_architecture`: the static description of :mod:`envrun.checkpoint.architectures`, for
  the host, where there is no torch;
- :func:`from_model_names`: the names the modelling code itself gives, built on the meta device by a
  python that has transformers (:mod:`envrun.checkpoint.modelnames`), so no table here can drift from
  the code it describes.

Neither source has MTP layers (transformers builds none). They follow the checkpoints' convention
(upstream-facts §4): layers ``N..N+M-1``, each a decoder block like the last decoder layer's (or of
the kind ``mlp_layer_types`` gives it, where the list reaches that far) plus ``enorm``, ``hnorm``,
``eh_proj`` and ``shared_head.norm``; ``shared_head.head`` and ``embed_tokens`` may be there too
(GLM-4.5 stores them). Their absence is tolerated, by name, and reported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from envrun.checkpoint.architectures import DENSE_MLP, LAYER_NORMS, TRANSFORMERS_VERSION, moe_suffixes
from envrun.checkpoint.layout import MTP_OPTIONAL, MTP_REQUIRED, ModelLayout, split_layer_name

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


def asked_once(source: NameSource) -> NameSource:
    """``source``, asked once per config.json: the exports of one run (``global_step_*``) share their
    model's config, and each answer costs seconds (an interpreter importing torch, in a container for an
    image). An answer is reused only within the limit a later question sets, so the limit still refuses
    a model larger than that checkpoint makes plausible."""
    answers: dict[bytes, ExpectedNames] = {}

    def ask(config: bytes, max_names: int) -> ExpectedNames:
        known = answers.get(config)
        if known is not None and len(known.names) <= max_names:
            return known
        answers[config] = names = source(config, max_names)
        return names

    return ask


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
    for i, suffixes in per_layer.items():
        prefix = f"model.layers.{i}."
        required.update(prefix + s for s in suffixes)
    mtp_required: set[str] = set()
    for i, suffixes in mtp.items():
        prefix = f"model.layers.{i}."
        mtp_required.update(prefix + s for s in suffixes)
        allowed.update(prefix + s for s in MTP_OPTIONAL)
    return Expectation(
        required=frozenset(required),
        mtp_required=frozenset(mtp_required),
        allowed=frozenset(allowed),
        check=check,
        source=source,
        layer_suffixes=per_layer,
        moe_layers=frozenset(i for i, s in per_layer.items() if _is_moe(s)),
    )


def _is_moe(suffixes: frozenset[str]) -> bool:
    return "mlp.gate.weight" in suffixes
