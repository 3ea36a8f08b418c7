"""envrun.checkpoint.layout: the arithmetic that lets a declared layout be checked before names exist."""

from __future__ import annotations

import itertools

import pytest

from envrun.checkpoint.layout import (
    EMBED,
    FINAL_NORM,
    LM_HEAD,
    MAX_EXPECTED_TENSORS,
    MTP_REQUIRED,
    PLAUSIBLE_FACTOR,
    PLAUSIBLE_SLACK,
    ModelLayout,
    implausible_counts,
    split_layer_name,
)


def layout(**kw: int | bool) -> ModelLayout:
    values: dict[str, int | bool] = dict(
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


def essential_names(lay: ModelLayout) -> set[str]:
    """The names min_tensor_count counts, enumerated one by one."""
    names = {EMBED, FINAL_NORM} | (set() if lay.tie_word_embeddings else {LM_HEAD})
    for i in range(lay.num_hidden_layers + lay.num_mtp_layers):
        suffixes = set(lay.essential_suffixes(i)) | (set(MTP_REQUIRED) if i in lay.mtp_layers else set())
        names.update(f"model.layers.{i}.{s}" for s in suffixes)
    return names


GRID = itertools.product(
    [1, 2, 5, 9],  # layers
    [0, 1, 2],  # MTP layers
    [0, 1, 3, 12],  # first_k_dense_replace, past the last layer too
    [0, 1, 3],  # routed experts
    [0, 2],  # shared experts
    [1, 2, 3],  # moe_layer_freq
    [False, True],  # tied
)


def test_min_tensor_count_is_the_number_of_essential_names() -> None:
    for n, m, k, e, shared, freq, tied in GRID:  # 1,728 layouts, enumerated against counted
        lay = layout(
            num_hidden_layers=n,
            num_mtp_layers=m,
            first_k_dense_replace=k,
            n_routed_experts=e,
            n_shared_experts=shared,
            moe_layer_freq=freq,
            tie_word_embeddings=tied,
        )
        assert lay.min_tensor_count() == len(essential_names(lay)), lay
        for start, stop in [(0, n), (n, n + m), (0, n + m), (2, 1)]:
            assert lay.moe_layers_between(start, stop) == sum(lay.is_moe(i) for i in range(start, stop)), lay


def test_counts_of_any_size_cost_nothing() -> None:
    lay = layout(num_hidden_layers=10**4000, n_routed_experts=10**4000)
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
