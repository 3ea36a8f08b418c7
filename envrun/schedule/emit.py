"""``--emit sbatch|volcano|rayjob DIR``: what a user submits, written from the prepared plan; nothing runs.

- ``sbatch``: the Slurm job's directory (:func:`envrun.schedule.slurm.write_job`): ``sbatch DIR/job.sbatch``.
  DIR must be where every node sees it, at the same path: the scripts name it.
- ``volcano`` / ``rayjob``: one manifest file (a ConfigMap with the job's spec and envrun's code, and the
  Volcano Job or KubeRay RayJob): ``kubectl create -f DIR/<name>.yaml`` (or ``kubectl apply --server-side``:
  the ConfigMap is too large for a client-side apply's annotation). The job's record is written under the
  output directory (the storage every pod mounts), else in the head pod only. A node that refuses the run
  never joins; the head's driver gives up after the join deadline (``--join-timeout``), and the job fails.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from pathlib import Path, PurePosixPath

from envbuild.errors import InputError
from envbuild.escape import for_terminal
from envbuild.fileio import write_atomic
from envrun.injob.spec import JOB_DIR
from envrun.plan import RunPlan
from envrun.schedule.jobdir import RECORD_DIR, code_files, in_job
from envrun.schedule.sbatch import job_dir_problem

KINDS = ("sbatch", "volcano", "rayjob")
ZIP_TIME = (2026, 1, 1, 0, 0, 0)  # every entry's: the same code gives the same bytes


def code_zip() -> bytes:
    """envbuild's and envrun's modules as one zip, the same bytes for the same code."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:  # each entry: zlib's default level
        for name, source in code_files():
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, source.read_bytes())
    return buffer.getvalue()


def locked_version(lock_file: str, name: str) -> str | None:
    """The version the run's lock pins for package ``name`` (KubeRay wants Ray's), None when it pins none."""
    from envbuild.lock.io import read_lock

    lock = read_lock(Path(lock_file)).lock
    return next((p.version for p in lock.packages if p.name == name), None)


def job_name(plan: RunPlan) -> str:
    """The run's id as a Kubernetes name (lowercase letters, digits and '-', at most ``NAME_MAX``): the id
    itself when it is one; else what of it fits, then 8 hex digits of the id. Two runs never share a name
    (a ConfigMap or Job of one run replaced by another's, or refused as existing), however long their
    common start (``<recipe>-<UTC time>`` of a long recipe name is cut inside its time) or however they
    differ in case or punctuation."""
    from envrun.schedule.kube import NAME_MAX

    run_id = plan.run_id
    if len(run_id) <= NAME_MAX and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", run_id):
        return run_id
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    stem = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    if not stem[:1].isalpha():
        stem = "run-" + stem
    return f"{stem[: NAME_MAX - len(digest) - 1].rstrip('-')}-{digest}"


def emit_target(kind: str, directory: Path) -> Path:
    """``directory`` made absolute, once ``kind`` is known and the directory can take its files (checked
    before the run is prepared, so a refusal costs nothing and writes nothing)."""
    if kind not in KINDS:
        raise InputError(f"--emit {kind!r}: expected one of {', '.join(KINDS)}")
    directory = directory.absolute()
    if kind == "sbatch" and (problem := job_dir_problem(str(directory))):
        raise InputError(f"--emit sbatch {for_terminal(str(directory))!r}: {problem}")
    existing = next(path for path in (directory, *directory.parents) if path.exists() or path.is_symlink())
    if not existing.is_dir():  # mkdir would fail on it after the whole preflight
        shown = "it" if existing == directory else for_terminal(str(existing))
        raise InputError(f"--emit {kind} {for_terminal(str(directory))!r}: {shown} exists and is not a directory")
    return directory


def emit(plan: RunPlan, kind: str, directory: Path, skip: frozenset[str]) -> list[Path]:
    directory = emit_target(kind, directory)
    if kind == "sbatch":
        from envrun.schedule.slurm import write_job

        write_job(plan, directory, skip)
        return [directory / "job.sbatch", directory / "node.sh", directory / "job.json", directory / "code"]
    from envrun.schedule.kube import KubeJob, dump_manifests, render_rayjob, render_volcano

    assert plan.nnodes and plan.image  # build_plan's promise for a scheduled run
    record = (
        PurePosixPath(str(plan.output_dir)) / f"envrun-record-{plan.run_id}"
        if plan.output_dir is not None
        else PurePosixPath(JOB_DIR) / RECORD_DIR
    )
    spec = in_job(plan, record, tuple(sorted(skip)))
    job = KubeJob(
        name=job_name(plan),
        nnodes=plan.nnodes,
        npus_per_node=plan.npus_per_node,
        image=plan.image,
        spec_json=json.dumps(spec.to_json(), indent=2, sort_keys=True) + "\n",
        code_zip=code_zip(),
        volumes=plan.volumes,
        # A volume's kind is what its path is here, where the job is written (shared storage, as on the nodes).
        file_volumes=frozenset(v.host for v in plan.volumes if Path(v.host).is_file()),
        env=dict(plan.env),
        head_port=spec.head_port,
        dashboard_port=spec.dashboard_port,
        ray_version=locked_version(plan.lock_file, "ray"),
    )
    documents = render_volcano(job) if kind == "volcano" else render_rayjob(job)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{job.name}.{kind}.yaml"
    write_atomic(target, dump_manifests(documents))
    return [target]
