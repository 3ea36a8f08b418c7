"""Run planning paths no other test reached: command-line choices that cannot make a plan, the dry run's
text for the docker and slurm backends, data files that are no readable file, overrides Hydra cannot
parse or compose, verl's config tree from a lock and an index that fail in each way they can, and cluster
files and node answers naming engines and addresses that are no such thing.

Runs go through ``envrun.cli.main`` with the tiny recipe (tests/lib/tinyrun.py); verl's config comes from
a real PEP 691 index on 127.0.0.1 (tests/lib/pyindex.py) serving wheels written here.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from envbuild.errors import CacheError, InputError, RemoteError
from envbuild.lock.io import dump_lock, read_lock
from envbuild.lock.model import PackageFile
from envrun.cli.main import main
from envrun.cluster.nodecheck import job_address_line, node_lines
from envrun.cluster.spec import ClusterFileError, parse_cluster_file, same_address
from envrun.overrides import OverrideError, validate_overrides
from envrun.verlconfig import VerlWheel, verl_config_dir
from tests.lib.pyindex import PyIndex
from tests.lib.tinyrun import FAKE_TRAINER, LOCK, TINY_CONFIG, TINY_RECIPE, Tiny, write_parquet_like

IMAGE = "registry.example/train@sha256:" + "a" * 64
CLUSTER = """\
name: glm5
nodes:
  - engine: ssh://root@node-001
    ip: 10.0.0.1
  - engine: tcp://node-002:2375
"""


def node_answer(name: str, lock: str, **more: object) -> dict[str, object]:
    """What the node check's task answers for node ``n<name>`` (envrun/cluster/onnode.py)."""
    node_id = name * 56
    answer = {"node_id": node_id, "answered_from": node_id, "name": f"n{name}", "ip": "10.0.0.1", "lock_sha256": lock}
    return {**answer, "devices": [], **more}


def run_args(tiny: Tiny, *extra: str) -> list[str]:
    """The tiny run, recorded under ``tiny.tmp / "run"`` (which must not appear when a run is refused)."""
    return tiny.args("--run-dir", str(tiny.tmp / "run"), *extra)


def refused(tiny: Tiny, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    """Exit 2, nothing on stdout, one line on stderr, no run directory; that line."""
    assert main(run_args(tiny, *extra)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("envrun: error: "), err
    assert not (tiny.tmp / "run").exists()
    return err.removeprefix("envrun: error: ").rstrip("\n")


def dry_run_text(tiny: Tiny, capsys: pytest.CaptureFixture[str], *extra: str) -> list[str]:
    assert main(run_args(tiny, "--dry-run", *extra)) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out.splitlines()


# --- what the command line asks for -------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--nnodes", "0"), "--nnodes: expected a positive number, got 0"),
        (("--npus-per-node", "-8"), "--npus-per-node: expected a positive number, got -8"),
        (("--backend", "docker"), "--backend docker needs --image REF (the image built from the lock)"),
        (
            ("--backend", "ray"),
            "--backend ray needs --ray-address URL (the Ray dashboard, e.g. http://HEAD:8265)",
        ),
        (
            ("--volume", "/data:/data"),
            "--volume: only the docker and slurm backends mount (a cluster's volumes are in its cluster file)",
        ),
        (("--env", "1PATH=/bin"), "--env 1PATH: not a valid environment variable"),
        (("--entry-point", "python3 'x"), '--entry-point "python3 \'x": no closing quotation'),
        (("--entry-point", ""), "--entry-point '': names no command"),
    ],
)
def test_options_that_make_no_plan_stop_before_anything(
    tiny: Tiny, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], message: str
) -> None:
    assert refused(tiny, capsys, *extra) == message


def test_a_flag_for_a_parameter_the_recipe_lacks_is_refused(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    tiny.recipe.write_text(TINY_RECIPE.replace("nnodes: trainer.nnodes, ", ""))
    assert refused(tiny, capsys, "--nnodes", "2") == "recipe tiny has no parameter nnodes; use -o KEY=VALUE"


def test_a_cluster_backend_needs_an_output_dir_for_the_recipes_outputs(
    tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny.recipe.write_text(TINY_RECIPE + "outputs: {trainer.default_local_dir: ckpts}\n")
    assert refused(tiny, capsys, "--backend", "ray", "--ray-address", "http://127.0.0.1:8265") == (
        "--backend ray needs --output-dir DIR for recipe tiny: a directory every node writes to (a cluster "
        "volume), where the checkpoints are kept and audited"
    )


@pytest.mark.parametrize(
    "override, problem",
    [
        ("model.path=/elsewhere", "model.path is set by --model, whose path envrun checks and mounts; use --model"),
        ("+data.train_files=/x.parquet", "data.train_files is set by --data, whose path envrun checks and mounts"),
        ("data.val_files=/x.parquet", "data.val_files is set by --val-data, whose path envrun checks and mounts"),
        ("~data", "the section data holds data.train_files, set by --data, whose path envrun checks and mounts; "
         "set its other keys one by one"),
        ("trainer.default_local_dir=/x", "trainer.default_local_dir is set by --output-dir, whose path envrun "
         "checks and mounts; use --output-dir"),
    ],
)  # fmt: skip
def test_an_override_of_a_key_a_path_flag_sets_is_refused(
    tiny: Tiny, capsys: pytest.CaptureFixture[str], override: str, problem: str
) -> None:
    """It would win the merge: the trainer would read another model or data than the preflight audited, and
    the docker backend would mount the flag's path, not the override's."""
    tiny.recipe.write_text(TINY_RECIPE + "outputs: {trainer.default_local_dir: ckpts}\n")
    assert refused(tiny, capsys, "--dry-run", "-o", override).startswith(f"-o {override}: {problem}")


def test_several_data_files_are_one_hydra_list(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    second = write_parquet_like(tiny.tmp / "more, data.parquet")
    val = write_parquet_like(tiny.tmp / "val.parquet")
    assert main(run_args(tiny, "--dry-run", "--json", "--data", str(tiny.data), str(second))) == 0
    argv = json.loads(capsys.readouterr().out)["argv"]
    both = f"[{tiny.data},'{second}']"  # each element quoted as Hydra needs it
    assert f"data.train_files={both}" in argv and f"data.val_files={both}" in argv
    assert (
        main(run_args(tiny, "--dry-run", "--json", "--data", str(tiny.data), str(second), "--val-data", str(val))) == 0
    )
    argv = json.loads(capsys.readouterr().out)["argv"]
    assert f"data.train_files={both}" in argv and f"data.val_files={val}" in argv


def test_an_existing_run_directory_is_refused_before_any_check(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused up front, exit 2, one line: not after the whole preflight (a model audit, the job probe)."""
    (tiny.tmp / "run").mkdir()
    (tiny.model / "config.json").unlink()  # the model check would fail, if it ran
    assert main(run_args(tiny)) == 2
    out, err = capsys.readouterr()
    assert (
        out == ""
        and err
        == f"envrun: error: --run-dir {tiny.tmp / 'run'}: exists; pick another (a run directory records one run)\n"
    )
    assert list((tiny.tmp / "run").iterdir()) == []


def test_validation_files_alone_set_the_validation_key(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    """--val-data without --data, where the recipe names the training files itself: the files the data
    check reads are the ones the trainer validates on, not dropped."""
    tiny.recipe.write_text(TINY_RECIPE.replace("[data.batch=4,", f"[data.train_files={tiny.data}, data.batch=4,"))
    val = write_parquet_like(tiny.tmp / "val.parquet")
    args = [a for a in run_args(tiny, "--dry-run", "--json", "--val-data", str(val)) if a != "--data"]
    args.remove(str(tiny.data))
    assert main(args) == 0
    argv = json.loads(capsys.readouterr().out)["argv"]
    assert f"data.val_files={val}" in argv and f"data.train_files={tiny.data}" in argv


def test_the_docker_dry_run_shows_the_container_it_would_start(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    # The image's label and platform are the engine's answers (tests/test_auditnames.py); skipped here,
    # the dry run needs no engine.
    lines = dry_run_text(
        tiny,
        capsys,
        *("--backend", "docker", "--image", "train:1", "--volume", f"{tiny.tmp}:/scratch:rw"),
        *("--skip-check", "image-lock-label", "--skip-check", "image-platform"),
    )
    launch = lines.index("launch:  a container, through the engine's API; as a docker command:")
    docker_run = lines[launch + 1]
    assert docker_run.startswith("  docker run --rm ") and f"--volume={tiny.tmp}:/scratch:rw" in docker_run
    assert f" train:1 {sys.executable} {FAKE_TRAINER} --config-name=tiny " in docker_run  # the tiny run's entry
    shown = lines[launch + 2 : lines.index("preflight:")]
    assert shown[0].startswith("  device  ")  # the host's NPUs, or "(none on this host)"
    assert f"  mount   {tiny.tmp} -> /scratch (rw)" in shown
    assert f"  mount   {tiny.model} -> {tiny.model} (ro)" in shown
    assert not (tiny.tmp / "run").exists()


def test_relative_paths_reach_the_trainer_and_the_container_as_one_absolute_path(
    tiny: Tiny, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model model --data train.parquet` from their directory: the overrides name the absolute paths
    (the trainer's working directory is another), and the container mounts them at exactly those."""
    monkeypatch.chdir(tiny.tmp)
    link = tiny.tmp / "model-link"
    link.symlink_to(tiny.model)
    args = run_args(tiny, "--dry-run", "--json", "--backend", "docker", "--image", "train:1")
    args[args.index("--model") + 1], args[args.index("--data") + 1] = "model-link", "train.parquet"
    assert main([*args, "--skip-check", "image-lock-label", "--skip-check", "image-platform"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert f"model.path={link}" in plan["argv"] and f"data.train_files={tiny.data}" in plan["argv"]
    mounts = {v["bind"]: v["host"] for v in plan["launch"]["volumes"] if v["mode"] == "ro"}
    assert mounts[str(link)] == str(link) and mounts[str(tiny.data)] == str(tiny.data)


def test_the_slurm_dry_run_shows_the_batch_job(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    lines = dry_run_text(
        tiny,
        capsys,
        *("--backend", "slurm", "--image", IMAGE, "--nnodes", "2", "--sbatch-arg=--partition=npu"),
    )
    run = tiny.tmp / "run"
    launch = lines.index(f"launch:  a Slurm batch job of 2 node(s), each running {IMAGE}")
    assert lines[launch + 1 : lines.index("preflight:")] == [
        f"  submit:  sbatch {run}/slurm/job.sbatch",
        "  sbatch  --job-name=envrun-tiny",
        "  sbatch  --nodes=2",
        "  sbatch  --ntasks-per-node=1",
        f"  sbatch  --output={run}/slurm/slurm-%j.out",
        "  sbatch  --partition=npu",
    ]
    assert not run.exists()


# --- data files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        ("absent", "no such file"),
        ("directory", "not a regular file (a directory)"),
        ("fifo", "not a regular file (a FIFO)"),  # refused unopened: an open would wait for a writer
        ("under a file", "cannot read: Not a directory"),  # a file taken for a dataset's directory
    ],
)
def test_data_that_is_no_readable_file_stops_the_run(
    tiny: Tiny, capsys: pytest.CaptureFixture[str], make: str, problem: str
) -> None:
    path = tiny.tmp / "train-2.parquet"
    if make == "directory":
        path.mkdir()
    elif make == "fifo":
        os.mkfifo(path)
    elif make == "under a file":
        path = tiny.data / "part-0.parquet"
    line = refused(tiny, capsys, "--data", str(path))
    assert line == f"preflight failed, nothing started: data: {path}: {problem}"


# --- overrides ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("data.batch=[1,2", "data.batch=[1,2: not a valid Hydra override: no viable alternative at input '[1,2'"),
        (
            "ckpt.strict=yes",
            "ckpt.strict=yes: ckpt.strict expects a boolean (True/False; default True), got 'yes'",
        ),
        (
            "hydra.run.dirr=/x",  # one of Hydra's own settings, misspelt
            "hydra.run.dirr=/x: unknown key hydra.run.dirr in the verl config (or add it with +hydra.run.dirr=..., "
            "if verl reads it)",
        ),
    ],
)
def test_an_override_of_the_wrong_form_or_kind_is_named(tiny: Tiny, override: str, problem: str) -> None:
    with pytest.raises(OverrideError) as info:
        validate_overrides([override, "ckpt.strict=0", "hydra.run.dir=/x"], tiny.config, "tiny")
    assert info.value.problems == [problem] and info.value.exit_code == 2


def test_a_config_group_is_chosen_by_option_and_an_unknown_option_refused(
    tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    (tiny.config / "tiny.yaml").write_text("defaults:\n  - optim: adam\n  - _self_\n" + TINY_CONFIG)
    (tiny.config / "optim").mkdir()
    (tiny.config / "optim" / "adam.yaml").write_text("name: adam\nlr: 0.001\n")
    (tiny.config / "optim" / "sgd.yaml").write_text("name: sgd\nlr: 0.1\n")
    assert main(run_args(tiny, "--dry-run", "--json", "-o", "optim=sgd")) == 0
    assert json.loads(capsys.readouterr().out)["argv"][-1] == "optim=sgd"
    assert main(run_args(tiny, "-o", "optim=rmsprop")) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "envrun: error: 1 override(s) do not fit the verl config; nothing started:\n"
        "envrun: error:   the verl config (tiny) rejects the overrides: In 'tiny': Could not find 'optim/rmsprop'\n"
    )
    assert not (tiny.tmp / "run").exists()


def test_a_verl_config_dir_without_the_recipes_config_is_named(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tiny.tmp / "not-verl"
    elsewhere.mkdir()
    args = run_args(tiny)
    args[args.index("--verl-config") + 1] = str(elsewhere)
    assert main(args) == 2
    assert capsys.readouterr() == ("", f"envrun: error: {elsewhere}: no tiny.yaml; is this verl's trainer/config?\n")


# --- verl's config tree, from the lock's wheel ----------------------------------------------------


def lock_with_verl(tmp_path: Path, files: tuple[PackageFile, ...] | None) -> Path:
    """The tiny lock with verl's files replaced (None: without verl at all), written to ``tmp_path``."""
    lock = read_lock(LOCK).lock
    if files is None:
        packages = tuple(p for p in lock.packages if p.name != "verl")
    else:
        packages = tuple(replace(p, files=files) if p.name == "verl" else p for p in lock.packages)
    path = tmp_path / "lock.yaml"
    path.write_text(dump_lock(replace(lock, packages=packages)))
    return path


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            None,
            "packages: no verl entry; the recipe's overrides are validated against the verl wheel the lock pins "
            "(re-lock with `envbuild lock`, or pass --verl-config DIR)",
        ),
        (
            (PackageFile("verl-0.9.1.tar.gz", "b" * 64),),
            "packages: verl 0.9.1 lists no wheel; add its py3-none-any wheel with its sha256 (`envbuild lock`)",
        ),
    ],
)
def test_a_lock_without_a_verl_wheel_stops_the_run(
    tiny: Tiny, capsys: pytest.CaptureFixture[str], files: tuple[PackageFile, ...] | None, message: str
) -> None:
    lock = lock_with_verl(tiny.tmp, files)
    args = run_args(tiny, "--cache-dir", str(tiny.tmp / "cache"))
    args[args.index("--lock") + 1] = str(lock)
    del args[args.index("--verl-config") : args.index("--verl-config") + 2]
    assert main(args) == 2
    assert capsys.readouterr() == ("", f"envrun: error: {lock}: {message}\n")
    assert not (tiny.tmp / "run").exists() and not (tiny.tmp / "cache").exists()


CONFIG = "verl/trainer/config/ppo_trainer.yaml"


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PyIndex]:
    (tmp_path / "dists").mkdir()
    with PyIndex(tmp_path / "dists") as served:
        yield served


def served_wheel(index: PyIndex, version: str, members: dict[str, str] | bytes) -> VerlWheel:
    """A file ``verl-VERSION-py3-none-any.whl`` on ``index`` (a zip of ``members``, or these bytes), as a
    lock pins it."""
    path = index.root / f"verl-{version}-py3-none-any.whl"
    if isinstance(members, bytes):
        path.write_bytes(members)
    else:
        with zipfile.ZipFile(path, "w") as wheel:
            for name, text in members.items():
                wheel.writestr(name, text)
    return VerlWheel("verl", version, path.name, hashlib.sha256(path.read_bytes()).hexdigest(), index.url)


def test_offline_without_the_wheel_in_the_cache_is_refused(index: PyIndex, tmp_path: Path) -> None:
    wheel = served_wheel(index, "1.0", {CONFIG: "a: 1\n"})
    with pytest.raises(InputError) as info:
        verl_config_dir(wheel, tmp_path / "cache", offline=True)
    root = tmp_path / "cache" / "verl-config" / wheel.sha256
    assert str(info.value) == (
        f"{wheel.filename}: not in the cache ({root}) and --offline was given; run once online or pass --verl-config DIR"
    )
    assert index.requests == []


def test_an_index_that_does_not_list_the_pinned_wheel_is_named(index: PyIndex, tmp_path: Path) -> None:
    wheel = served_wheel(index, "1.0", {CONFIG: "a: 1\n"})
    index.hide(wheel.filename)
    with pytest.raises(RemoteError) as info:
        verl_config_dir(wheel, tmp_path / "cache")
    assert str(info.value) == f"{index.url}: the index does not serve {wheel.filename}"


def test_a_half_written_config_tree_is_replaced(index: PyIndex, tmp_path: Path) -> None:
    wheel = served_wheel(index, "1.0", {CONFIG: "a: 1\n", "verl/__init__.py": ""})
    root = tmp_path / "cache" / "verl-config" / wheel.sha256
    (root / "verl/trainer/config").mkdir(parents=True)
    (root / "verl/trainer/config/stale.yaml").write_text("left by an interrupted run\n")  # and no .complete
    config = verl_config_dir(wheel, tmp_path / "cache")
    assert config == root / "verl/trainer/config"
    assert sorted(p.name for p in config.iterdir()) == ["ppo_trainer.yaml"]
    assert (root / ".complete").read_text() == f"{wheel.filename}\n"
    assert not (root / "verl/__init__.py").exists()  # only the config tree is kept


def test_a_cache_it_cannot_write_is_a_cache_error(index: PyIndex, tmp_path: Path) -> None:
    # As root no permission stands in for a read-only cache: a file where its directory goes fails alike.
    wheel = served_wheel(index, "1.0", {CONFIG: "a: 1\n"})
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "verl-config").write_text("")
    with pytest.raises(CacheError) as info:
        verl_config_dir(wheel, tmp_path / "cache")
    root = tmp_path / "cache" / "verl-config" / wheel.sha256
    assert str(info.value) == f"{root}: cannot write the verl config cache: File exists"
    assert info.value.exit_code == 1


@pytest.mark.parametrize(
    ("members", "error", "message"),
    [
        ({"verl/__init__.py": ""}, InputError, "holds no verl/trainer/config/; is it a verl wheel?"),
        (
            {CONFIG: "a: 1\n", "verl/trainer/config/../../../../../../escaped.yaml": "x"},
            RemoteError,
            "refusing member 'verl/trainer/config/../../../../../../escaped.yaml' (path escape)",
        ),
        (b"PK\x03\x04 and then no zip", RemoteError, "not a valid wheel: File is not a zip file"),
    ],
)
def test_a_pinned_wheel_that_holds_no_usable_config_tree_is_refused(
    index: PyIndex, tmp_path: Path, members: dict[str, str] | bytes, error: type[Exception], message: str
) -> None:
    wheel = served_wheel(index, "1.0", members)  # the lock pins its sha256: the file is what the lock says
    with pytest.raises(error) as info:
        verl_config_dir(wheel, tmp_path / "cache")
    assert str(info.value) == f"{wheel.filename}: {message}"
    assert list((tmp_path / "cache" / "verl-config").iterdir()) == []  # no tree, no staging left
    assert list(tmp_path.rglob("escaped.yaml")) == []


# --- cluster files and node answers --------------------------------------------------------------


IGNORED = " (what follows '?' or '#' would be ignored)"


@pytest.mark.parametrize(
    ("engine", "problem"),
    [
        ("ssh://node 002", "'ssh://node 002' contains whitespace or control characters"),
        ('"ssh://node-002\\e[2J"', "'ssh://node-002\\x1b[2J' contains whitespace or control characters"),
        ("tcp://node-002:99999", "'tcp://node-002:99999' has an invalid host or port"),
        ("tcp://node-002:http", "'tcp://node-002:http' has an invalid host or port"),
        ("tcp://[::1:2375", "'tcp://[::1:2375' has an invalid host or port"),
        ("tcp://:2375", "'tcp://:2375' has no host"),
        ("ssh://", "'ssh://' has no host"),
        ("tcp://node-002:2375/v1.43", "'tcp://node-002:2375/v1.43': an engine URL has no path"),
        ("ssh://root@node-002?x=1", "'ssh://***@node-002?x=1': an engine URL has no query or fragment" + IGNORED),
        ("ssh://root@node-002#a", "'ssh://***@node-002#a': an engine URL has no query or fragment" + IGNORED),
        ("ssh://root@node-002:0", "'ssh://***@node-002:0': 0 is not a port (1-65535)"),
    ],
)
def test_an_engine_that_is_no_engine_url_is_named_by_line(engine: str, problem: str) -> None:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster_file(CLUSTER.replace("tcp://node-002:2375", engine), "c.yaml")
    assert str(info.value) == f"c.yaml:5: nodes[1].engine: {problem}" and info.value.exit_code == 2


def test_a_node_answer_naming_no_address_fails_its_check() -> None:
    want = "a" * 64
    answer = {k: v for k, v in node_answer("2", want).items() if k != "ip"}
    (line,) = node_lines([answer], want, "x", {"n2": "10.0.0.2"})
    assert line.status == "fail"
    assert (
        f"node n2 (ip None, Ray node {'2' * 56}) advertises None, not 10.0.0.2 (the cluster file's ip)" in line.detail
    )


def test_a_head_named_by_host_name_is_not_taken_for_its_address() -> None:
    line = job_address_line([node_answer("1", "a", job_ray_address="head-001:6379")], "10.0.0.1")
    assert line is not None and line.status == "fail"
    assert "RAY_ADDRESS=head-001:6379, not the head's address 10.0.0.1" in line.detail
    assert same_address("[::1]", "0:0::1") and same_address("head-001", "head-001")
