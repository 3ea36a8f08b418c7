"""The run plan and the dry run: argv exactly as Hydra receives it, env, preflight; bad input stops early.

Most tests use a tiny recipe with a tiny Hydra config of their own (another recipe is another file),
so they need no network; the grpo-glm5 recipe against verl's real config is in test_overrides.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envrun.cli_run import main_for_tests
from envrun.plan import RunParameters, build_plan, hydra_string
from envrun.recipe import load_recipe, recipe_path
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint
from tests.lib.tinyrun import LOCK, Tiny, dry_run_json, tiny_setup


def test_dry_run_json_is_the_full_command(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    plan = dry_run_json(tiny, capsys, "--entry-point", "python3 -m tiny.main", "--nnodes", "2", "-o", "data.batch=16")
    assert list(plan)[:4] == ["argv", "env", "backend", "preflight"]
    assert plan["argv"] == [
        "python3",
        "-m",
        "tiny.main",
        "--config-name=tiny",
        "++ray_kwargs.ray_init.runtime_env.env_vars.TINY_PATCH='1'",
        "data.batch=16",  # the user's -o replaced the recipe's, in its place
        "+data.extra.deep=x y",  # as Hydra receives it: no shell quoting
        'trainer.logger=["console"]',
        "trainer.total_epochs=2",
        "ckpt.strict=False",
        f"model.path={tiny.model}",
        f"data.train_files={tiny.data}",
        f"data.val_files={tiny.data}",
        "trainer.nnodes=2",
    ]
    assert plan["env"] == {"TINY_PATCH": "1"}
    assert plan["backend"] == "local"
    assert {c["name"]: c["status"] for c in plan["preflight"]} == {
        "image-lock-label": "skip",
        "npus": "skip",
        "model": "ok",
        "data": "ok",
    }
    assert plan["lock"]["sha256"] == __import__("hashlib").sha256(LOCK.read_bytes()).hexdigest()


def test_dry_run_text(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_for_tests(tiny.args("--dry-run")) == 0
    out = capsys.readouterr().out
    assert "--config-name=tiny" in out and "ok   model:" in out


def test_hydra_string_quotes_only_what_needs_it() -> None:
    assert hydra_string("/data/a-b_c.parquet") == "/data/a-b_c.parquet"
    assert hydra_string("/data/my file,v2.parquet") == "'/data/my file,v2.parquet'"
    assert hydra_string("/data/it's") == "'/data/it\\'s'"
    assert hydra_string("123") == "'123'"


def test_user_value_wins_and_keeps_the_recipes_plus(tiny: Tiny) -> None:
    recipe = load_recipe(tiny.recipe)
    params = RunParameters(model=tiny.model, train_files=(tiny.data,), overrides=("data.extra.deep=z", "~data.batch"))
    plan = build_plan(recipe, params, "lock.yaml", b"lock")
    assert "+data.extra.deep=z" in plan.overrides
    assert "~data.batch" in plan.overrides and "data.batch=4" not in plan.overrides


def test_model_is_required(tiny: Tiny) -> None:
    recipe = load_recipe(recipe_path("grpo-glm5"))
    with pytest.raises(Exception, match="--model is required"):
        build_plan(recipe, RunParameters(train_files=(tiny.data,)), "lock.yaml", b"")


def test_missing_model_dir_stops_before_anything(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    args = tiny.args("--run-dir", str(tiny.tmp / "run"))
    args[args.index("--model") + 1] = str(tiny.tmp / "nowhere")
    assert main_for_tests(args) == 2
    err = capsys.readouterr().err
    assert "preflight failed, nothing started" in err and "nowhere: not a directory" in err
    assert not (tiny.tmp / "run").exists()


def test_non_parquet_data_is_refused(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    (tiny.tmp / "train.parquet").write_text("a,b\n1,2\n")
    assert main_for_tests(tiny.args("--run-dir", str(tiny.tmp / "run"))) == 2
    assert "not a parquet file" in capsys.readouterr().err
    assert not (tiny.tmp / "run").exists()


def test_truncated_shard_is_refused(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    shard = sorted(tiny.model.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:20])
    assert main_for_tests(tiny.args("--run-dir", str(tiny.tmp / "run"))) == 2
    err = capsys.readouterr().err
    assert "model:" in err and shard.name in err
    assert not (tiny.tmp / "run").exists()


def test_lost_lm_head_fails_the_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = tiny_setup(tmp_path)
    for f in tiny.model.iterdir():
        f.unlink()
    write_checkpoint(tiny.model, CheckpointSpec(include_mtp=False), drop=["lm_head.weight"])
    assert main_for_tests(tiny.args("--dry-run")) == 2
    assert "lm_head.weight" in capsys.readouterr().err


def test_unknown_override_names_the_key_offline(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_for_tests(tiny.args("-o", "trainer.nnode=3", "--run-dir", str(tiny.tmp / "run"))) == 2
    err = capsys.readouterr().err
    assert "unknown key trainer.nnode" in err and "did you mean trainer.nnodes?" in err
    assert not (tiny.tmp / "run").exists()
