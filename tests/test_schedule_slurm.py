"""The scheduled run's parts that need no Slurm: the plan carried whole to the job, the job's spec, who a
node is and how it starts Ray, the batch scripts as rendered (and as bash parses them), and the CLI's
refusals and ``--emit sbatch``. The run itself, through a real Slurm: tests/test_slurm_run.py."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from envbuild.errors import InputError
from envrun.cli.main import main
from envrun.injob.node import port_args, ray_start
from envrun.injob.spec import InJob, identity
from envrun.plan import RunParameters, Scheduled, Volume, build_plan
from envrun.planrecord import plan_from_record, plan_record
from envrun.probe.request import ProbeRequest
from envrun.recipe import load_recipe
from envrun.schedule.jobdir import in_job, write_code
from envrun.schedule.sbatch import SlurmJob, render_batch, render_node
from tests.lib.tinyrun import Tiny

DIGEST = "registry.example/glm5@sha256:" + "ab" * 32


def slurm_params(tiny: Tiny, **changes: object) -> RunParameters:
    base = RunParameters(
        backend="slurm",
        model=tiny.model,
        train_files=(tiny.data,),
        nnodes=2,
        npus_per_node=16,
        image=DIGEST,
        output_dir=Path("/runs"),
        volumes=(Volume("/shared/data", "/data"), Volume("/shared/runs", "/runs", "rw")),
        scheduled=Scheduled(head_port=24000, dashboard_port=24001, node_ports=24002, join_timeout=30),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_the_plan_travels_whole(tiny: Tiny, tmp_path: Path) -> None:
    plan = build_plan(load_recipe(tiny.recipe), slurm_params(tiny), "x.lock.yaml", "f" * 64, tmp_path / "run")
    plan = replace(plan, probe=ProbeRequest("tiny", plan.overrides, "tiny.main", {"vllm": "no NPU here"}))
    back = plan_from_record(json.loads(json.dumps(plan_record(plan))))
    assert back == replace(plan, scheduled=None)  # the job's own settings travel in its spec, not the plan
    with pytest.raises(ValueError, match="version"):
        plan_from_record({**plan_record(plan), "version": 99})


def test_the_jobs_spec_round_trips_and_keeps_the_run_aimed_at_its_record(tiny: Tiny, tmp_path: Path) -> None:
    plan = build_plan(load_recipe(tiny.recipe), slurm_params(tiny), "x.lock.yaml", "f" * 64, tmp_path / "run")
    assert plan.scheduled is not None
    from pathlib import PurePosixPath

    spec = in_job(plan, PurePosixPath("/opt/envrun/job/record"), ("npus",))
    assert InJob.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.plan["run_dir"] == "/opt/envrun/job/record" and spec.lock_sha256 == "f" * 64
    assert (spec.nnodes, spec.npus_per_node, spec.node_ports, spec.skip_checks) == (2, 16, 24002, ("npus",))


def test_a_scheduled_run_needs_an_image_by_digest_and_its_node_count(tiny: Tiny, tmp_path: Path) -> None:
    recipe = load_recipe(tiny.recipe)
    with pytest.raises(InputError, match=r"REPOSITORY@sha256"):
        build_plan(recipe, slurm_params(tiny, image="registry.example/glm5:latest"), "x", "f" * 64, tmp_path)
    with pytest.raises(InputError, match="^--backend slurm needs --nnodes N"):
        build_plan(recipe, slurm_params(tiny, nnodes=None), "x", "f" * 64, tmp_path)
    emitted = replace(slurm_params(tiny, nnodes=None), emit="rayjob")
    with pytest.raises(InputError, match="^--emit rayjob needs --nnodes N"):  # what the user typed, not slurm
        build_plan(recipe, emitted, "x", "f" * 64, tmp_path)


def test_who_a_node_is_and_where_its_ports_are() -> None:
    env = {"ENVRUN_NODE_INDEX": "1", "ENVRUN_NODE_NAME": "n2", "ENVRUN_NODE_IP": "10.0.0.2", "ENVRUN_HEAD": "10.0.0.1"}
    worker = identity({**env, "ENVRUN_MACHINES": "host-a host-a"})
    assert (worker.index, worker.name, worker.ip, worker.head, worker.slot) == (1, "n2", "10.0.0.2", "10.0.0.1", 1)
    assert identity({**env, "ENVRUN_MACHINES": "host-a host-b"}).slot == 0
    with pytest.raises(ValueError, match="ENVRUN_HEAD"):
        identity({"ENVRUN_NODE_INDEX": "1"})
    with pytest.raises(ValueError, match="ENVRUN_NODE_INDEX"):
        identity({"ENVRUN_NODE_INDEX": "x"})
    spec = InJob(plan={"lock_sha256": "f" * 64}, lenient=False, nnodes=2, head_port=24000, dashboard_port=24001)
    with pytest.raises(ValueError, match="2 nodes of this job share machine host-a: give --ray-ports BASE"):
        port_args(spec, worker)  # two nodes on one machine with Ray's own ports would collide
    spec = replace(spec, node_ports=24002)
    assert "--node-manager-port=24052" in port_args(spec, worker)  # its slot's block, after the first node's
    argv = ray_start(spec, worker, 16)
    assert argv[:2] == ["ray", "start"] and "--block" in argv and "--address=10.0.0.1:24000" in argv
    assert "--node-ip-address=10.0.0.2" in argv and '--resources={"NPU": 16}' in argv
    head = ray_start(spec, identity({"ENVRUN_NODE_INDEX": "0", "ENVRUN_NODE_IP": "10.0.0.1"}), 0)
    assert "--head" in head and "--block" not in head and "--dashboard-host=10.0.0.1" in head
    assert not any(a.startswith("--resources") for a in head)  # no NPU seen: none claimed


def slurm_job(**changes: object) -> SlurmJob:
    job = SlurmJob(
        name="envrun-grpo-glm5",
        nnodes=32,
        job_dir="/shared/runs/grpo glm5/slurm",
        image=DIGEST,
        volumes=(Volume("/shared/data", "/data"), Volume("/shared/runs", "/runs", "rw")),
        sbatch_args=("--partition=npu", "--time=2-00:00:00"),
    )
    return replace(job, **changes)  # type: ignore[arg-type]


def test_the_batch_script_asks_for_the_nodes_and_ends_with_the_head(tmp_path: Path) -> None:
    script = render_batch(slurm_job())
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert header == [
        "#SBATCH --job-name=envrun-grpo-glm5",
        "#SBATCH --nodes=32",
        "#SBATCH --ntasks-per-node=1",
        '#SBATCH "--output=/shared/runs/grpo glm5/slurm/slurm-%j.out"',  # one word: sbatch splits on spaces
        "#SBATCH --partition=npu",
        "#SBATCH --time=2-00:00:00",
    ]
    assert "job_dir='/shared/runs/grpo glm5/slurm'" in script  # quoted: a path with a space stays one word
    assert script.count("--kill-on-bad-exit=1") == 2 and "--relative=1" in script
    assert "wait -n -p first" in script and "trap '" in script
    for name, text in (("job.sbatch", script), ("node.sh", render_node(slurm_job()))):
        (tmp_path / name).write_text(text)
        parsed = subprocess.run(["bash", "-n", str(tmp_path / name)], capture_output=True, text=True)
        assert parsed.returncode == 0, (name, parsed.stderr)


@pytest.mark.slurm
def test_sbatch_reads_each_directive_as_the_option_it_was(tmp_path: Path) -> None:
    """Before, a job directory with a space (or a quote) in it made the job unsubmittable: `Invalid directive
    found in batch script: ace/slurm-%j.out`. The real sbatch (`--test-only -v`) shows what it parsed."""
    job_dir = tmp_path / 'sp ace it\'s "q" #1 $HOME `x` 50%'
    job_dir.mkdir()
    comment = "a b#c 'd' \"e\" \\f"
    job = slurm_job(nnodes=2, job_dir=str(job_dir), sbatch_args=(f"--comment={comment}",))
    (job_dir / "job.sbatch").write_text(render_batch(job))
    done = subprocess.run(
        ["sbatch", "--test-only", "-v", str(job_dir / "job.sbatch")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    said = (line.removeprefix("sbatch: ").partition(" : ") for line in done.stderr.splitlines())
    parsed = {key.strip(): value for key, sep, value in said if sep}
    assert parsed["output"] == str(job_dir).replace("%", "%%") + "/slurm-%j.out"  # %% is Slurm's literal '%'
    assert parsed["comment"] == comment and parsed["job-name"] == "envrun-grpo-glm5"


@pytest.mark.parametrize(
    ("where", "flag", "why"),
    [
        ("a\\b", "--emit", "backslash"),
        ("a:b", "--emit", "docker bind"),
        ("a\\b", "--run-dir", "backslash"),
        ("nl\ntouch PWNED\n", "--emit", "control character"),  # was a command in the header's comment
        ("nl\ntouch PWNED\n", "--run-dir", "control character"),
        ("tab\t", "--emit", "control character"),
    ],
)
def test_a_job_directory_the_scripts_cannot_name_is_refused_before_anything(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, flag: str, why: str
) -> None:
    target = tmp_path / where / "job"
    run = ["--backend", "slurm", "--run-dir", str(target), "--dry-run"]  # a dry run: nothing submitted, ever
    how = ["--emit", "sbatch", str(target)] if flag == "--emit" else run
    assert main([*cli_args(tiny, "--image", DIGEST), *how]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} " in err, err
    assert why in err
    assert not (tmp_path / where).exists()


def test_each_node_runs_the_image_by_digest_and_removes_its_container_when_signalled() -> None:
    script = render_node(slurm_job())
    assert f"image={DIGEST}\n" in script and 'docker pull -q "$image"' in script
    assert '--label "io.envrun.slurm.job=$SLURM_JOB_ID"' in script and "--network host" in script
    assert "-v /shared/data:/data:ro" in script and "-v /shared/runs:/runs:rw" in script
    assert "-e PYTHONPATH=/opt/envrun/job/code" in script and "python3 -m envrun.injob node" in script
    assert "trap 'stop; exit 143' TERM INT" in script and 'docker rm -f "$name"' in script
    assert script.rstrip().endswith("wait $!")  # the container in the background: the trap runs at once
    assert "/dev/davinci[0-9]*" in script and "/usr/local/Ascend/driver/lib64" in script
    assert "envrun-bytecode-${image_id:7:16}" in script  # compiled once per image and host, as up does
    own = render_node(slurm_job(env={"PYTHONPYCACHEPREFIX": "/mine"}))
    assert "envrun-bytecode" not in own and "-e PYTHONPYCACHEPREFIX=/mine" in own


def test_the_jobs_code_is_envruns_sources(tmp_path: Path) -> None:
    count = write_code(tmp_path / "code")
    assert (tmp_path / "code" / "envrun" / "injob" / "node.py").is_file()
    assert (tmp_path / "code" / "envbuild" / "errors.py").is_file()
    assert count == len(list((tmp_path / "code").rglob("*.py"))) and not list((tmp_path / "code").rglob("*.pyc"))


def cli_args(tiny: Tiny, *extra: str) -> list[str]:
    return tiny.args("--nnodes", "2", "--output-dir", "/runs", *extra)


@pytest.mark.parametrize(
    "image",
    [
        "registry.example/glm5:latest",
        "registry.example/glm5@sha256:…",  # the docs' placeholder, pasted as it is
        "registry.example/glm5@sha256:" + "AB" * 32,  # the registry serves lowercase
        "registry.example/glm5:2026-12@sha256:" + "ab" * 32,  # a tag beside the digest: which one is pulled?
        "Registry.example/GLM5@sha256:" + "ab" * 32,
    ],
)
@pytest.mark.parametrize("how", [["--backend", "slurm"], ["--emit", "volcano"], ["--emit", "sbatch"]])
def test_the_cli_refuses_an_image_not_by_digest_before_reading_the_overrides(
    tiny: Tiny, image: str, how: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, `--emit sbatch` wrote a job from the docs' `@sha256:…` (every node's pull would fail), and a
    Kubernetes emit refused it only after validating the overrides against verl's config."""
    target = tmp_path / "out"
    assert main([*cli_args(tiny), *how, *([str(target)] if how[0] == "--emit" else []), "--image", image]) == 2
    assert not target.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, and no "validating N overrides" before it
    assert err.startswith(f"envrun: error: {' '.join(how)} needs --image REPOSITORY@sha256:<64 lowercase hex>")
    assert f"not {image!r}" in err


@pytest.mark.parametrize(
    ("volumes", "message"),
    [
        (["/s/a:/runs", "/s/b:/runs/"], "--volume /s/b:/runs/: /runs is mounted twice (--volume /s/a:/runs too)"),
        (["/s/a:/runs/./x:rw", "/s/b:/runs/x"], "--volume /s/b:/runs/x: /runs/x is mounted twice"),
        (["/s/a:/data", "/s/b:/data"], "--volume /s/b:/data: /data is mounted twice"),
        (["/s/a:/opt/envrun/job/code"], "--volume /s/a:/opt/envrun/job/code: it would hide the job's directory"),
        (["/s/a:/opt/envrun"], "--volume /s/a:/opt/envrun: it would hide the job's directory (/opt/envrun/job"),
    ],
)
@pytest.mark.parametrize("how", [["--backend", "slurm"], ["--emit", "volcano"], ["--emit", "sbatch"]])
def test_volumes_no_node_could_mount_are_refused_before_anything_is_written(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str], volumes: list[str], message: str, how: list[str]
) -> None:
    """Before, the job was written (and submitted): each node's `docker run` failed with "Duplicate mount
    point" once the job ran, a Kubernetes pod kept one of the two mounts, a volume over the job's directory
    hid envrun's code from the node."""
    target = tmp_path / "out"
    args = [*cli_args(tiny, "--image", DIGEST), *how, *([str(target)] if how[0] == "--emit" else ["--dry-run"])]
    assert main([*args, *(f"--volume={v}" for v in volumes)]) == 2
    assert not target.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"envrun: error: {message}"), err


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--ray-start-arg=--head"], "--ray-start-arg: --head is set by envrun cluster"),
        (["--ray-ports", "80"], "--ray-ports 80: expected a port"),
        (["--sbatch-arg", "partition=npu"], "expected one sbatch option"),
        (["--sbatch-arg=--comment=a\vb"], "expected one sbatch option"),  # sbatch cuts its line there
        (["--ray-ports", "60000"], "--ray-ports 60000: Ray's ports 60000-60201 overlap HCCL's 60000-60511 ("),
        (["--ray-ports", "59799"], "give a base up to 59798 or from 60512"),  # its last worker port is 60000
        (["--ray-ports", "60511"], "Ray's ports 60511-60712 overlap"),
    ],
)
def test_the_cli_refuses_bad_scheduler_options_in_one_line(
    tiny: Tiny, capsys: pytest.CaptureFixture[str], flag: list[str], message: str
) -> None:
    assert main([*cli_args(tiny), "--backend", "slurm", "--image", DIGEST, "--dry-run", *flag]) == 2  # never submits
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("base", ["59798", "60512"])
def test_ray_ports_next_to_hccls_are_taken(tiny: Tiny, base: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*cli_args(tiny), "--backend", "slurm", "--image", DIGEST, "--dry-run", "--ray-ports", base]) == 0


def test_emit_sbatch_writes_the_job_without_running_it(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "job"
    args = cli_args(tiny, "--image", DIGEST, "--ray-ports", "24000", "--sbatch-arg=--partition=npu", "--json")
    assert main([*args, "--emit", "sbatch", str(target)]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["emitted"] == "sbatch" and str(target / "job.sbatch") in written["files"]
    spec = InJob.from_json(json.loads((target / "job.json").read_text()))
    assert (spec.nnodes, spec.head_port, spec.dashboard_port, spec.node_ports) == (2, 24000, 24001, 24002)
    assert spec.plan["image"] == DIGEST and spec.plan["run_dir"] == "/opt/envrun/job/record"
    assert "#SBATCH --partition=npu" in (target / "job.sbatch").read_text()
    assert (target / "code" / "envrun" / "injob" / "__main__.py").is_file()
    assert not (target / "slurm-").exists() and not list(target.glob("slurm-*.out"))  # nothing was submitted


@pytest.mark.parametrize("kind", ["volcano", "rayjob"])
def test_emit_kubernetes_writes_one_manifest_with_the_plan_and_envruns_code(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    import base64
    import io
    import zipfile

    import yaml

    tiny.recipe.write_text(tiny.recipe.read_text() + "outputs:\n  trainer.default_local_dir: ckpts\n")
    args = cli_args(tiny, "--image", DIGEST, "--npus-per-node", "16", "--run-dir", str(tmp_path / "grpo-run"))
    assert main([*args, "--emit", kind, str(tmp_path / "k8s")]) == 0
    (path,) = [Path(line) for line in capsys.readouterr().out.splitlines()]
    assert path.parent == tmp_path / "k8s" and path.name == f"grpo-run.{kind}.yaml"
    config_map, job = list(yaml.safe_load_all(path.read_text()))
    spec = InJob.from_json(json.loads(config_map["data"]["job.json"]))
    assert spec.plan["image"] == DIGEST and spec.nnodes == 2 and spec.npus_per_node == 16
    assert spec.plan["run_dir"] == "/runs/envrun-record-grpo-run"  # the record on the storage every pod mounts
    names = zipfile.ZipFile(io.BytesIO(base64.b64decode(config_map["binaryData"]["code.zip"]))).namelist()
    assert "envrun/injob/node.py" in names and "envbuild/errors.py" in names
    assert job["kind"] == ("Job" if kind == "volcano" else "RayJob") and DIGEST in path.read_text()


def test_emit_kubernetes_never_gives_two_runs_one_name(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run ids past Kubernetes' length (a long recipe name before the UTC time), or differing only in case or
    punctuation: each run its own manifest and its own objects, none replacing another's."""
    import yaml

    args = cli_args(tiny, "--image", DIGEST, "--npus-per-node", "16")
    long = "grpo-glm5-2-megatron-a3-superpod"
    runs = [f"{long}-20261207-090000", f"{long}-20261208-090000", "Run_A", "run-a", "2026-run", "grpo-run"]
    for run in runs:
        assert main([*args, "--run-dir", str(tmp_path / "runs" / run), "--emit", "volcano", str(tmp_path / "k8s")]) == 0
    paths = [Path(line) for line in capsys.readouterr().out.splitlines()]
    assert len(set(paths)) == len(runs) == len(list((tmp_path / "k8s").iterdir()))
    names = [list(yaml.safe_load_all(path.read_text()))[1]["metadata"]["name"] for path in paths]
    assert len(set(names)) == len(runs) and names[-1] == "grpo-run"  # a valid name is kept as it is
    assert all(len(name) <= 40 and name[0].isalpha() for name in names)
    assert names[0].startswith(long[:20]) and names[3] == "run-a"


def test_emit_kubernetes_mounts_a_file_volume_as_a_file(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    data = tmp_path / "share" / "train.parquet"
    data.parent.mkdir()
    data.write_bytes(b"PAR1" + b"\0" * 8 + b"PAR1")
    volumes = ["--volume", f"{data}:/data/train.parquet", "--volume", f"{data.parent}:/share"]
    assert main([*cli_args(tiny, "--image", DIGEST), *volumes, "--emit", "volcano", str(tmp_path / "k8s")]) == 0
    (path,) = [Path(line) for line in capsys.readouterr().out.splitlines()]
    _, manifest = list(yaml.safe_load_all(path.read_text()))
    for task in manifest["spec"]["tasks"]:
        paths = {
            v["hostPath"]["path"]: v["hostPath"]["type"] for v in task["template"]["spec"]["volumes"] if "hostPath" in v
        }
        assert paths == {str(data): "File", str(data.parent): "Directory"}


@pytest.mark.parametrize("kind", ["volcano", "rayjob", "sbatch"])
@pytest.mark.parametrize("under", ["", "job"])
def test_emit_into_a_file_is_refused_in_one_line(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, under: str
) -> None:
    """Before, `File exists` (or `Not a directory`) from mkdir, exit 1, after the whole preflight."""
    existing = tmp_path / "taken"
    existing.write_text("mine\n")
    target = existing / under if under else existing
    assert main([*cli_args(tiny, "--image", DIGEST), "--emit", kind, str(target)]) == 2
    err = capsys.readouterr().err
    shown = "it" if not under else str(existing)
    assert err == f"envrun: error: --emit {kind} {str(target)!r}: {shown} exists and is not a directory\n"
    assert existing.read_text() == "mine\n"


def test_emit_refuses_a_backend_it_cannot_write(tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*cli_args(tiny, "--image", DIGEST), "--backend", "ray", "--emit", "sbatch", str(tmp_path)]) == 2
    assert "--emit writes a scheduler's job" in capsys.readouterr().err
    assert main([*cli_args(tiny, "--image", DIGEST), "--emit", "helm", str(tmp_path / "x")]) == 2
    assert "--emit 'helm': expected one of sbatch, volcano, rayjob" in capsys.readouterr().err


def test_a_number_that_is_not_ascii_digits_is_no_node_count(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    """``-o trainer.nnodes=²``: str.isdigit() says yes, int() says no; the plan takes ASCII digits only."""
    assert main([*tiny.args("-o", "trainer.nnodes=\u00b2"), "--backend", "slurm", "--image", DIGEST]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    with pytest.raises(ValueError, match="ENVRUN_NODE_INDEX"):
        identity({"ENVRUN_NODE_INDEX": "\u0661"})  # an Arabic-Indic one: a digit to Python, not to a shell
