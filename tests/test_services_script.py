"""scripts/services starting Debian's registry where things go wrong: the default port held by another
process, a registry that dies before it answers; and a Slurm whose stop must leave none of its jobs
behind. Each test runs an instance of its own (own run dir, storage and ports), beside the suite's
services, and stops what it started."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

SERVICES = Path(__file__).resolve().parents[1] / "scripts" / "services"


@dataclass(frozen=True)
class Instance:
    run_dir: Path
    env: dict[str, str]

    def services(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SERVICES), *args, "registry"], env=self.env, capture_output=True, text=True, timeout=300
        )

    def address(self) -> str:
        for line in (self.run_dir / "env").read_text().splitlines():
            if line.startswith("export ENVBUILD_TEST_REGISTRY="):
                return line.split("=", 1)[1]
        raise AssertionError("the env file names no registry")

    def pid(self) -> int:
        return int((self.run_dir / "registry.pid").read_text())


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[Instance]:
    env = {k: v for k, v in os.environ.items() if k != "ENVBUILD_TEST_REGISTRY_ADDR"}
    env.update(ENVBUILD_TEST_RUN_DIR=str(tmp_path / "run"), ENVBUILD_TEST_REGISTRY_DIR=str(tmp_path / "storage"))
    it = Instance(tmp_path / "run", env)
    yield it
    it.services("stop")


def _dies_first(tmp_path: Path, how: str) -> str:
    """A PATH entry whose docker-registry dies (``how``) on its first start, then is Debian's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker-registry"
    script.write_text(
        "#!/bin/bash\n"
        f"if [[ ! -e {tmp_path}/started ]]; then touch {tmp_path}/started; {how}; fi\n"
        'exec /usr/bin/docker-registry "$@"\n'
    )
    script.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def _answers(address: str) -> bool:
    return requests.get(f"http://{address}/v2/", timeout=10).status_code == 200


@pytest.mark.registry
def test_default_port_held_by_another_process_moves_the_registry(instance: Instance) -> None:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", 5000))
    except OSError:
        pass  # the suite's own registry holds it: the same case
    else:
        holder.listen()
    try:
        started = instance.services("start")
        assert started.returncode == 0, started.stderr
        assert "port 5000 is taken" in started.stderr
        address = instance.address()
        assert address.startswith("127.0.0.1:") and address != "127.0.0.1:5000"
        assert _answers(address)
        assert instance.services("status").returncode == 0
    finally:
        holder.close()
    pid = instance.pid()
    assert instance.services("stop").returncode == 0
    assert not Path(f"/proc/{pid}").exists()
    assert instance.services("status").returncode == 3


@pytest.mark.registry
@pytest.mark.parametrize(
    ("how", "said"), [("kill -9 $$", "was killed by signal 9"), ("echo bad config >&2; exit 3", "exited with status 3")]
)
def test_registry_that_dies_before_it_answers_says_why_and_is_started_once_more(
    instance: Instance, tmp_path: Path, how: str, said: str
) -> None:
    instance.env["PATH"] = _dies_first(tmp_path, how)
    started = instance.services("start")
    assert started.returncode == 0, started.stderr
    assert said in started.stderr
    if "exit 3" in how:
        assert "bad config" in started.stderr  # the end of its log
    assert "starting the registry once more" in started.stderr
    assert _answers(instance.address())


@pytest.mark.registry
def test_a_registry_slow_to_exec_its_program_is_waited_for_not_called_dead(instance: Instance, tmp_path: Path) -> None:
    """Until a child has exec'd the registry its command line is another's (this script's, or empty while
    it execs): on a loaded machine the first look can come then. The start must not call it dead (it did,
    in CI: the registry was killed as 'not answering' with an empty log). Here the wait is made long: for
    a second the child runs under a command line that does not name the registry."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker-registry").write_text(
        '#!/bin/bash\nREAL=/usr/bin/docker-registry exec -a warming-up bash -c \'sleep 1; exec "$REAL" "$@"\' x "$@"\n'
    )
    (bin_dir / "docker-registry").chmod(0o755)
    instance.env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    started = instance.services("start")
    assert started.returncode == 0, started.stderr
    assert "before it answered" not in started.stderr and "once more" not in started.stderr
    assert _answers(instance.address())


@pytest.mark.registry
def test_registry_that_never_starts_fails_in_one_clear_line(instance: Instance, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker-registry").write_text("#!/bin/bash\necho 'listen: permission denied' >&2\nexit 1\n")
    (bin_dir / "docker-registry").chmod(0o755)
    instance.env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    started = instance.services("start")
    assert started.returncode == 1
    assert started.stderr.count("exited with status 1 before it answered") == 2
    assert "listen: permission denied" in started.stderr
    assert started.stderr.rstrip().splitlines()[-1].startswith("services: the registry would not start (log: ")
    assert not (instance.run_dir / "registry.pid").exists()
    assert not (instance.run_dir / "registry.addr").exists()
    assert not (instance.run_dir / "env").exists()


def test_unknown_service_is_a_usage_error() -> None:
    result = subprocess.run([str(SERVICES), "start", "ray"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: ")


def _slurmctld_port(conf: Path) -> str:
    return next(line.split("=", 1)[1] for line in conf.read_text().splitlines() if line.startswith("SlurmctldPort="))


def _processes_naming(text: str) -> list[str]:
    """The live processes whose command line or environment holds ``text``, as "PID command"."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue  # not a process, or gone
        if cmdline and (text.encode() in cmdline or text.encode() in environ):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name} {command}")
    return found


@pytest.mark.slurm
def test_slurm_instance_beside_the_suites_runs_jobs_and_its_stop_leaves_none_of_them(tmp_path: Path) -> None:
    """A second Slurm on one machine takes other ports; stopped with a job's step running, nothing of it is
    left (slurmstepd outlives slurmd, a job's daemon outlives its slurmstepd), and the suite's Slurm never
    noticed."""
    # munged runs as user munge, which cannot enter pytest's tmp_path (mode 0700).
    run_dir = Path(tempfile.mkdtemp(prefix="envbuild-test-slurm-"))
    run_dir.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["ENVBUILD_TEST_RUN_DIR"] = str(run_dir)
    conf = run_dir / "slurm" / "slurm.conf"

    def services(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SERVICES), *args, "slurm"], env=env, capture_output=True, text=True, timeout=120)

    try:
        started = services("start")
        assert started.returncode == 0, started.stderr
        assert (run_dir / "env").read_text() == f"export SLURM_CONF={conf}\n"
        assert _slurmctld_port(conf) != _slurmctld_port(Path(os.environ["SLURM_CONF"]))
        assert services("status").returncode == 0
        submitted = subprocess.run(
            ["sbatch", "--parsable", "-N2", f"--output={tmp_path / 'job.out'}", f"--chdir={tmp_path}"]
            # A daemon that leaves the job's process tree (as a Ray node does), and a step on both nodes.
            + ["--wrap", "setsid -f sleep 301 </dev/null >/dev/null 2>&1 & srun -N2 --ntasks-per-node=1 sleep 302"],
            env={**env, "SLURM_CONF": str(conf)},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        job_id = submitted.stdout.strip()
        deadline = time.monotonic() + 30
        while "slurmstepd: [" + job_id + ".0]" not in " ".join(_processes_naming(str(conf))):
            assert time.monotonic() < deadline, f"no step of job {job_id} ran; its log is {tmp_path / 'job.out'}"
            time.sleep(0.1)
        stopped = services("stop")
        assert stopped.returncode == 0, stopped.stderr
        assert "stopping the jobs of this instance" in stopped.stderr
        assert _processes_naming(str(run_dir)) == []
        assert services("status").returncode == 3
    finally:
        services("stop")
        shutil.rmtree(run_dir, ignore_errors=True)
    # The suite's Slurm (at the caller's SLURM_CONF) still has both nodes up.
    listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30)
    states = dict(line.split() for line in listed.stdout.splitlines())
    assert sorted(states) == ["n1", "n2"] and set(states.values()) <= {"idle", "mix", "alloc"}, listed
