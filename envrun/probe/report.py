"""The job probe's report as a typed value, and its verdict as preflight lines (pure).

One line per problem, each naming the config key or the module and why it is imported; no problem is
one ``ok`` line saying what was proven. The whole report rides on the first line (``facts``), so
``preflight.json`` records what the probe saw: verl's version and path, every import with its verdict
(``skip`` ones with the recipe's reason), and where the exports go.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from envbuild.data.jsonout import json_meta
from envrun.checkpoint.untrusted import load_json
from envrun.preflightline import PreflightLine
from envrun.probe.job_script import MARKER

CHECK = "job-probe"
# The answer is a few KB (a problem and a verdict per import); the image's python writes it, so it is
# bounded like any hostile JSON: its size before it is read, its nesting before it is parsed.
MAX_ANSWER = 8 << 20
ImportStatus = Literal["ok", "skip", "fail"]


@dataclass(frozen=True)
class ExportLayout:
    """Where the job writes its Hugging Face exports, read from its verl, and whether it writes any."""

    root: str | None  # trainer.default_local_dir as a worker resolves it
    pattern: str  # glob under root (verl 0.9.1, megatron: global_step_*/actor/model/huggingface)
    expected: bool  # the config saves HF weights (trainer.save_freq > 0 and save_contents holds them)
    why: str
    strict: bool = field(metadata=json_meta(skip=True))


@dataclass(frozen=True)
class ProbeImport:
    module: str
    why: str
    status: ImportStatus
    detail: str = ""
    skip: str = ""  # the skip_imports entry that covers a failure


@dataclass(frozen=True)
class ProbeProblem:
    what: str  # compose | validate_config | resolve | import | trainer | exports | probe
    detail: str
    key: str = ""
    module: str = ""


@dataclass(frozen=True)
class ProbeReport:
    where: str  # "this host", "image REF", "node NAME"
    problems: tuple[ProbeProblem, ...]
    imports: tuple[ProbeImport, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    exports: ExportLayout | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)  # the script's own answer, for the record

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def verl(self) -> str:
        found = self.facts.get("verl") or {}
        return f"verl {found.get('version')}" if isinstance(found, dict) and found else "no verl"


def failed_report(where: str, detail: str) -> ProbeReport:
    """A probe that could not run or gave no answer: one problem saying why."""
    return ProbeReport(where, (ProbeProblem("probe", detail),))


def parse_report(where: str, stdout: str, stderr: str = "", exit_code: int | None = 0) -> ProbeReport:
    """The script's answer (its last ``MARKER`` line); a report with one problem when there is none."""
    lines = [line for line in stdout.splitlines() if line.startswith(MARKER)]
    if not lines:
        tail = " | ".join(stderr.strip().splitlines()[-3:]) or stdout.strip()[-300:]
        return failed_report(where, f"the probe gave no answer (exit {exit_code}): {tail}")
    text = lines[-1][len(MARKER) :].encode("utf-8", "surrogateescape")
    if len(text) > MAX_ANSWER:
        return failed_report(
            where, f"the probe's answer is {len(text)} bytes, more than the {MAX_ANSWER} read; refused"
        )
    try:
        answer = load_json(text)
    except ValueError as exc:
        return failed_report(where, f"the probe's answer is not JSON: {exc}")
    if not isinstance(answer, dict):
        return failed_report(where, f"the probe's answer is not a JSON object but {_kind(answer)}")
    return report_from_json(where, answer)


_STATUSES: dict[str, ImportStatus] = {"ok": "ok", "skip": "skip", "fail": "fail"}


class _Malformed(ValueError):
    pass


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", dict: "an object", bool: "a boolean"}.get(type(value), "a number or null")


def _records(answer: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """``answer[key]``: a list of objects (absent: none), or :class:`_Malformed` naming the key."""
    value = answer.get(key) or []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _Malformed(f"{key} is not a list of objects")
    return value


def report_from_json(where: str, answer: Mapping[str, Any]) -> ProbeReport:
    """The report an answer says; an answer of the wrong shape is one problem saying which key."""
    try:
        return _report(where, answer)
    except _Malformed as exc:
        return failed_report(where, f"the probe's answer is malformed: {exc}")


def _report(where: str, answer: Mapping[str, Any]) -> ProbeReport:
    if answer.get("crash"):
        return ProbeReport(where, (ProbeProblem("probe", f"the probe crashed: {answer['crash']}"),), raw=answer)
    facts = answer.get("facts") or {}
    if not isinstance(facts, dict):
        raise _Malformed("facts is not an object")
    if "ray_cpus" in facts and (problem := ray_cpus_problem(facts["ray_cpus"])):
        raise _Malformed(f"facts.ray_cpus {problem}")
    problems = tuple(
        ProbeProblem(str(p.get("what", "")), str(p.get("detail", "")), str(p.get("key", "")), str(p.get("module", "")))
        for p in _records(answer, "problems")
    )
    imports = tuple(
        ProbeImport(
            str(i.get("module", "")),
            str(i.get("why", "")),
            _STATUSES.get(str(i.get("status")), "fail"),
            str(i.get("detail", "")),
            str(i.get("skip", "")),
        )
        for i in _records(answer, "imports")
    )
    layout = answer.get("exports")
    exports = None
    if isinstance(layout, dict):
        exports = ExportLayout(
            root=None if layout.get("root") is None else str(layout["root"]),
            pattern=str(layout.get("pattern", "")),
            expected=bool(layout.get("expected")),
            why=str(layout.get("why", "")),
            strict=bool(layout.get("strict", True)),
        )
    return ProbeReport(where, problems, imports, dict(facts), exports, dict(answer))


def _problem_text(problem: ProbeProblem) -> str:
    named = f"key {problem.key}: " if problem.key else (f"module {problem.module}: " if problem.module else "")
    return f"{named}{problem.detail}"


def probe_lines(report: ProbeReport) -> tuple[PreflightLine, ...]:
    """One ``fail`` line per problem, or one ``ok`` line; the first carries the whole report."""
    facts: dict[str, Any] = {"where": report.where, **dict(report.raw)}
    if report.problems:
        return tuple(
            PreflightLine(CHECK, "fail", f"{report.where}: {_problem_text(p)}", facts if i == 0 else None)
            for i, p in enumerate(report.problems)
        )
    done = [i for i in report.imports if i.status == "ok"]
    skipped = [i for i in report.imports if i.status == "skip"]
    f = report.facts
    trainer = str(f.get("trainer_class") or "").rpartition(".")[2]
    detail = (
        f"{report.where}: {report.verl}{f' ({trainer})' if trainer else ''}: the config composes, validate_config "
        f"passes for {f.get('nnodes')} node(s) x {f.get('npus_per_node')} NPU(s), it resolves in a Ray worker; "
        f"{len(done)} import(s) ok"
    )
    if skipped:
        detail += f", {len(skipped)} skipped by the recipe ({', '.join(sorted({i.skip for i in skipped}))})"
    if report.exports is not None:
        detail += f"; exports: {report.exports.why}"
    return (PreflightLine(CHECK, "ok", detail, facts),)


RAY_RESOURCES = "ray-resources"  # envrun.preflight.RAY_CHECK


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value: Any) -> str:
    return "missing" if value is None else json.dumps(value)[:40]


def ray_cpus_problem(found: Any) -> str | None:
    """What is wrong with the probe's ``ray_cpus`` facts (:meth:`job_script.Probe.ray_cpus`), which
    :func:`ray_cpu_line` and the cluster's check compute with; None when they are what the script writes."""
    if not isinstance(found, dict):
        return f"is {_kind(found)}, not an object"
    for key in ("needed", "detected"):
        if not _number(found.get(key)):
            return f"{key} is {_shown(found.get(key))}, not a number"
    if found.get("num_cpus") is not None and not _number(found["num_cpus"]):
        return f"num_cpus is {_shown(found['num_cpus'])}, not a number or null"
    parts = found.get("parts") or []
    if not isinstance(parts, (list, tuple)) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and _number(p[1]) for p in parts
    ):
        return "parts is not a list of [what, CPUs] pairs"
    asked = found.get("set_for_a_new_ray") or []
    if not isinstance(asked, (list, tuple)) or not all(isinstance(key, str) for key in asked):
        return "set_for_a_new_ray is not a list of names"
    return None


def cpu_ask(facts: Mapping[str, Any]) -> str:
    """What the probe's ``ray_cpus`` facts say the job's first Ray actors ask for, in words."""
    parts = "; ".join(f"{what}: {cpus:g}" for what, cpus in facts.get("parts") or ())
    return f"the job's Ray actors ask for {float(facts['needed']):g} CPU(s) at once ({parts})"


def ray_cpu_line(report: ProbeReport) -> PreflightLine | None:
    """For a job that starts its own Ray (the local and docker backends): the CPUs its first actors ask
    for against what that Ray will have. Ray does not refuse an actor it cannot place; it waits, so a
    shortfall is a job that hangs before it reaches anything else."""
    found = report.facts.get("ray_cpus")
    if not isinstance(found, dict):
        return None
    needed, num_cpus, detected = float(found["needed"]), found.get("num_cpus"), float(found["detected"])
    have = (
        f"ray_kwargs.ray_init.num_cpus={float(num_cpus):g}"
        if num_cpus is not None
        else f"ray_kwargs.ray_init.num_cpus is unset and Ray detects {detected:g} CPU(s) there"
    )
    total = float(num_cpus) if num_cpus is not None else detected
    asks = f"{report.where}: {cpu_ask(found)}; {have}"
    if needed > total:
        return PreflightLine(
            RAY_RESOURCES,
            "fail",
            f"{asks}: Ray would wait for them forever. Pass -o ray_kwargs.ray_init.num_cpus={int(needed + 0.999)} "
            "or more (a scheduling quota, not a thread limit)",
            dict(found),
        )
    return PreflightLine(RAY_RESOURCES, "ok", asks, dict(found))


def layout_of(lines: tuple[PreflightLine, ...]) -> ExportLayout | None:
    """The export layout a probe line recorded (the first line of a report carries it)."""
    for line in lines:
        if line.name == CHECK and line.facts and isinstance(line.facts.get("exports"), dict):
            return report_from_json(str(line.facts.get("where", "")), line.facts).exports
    return None
