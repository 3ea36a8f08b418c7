"""The job spec a node reads (envrun.injob.spec) when it is not what envrun wrote: ``python3 -m envrun.injob``
run as a scheduler's job runs it, with a spec truncated, of another kind, or with a field of the wrong kind.
Each is one line naming the file and the field, exit 2, before the node checks or starts anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envrun.injob.spec import InJob, SpecError

REPO = Path(__file__).resolve().parents[1]
GOOD: dict[str, Any] = json.loads(
    json.dumps(InJob(plan={"lock_sha256": "ab" * 32}, lenient=True, nnodes=2, npus_per_node=16).to_json())
)


def run_injob(tmp_path: Path, text: str, verb: str = "check") -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "job.json"
    spec.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO), "ENVRUN_NODE_INDEX": "0"}
    return subprocess.run(
        [sys.executable, "-m", "envrun.injob", verb, str(spec)], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[]", "expected a JSON object (envrun's job spec), not list"),
        ('"job"', "expected a JSON object (envrun's job spec), not str"),
        (
            json.dumps({**GOOD, "ray_start_args": "--num-cpus=4"}),
            'field ray_start_args: expected a list of `ray start` arguments, not "--num-cpus=4"',
        ),
        (json.dumps({**GOOD, "skip_checks": "npus"}), 'field skip_checks: expected a list of check names, not "npus"'),
        (
            json.dumps({**GOOD, "npus_per_node": "16"}),
            'field npus_per_node: expected a whole number of NPUs, or null, not "16"',
        ),
        (json.dumps({**GOOD, "nnodes": True}), "field nnodes: expected a whole number, at least 1, not true"),
        (json.dumps({**GOOD, "head_port": 70000}), "field head_port: expected a TCP port (1 to 65535), not 70000"),
        (json.dumps({**GOOD, "join_timeout": float("nan")}), "field join_timeout: expected seconds above 0, not NaN"),
        (json.dumps({**GOOD, "plan": {}}), "field plan.lock_sha256: missing; expected the lock's sha256"),
    ],
)
def test_a_spec_of_the_wrong_kind_is_one_line_naming_the_field(tmp_path: Path, text: str, said: str) -> None:
    for verb in ("check", "node", "driver"):
        done = run_injob(tmp_path, text, verb)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr == f"envrun: {tmp_path / 'job.json'}: {said}\n"


def test_every_field_of_the_wrong_kind_is_named_at_once() -> None:
    broken = {**GOOD, "lenient": "yes", "hccl_ports": "60000"}
    del broken["dashboard_port"]
    with pytest.raises(SpecError) as refused:
        InJob.from_json(broken)
    assert str(refused.value) == (
        'field lenient: expected true or false, not "yes"; '
        "field dashboard_port: missing; expected a TCP port (1 to 65535); "
        'field hccl_ports: expected a TCP port (1 to 65535), not "60000"'
    )


def test_a_truncated_spec_says_where_its_json_ends(tmp_path: Path) -> None:
    done = run_injob(tmp_path, json.dumps(GOOD)[:40])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"envrun: {tmp_path / 'job.json'}: JSONDecodeError: ")
    assert done.stderr.count("\n") == 1


def test_the_spec_envrun_writes_is_read_back() -> None:
    spec = InJob(
        plan={"lock_sha256": "ab" * 32},
        lenient=False,
        nnodes=32,
        skip_checks=("npus",),
        ray_start_args=("--num-cpus=64",),
    )
    assert InJob.from_json(json.loads(json.dumps(spec.to_json()))) == spec
