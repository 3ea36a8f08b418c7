"""envbuild.engine.cli_build above the real boundary: which transport a set of docker CLIs gives, and
the CLI's plain progress read as steps; the probe against the machine's real docker CLIs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from envbuild.engine.buildkit import BuildKitProgress
from envbuild.engine.cli_build import (
    CliProbe,
    PlainProgress,
    choose_transport,
    find_transport,
    probe_cli,
)
from envbuild.errors import EngineError

OLD = CliProbe("/opt/docker19", "19.03.15", False)
DEBIAN = CliProbe("/usr/bin/docker", "20.10.24+dfsg1", False)
NEW_NO_BUILDX = CliProbe("/usr/local/bin/docker", "28.1.1", False)
NEW_BUILDX = CliProbe("/opt/docker28", "28.1.1", True)
NOT_DOCKER = CliProbe("/bin/true", "", False)


def test_docker_20_10_to_22_build_with_docker_build() -> None:
    for version in ("20.10.24+dfsg1", "22.06.0-beta.0"):
        transport = choose_transport([CliProbe("/usr/bin/docker", version, False)])
        assert transport.cli is not None and transport.cli.command == ("build",)
        assert transport.describe().startswith("/usr/bin/docker build (docker ")


def test_docker_23_and_later_need_buildx_and_build_on_the_engines_builder() -> None:
    transport = choose_transport([NEW_BUILDX])
    assert transport.cli is not None
    assert transport.cli.command == ("buildx", "build", "--load", "--builder", "default")
    assert "buildx build" in transport.describe()


def test_the_first_usable_cli_wins_and_the_ones_passed_over_are_named() -> None:
    transport = choose_transport([NEW_NO_BUILDX, OLD, DEBIAN, NEW_BUILDX])
    assert transport.cli is not None and transport.cli.path == "/usr/bin/docker"
    assert "/usr/local/bin/docker is docker 28.1.1 without the buildx plugin" in transport.reason
    assert "/opt/docker19 is docker 19.03.15, older than 20.10" in transport.reason


def test_without_a_usable_cli_the_engine_api_is_used_and_says_why() -> None:
    transport = choose_transport([NEW_NO_BUILDX, NOT_DOCKER])
    assert transport.cli is None and transport.describe() == "the Engine API"
    assert "no docker CLI that runs BuildKit builds" in transport.reason
    assert "without the buildx plugin" in transport.reason and "/bin/true is not a docker CLI" in transport.reason
    assert "no docker CLI on PATH" in choose_transport([]).reason


def test_envbuild_docker_cli_names_the_cli_or_none() -> None:
    assert choose_transport([DEBIAN], "none").cli is None
    assert choose_transport([DEBIAN], "/usr/bin/docker").cli is not None
    with pytest.raises(EngineError, match=r"^ENVBUILD_DOCKER_CLI=/usr/local/bin/docker: .*without the buildx"):
        choose_transport([NEW_NO_BUILDX], "/usr/local/bin/docker")


def _script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_probe_reads_a_cli_s_version(tmp_path: Path) -> None:
    fake = _script(tmp_path, "docker", 'echo "Docker version 20.10.24+dfsg1, build 297e128"')
    assert probe_cli(str(fake)) == CliProbe(str(fake), "20.10.24+dfsg1", False)
    newer = _script(tmp_path, "docker28", '[ "$1" = buildx ] && exit 1; echo "Docker version 28.1.1, build 4eba377"')
    assert probe_cli(str(newer)) == CliProbe(str(newer), "28.1.1", False)
    assert probe_cli(str(tmp_path / "absent")).version == ""
    assert probe_cli(str(_script(tmp_path, "other", "echo hello"))).version == ""


def test_find_transport_tries_path_first_and_takes_what_envbuild_docker_cli_names(tmp_path: Path) -> None:
    broken = _script(tmp_path, "docker", "exit 1")
    transport = find_transport({"PATH": str(tmp_path)})  # then /usr/bin/docker, /usr/local/bin/docker
    assert f"{broken} is not a docker CLI that answers" in transport.reason
    with pytest.raises(EngineError, match=r"^ENVBUILD_DOCKER_CLI=docker: .* is not a docker CLI"):
        find_transport({"PATH": str(tmp_path), "ENVBUILD_DOCKER_CLI": "docker"})
    assert find_transport({"PATH": os.environ.get("PATH", ""), "ENVBUILD_DOCKER_CLI": "none"}).cli is None


def test_the_machines_debian_cli_runs_buildkit_builds() -> None:
    """The real docker CLI the project's services use (Debian's docker.io)."""
    transport = find_transport({"PATH": "/usr/bin", "ENVBUILD_DOCKER_CLI": "/usr/bin/docker"})
    assert transport.cli is not None and transport.cli.path == "/usr/bin/docker"


# Lines of `DOCKER_BUILDKIT=1 docker build --progress plain` (docker 20.10), cut down.
PLAIN = """\
#1 [internal] load build definition from Dockerfile
#1 sha256:c2e0b36e29f82353a5fe06ae88f8c984128a924591ba4c7d9a2f56f67ed3a965
#1 transferring dockerfile: 1.28kB done
#1 DONE 0.0s

#4 [envbuild-from 1/1] FROM 127.0.0.1:5032/base@sha256:7078
#4 sha256:e7ab56639d4aca54b582b87f84de4796ef7ed97089f5102758bde0ca9284cfe8
#4 CACHED

#5 [internal] load build context
#5 transferring context: 413.66MB 4.8s
#5 transferring context: 1.06GB 13.1s done
#5 DONE 13.3s

#8 [stage-2 3/3] RUN sh /opt/envbuild/mnt/packages.sh
#8 6.804 Looking in links: wheels
#8 13.11 Installing collected packages: mpmath
#8 14.2 ERROR: pip says no
#8 ERROR: executor failed running [/bin/sh -c sh /opt/envbuild/mnt/packages.sh]: exit code: 1
------
 > [stage-2 3/3] RUN sh /opt/envbuild/mnt/packages.sh:
------
error: failed to solve: rpc error: code = Unknown desc = executor failed running [/bin/sh -c sh packages.sh]: exit code: 1
"""


def test_plain_progress_becomes_steps_and_a_failure_with_its_log_tail() -> None:
    lines: list[str] = []
    build = BuildKitProgress(lines.append)
    plain = PlainProgress(build)
    for line in PLAIN.splitlines():
        plain.line(line, now=0.0)
        plain.tick(now=0.1)  # each line comes at once after the one before: no step is started by the clock
    assert plain.sent == 1_060_000_000
    assert [(s.instruction.split()[0], s.cached) for s in build.steps] == [("[envbuild-from", True)]
    assert "step [envbuild-from 1/1] FROM 127.0.0.1:5032/base@sha256:7078: cached" in lines
    assert "step [stage-2 3/3] RUN sh /opt/envbuild/mnt/packages.sh" in lines
    assert not any(line.startswith("step [envbuild-from") and not line.endswith("cached") for line in lines)
    failure = build.failure(plain.error())
    assert failure.startswith(
        "build failed at step [stage-2 3/3] RUN sh /opt/envbuild/mnt/packages.sh: failed to solve"
    )
    assert "\n    | Looking in links: wheels" in failure and "\n    | ERROR: pip says no" in failure


def test_a_step_that_prints_nothing_has_started_once_the_cache_did_not_answer() -> None:
    lines: list[str] = []
    plain = PlainProgress(BuildKitProgress(lines.append))
    plain.line("#7 [stage-2 2/3] RUN sleep 60", now=0.0)
    plain.tick(now=0.2)
    assert lines == []
    plain.tick(now=1.0)
    assert lines == ["step [stage-2 2/3] RUN sleep 60"]
    plain.line("#7 DONE 60.1s", now=61.0)
    assert plain.build.steps[0].cached is False
