"""Preflight: the checks that must pass before a job starts, each a typed line of a report.

The outside world comes in through injected callables (image labels and platform, the NPU and job
probes), so the checks run the same in tests with small fakes and in production with the real thing.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import EnvbuildError, InputError
from envbuild.image.plan import LOCK_LABEL
from envbuild.lock.platform import OCI_ARCH
from envrun.auditnames import name_source
from envrun.checkpoint.audit import NOT_A_MODEL_DIR, ModelAudit, audit_model
from envrun.checkpoint.names import shown_name
from envrun.datafiles import parquet_problem
from envrun.plan import RunPlan
from envrun.preflightline import PreflightLine

# The last is not run here: it asks where the job runs (a Ray cluster's nodes), when it is launched.
TARGET_CHECK = "ray-node"
PROBE_CHECK = "job-probe"  # envrun.probe.report.CHECK, without importing the probe here
RAY_CHECK = "ray-resources"  # from the probe's facts: the CPUs the job's Ray actors ask for, against its Ray's
NETWORK_CHECK = "network"  # envrun.cluster.network.CHECK: asked of a Ray cluster's nodes, at launch
STORAGE_CHECK = "storage"  # envrun.cluster.storage.CHECK: the output directory, one storage for every node
CHECKS = (
    "image-lock-label",
    "image-platform",
    "npus",
    "model",
    "data",
    PROBE_CHECK,
    RAY_CHECK,
    TARGET_CHECK,
    NETWORK_CHECK,
    STORAGE_CHECK,
)

ImageLabels = Callable[[str], "dict[str, str]"]  # image ref -> labels; raises EnvbuildError if absent
ImagePlatform = Callable[[str], "tuple[str, str]"]  # image ref -> (the image's architecture, the engine host's)
NpuProbe = Callable[[], PreflightLine]
JobProbe = Callable[[RunPlan], "tuple[PreflightLine, ...]"]  # the job probe's lines for a plan


class PreflightError(InputError):
    """A preflight check failed; nothing was started (exit 2)."""


@dataclass(frozen=True)
class PreflightEnv:
    image_labels: ImageLabels | None = None
    image_platform: ImagePlatform | None = None  # the docker backend's: the image must run on the engine's host
    npu_probe: NpuProbe | None = None
    job_probe: JobProbe | None = None  # None: the probe as the plan's backend runs it (envrun.probe.run)


def run_preflight(
    plan: RunPlan, env: PreflightEnv, *, dry_run: bool = False, skip: Iterable[str] = ()
) -> tuple[PreflightLine, ...]:
    skip = set(skip)
    unknown = skip - set(CHECKS)
    if unknown:
        raise InputError(f"--skip-check: unknown check {sorted(unknown)[0]} (checks: {', '.join(CHECKS)})")
    results: list[PreflightLine] = []
    for name, check in (
        ("image-lock-label", lambda: (check_image_label(plan, env.image_labels),)),
        ("image-platform", lambda: (check_image_platform(plan, env.image_platform),)),
        ("npus", lambda: (check_npus(plan, env.npu_probe, dry_run),)),
        ("model", lambda: (_on_nodes("model", plan) or check_model(plan),)),
        ("data", lambda: (_on_nodes("data", plan) or check_data(plan.data_files),)),
        (PROBE_CHECK, lambda: check_job(plan, env.job_probe, results)),
    ):
        results.extend((PreflightLine(name, "skip", "skipped by --skip-check"),) if name in skip else check())
    if RAY_CHECK in skip:  # made from the probe's answer: dropped, and said so
        results = [line for line in results if line.name != RAY_CHECK]
        results.append(PreflightLine(RAY_CHECK, "skip", "skipped by --skip-check"))
    return tuple(results)


def _on_nodes(name: str, plan: RunPlan) -> PreflightLine | None:
    """On a cluster the job reads its files on the nodes: checked there, on the same paths."""
    if not plan.on_nodes:
        return None
    return PreflightLine(name, "skip", f"checked on every node of the cluster, with the {TARGET_CHECK} check")


def check_job(plan: RunPlan, probe: JobProbe | None, before: list[PreflightLine]) -> tuple[PreflightLine, ...]:
    """The job probe where the job will run (:mod:`envrun.probe`); on a Ray cluster, with the node check."""
    if plan.probe is None:
        return (PreflightLine(PROBE_CHECK, "skip", f"recipe {plan.recipe} has no probe"),)
    if plan.on_nodes:
        return (
            PreflightLine(PROBE_CHECK, "skip", f"runs on every node of the cluster, with the {TARGET_CHECK} check"),
        )
    if any(line.name == "image-lock-label" and line.status == "fail" for line in before):
        return (PreflightLine(PROBE_CHECK, "skip", "not run: the image is not the lock's"),)
    return (probe or default_job_probe)(plan)


def default_job_probe(plan: RunPlan) -> tuple[PreflightLine, ...]:
    from envrun.probe.report import probe_lines, ray_cpu_line  # the probe's cost: only when probing
    from envrun.probe.run import probe_here, probe_in_image

    assert plan.probe is not None
    if plan.backend == "docker" and plan.image:
        from envrun.dockerhost import job_volumes

        report = probe_in_image(plan.probe, plan.image, plan.python, plan.env, job_volumes(plan))
    else:
        report = probe_here(plan.probe, plan.python, plan.env)
    cpus = ray_cpu_line(report)  # the job starts its own Ray here: it must be able to place its actors
    return probe_lines(report) + ((cpus,) if cpus is not None else ())


def failed(results: Iterable[PreflightLine]) -> list[PreflightLine]:
    return [r for r in results if r.status == "fail"]


def check_image_label(plan: RunPlan, image_labels: ImageLabels | None) -> PreflightLine:
    name = "image-lock-label"
    if plan.backend == "slurm":
        return PreflightLine(name, "skip", "read on every node from the image it pulled, before Ray starts there")
    if not plan.image:
        return PreflightLine(name, "skip", f"no --image; the {plan.backend} backend runs in the current image")
    if image_labels is None:
        return PreflightLine(name, "fail", f"{plan.image}: cannot read its labels (no container engine)")
    try:
        labels = image_labels(plan.image)
    except EnvbuildError as exc:
        return PreflightLine(name, "fail", f"{plan.image}: {exc}")
    found = (labels or {}).get(LOCK_LABEL)
    if found is None:
        return PreflightLine(name, "fail", f"{plan.image} has no {LOCK_LABEL} label; build it with `envbuild image`")
    if found != plan.lock_sha256:
        return PreflightLine(
            name,
            "fail",
            f"{plan.image} was built from lock sha256 {found}, not {plan.lock_file} "
            f"(sha256 {plan.lock_sha256}); rebuild the image or pass the lock it was built from",
        )
    return PreflightLine(name, "ok", f"{plan.image} carries {LOCK_LABEL}={found}")


def check_image_platform(plan: RunPlan, image_platform: ImagePlatform | None) -> PreflightLine:
    """The docker backend's image is built for the engine host's architecture: else the container fails
    to start with "exec format error", after everything else passed."""
    name = "image-platform"
    if plan.backend != "docker" or not plan.image:
        return PreflightLine(name, "skip", f"the {plan.backend} backend starts no container of an image here")
    if image_platform is None:
        return PreflightLine(name, "fail", f"{plan.image}: cannot read its platform (no container engine)")
    try:
        image_arch, machine = image_platform(plan.image)
    except EnvbuildError as exc:
        return PreflightLine(name, "fail", f"{plan.image}: {exc}")
    host_arch = OCI_ARCH.get(machine, machine)  # the engine reports uname's name, an image OCI's
    if image_arch != host_arch:
        return PreflightLine(
            name,
            "fail",
            f"{plan.image} is built for linux/{image_arch}, but the engine's host is {machine} (linux/{host_arch}): "
            "its programs would fail with 'exec format error'; build the lock for this host's platform",
        )
    return PreflightLine(name, "ok", f"{plan.image} is linux/{image_arch}, as the engine's host ({machine})")


def check_npus(plan: RunPlan, probe: NpuProbe | None, dry_run: bool) -> PreflightLine:
    if dry_run:
        return PreflightLine("npus", "skip", "dry run")
    if plan.on_nodes:
        return PreflightLine("npus", "skip", f"the cluster's nodes run the job; counted there ({TARGET_CHECK})")
    return (probe or probe_npus)()


def probe_npus() -> PreflightLine:
    devices = sorted(str(d) for d in Path("/dev").glob("davinci[0-9]*"))
    if not devices:
        return PreflightLine("npus", "fail", "no /dev/davinci* device: no Ascend NPU visible on this host")
    npu_smi = shutil.which("npu-smi") or ("/usr/local/bin/npu-smi" if Path("/usr/local/bin/npu-smi").exists() else None)
    if npu_smi is None:
        return PreflightLine(
            "npus", "fail", f"{len(devices)} /dev/davinci* devices but no npu-smi (driver not installed?)"
        )
    try:
        done = subprocess.run([npu_smi, "info"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return PreflightLine("npus", "fail", f"npu-smi info failed: {exc}")
    if done.returncode != 0:
        return PreflightLine("npus", "fail", f"npu-smi info exited {done.returncode}: {done.stderr.strip()[:200]}")
    return PreflightLine("npus", "ok", f"{len(devices)} devices ({', '.join(devices)}); npu-smi info ok")


def check_model(plan: RunPlan) -> PreflightLine:
    """The model directory, audited where the plan's lenient save needs its guard, with the names the
    job's own transformers gives where the lock pins one (:mod:`envrun.auditnames`), else envrun's
    static description."""
    model = plan.model
    if model is None:
        return PreflightLine("model", "skip", "the model path is set by an override, not --model")
    if plan.lenient_checkpoint:
        return model_verdict(audit_model(str(model), name_source(plan)))
    if not model.is_dir():
        return PreflightLine("model", "fail", f"{model}: {NOT_A_MODEL_DIR}")
    return PreflightLine("model", "ok", f"{model}: a directory")


def model_verdict(audit: ModelAudit, where: str = "") -> PreflightLine:
    """The model check's one verdict (pure), on this host's audit and on each node's
    (:mod:`envrun.cluster.nodecheck`), both worded by :func:`envrun.checkpoint.audit.audit_model`;
    ``where`` names the node."""
    who = f"{where}: " if where else ""
    if audit.error is not None:
        return PreflightLine("model", "fail", who + audit.error)
    names = audit.expected_from or "-"
    facts = {"check": audit.check, "expected_from": names}
    if not audit.ok:
        # Names come from the checkpoint: escaped and shortened as the audit's own report does.
        missing = [shown_name(n) for n in audit.missing]
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        unexpected = [shown_name(n) for n in audit.unexpected]
        more = f"; unexpected: {', '.join(unexpected[:5])}" if unexpected else ""
        # A shard file the index names that is gone fails a loader even when it held only MTP tensors.
        files = [shown_name(n) for n in audit.shards_missing]
        more += f"; missing shard files: {', '.join(files[:5])}" if files else ""
        return PreflightLine(
            "model",
            "fail",
            f"{who}{audit.path}: checkpoint audit failed (checkpoint.strict=False "
            f"tolerates only the MTP layers): missing: {shown or '-'}{more}; names: {names}",
            facts,
        )
    return PreflightLine(
        "model", "ok", f"{who}{audit.path}: checkpoint audit ok (only MTP layers may be absent); names: {names}", facts
    )


def check_data(files: tuple[Path, ...]) -> PreflightLine:
    if not files:
        return PreflightLine("data", "skip", "the data files are set by overrides, not --data")
    problems = [p for p in map(parquet_problem, files) if p]
    if problems:
        return PreflightLine("data", "fail", "; ".join(problems))
    return PreflightLine("data", "ok", f"{len(files)} parquet file(s)")
