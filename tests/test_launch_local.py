"""The local backend, end to end: envrun runs tests/lib/fake_trainer.py, which checks the plan's argv and env."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from envrun.cli.main import main
from envrun.execute import execute_run
from envrun.exports import UNCHECKED
from envrun.prepare import PreparedRun, prepare_run
from envrun.rundir import read_status
from tests.lib.readergone import run_reader_gone
from tests.lib.tinyrun import REPO, Tiny, envrun_until_sleeping


def prepared_and_expected(tiny: Tiny, *overrides: str, **params: object) -> PreparedRun:
    """The run prepared with the fake trainer told (through its env) to expect exactly its plan."""
    env = {"FAKE_TRAINER_EXPECT": str(tiny.expect_file)}
    prepared = prepare_run(tiny.request(overrides=overrides, extra_env=env, **params))
    tiny.expect(prepared.plan)
    return prepared


def test_local_run_passes_argv_and_env(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    prepared = prepared_and_expected(tiny.strict(), "trainer.total_epochs=3")
    outcome = execute_run(prepared)
    assert (outcome.status, outcome.exit_code, outcome.exit_status) == ("succeeded", 0, 0)
    assert "fake trainer: ok" in capsys.readouterr().out
    assert read_status(outcome.run_dir) == {"status": "succeeded", "exit_code": 0}
    assert "fake trainer: ok" in (outcome.run_dir / "output.log").read_text()


def test_local_run_through_the_cli_prints_the_outcome(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    prepared_and_expected(tiny.strict())
    run_dir = tiny.tmp / "run"
    assert main(tiny.args("--env", f"FAKE_TRAINER_EXPECT={tiny.expect_file}", "--run-dir", str(run_dir), "--json")) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert json.loads(last) == {"exit_code": 0, "run_dir": str(run_dir), "status": "succeeded"}


def test_json_run_prints_only_json_on_stdout(tiny: Tiny) -> None:
    """`envrun run … --json > status.json` then `jq`: the job's own lines came first on stdout, and the file
    was no JSON. With --json they are shown on stderr (and kept in output.log); stdout is the outcome alone."""
    prepared_and_expected(tiny.strict())
    run_dir = tiny.tmp / "run"
    args = tiny.args("--env", f"FAKE_TRAINER_EXPECT={tiny.expect_file}", "--run-dir", str(run_dir), "--json")
    done = subprocess.run(
        [sys.executable, "-m", "envrun.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"exit_code": 0, "run_dir": str(run_dir), "status": "succeeded"}
    assert "fake trainer: ok" in done.stderr
    assert "fake trainer: ok" in (run_dir / "output.log").read_text()


def test_trainer_failure_is_recorded(tiny: Tiny) -> None:
    prepared_and_expected(tiny)
    # A different value than the expectation: the fake trainer sees it and fails.
    env = {"FAKE_TRAINER_EXPECT": str(tiny.expect_file)}
    prepared = prepare_run(tiny.request(overrides=("trainer.total_epochs=7",), extra_env=env))
    outcome = execute_run(prepared)
    assert (outcome.status, outcome.exit_code, outcome.exit_status) == ("failed", 1, 1)
    assert read_status(outcome.run_dir)["status"] == "failed"
    assert "expected 'trainer.total_epochs=2'" in (outcome.run_dir / "output.log").read_text()


def test_ctrl_c_stops_the_job_and_records_interrupted(tiny: Tiny) -> None:
    prepared_and_expected(tiny)
    env = ["--env", f"FAKE_TRAINER_EXPECT={tiny.expect_file}"]
    run_dir = tiny.tmp / "run"
    args = tiny.args(*env, "--run-dir", str(run_dir))
    with envrun_until_sleeping(args, {**os.environ, "FAKE_TRAINER_SLEEP": "120"}) as run:
        assert run.stop(signal.SIGINT, timeout=30) == 130
    assert "fake trainer: interrupted" in run.rest
    status = read_status(run_dir)
    assert status["status"] == "interrupted" and status["exit_code"] == 130
    assert "fake trainer: interrupted" in (run_dir / "output.log").read_text()


def test_a_lenient_recipe_without_a_probe_fails_its_unchecked_exports(tiny: Tiny) -> None:
    """Where the exports are is read from verl by the job probe (tests/test_probe.py); without one it is
    unknown, and the record says so: not ok, and the run not succeeded, though the job was."""
    outcome = execute_run(prepared_and_expected(tiny))
    assert (outcome.status, outcome.exit_code, outcome.exit_status) == ("failed", 0, 1)
    record = json.loads((outcome.run_dir / "exports.json").read_text())
    why = "exports not checked: no export layout (the job probe did not run; job-probe: recipe tiny has no probe)"
    assert record["where"] == why and record["ok"] is False
    assert record["failures"] == [f"{why}; {UNCHECKED}"]
    assert read_status(outcome.run_dir)["detail"] == f"export audit: {why}; {UNCHECKED}"


def test_a_skipped_job_probe_leaves_a_lenient_save_unchecked_and_the_run_failed(
    tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--skip-check job-probe` skips the probe by name; it does not pass the export audit it feeds."""
    prepared_and_expected(tiny)
    run_dir = tiny.tmp / "run"
    env = ["--env", f"FAKE_TRAINER_EXPECT={tiny.expect_file}", "--skip-check", "job-probe"]
    assert main(tiny.args(*env, "--run-dir", str(run_dir), "--json")) == 1
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[-1]) == {"exit_code": 0, "run_dir": str(run_dir), "status": "failed"}
    why = "exports not checked: no export layout (the job probe did not run; job-probe: skipped by --skip-check)"
    assert f"envrun: export audit FAILED: {why}; a lenient checkpoint save" in err
    assert json.loads((run_dir / "exports.json").read_text())["ok"] is False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_stops_the_job_and_everything_it_started(tiny: Tiny) -> None:
    """A scheduler's SIGTERM (or `timeout`, `docker stop`) to envrun: the job's whole process group stops —
    the trainer and the process it started — and the run is recorded as interrupted by SIGTERM."""
    prepared_and_expected(tiny)
    env = ["--env", f"FAKE_TRAINER_EXPECT={tiny.expect_file}"]
    run_dir = tiny.tmp / "run"
    args = tiny.args(*env, "--run-dir", str(run_dir))
    with envrun_until_sleeping(args, {**os.environ, "FAKE_TRAINER_SLEEP": "120", "FAKE_TRAINER_CHILD": "1"}) as run:
        started = [line for line in run.seen if line.startswith("fake trainer: started child ")]
        child = int(started[-1].split()[-1]) if started else None
        assert child is not None and _alive(child)
        assert run.stop(signal.SIGTERM, timeout=60) == 130
    status = read_status(run_dir)
    assert status["status"] == "interrupted" and status["detail"].startswith("stopped on SIGTERM")
    assert not _alive(child)


HYDRA_APP = """\
import hydra


@hydra.main(config_path={config!r}, config_name="tiny", version_base=None)
def main(cfg):
    print("hydra app: epochs", cfg.trainer.total_epochs, flush=True)


main()
"""


def test_a_hydra_trainer_writes_its_record_in_the_run_not_the_callers_directory(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real Hydra app as the trainer (verl's main_ppo is one): Hydra writes `outputs/DATE/TIME/` under the
    working directory unless told otherwise; a local run tells it `<run dir>/hydra`."""
    app = tiny.tmp / "hydra_app.py"
    app.write_text(HYDRA_APP.format(config=str(tiny.config)), encoding="utf-8")
    caller = tiny.tmp / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    outcome = execute_run(prepare_run(tiny.strict().request(entry_point=(sys.executable, str(app)))))
    assert outcome.status == "succeeded", (outcome.run_dir / "output.log").read_text()
    assert "hydra app: epochs 2" in (outcome.run_dir / "output.log").read_text()
    assert list(caller.iterdir()) == []  # nothing of Hydra's in the caller's directory
    assert (outcome.run_dir / "hydra" / ".hydra" / "overrides.yaml").is_file()


def test_a_run_whose_stdout_reader_is_gone_goes_on_and_records_everything(tiny: Tiny) -> None:
    """``envrun … | tee x`` whose tee was stopped (or ``| head -1`` that has its line): the job is not cut short
    and no error is said; its output is still all in output.log and the run's exit status is the job's."""
    prepared_and_expected(tiny.strict())
    run_dir = tiny.tmp / "run"
    args = tiny.args("--env", f"FAKE_TRAINER_EXPECT={tiny.expect_file}", "--run-dir", str(run_dir))
    done = run_reader_gone([sys.executable, "-m", "envrun.cli.main", *args], timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert read_status(run_dir) == {"status": "succeeded", "exit_code": 0}
    assert "fake trainer: ok" in (run_dir / "output.log").read_text()
