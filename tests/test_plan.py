"""The run plan and the dry run: argv exactly as Hydra receives it, env, preflight; bad input stops early.

Most tests use a tiny recipe with a tiny Hydra config of their own (another recipe is another file),
so they need no network; the grpo-glm5 recipe against verl's real config is in test_overrides.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from envbuild.errors import InputError
from envrun.cli.main import main
from envrun.overrides import OverrideError
from envrun.plan import RunParameters, build_plan, hydra_string
from envrun.preflight import PreflightError
from envrun.prepare import prepare_run
from envrun.recipe import load_recipe, recipe_path
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint
from tests.lib.tinyrun import LOCK, Tiny, tiny_setup


def test_dry_run_plan_is_the_full_command(tiny: Tiny) -> None:
    request = tiny.request(
        dry_run=True, entry_point=("python3", "-m", "tiny.main"), nnodes=2, overrides=("data.batch=16",)
    )
    plan = prepare_run(request).plan
    assert list(plan.argv) == [
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
        f"hydra.run.dir={plan.run_dir / 'hydra'}",  # local: Hydra's own record in the run, not in the caller's cwd
        f"model.path={tiny.model}",
        f"data.train_files={tiny.data}",
        f"data.val_files={tiny.data}",
        "trainer.nnodes=2",
    ]
    assert plan.env == {"TINY_PATCH": "1"}
    assert plan.backend == "local"
    assert {c.name: c.status for c in plan.preflight} == {
        "image-lock-label": "skip",
        "image-platform": "skip",
        "npus": "skip",
        "model": "ok",
        "data": "ok",
        "job-probe": "skip",  # the tiny recipe has no probe
    }
    assert plan.lock_sha256 == hashlib.sha256(LOCK.read_bytes()).hexdigest()


def test_dry_run_text_through_the_cli(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(tiny.args("--dry-run")) == 0
    out = capsys.readouterr().out
    assert "--config-name=tiny" in out and "ok   model:" in out


def test_dry_run_json_through_the_cli(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(tiny.args("--dry-run", "--json", "--nnodes", "2")) == 0
    plan = json.loads(capsys.readouterr().out)
    assert list(plan)[:4] == ["argv", "env", "backend", "preflight"]
    (model,) = [line for line in plan["preflight"] if line["name"] == "model"]
    assert "trainer.nnodes=2" in plan["argv"] and model["name"] == "model" and model["status"] == "ok"
    # The tiny lock pins no transformers: the names are envrun's description, and the line says so.
    names = "the glm_moe_dsa modelling code of transformers 5.10.4 (envrun's description)"
    assert model["detail"] == f"{tiny.model}: checkpoint audit ok (only MTP layers may be absent); names: {names}"
    assert model["facts"] == {"check": "architecture", "expected_from": names}


def test_hydra_string_quotes_only_what_needs_it() -> None:
    assert hydra_string("/data/a-b_c.parquet") == "/data/a-b_c.parquet"
    assert hydra_string("/data/my file,v2.parquet") == "'/data/my file,v2.parquet'"
    assert hydra_string("/data/it's") == "'/data/it\\'s'"
    assert hydra_string("123") == "'123'"
    assert hydra_string("/data/x\\y/z") == "'/data/x\\y/z'"  # a backslash is itself, not doubled


def test_hydra_string_reads_back_exactly_through_the_real_hydra(tmp_path: Path) -> None:
    """Every string of up to 4 characters from backslash, quote, `$`, braces, comma, space and a letter,
    and real paths, composed by Hydra and OmegaConf as the trainer composes them: the same string back."""
    from itertools import product

    from hydra import compose, initialize_config_dir

    (tmp_path / "c.yaml").write_text("v: {}\n")
    values = ["/data/x\\y/z", "C:\\data\\", "/data/it's/${x}", "a\nb\\", "1e3", "-1.5E+2", "+inf", "NaN", "null"]
    values += ["".join(chars) for n in range(1, 5) for chars in product("\\'${}, a", repeat=n)]
    values += ["".join(chars) for n in range(1, 4) for chars in product("1e.-+_in", repeat=n)]  # numbers or not
    overrides = [f"+v.k{i}={hydra_string(value)}" for i, value in enumerate(values)]
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        config = compose("c", overrides=overrides)
    assert [config.v[f"k{i}"] for i in range(len(values))] == values


def test_user_value_wins_and_keeps_the_recipes_plus(tiny: Tiny) -> None:
    recipe = load_recipe(tiny.recipe)
    params = RunParameters(model=tiny.model, train_files=(tiny.data,), overrides=("data.extra.deep=z", "~data.batch"))
    plan = build_plan(recipe, params, "lock.yaml", "0" * 64, Path("runs/tiny-1"))
    assert "+data.extra.deep=z" in plan.overrides
    assert "~data.batch" in plan.overrides and "data.batch=4" not in plan.overrides


def test_model_is_required(tiny: Tiny) -> None:
    recipe = load_recipe(recipe_path("grpo-glm5"))
    with pytest.raises(Exception, match="--model is required"):
        build_plan(recipe, RunParameters(train_files=(tiny.data,)), "lock.yaml", "0" * 64, Path("runs/tiny-1"))


def test_missing_model_dir_stops_before_anything(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    args = tiny.args("--run-dir", str(tiny.tmp / "run"))
    args[args.index("--model") + 1] = str(tiny.tmp / "nowhere")
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "preflight failed, nothing started" in err and "nowhere: not a directory" in err
    assert not (tiny.tmp / "run").exists()


def _refused(tiny: Tiny, **params: object) -> str:
    prepared = prepare_run(tiny.request(**params))
    with pytest.raises(PreflightError) as info:
        prepared.refuse_if_failed()
    assert info.value.exit_code == 2
    return str(info.value)


def test_non_parquet_data_is_refused(tiny: Tiny) -> None:
    (tiny.tmp / "train.parquet").write_text("a,b\n1,2\n")
    assert "not a parquet file" in _refused(tiny)


def test_truncated_shard_is_refused(tiny: Tiny) -> None:
    shard = sorted(tiny.model.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:20])
    message = _refused(tiny)
    assert "model:" in message and shard.name in message


def test_lost_lm_head_fails_the_audit(tmp_path: Path) -> None:
    tiny = tiny_setup(tmp_path)
    for f in tiny.model.iterdir():
        f.unlink()
    write_checkpoint(tiny.model, CheckpointSpec(include_mtp=False), drop=["lm_head.weight"])
    assert "lm_head.weight" in _refused(tiny, dry_run=True)


def test_unknown_override_names_the_key_offline(tiny: Tiny) -> None:
    with pytest.raises(OverrideError) as info:
        prepare_run(tiny.request(overrides=("trainer.nnode=3",)))
    assert "unknown key trainer.nnode" in str(info.value) and "did you mean trainer.nnodes?" in str(info.value)


def test_an_unknown_skip_check_is_bad_input(tiny: Tiny) -> None:
    from dataclasses import replace

    with pytest.raises(InputError, match="unknown check gpus"):
        prepare_run(replace(tiny.request(), skip_checks=("gpus",)))


def test_an_image_for_another_architecture_is_refused_before_it_starts(tiny: Tiny) -> None:
    from envrun.preflight import check_image_platform

    plan = replace(prepare_run(tiny.request(dry_run=True)).plan, backend="docker", image="train:1")
    line = check_image_platform(plan, lambda ref: ("arm64", "x86_64"))
    assert line.status == "fail" and "train:1 is built for linux/arm64, but the engine's host is x86_64" in line.detail
    assert "exec format error" in line.detail
    assert check_image_platform(plan, lambda ref: ("amd64", "x86_64")).status == "ok"
    assert check_image_platform(plan, lambda ref: ("arm64", "aarch64")).status == "ok"
    assert check_image_platform(replace(plan, backend="local"), None).status == "skip"
