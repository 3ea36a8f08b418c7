"""The job probe against the real verl 0.9.1 (PyPI wheel, CPU torch), in environments of the lock's own pins:
what a real start would meet is refused in one line before anything is launched, and the export guard
looks where verl writes (the path taken here from verl's own function, not from envrun).

The environments are cached per machine (tests/lib/verlenv.py); each probe imports verl's stack (~20 s).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from envrun.cli.main import main
from envrun.execute import execute_run
from envrun.plan import RunParameters
from envrun.prepare import PreparedRun, RunRequest, prepare_run
from envrun.probe.report import CHECK, layout_of
from envrun.rundir import read_status
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint
from tests.lib.pyenvs import Venv
from tests.lib.tinyrun import FAKE_TRAINER, LOCK, write_parquet_like
from tests.lib.verlenv import path_env, probe_recipe, verl_env, verl_hf_export_dir

pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.fixture(scope="module")
def verl() -> Venv:
    return verl_env()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recipe (with the test environment's one skip), a model the audit accepts and a data file."""
    root = tmp_path_factory.mktemp("probe")
    probe_recipe(root)
    write_checkpoint(root / "model", CheckpointSpec(include_mtp=False))
    write_parquet_like(root / "train.parquet")
    return root


# The recipe's TransferQueue asks Ray for 9 CPUs (its controller and 8 storage units); a test machine has 2.
ENOUGH_CPUS = ("-o", "ray_kwargs.ray_init.num_cpus=16")


def cli_args(files: Path, cache: Path, *extra: str, cpus: tuple[str, ...] = ENOUGH_CPUS) -> list[str]:
    recipe = str(files / "grpo-glm5.yaml")
    data = ["--data", str(files / "train.parquet")]
    return [
        "run",
        recipe,
        "--lock",
        str(LOCK),
        "--model",
        str(files / "model"),
        *data,
        "--cache-dir",
        str(cache),
        *cpus,
        *extra,
    ]


def path_args(venv: Venv) -> list[str]:
    return ["--env", f"PATH={path_env(venv)['PATH']}"]


def probe_facts(preflight: list[dict[str, object]]) -> dict[str, object]:
    (first, *_rest) = [line for line in preflight if line["name"] == CHECK]
    facts = first.get("facts")
    assert isinstance(facts, dict)
    return facts


def test_the_fixed_lock_passes_the_probe(
    verl: Venv, files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(cli_args(files, tmp_path / "cache", "--dry-run", "--json", "-q", *path_args(verl)))
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    (line,) = [c for c in out["preflight"] if c["name"] == CHECK]
    assert line["status"] == "ok", line["detail"]
    assert "verl 0.9.1" in line["detail"] and "validate_config passes for 32 node(s) x 16 NPU(s)" in line["detail"]
    facts = line["facts"]
    assert facts["facts"]["verl"]["version"] == "0.9.1" and facts["facts"]["use_v1"] is True
    assert facts["facts"]["trainer_class"] == "verl.trainer.ppo.v1.trainer_sync.PPOTrainerSync"
    verdicts = {i["module"]: i["status"] for i in facts["imports"]}
    assert verdicts["transfer_queue"] == verdicts["verl.trainer.ppo.v1"] == "ok"  # TaskRunnerV1's imports
    skipped = {i["skip"] for i in facts["imports"] if i["status"] == "skip"}
    assert skipped == {"megatron", "verl.workers.rollout.vllm_rollout"}  # each with the recipe's reason
    # Where the exports go, as verl says, and that this config (save_freq=-1) writes none.
    expected_dir = verl_hf_export_dir(verl, tmp_path / "ckpts").relative_to(tmp_path / "ckpts")
    assert facts["exports"]["pattern"] == str(expected_dir).replace("global_step_1", "global_step_*")
    assert facts["exports"]["expected"] is False and "trainer.save_freq=-1" in facts["exports"]["why"]
    assert facts["exports"]["root"] == out["output_dir"] + "/ckpts"  # envrun's plain value, resolved by a worker
    # The CPUs the job's first Ray actors ask for, read from their own ray.remote options, against the 16 given.
    (cpus,) = [c for c in out["preflight"] if c["name"] == "ray-resources"]
    assert cpus["status"] == "ok" and "ask for 9 CPU(s) at once" in cpus["detail"], cpus["detail"]
    assert "TransferQueueController: 1; 8 SimpleStorageUnit x 1" in cpus["detail"]
    assert "ray_kwargs.ray_init.num_cpus=16" in cpus["detail"]
    assert cpus["facts"]["set_for_a_new_ray"] == ["num_cpus"]  # what a job joining a Ray cluster must not pass


def test_without_transfer_queue_the_job_is_refused_naming_it(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The environment the lock gave before TransferQueue was locked: verl's v1 task runner cannot start."""
    old = verl_env(transfer_queue=False)
    run_dir = tmp_path / "run"
    code = main(
        cli_args(files, tmp_path / "cache", "-q", "--skip-check", "npus", "--run-dir", str(run_dir), *path_args(old))
    )
    err = capsys.readouterr().err
    assert code == 2 and not run_dir.exists()  # nothing started, nothing written
    (error,) = [line for line in err.splitlines() if line.startswith("envrun: error: ")]
    assert "preflight failed, nothing started" in error
    assert "module transfer_queue: trainer.use_v1=true: main() runs TaskRunnerV1, which imports it" in error
    assert "No module named 'transfer_queue'" in error


def test_a_driver_only_interpolation_and_too_few_npus_are_refused(
    verl: Venv, files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both pass the override check, which composes in the driver; the probe resolves as a Ray worker and
    runs verl's own validate_config for 2 nodes x 16 NPUs."""
    now = "trainer.experiment_name=glm5_${now:%Y%m%d_%H%M%S}"  # (the output keys are --output-dir's alone)
    few = ("-o", "ray_kwargs.ray_init.num_cpus=2")  # what Ray detects on a 2-core machine
    args = cli_args(
        files, tmp_path / "cache", "--dry-run", "-q", "--nnodes", "2", "-o", now, *path_args(verl), cpus=few
    )
    code = main(args)
    captured = capsys.readouterr()
    assert code == 2
    # A Ray that cannot place the job's actors waits forever: refused before, with the fix.
    (cpus,) = [line for line in captured.out.splitlines() if line.lstrip().startswith("fail ray-resources")]
    assert "ask for 9 CPU(s) at once" in cpus and "ray_kwargs.ray_init.num_cpus=2" in cpus
    assert "Ray would wait for them forever. Pass -o ray_kwargs.ray_init.num_cpus=9 or more" in cpus
    lines = [line for line in captured.out.splitlines() if line.lstrip().startswith(f"fail {CHECK}")]
    assert len(lines) == 2, captured.out  # one line per problem
    assert any(
        "verl's validate_config refuses the run for 2 node(s) x 16 NPU(s)" in line
        and "n_gpus (32) must be divisible by model_parallel_size (64)" in line
        for line in lines
    )
    assert any(  # the first key that reads it: verl's trace section interpolates the experiment's name
        "experiment_name: the config does not resolve in a Ray worker" in line
        and "UnsupportedInterpolationType: Unsupported interpolation type now" in line
        for line in lines
    )


def test_a_cpu_count_ray_cannot_take_is_named_by_its_key_and_the_probe_still_reports(
    verl: Venv, files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The override check cannot type ray_init.num_cpus (verl's default is null); before, the probe itself
    crashed on it ("the probe crashed: ValueError: could not convert string to float: 'auto'"), naming no
    key and losing every import it had checked."""
    auto = ("-o", "ray_kwargs.ray_init.num_cpus=auto")
    code = main(cli_args(files, tmp_path / "cache", "--dry-run", "--json", *path_args(verl), cpus=auto))
    out = json.loads(capsys.readouterr().out)
    assert code == 2
    (line,) = [c for c in out["preflight"] if c["name"] == CHECK]
    assert line["status"] == "fail" and "crashed" not in line["detail"]
    assert line["detail"].endswith("key ray_kwargs.ray_init.num_cpus: ray.init takes a number of CPUs, not 'auto'")
    assert "ok" in [i["status"] for i in line["facts"]["imports"]]  # the imports were still checked


@pytest.fixture(scope="module")
def saving(verl: Venv, files: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedRun:
    """grpo-glm5 saving every step (so HF weights are exported), with the stand-in trainer as its entry
    point: the probe runs the recipe's python3 (the verl environment); the trainer writes what a test says."""
    request = RunRequest(
        str(files / "grpo-glm5.yaml"),
        RunParameters(
            model=files / "model",
            train_files=(files / "train.parquet",),
            overrides=("trainer.save_freq=1", "ray_kwargs.ray_init.num_cpus=16"),  # TransferQueue asks for 9
            extra_env=path_env(verl),
            entry_point=(sys.executable, str(FAKE_TRAINER)),
        ),
        lock=LOCK,
        cache_dir=tmp_path_factory.mktemp("cache"),
        skip_checks=("npus",),
        run_dir=tmp_path_factory.mktemp("unused") / "run",
    )
    return prepare_run(request)


def run_saving(prepared: PreparedRun, run_dir: Path, export: tuple[Path, Path] | None) -> PreparedRun:
    """``prepared`` recorded in ``run_dir``, its outputs there, and the trainer told to export ``FROM -> TO``."""
    layout = layout_of(prepared.plan.preflight)
    assert layout is not None and layout.expected and layout.root is not None
    old_root = layout.root.rsplit("/ckpts", 1)[0]
    new_root = str(run_dir / "outputs")
    argv = tuple(a.replace(old_root, new_root) for a in prepared.plan.argv)
    preflight = tuple(
        replace(line, facts=json.loads(json.dumps(line.facts).replace(old_root, new_root))) if line.facts else line
        for line in prepared.plan.preflight
    )
    expect = run_dir.parent / f"{run_dir.name}-expect.json"
    expect.write_text(json.dumps({"args": list(argv[2:]), "env": {}}))
    env = {**prepared.plan.env, "FAKE_TRAINER_EXPECT": str(expect)}
    if export is not None:
        env["FAKE_TRAINER_EXPORT"] = f"{export[0]}={export[1]}"
    plan = replace(prepared.plan, argv=argv, env=env, run_dir=run_dir, preflight=preflight)
    return replace(prepared, plan=plan)


@pytest.mark.parametrize(
    "drop, ok", [((), True), (("lm_head.weight",), False)], ids=["only-mtp-missing", "lm_head-lost"]
)
def test_an_export_where_verl_writes_it_is_audited(
    saving: PreparedRun, verl: Venv, tmp_path: Path, drop: tuple[str, ...], ok: bool
) -> None:
    run_dir = tmp_path / "run"
    scratch = tmp_path / "scratch"  # verl's function makes the directories; the run directory must be new
    where = run_dir / "outputs" / "ckpts" / verl_hf_export_dir(verl, scratch).relative_to(scratch)
    saved = tmp_path / "saved"  # what the lenient save wrote: never the MTP layers, maybe worse
    write_checkpoint(saved, CheckpointSpec(include_mtp=False), drop=drop)
    outcome = execute_run(run_saving(saving, run_dir, (saved, where)))
    record = json.loads((run_dir / "exports.json").read_text())
    (audit,) = record["exports"]
    assert audit["path"] == str(where) and audit["ok"] is ok
    status = read_status(run_dir)
    if ok:
        assert outcome.exit_status == 0 and status["status"] == "succeeded"
    else:
        assert outcome.exit_status == 1 and status["status"] == "failed" and "lm_head.weight" in status["detail"]
        (failure,) = outcome.export_failures
        assert failure.startswith(str(where)) and "lm_head.weight" in failure


def test_no_export_where_the_config_saves_them_fails_the_run(saving: PreparedRun, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    outcome = execute_run(run_saving(saving, run_dir, None))
    record = json.loads((run_dir / "exports.json").read_text())
    assert record["ok"] is False and record["exports"] == []
    assert outcome.status == "failed" and "does not exist on this host, though trainer.save_freq=1" in outcome.detail


def test_a_config_that_saves_no_export_says_so(verl: Venv, files: Path, tmp_path: Path) -> None:
    """trainer.save_freq=-1 (the recipe's): no periodic checkpoint, so nothing to audit — recorded as such."""
    request = RunRequest(
        str(files / "grpo-glm5.yaml"),
        RunParameters(
            model=files / "model",
            train_files=(files / "train.parquet",),
            extra_env={**path_env(verl), "FAKE_TRAINER_EXPECT": str(tmp_path / "expect.json")},
            entry_point=(sys.executable, str(FAKE_TRAINER)),
            overrides=ENOUGH_CPUS[1:],
        ),
        lock=LOCK,
        cache_dir=tmp_path / "cache",
        skip_checks=("npus",),
        run_dir=tmp_path / "run",
    )
    prepared = prepare_run(request)
    (tmp_path / "expect.json").write_text(json.dumps({"args": list(prepared.plan.argv[2:]), "env": {}}))
    outcome = execute_run(prepared)
    record = json.loads((tmp_path / "run" / "exports.json").read_text())
    assert outcome.status == "succeeded" and record["ok"] is True and record["exports"] == []
    assert record["where"].startswith("no periodic export (trainer.save_freq=-1")
