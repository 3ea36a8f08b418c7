"""Recipe files: the shipped grpo-glm5 recipe as data, and strict line-numbered errors for bad ones."""

from __future__ import annotations

import pytest

from envrun.recipe import (
    RecipeError,
    load_recipe,
    override_key,
    parse_recipe,
    recipe_path,
    shipped_recipes,
)

# upstream-facts §3: one override from each group, as Hydra receives it.
UPSTREAM_SAMPLES = (
    "+data.apply_chat_template_kwargs.enable_thinking=False",
    "actor_rollout_ref.nccl_timeout=7200",
    "algorithm.rollout_correction.rollout_rs_threshold=0.6_1.6",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.pipeline_model_parallel_layout=Et*10|t*12|t*8|t*8|t*12|t*12|t*12|t*4L",
    "actor_rollout_ref.ref.megatron.expert_model_parallel_size=64",
    "++actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.enable_cpu_binding=True",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes=[2, 4, 8, 16, 24, 32, 64]",
    'trainer.logger=["console"]',
    "trainer.nnodes=32",
)


def test_shipped_recipe_holds_the_whole_job() -> None:
    assert "grpo-glm5" in shipped_recipes()
    recipe = load_recipe(recipe_path("grpo-glm5"))
    overrides = recipe.overrides()
    assert recipe.entry_point == ("python3", "-m", "verl.trainer.main_ppo")
    assert recipe.config_name == "ppo_megatron_trainer"
    assert [g.group for g in recipe.override_groups] == [
        "data",
        "model",
        "actor",
        "ref",
        "rollout",
        "algorithm",
        "trainer",
    ]
    assert overrides[0] == "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_VLLM_ASCEND_GLM52_PATCH='1'"
    assert recipe.runtime_env == {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"}
    for sample in UPSTREAM_SAMPLES:
        assert sample in overrides
    assert recipe.lenient_checkpoint is not None
    assert recipe.lenient_checkpoint.override == "actor_rollout_ref.actor.checkpoint.strict=False"
    assert recipe.lenient_checkpoint.guard == "checkpoint-audit"
    assert "MTP" in recipe.lenient_checkpoint.reason
    assert len(overrides) == len({override_key(o) for o in overrides}) == 121
    assert recipe.parameters["model"] == "actor_rollout_ref.model.path"
    # Plain values only: a Ray worker resolves the config again, where Hydra's ${now:} does not exist; the
    # run's directories are envrun's to give.
    assert not [o for o in overrides if "${" in o]
    assert recipe.outputs == {
        "trainer.default_local_dir": "ckpts",
        "trainer.rollout_data_dir": "rollout_data/{run_id}",
    }
    assert recipe.entry_module == "verl.trainer.main_ppo" and recipe.probe is not None
    assert all(s.reason for s in recipe.probe.skip_imports)


MINIMAL = """\
recipe: 1
name: tiny
entry_point: [python3, -m, tiny]
config_name: tiny
override_groups:
- group: trainer
  overrides:
  - trainer.nnodes=1
"""


def test_minimal_recipe_parses() -> None:
    recipe = parse_recipe(MINIMAL, "tiny.yaml")
    assert recipe.overrides() == ("trainer.nnodes=1",)
    assert recipe.lenient_checkpoint is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MINIMAL + "colour: red\n", "tiny.yaml:9: colour: unknown key"),
        (MINIMAL.replace("recipe: 1", "recipe: 2"), "tiny.yaml:1: recipe: expected one of 1"),
        (MINIMAL + "  - trainer nnodes 2\n", "is not a Hydra override"),
        (MINIMAL + "  - trainer.nnodes=2\n", "trainer.nnodes is set twice"),
        (MINIMAL + "parameters: {weights: model.path}\n", "unknown parameter 'weights'"),
        (MINIMAL + "runtime_env: {1BAD: x}\n", "not a valid environment variable name"),
        (MINIMAL.replace("config_name: tiny\n", ""), "config_name: required key is missing"),
        (MINIMAL + "outputs: {trainer.ckpt: ../up}\n", "not a relative directory"),
        (MINIMAL + "outputs: {trainer.nnodes: ckpts}\n", "trainer.nnodes is set by envrun"),
        (MINIMAL.replace("[python3, -m, tiny]", "[trainer]") + "probe: {}\n", "needs an entry point [python3, -m"),
        (MINIMAL + "probe: {skip_imports: [{name: vllm, reason: ' '}]}\n", "must say why"),
        (MINIMAL + "probe: {skip_imports: [{name: 'a b', reason: x}]}\n", "a dotted module name"),
        ("recipe: [1\n", "not valid YAML"),
        ("", "empty file"),
    ],
)
def test_bad_recipes_are_named_with_their_line(text: str, expected: str) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "tiny.yaml")
    assert expected in str(info.value)
    assert info.value.exit_code == 2


def test_every_problem_is_reported_at_once() -> None:
    text = MINIMAL.replace("\nname: tiny", "\nname: Tiny Recipe") + "colour: red\n"
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "tiny.yaml")
    assert len(info.value.problems) == 2
