"""The local backend, end to end: the CLI runs tests/lib/fake_trainer.py, which checks the plan's argv and env."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from envrun.cli_run import main_for_tests
from envrun.rundir import read_status
from tests.lib.tinyrun import REPO, Tiny, dry_run_json, tiny_setup


def expect_file(tiny: Tiny, capsys: pytest.CaptureFixture[str], *extra: str) -> list[str]:
    """Write what the fake trainer must receive (from the dry run) and return the --env that names it."""
    path = tiny.tmp / "expect.json"
    env = ["--env", f"FAKE_TRAINER_EXPECT={path}"]
    plan = dry_run_json(tiny, capsys, *env, *extra)
    path.write_text(json.dumps({"args": plan["argv"][2:], "env": plan["env"]}))
    return env


def test_local_run_passes_argv_and_env(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    env = expect_file(tiny, capsys, "-o", "trainer.total_epochs=3")
    run_dir = tiny.tmp / "run"
    assert main_for_tests(tiny.args(*env, "-o", "trainer.total_epochs=3", "--run-dir", str(run_dir))) == 0
    assert "fake trainer: ok" in capsys.readouterr().out
    assert read_status(run_dir) == {"status": "succeeded", "exit_code": 0}
    assert "fake trainer: ok" in (run_dir / "output.log").read_text()


def test_trainer_failure_is_recorded(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    env = expect_file(tiny, capsys)
    run_dir = tiny.tmp / "run"
    # A different value than the expectation: the fake trainer sees it and fails.
    assert main_for_tests(tiny.args(*env, "-o", "trainer.total_epochs=7", "--run-dir", str(run_dir))) == 1
    assert read_status(run_dir)["status"] == "failed"
    assert "expected 'trainer.total_epochs=2'" in (run_dir / "output.log").read_text()


def test_ctrl_c_stops_the_job_and_records_interrupted(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    env = expect_file(tiny, capsys)
    run_dir = tiny.tmp / "run"
    cli = subprocess.Popen(
        [sys.executable, "-m", "envrun.cli_run", *tiny.args(*env, "--run-dir", str(run_dir))],
        cwd=REPO,
        env={**os.environ, "FAKE_TRAINER_SLEEP": "120"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert cli.stdout is not None
        for line in cli.stdout:  # wait until the trainer is really running
            if "fake trainer: sleeping" in line:
                break
        cli.send_signal(signal.SIGINT)
        rest = cli.communicate(timeout=30)[0]
    finally:
        cli.kill()
    assert cli.returncode == 130
    assert "fake trainer: interrupted" in rest
    status = read_status(run_dir)
    assert status["status"] == "interrupted" and status["exit_code"] == 130
    assert "fake trainer: interrupted" in (run_dir / "output.log").read_text()


@pytest.mark.network
def test_grpo_glm5_locally_with_the_fake_trainer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = tiny_setup(tmp_path)
    cache = tmp_path / "cache"
    expect = tmp_path / "expect.json"
    args = [
        "grpo-glm5",
        "--model",
        str(tiny.model),
        "--data",
        str(tiny.data),
        "--cache-dir",
        str(cache),
        "-q",
        "--nnodes",
        "1",
        "--npus-per-node",
        "1",
        "--entry-point",
        f"{sys.executable} {REPO}/tests/lib/fake_trainer.py",
        "--env",
        f"FAKE_TRAINER_EXPECT={expect}",
    ]
    assert main_for_tests([*args, "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    expect.write_text(json.dumps({"args": plan["argv"][2:], "env": plan["env"]}))
    run_dir = tmp_path / "run"
    # No NPU here: the check is skipped, and the run records that it was.
    assert main_for_tests([*args, "--skip-check", "npus", "--run-dir", str(run_dir)]) == 0
    assert read_status(run_dir)["status"] == "succeeded"
    recorded = json.loads((run_dir / "plan.json").read_text())
    assert recorded["argv"] == plan["argv"]
    assert {"name": "npus", "status": "skip", "detail": "skipped by --skip-check"} in recorded["preflight"]


@pytest.mark.parametrize(
    "drop, ok", [((), True), (("lm_head.weight",), False)], ids=["only-mtp-missing", "lm_head-lost"]
)
def test_exported_weights_are_audited_after_the_run(
    tiny: Tiny, capsys: pytest.CaptureFixture[str], drop: tuple[str, ...], ok: bool
) -> None:
    from tests.lib.ckptgen import CheckpointSpec, write_checkpoint

    saved = tiny.tmp / "saved"  # what the lenient save wrote: never the MTP layers, maybe worse
    write_checkpoint(saved, CheckpointSpec(include_mtp=False), drop=drop)
    ckpts = tiny.tmp / "ckpts"
    extra = [
        "-o",
        f"trainer.default_local_dir={ckpts}",
        "--env",
        f"FAKE_TRAINER_EXPORT={saved}={ckpts}/global_step_1/actor/huggingface",
    ]
    env = expect_file(tiny, capsys, *extra)
    run_dir = tiny.tmp / "run"
    code = main_for_tests(tiny.args(*env, *extra, "--run-dir", str(run_dir)))
    record = json.loads((run_dir / "exports.json").read_text())
    (audit,) = record["exports"]
    assert audit["path"].endswith("global_step_1/actor/huggingface") and audit["ok"] is ok
    if ok:
        assert code == 0 and read_status(run_dir)["status"] == "succeeded"
    else:
        status = read_status(run_dir)
        assert code == 1 and status["status"] == "failed" and "lm_head.weight" in status["detail"]
        assert "export audit FAILED" in capsys.readouterr().err


def test_no_export_directory_is_said_not_hidden(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    env = expect_file(tiny, capsys)
    run_dir = tiny.tmp / "run"
    assert main_for_tests(tiny.args(*env, "--run-dir", str(run_dir))) == 0
    assert "exports not checked" in json.loads((run_dir / "exports.json").read_text())["where"]
