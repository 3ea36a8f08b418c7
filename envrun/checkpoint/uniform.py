"""The weaker check, for an architecture no description covers, and only when asked for by name
(``--trust-uniform-layers``): layers of a kind are alike.

Only the essentials are hard-coded (embedding, final norm, lm_head, per-layer norms, ``o_proj``, the
dense MLP or the router, every routed expert and the shared experts, the MTP head). Everything else a
layer holds is learned from the checkpoint itself: a suffix that at least half the layers of a kind
carry is expected in every layer of that kind. One layer that lost a tensor is then missing it, and
one layer with a stray tensor has an unexpected one — but a tensor lost from *every* layer (the
typical failure of a lenient save with one missing mapping) looks normal, and passes. That is why the
report names this check, and why the audit never falls back to it on its own.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from envrun.checkpoint.architectures import DENSE_MLP, LAYER_NORMS, PROJ
from envrun.checkpoint.expected import Expectation, build_expectation
from envrun.checkpoint.layout import MTP_REQUIRED, ModelLayout, split_layer_name

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
