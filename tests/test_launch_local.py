"""The local backend, end to end: envrun runs tests/lib/fake_trainer.py, which checks the plan's argv and env."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from envrun.cli import main
from envrun.execute import execute_run
from envrun.prepare import PreparedRun, prepare_run
from envrun.rundir import read_status
from tests.lib.tinyrun import REPO, Tiny, tiny_setup


def prepared_and_expected(tiny: Tiny, *overrides: str, **params: object) -> PreparedRun:
    """The run prepared with the fake trainer told (through its env) to expect exactly its plan."""
    env = {"FAKE_TRAINER_EXPECT": str(tiny.expect_file)}
    prepared = prepare_run(tiny.request(overrides=overrides, extra_env=env, **params))
    tiny.expect(prepared.plan)
    return prepared


def test_local_run_passes_argv_and_env(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    prepared = prepared_and_expected(tiny, "trainer.total_epochs=3")
    outcome = execute_run(prepared, tiny.tmp / "run")
    assert (outcome.status, outcome.exit_code, outcome.exit_status) == ("succeeded", 0, 0)
    assert "fake trainer: ok" in capsys.readouterr().out
    assert read_status(outcome.run_dir) == {"status": "succeeded", "exit_code": 0}
    assert "fake trainer: ok" in (outcome.run_dir / "output.log").read_text()


def test_local_run_through_the_cli_prints_the_outcome(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    prepared_and_expected(tiny)
    run_dir = tiny.tmp / "run"
    assert main(tiny.args("--env", f"FAKE_TRAINER_EXPECT={tiny.expect_file}", "--run-dir", str(run_dir), "--json")) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert json.loads(last) == {"exit_code": 0, "run_dir": str(run_dir), "status": "succeeded"}


def test_trainer_failure_is_recorded(tiny: Tiny) -> None:
    prepared_and_expected(tiny)
    # A different value than the expectation: the fake trainer sees it and fails.
    env = {"FAKE_TRAINER_EXPECT": str(tiny.expect_file)}
    prepared = prepare_run(tiny.request(overrides=("trainer.total_epochs=7",), extra_env=env))
    outcome = execute_run(prepared, tiny.tmp / "run")
    assert (outcome.status, outcome.exit_code, outcome.exit_status) == ("failed", 1, 1)
    assert read_status(outcome.run_dir)["status"] == "failed"
    assert "expected 'trainer.total_epochs=2'" in (outcome.run_dir / "output.log").read_text()


def test_ctrl_c_stops_the_job_and_records_interrupted(tiny: Tiny) -> None:
    prepared_and_expected(tiny)
    env = ["--env", f"FAKE_TRAINER_EXPECT={tiny.expect_file}"]
    run_dir = tiny.tmp / "run"
    cli = subprocess.Popen(
        [sys.executable, "-m", "envrun.cli", *tiny.args(*env, "--run-dir", str(run_dir))],
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
def test_grpo_glm5_locally_with_the_fake_trainer(tmp_path: Path) -> None:
    from dataclasses import replace

    tiny = tiny_setup(tmp_path)
    expect = tmp_path / "expect.json"
    request = replace(
        tiny.request(nnodes=1, npus_per_node=1, extra_env={"FAKE_TRAINER_EXPECT": str(expect)}),
        recipe="grpo-glm5",
        lock=None,  # the recipe's own
        verl_config=None,  # from the verl wheel the lock pins
        cache_dir=tmp_path / "cache",
    )
    prepared = prepare_run(request)
    tiny.expect(prepared.plan, expect)
    # No NPU here: the check is skipped, and the run records that it was.
    outcome = execute_run(prepared, tmp_path / "run")
    assert outcome.status == "succeeded"
    recorded = json.loads((outcome.run_dir / "plan.json").read_text())
    assert recorded["argv"] == list(prepared.plan.argv)
    assert {"name": "npus", "status": "skip", "detail": "skipped by --skip-check"} in recorded["preflight"]


@pytest.mark.parametrize(
    "drop, ok", [((), True), (("lm_head.weight",), False)], ids=["only-mtp-missing", "lm_head-lost"]
)
def test_exported_weights_are_audited_after_the_run(tiny: Tiny, drop: tuple[str, ...], ok: bool) -> None:
    from tests.lib.ckptgen import CheckpointSpec, write_checkpoint

    saved = tiny.tmp / "saved"  # what the lenient save wrote: never the MTP layers, maybe worse
    write_checkpoint(saved, CheckpointSpec(include_mtp=False), drop=drop)
    ckpts = tiny.tmp / "ckpts"
    env = {
        "FAKE_TRAINER_EXPECT": str(tiny.expect_file),
        "FAKE_TRAINER_EXPORT": f"{saved}={ckpts}/global_step_1/actor/huggingface",
    }
    prepared = prepare_run(tiny.request(overrides=(f"trainer.default_local_dir={ckpts}",), extra_env=env))
    tiny.expect(prepared.plan)
    outcome = execute_run(prepared, tiny.tmp / "run")
    record = json.loads((outcome.run_dir / "exports.json").read_text())
    (audit,) = record["exports"]
    assert audit["path"].endswith("global_step_1/actor/huggingface") and audit["ok"] is ok
    if ok:
        assert outcome.exit_status == 0 and read_status(outcome.run_dir)["status"] == "succeeded"
    else:
        status = read_status(outcome.run_dir)
        assert outcome.exit_status == 1 and status["status"] == "failed" and "lm_head.weight" in status["detail"]
        (failure,) = outcome.export_failures
        assert failure.startswith(audit["path"]) and "lm_head.weight" in failure


def test_no_export_directory_is_said_not_hidden(tiny: Tiny) -> None:
    outcome = execute_run(prepared_and_expected(tiny), tiny.tmp / "run")
    assert outcome.exit_status == 0
    assert "exports not checked" in json.loads((outcome.run_dir / "exports.json").read_text())["where"]
