"""The run's checkpoint audits take their names from the model the lock's transformers builds, where the
job runs (envrun/auditnames.py; envrun/cluster/onnode.py on a node, both through
envrun.checkpoint.modelnames.job_names), and every result says so, in the same words on host and node.

Against the real transformers 5.10.4 (tests/lib/pyenvs.py HF_STACK) and checkpoints its own
save_pretrained wrote (tests/lib/hfckpt.py); the docker case in an image that really has it
(tests/lib/hfimage.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import replace
from pathlib import Path

import docker
import pytest

from envbuild.image.plan import LOCK_LABEL
from envbuild.lock.io import read_lock
from envbuild.progress import silent
from envrun.auditnames import InImage, locked_transformers, name_source
from envrun.checkpoint import ModelNames, ModelNamesError, audit_checkpoint
from envrun.checkpoint.modelnames import job_names
from envrun.cluster import onnode
from envrun.exports import export_verdict, search_here
from envrun.launch.docker_backend import DockerLauncher
from envrun.plan import RunPlan
from envrun.prepare import prepare_run
from envrun.probe.report import ExportLayout
from tests.lib.baseimage import BaseImage
from tests.lib.hfckpt import alter_checkpoint, hf_venv, tensor_names, write_hf_checkpoint
from tests.lib.hfimage import hf_image
from tests.lib.tinyrun import REAL_LOCK, Tiny

pytestmark = [pytest.mark.network, pytest.mark.slow]  # the environment is built from PyPI on first use

MODEL = "GlmMoeDsaForCausalLM of transformers 5.10.4 on the meta device (torch 2.13.0"
PATTERN = "global_step_*/actor/model/huggingface"  # verl 0.9.1's, as the probe reads it


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_checkpoint(tmp_path_factory.mktemp("hf") / "glm5", max_shard_size="20KB")


def indexer_everywhere(model: Path) -> list[str]:
    return [n for n in tensor_names(model) if ".self_attn.indexer.k_norm.weight" in n]


def lost_indexer_norm(checkpoint: Path, where: Path) -> Path:
    """A copy that lost one tensor in every layer: what the static table would also catch, here the model must."""
    shutil.copytree(checkpoint, where)
    alter_checkpoint(where, drop=indexer_everywhere(where))
    return where


def bin_with_python(tmp_path: Path, python: Path, log: Path | None = None) -> str:
    """A PATH on which ``python3`` runs ``python`` (the job's interpreter as its own PATH finds it; a
    wrapper, not a symlink, so that a virtual environment's python still finds its environment); each
    start adds a line to ``log`` when given."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "python3"
    logged = f"echo started >>{log}\n" if log is not None else ""
    wrapper.write_text(f'#!/bin/sh\n{logged}exec {python} "$@"\n')
    wrapper.chmod(0o755)
    return f"{bindir}:{os.environ.get('PATH', '')}"


def real_lock_plan(tiny: Tiny, model: Path, **params: object) -> RunPlan:
    request = replace(tiny.request(dry_run=True, model=model, **params), lock=REAL_LOCK)
    return prepare_run(request).plan


def model_line(plan: RunPlan) -> tuple[str, str]:
    (line,) = [line for line in plan.preflight if line.name == "model"]
    return line.status, line.detail


def test_the_lock_s_transformers_is_the_one_asked() -> None:
    assert locked_transformers(read_lock(REAL_LOCK).lock) == "5.10.4"


def test_local_preflight_asks_the_job_s_own_transformers(tiny: Tiny, checkpoint: Path, tmp_path: Path) -> None:
    path = bin_with_python(tmp_path, hf_venv().python)
    plan = real_lock_plan(tiny, checkpoint, extra_env={"PATH": path})
    status, detail = model_line(plan)
    assert status == "ok", detail
    assert MODEL in detail and f"with the job's python3 ({tmp_path}/bin/python3) on this host" in detail
    assert plan.audit_names == "the model built by the lock's transformers 5.10.4 with the job's python3 on this host"

    lost = real_lock_plan(tiny, lost_indexer_norm(checkpoint, tmp_path / "lost"), extra_env={"PATH": path})
    status, detail = model_line(lost)
    assert status == "fail" and "self_attn.indexer.k_norm.weight" in detail and MODEL in detail


def test_a_job_python_without_transformers_fails_the_check_with_the_reason(
    tiny: Tiny, checkpoint: Path, tmp_path: Path
) -> None:
    plan = real_lock_plan(tiny, checkpoint, extra_env={"PATH": bin_with_python(tmp_path, Path(sys.executable))})
    status, detail = model_line(plan)
    assert status == "fail"
    assert "could not be had from the model the lock's transformers 5.10.4 builds (no fallback" in detail
    assert "cannot import torch and transformers" in detail


def test_a_job_python_missing_from_path_fails_the_check(tiny: Tiny, checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    status, detail = model_line(real_lock_plan(tiny, checkpoint, extra_env={"PATH": str(tmp_path / "empty")}))
    assert status == "fail" and "python3: not found on the job's PATH" in detail


def test_names_made_by_another_transformers_than_the_lock_s_are_refused(checkpoint: Path) -> None:
    names = ModelNames((str(hf_venv().python),), transformers="5.9.0")
    with pytest.raises(ModelNamesError, match=r"of transformers 5\.10\.4 .* but the lock pins transformers 5\.9\.0"):
        audit_checkpoint(checkpoint, expected=names)


def test_local_exports_are_audited_with_the_model_s_names(tiny: Tiny, checkpoint: Path, tmp_path: Path) -> None:
    started = tmp_path / "started.log"
    plan = real_lock_plan(tiny, checkpoint, extra_env={"PATH": bin_with_python(tmp_path, hf_venv().python, started)})
    root = tmp_path / "ckpts"
    shutil.copytree(checkpoint, root / "global_step_1/actor/model/huggingface")
    lost_indexer_norm(checkpoint, root / "global_step_2/actor/model/huggingface")
    layout = ExportLayout(str(root), PATTERN, True, "save_freq=1", False)
    started.unlink()  # the preflight's own model build
    verdict = export_verdict(layout, search_here(layout, name_source(plan)))
    assert [a.ok for a in verdict.audits] == [True, False]
    assert len(started.read_text().splitlines()) == 1  # two steps' exports of one config: one model build
    assert all(MODEL in a.expected_from and "on this host" in a.expected_from for a in verdict.audits)
    assert "names: " + verdict.audits[0].expected_from in verdict.detail
    assert "global_step_2" in verdict.failures[0] and "indexer.k_norm.weight" in verdict.failures[0]


def test_without_a_transformers_pin_the_static_description_is_named(tiny: Tiny) -> None:
    plan = prepare_run(tiny.request(dry_run=True)).plan  # the tiny lock: the real one without transformers
    assert plan.transformers is None and name_source(plan) is None
    assert plan.audit_names == "envrun's static description (the lock pins no transformers)"
    status, detail = model_line(plan)
    assert status == "ok" and detail.endswith(
        "names: the glm_moe_dsa modelling code of transformers 5.10.4 (envrun's description)"
    )


def test_a_node_asks_the_job_s_interpreter_there(checkpoint: Path, tmp_path: Path) -> None:
    # The function a Ray node's task runs (envrun/cluster/onnode.py), called here with a node's spec.
    spec = {"transformers": "5.10.4", "python": "python3", "env": {"PATH": bin_with_python(tmp_path, hf_venv().python)}}
    answer = onnode.audit(str(checkpoint), onnode.names_for(spec))
    assert answer["ok"] and answer["check"] == "model", answer
    assert MODEL in answer["expected_from"] and f"on node {socket.gethostname()}" in answer["expected_from"]
    spec["env"] = {"PATH": str(tmp_path / "nowhere")}
    failed = onnode.audit(str(checkpoint), onnode.names_for(spec))
    assert not failed["ok"] and failed["error"] == (
        f"{checkpoint}: the expected names could not be had from the model the lock's transformers 5.10.4 builds "
        f"(no fallback to envrun's description): python3: not found on the job's PATH on node {socket.gethostname()} "
        "(the job's interpreter)"
    )
    assert onnode.audit(str(checkpoint), onnode.names_for({}))["check"] == "architecture"  # no pin: static


@pytest.fixture(scope="module")
def image(docker_client: docker.DockerClient, base_image: BaseImage) -> str:
    return hf_image(docker_client, base_image, {LOCK_LABEL: read_lock(REAL_LOCK).sha256})


@pytest.mark.docker
def test_docker_preflight_and_exports_ask_the_image_s_transformers(
    tiny: Tiny, checkpoint: Path, image: str, tmp_path: Path
) -> None:
    plan = real_lock_plan(tiny, checkpoint, backend="docker", image=image)
    statuses = {line.name: line.status for line in plan.preflight}
    assert statuses["image-lock-label"] == statuses["image-platform"] == "ok"  # the engine's own answers
    status, detail = model_line(plan)
    assert status == "ok" and MODEL in detail and f"in image {image}" in detail, detail
    assert plan.audit_names == f"the model built by the lock's transformers 5.10.4 in image {image}"

    root = tmp_path / "outputs"
    lost_indexer_norm(checkpoint, root / "global_step_3/actor/model/huggingface")
    layout = ExportLayout(str(root), PATTERN, True, "save_freq=1", False)
    verdict = export_verdict(layout, DockerLauncher().find_exports(plan, layout, silent))
    (audit,) = verdict.audits
    assert not audit.ok and "model.layers.0.self_attn.indexer.k_norm.weight" in audit.missing
    assert f"in image {image}" in audit.expected_from


@pytest.mark.docker
def test_an_image_without_transformers_fails_the_check(base_image: BaseImage, checkpoint: Path) -> None:
    names = job_names("5.10.4", "python3", {}, f"in image {base_image.tag}", InImage(base_image.tag))
    with pytest.raises(ModelNamesError, match=r"python3 in image .* exited 1: .*cannot import torch and transformers"):
        audit_checkpoint(checkpoint, expected=names)
