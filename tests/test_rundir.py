"""The run directory's record: plan, command line, preflight, streamed output, final status."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from envbuild.errors import CacheError
from envrun.plan import RunParameters, build_plan
from envrun.preflightline import PreflightLine
from envrun.recipe import load_recipe, recipe_path
from envrun.rundir import RunDir, read_status


def a_plan(tmp_path: Path):
    recipe = load_recipe(recipe_path("grpo-glm5"))
    params = RunParameters(model=tmp_path / "m", train_files=(tmp_path / "d.parquet",), overrides=("trainer.nnodes=2",))
    return build_plan(recipe, params, "lock.yaml", "ab" * 32, Path("runs/tiny-1")).with_preflight(
        (PreflightLine("data", "ok", "1 parquet file(s)"),)
    )


def test_run_dir_records_everything(tmp_path: Path) -> None:
    plan = a_plan(tmp_path)
    echo = io.StringIO()
    record = RunDir(tmp_path / "run", echo=echo)
    record.record_plan(plan, image_digest="sha256:" + "a" * 64)
    record.log("line 1\n")
    record.log("line 2\n")
    record.finish("succeeded", 0)
    files = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert files == ["command.txt", "output.log", "plan.json", "preflight.json", "status.json"]
    document = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert document["argv"] == list(plan.argv)
    assert document["env"] == {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"}
    assert document["lock"] == {"file": "lock.yaml", "sha256": plan.lock_sha256}
    assert document["image_digest"] == "sha256:" + "a" * 64
    assert (
        (tmp_path / "run" / "command.txt")
        .read_text()
        .startswith("python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer ")
    )
    assert json.loads((tmp_path / "run" / "preflight.json").read_text()) == [
        {"name": "data", "status": "ok", "detail": "1 parquet file(s)"}
    ]
    assert (tmp_path / "run" / "output.log").read_text() == echo.getvalue() == "line 1\nline 2\n"
    assert read_status(tmp_path / "run") == {"status": "succeeded", "exit_code": 0}


def test_interrupted_status(tmp_path: Path) -> None:
    record = RunDir(tmp_path / "run", echo=None)
    record.finish("interrupted", 130, "stopped on Ctrl-C")
    assert read_status(tmp_path / "run") == {"status": "interrupted", "exit_code": 130, "detail": "stopped on Ctrl-C"}


def test_existing_run_dir_is_not_reused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(CacheError, match="run directory exists"):
        RunDir(tmp_path / "run")
