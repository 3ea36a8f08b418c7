"""The job probe's answer as hostile input (envrun.probe.report): it comes from a script run inside an
image, whose python and packages the image decides. Whatever the answer's shape, size or nesting, the
parser gives a report (a problem saying what was wrong with the answer), never a traceback."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from envrun.checkpoint import audit_checkpoint, render_audit
from envrun.checkpoint.modelnames import ModelNamesError, _parse_answer
from envrun.cluster.nodecheck import cluster_cpu_line
from envrun.probe.job_script import MARKER
from envrun.probe.report import parse_report, probe_lines, ray_cpu_line
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint

HOSTILE = {
    "not an object": "[1, 2]",
    "a string": '"ok"',
    "problems as a string": json.dumps({"problems": "abc"}),
    "problems of numbers": json.dumps({"problems": [1, None]}),
    "imports as an object": json.dumps({"imports": {"torch": "ok"}}),
    "imports of strings": json.dumps({"imports": ["torch"]}),
    "facts as a list": json.dumps({"facts": [1, 2]}),
    "facts as a string": json.dumps({"facts": "verl"}),
    "verl as a string": json.dumps({"facts": {"verl": "0.9.1"}}),
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "crash as an object": json.dumps({"crash": {"x": 1}}),
}


@pytest.mark.parametrize("answer", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_answer_is_a_report_never_a_traceback(answer: str) -> None:
    report = parse_report("image x", f"noise\n{MARKER}{answer}\n")
    lines = probe_lines(report)
    assert lines and all("\n" not in line.detail for line in lines)
    json.dumps([line.facts for line in lines])  # what preflight.json records stays serialisable


RAY_CPUS = {
    "not an object": ([4], "facts.ray_cpus is a list, not an object"),
    "needed as text": ({"needed": "many", "detected": 8}, 'facts.ray_cpus needed is "many", not a number'),
    "needed missing": ({"detected": 8}, "facts.ray_cpus needed is missing, not a number"),
    "detected NaN": ({"needed": 1, "detected": float("nan")}, "facts.ray_cpus detected is NaN, not a number"),
    "num_cpus as text": ({"needed": 1, "detected": 8, "num_cpus": "auto"}, 'num_cpus is "auto", not a number or null'),
    "parts of numbers": ({"needed": 1, "detected": 8, "parts": [1, 2]}, "parts is not a list of [what, CPUs] pairs"),
    "names as text": ({"needed": 1, "detected": 8, "set_for_a_new_ray": "num_cpus"}, "set_for_a_new_ray is not"),
}


@pytest.mark.parametrize(("ray_cpus", "said"), RAY_CPUS.values(), ids=RAY_CPUS.keys())
def test_hostile_cpu_facts_are_a_named_problem_never_a_traceback(ray_cpus: object, said: str) -> None:
    """The CPUs the job's actors ask for, as this host's preflight and a cluster's node check judge them:
    before, each of these ended envrun with a traceback (float() of text, a missing key, a bad pair)."""
    answer = {"facts": {"ray_cpus": ray_cpus}, "problems": [], "imports": []}
    report = parse_report("image x", MARKER + json.dumps(answer))
    assert not report.ok and said in report.problems[0].detail
    assert ray_cpu_line(report) is None  # the probe's own line refuses the run
    assert cluster_cpu_line([{"name": "n1", "cpu_resource": 8, "probe": answer}]) is None
    assert [line.status for line in probe_lines(report)] == ["fail"]


def test_the_cpu_facts_the_script_writes_are_judged() -> None:
    found = {"needed": 9.0, "parts": [["TaskRunner", 1.0], ["8 SimpleStorageUnit x 1", 8.0]], "num_cpus": None}
    answer = {"facts": {"ray_cpus": {**found, "detected": 2.0, "set_for_a_new_ray": []}}}
    line = ray_cpu_line(parse_report("image x", MARKER + json.dumps(answer)))
    assert line is not None and line.status == "fail" and "num_cpus=9" in line.detail


def test_an_answer_of_the_wrong_shape_is_named() -> None:
    report = parse_report("image x", f"{MARKER}[1, 2]\n")
    assert not report.ok
    assert report.problems[0].detail == "the probe's answer is not a JSON object but a list"


def test_an_answer_too_large_is_refused_unparsed() -> None:
    report = parse_report("image x", MARKER + json.dumps({"facts": {"x": "a" * (9 << 20)}}))
    assert report.problems[0].detail.startswith("the probe's answer is 9437")
    assert report.problems[0].detail.endswith("bytes, more than the 8388608 read; refused")


# --- the meta-device names answer (envrun.checkpoint.modelnames) -------------------------------


@pytest.mark.parametrize(
    "answer", [b"[" * 100_000 + b"]" * 100_000, b'{"names": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", b"\xff\xfe"]
)
def test_a_hostile_names_answer_is_one_error_line(answer: bytes) -> None:
    with pytest.raises(ModelNamesError) as info:
        _parse_answer(answer, b"{}", "python3", 10)
    assert str(info.value).startswith("python3: ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("field", ["class", "transformers", "torch"])
def test_a_names_answer_naming_its_maker_in_terminal_codes_is_refused(field: str) -> None:
    config = b"{}"
    doc = {"names": ["lm_head.weight"], "config_sha256": hashlib.sha256(config).hexdigest(),
           "class": "GlmMoeDsaForCausalLM", "transformers": "5.10.4", "torch": "2.13.0+cpu"}  # fmt: skip
    assert _parse_answer(json.dumps(doc).encode(), config, "python3", 10).transformers == "5.10.4"
    doc[field] = "5.10.4\x1b]0;owned\x07"
    with pytest.raises(ModelNamesError, match="not a plain name"):
        _parse_answer(json.dumps(doc).encode(), config, "python3", 10)


def test_the_audit_summary_escapes_what_the_image_and_the_checkpoint_said(tmp_path: Path) -> None:
    """The expected names' source names the class and versions the image's python reported."""
    write_checkpoint(tmp_path, CheckpointSpec(include_mtp=False))
    report = dataclasses.replace(
        audit_checkpoint(tmp_path), expected_from="\x1b]0;owned\x07Glm\x1b[2J of transformers 5"
    )
    text = render_audit(report, tmp_path)
    assert "\x1b" not in text and "\x07" not in text
    assert "expected names: \\x1b]0;owned\\x07Glm\\x1b[2J of transformers 5" in text
