"""Overrides against verl 0.9.1's real config (from PyPI, through envrun.verlconfig) and merge rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuild.errors import RemoteError
from envbuild.lock.io import read_lock
from envrun.cli.main import main
from envrun.overrides import OverrideError, merge_overrides, validate_overrides
from envrun.recipe import load_recipe, recipe_path
from envrun.verlconfig import VerlWheel, verl_config_dir, verl_wheel_from_lock
from tests.lib.tinyrun import LOCK, tiny_setup

VERL_091 = VerlWheel(
    "verl",
    "0.9.1",
    "verl-0.9.1-py3-none-any.whl",
    "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14",
    "https://pypi.org/simple",
)


def test_merge_last_wins_in_place() -> None:
    merged = merge_overrides(["a=1", "+b=2", "c=3"], ["a=9", "b=8", "d=4", "a=10", "~c"])
    assert merged == ("a=10", "+b=8", "~c", "d=4")


def test_merge_delete_of_an_added_key_drops_it() -> None:
    assert merge_overrides(["+b=2"], ["~b"]) == ()


def test_the_lock_pins_the_verl_wheel() -> None:
    wheel = verl_wheel_from_lock(read_lock(LOCK).lock, str(LOCK))
    assert (wheel.filename, wheel.sha256) == (VERL_091.filename, VERL_091.sha256)


@pytest.fixture(scope="module")
def verl_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def verl_config(verl_cache: Path) -> Path:
    return verl_config_dir(VERL_091, verl_cache)


@pytest.mark.network
def test_verl_091_accepts_every_recipe_override(verl_config: Path) -> None:
    assert (verl_config / "ppo_megatron_trainer.yaml").is_file()
    assert not list(verl_config.parent.parent.parent.glob("verl/*.py"))  # only the config tree is kept
    recipe = load_recipe(recipe_path("grpo-glm5"))
    validate_overrides(
        [
            *recipe.overrides(),
            "actor_rollout_ref.model.path=/m",
            "data.train_files=/d.parquet",
            "data.val_files=/d.parquet",
        ],
        verl_config,
        recipe.config_name,
    )


@pytest.mark.network
def test_cached_config_is_reused_offline(verl_config: Path, verl_cache: Path) -> None:
    assert verl_config_dir(VERL_091, verl_cache, offline=True) == verl_config


@pytest.mark.network
@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "actor_rollout_ref.actor.optim.lrr=1e-5",
            "unknown key actor_rollout_ref.actor.optim.lrr in the verl config; did you mean actor_rollout_ref.actor.optim.lr?",
        ),
        ("trainer.nnode=2", "did you mean trainer.nnodes?"),
        ("+trainer.nnodes=2", "trainer.nnodes already exists"),
        ("trainer.total_epochs=many", "expects a number"),
        ("trainer.nnodes=1,2", "a sweep"),
        ("~trainer.no_such_key", "unknown key trainer.no_such_key"),
        # Reshaping: Hydra composes each of these without a word, and the trainer runs without the section.
        (
            "actor_rollout_ref.actor.checkpoint=x",
            "actor_rollout_ref.actor.checkpoint is a section of the verl config (_target_, async_save,",
        ),
        ("trainer=5", "trainer is a section of the verl config"),
        ("++actor_rollout_ref.actor.optim=null", "actor_rollout_ref.actor.optim is a section"),
        (
            "+data.train_batch_size.x=1",
            "data.train_batch_size is a value in the verl config (1024), not a section; "
            "data.train_batch_size.x would replace it with a section, silently",
        ),
        ("++trainer.nnodes.per_host=2", "trainer.nnodes is a value in the verl config (1), not a section"),
        ("trainer.project_name={a: 1}", "trainer.project_name is a value in the verl config (default 'verl_examples')"),
        # A path through a list: OmegaConf's select raised from the check itself (a traceback, not exit 2).
        ("+trainer.logger.x=1", "trainer.logger is a value in the verl config (['console', 'wandb']), not a section"),
        ("~trainer.logger.x", "not a section; it has no key trainer.logger.x"),
        # A list's items are set in place by number; there are two, and Hydra deletes none of them.
        ("trainer.logger.2=x", "trainer.logger is a list in the verl config (['console', 'wandb']); it has 2 item(s)"),
        ("~trainer.logger.0", "Hydra cannot delete an item of a list; give the whole list (trainer.logger=[...])"),
        ("trainer.logger.0={a: 1}", "trainer.logger.0 is a value in the verl config (default 'console')"),
        # Hydra's own groups pass the key check; the composition judges the option, in Hydra's words.
        ("hydra/job_logging=nosuch", "Could not find 'hydra/job_logging/nosuch'"),
        ("hydra.run.nosuch=1", "unknown key hydra.run.nosuch"),
    ],
)
def test_bad_override_is_named(verl_config: Path, override: str, expected: str) -> None:
    with pytest.raises(OverrideError) as info:
        validate_overrides(["trainer.nnodes=4", override], verl_config, "ppo_megatron_trainer")
    assert expected in str(info.value)
    assert info.value.exit_code == 2


@pytest.mark.network
def test_a_section_merged_a_null_given_a_section_and_an_interpolation_pass(verl_config: Path) -> None:
    validate_overrides(
        [
            "actor_rollout_ref.actor.optim={lr: 0.1}",  # Hydra merges a section into a section
            "trainer.total_training_steps={a: 1}",  # the default is null: either shape may be meant
            "+trainer.total_training_steps.b=2",
            "actor_rollout_ref.actor.checkpoint=${actor_rollout_ref.ref.checkpoint}",  # resolved by the trainer
            "trainer.project_name=null",
            "++ray_kwargs.ray_init.runtime_env.env_vars.X='1'",
        ],
        verl_config,
        "ppo_megatron_trainer",
    )


@pytest.mark.network
def test_an_override_hydra_cannot_parse_is_one_problem_even_with_a_colon_in_it(verl_config: Path) -> None:
    """Its problem once went on to the key check too (found by splitting the problem at ': '), which said
    the section would be replaced by None."""
    broken = "actor_rollout_ref.actor.checkpoint={strict: False"
    with pytest.raises(OverrideError) as info:
        validate_overrides(["trainer.nnodes=4", broken, "trainer.nnodes=1,2"], verl_config, "ppo_megatron_trainer")
    assert info.value.problems == [
        f"{broken}: not a valid Hydra override: no viable alternative at input '{{strict: False'",
        "trainer.nnodes=1,2: a sweep (a,b or range) is not a single run; quote the value or pick one",
    ]


@pytest.mark.network
def test_a_list_item_and_hydras_own_logging_settings_pass(verl_config: Path) -> None:
    """Each is a standard override a real Hydra app takes; the key check once refused all five."""
    validate_overrides(
        [
            "trainer.logger.0=wandb",  # Hydra sets the item in place: ['wandb', 'wandb']
            "trainer.logger.1=console",
            "hydra/job_logging=disabled",  # Hydra's own config groups, not verl's
            "hydra/hydra_logging=disabled",
            "hydra.job_logging.root.level=WARN",  # under the logging config that group fills in
        ],
        verl_config,
        "ppo_megatron_trainer",
    )


@pytest.mark.network
def test_grpo_glm5_dry_run_and_unknown_override_through_the_cli(
    verl_cache: Path, verl_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = tiny_setup(tmp_path)
    args = ["grpo-glm5", "--model", str(tiny.model), "--data", str(tiny.data), "--cache-dir", str(verl_cache), "-q"]
    # The overrides against verl's config, alone: the job probe (verl itself, where the job runs) refuses
    # --nnodes 2 for this parallelism; tests/test_probe.py runs it. The model check asks the job's python3
    # for the lock's transformers, which this one has not: tests/test_auditnames.py runs it.
    args += ["--skip-check", "job-probe", "--skip-check", "model"]
    assert main([*args, "--dry-run", "--json", "--nnodes", "2"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["argv"][:6] == [
        "python3",
        "-m",
        "verl.trainer.main_ppo",
        "--config-name=ppo_megatron_trainer",
        "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_VLLM_ASCEND_GLM52_PATCH='1'",
        "data.train_batch_size=64",
    ]
    assert "trainer.nnodes=2" in plan["argv"] and "trainer.nnodes=32" not in plan["argv"]
    assert "actor_rollout_ref.actor.checkpoint.strict=False" in plan["argv"]
    assert plan["env"] == {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"}
    assert [c["status"] for c in plan["preflight"] if c["name"] == "model"] == ["skip"]

    run_dir = tmp_path / "run"
    assert main([*args, "-o", "trainer.nnode=2", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "trainer.nnode=2: unknown key trainer.nnode" in err and "did you mean trainer.nnodes?" in err
    assert not run_dir.exists()

    assert main([*args, "-o", "+trainer.logger.x=1", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "+trainer.logger.x=1: trainer.logger is a value in the verl config" in err and "Traceback" not in err
    assert not run_dir.exists()


@pytest.mark.network
def test_wrong_sha256_is_refused(tmp_path: Path) -> None:
    wrong = VerlWheel(**{**VERL_091.__dict__, "sha256": "0" * 64})
    with pytest.raises(RemoteError, match="sha256"):
        verl_config_dir(wrong, tmp_path)
    assert not (tmp_path / "verl-config" / ("0" * 64)).exists()
